"""The warm start clones the decisions the run will train: the seats dealt the trained roles, in the run's
language and options; ``format_only`` keeps the bot's moves but not its speeches; unset optional fields stay
out of the cache key. Answers and prompts judged against the game and the driver: ``test_warmstart_answers``."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from wolfpack_games import get_game, make_game
from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import TrainConfig, WarmStartSection
from wolfpack_trainer.warmstart import (
    FORMAT_ONLY_SPEECH,
    RECORD,
    WarmStartConfig,
    bot_pairs,
    bot_turns,
    cache_key,
    clone_bot,
    clone_record,
    record_line,
    record_metrics,
    response_loss,
    split_passes,
    warmstart_config,
)

HAN = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model(tmp_path_factory.mktemp("models"))))


def _werewolf(**kw: Any) -> WarmStartConfig:
    return WarmStartConfig(game_id="werewolf_v1", variant="6p", seats=(), bot="heuristic", **kw)


def test_roles_clone_the_seats_dealt_those_roles() -> None:
    heuristic = get_game("werewolf_v1").bots["heuristic"]
    for seed in (1, 2, 3):
        env = make_game("werewolf_v1", "6p")
        env.start(seed=seed)
        seer = next(s for s in env.possible_agents if env.role(s) == "seer")
        turns = bot_turns(_werewolf(roles=("seer",)), seed, heuristic)
        assert turns and {t.seat for t in turns} == {seer}
        assert all("seer" in t.observation.lower() for t in turns)
    assert bot_turns(_werewolf(), 1, heuristic) == []  # no seats, no roles: nothing to clone


def test_language_and_options_reach_the_game() -> None:
    heuristic = get_game("werewolf_v1").bots["heuristic"]
    zh = WarmStartConfig(
        game_id="werewolf_v1", variant="12p", seats=(), roles=("wolf_king",), bot="heuristic",
        options={"wolf_king": True, "language": "zh"},
    )  # fmt: skip
    turns = bot_turns(zh, 5, heuristic)
    assert turns and all(HAN.search(t.observation) for t in turns)
    assert bot_turns(replace(zh, options={"language": "zh"}), 5, heuristic) == []  # no wolf king dealt
    en = bot_turns(replace(zh, roles=("villager",), options={"wolf_king": True}), 5, heuristic)
    assert en and not any(HAN.search(t.observation) for t in en)


def test_format_only_keeps_moves_and_replaces_speeches(tokenizer: Any) -> None:
    cfg = _werewolf(roles=("seer", "villager"), episodes=2)
    turns = [
        t
        for i in range(2)
        for t in bot_turns(cfg, cfg.seed_offset + i, get_game("werewolf_v1").bots["heuristic"])
    ]
    speeches = [t for t in turns if t.speech]
    moves = [t for t in turns if not t.speech]
    assert speeches and moves
    assert any(t.text != FORMAT_ONLY_SPEECH["en"] for t in speeches)  # the bot's own speeches differ

    def answers(c: WarmStartConfig) -> list[str]:
        return [tokenizer.decode(r, skip_special_tokens=True) for _, r in bot_pairs(c, tokenizer)]

    plain, formatted = answers(cfg), answers(replace(cfg, format_only=True))
    assert len(plain) == len(formatted) == len(turns)
    for turn, a, b in zip(turns, plain, formatted, strict=True):
        assert a == turn.text
        assert b == (FORMAT_ONLY_SPEECH["en"] if turn.speech else turn.text)
    zh = replace(cfg, format_only=True, options={"language": "zh"}, episodes=1)
    assert FORMAT_ONLY_SPEECH["zh"] in answers(zh)


def test_cache_key_leaves_out_optional_fields_that_are_unset() -> None:
    """Unset optional fields are not in the key (a config that does not use them keys as without them);
    clones cached before the driver's prompt fields get new keys (``test_warmstart_answers``)."""
    cfg = WarmStartConfig(game_id="bargaining_v1", variant="medium", seats=(1,), episodes=200, steps=60)
    optional = (
        "roles",
        "options",
        "format_only",
        "system_prompt",
        "precision",
        "pass_tokens",
        "check_decisions",
    )
    old_fields = {k: v for k, v in asdict(cfg).items() if k not in optional}
    old = hashlib.sha256(json.dumps(["/m", old_fields], sort_keys=True).encode()).hexdigest()[:12]
    assert cache_key("/m", cfg) == old
    keys = {
        cache_key("/m", c)
        for c in (cfg, replace(cfg, roles=("seer",)), replace(cfg, options={"language": "zh"}),
                  replace(cfg, format_only=True), replace(cfg, steps=61), replace(cfg, precision="bf16"))
    }  # fmt: skip
    assert len(keys) == 6
    assert cache_key("/m", replace(cfg, pass_tokens=512)) == old  # memory, not the clone
    assert cache_key("/m", replace(cfg, check_decisions=64)) == old  # a measurement of the clone


def _train_config(**over: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "name": "ws",
        "game": {"id": "werewolf_v1", "variant": "12p", "language": "zh", "options": {"wolf_king": True}},
        "policies": [{"id": "player", "roles": ["villager", "seer"], "learner": "verl_fsdp"}],
        "rollout": {"mode": "service"},
        **over,
    }
    return TrainConfig.model_validate(data)


def test_warmstart_config_follows_the_training_config() -> None:
    assert warmstart_config(_train_config()) is None
    cfg = TrainConfig.model_validate(
        {
            "name": "ws",
            "game": {"id": "bargaining_v1"},
            "policies": [{"id": "b", "seats": [0]}, {"id": "s", "seats": [1]}],
            "warmstart": {"bot": "random", "episodes": 7, "steps": 3, "lr": 1e-4},
            "rollout": {"max_prompt_tokens": 64},
        }
    )
    ws = warmstart_config(cfg)
    assert ws == WarmStartConfig(
        game_id="bargaining_v1", variant="medium", seats=(0, 1), roles=(), options={}, bot="random",
        episodes=7, steps=3, lr=1e-4, max_prompt_tokens=64, check_decisions=256,
    )  # fmt: skip


def test_warmstart_config_carries_roles_language_and_options() -> None:
    """A role-based run (today's config check refuses a warm start with roles, so the section is added
    to a validated config)."""
    cfg = _train_config().model_copy(update={"warmstart": WarmStartSection(steps=5, bot="heuristic")})
    ws = warmstart_config(cfg)
    assert ws is not None
    assert (ws.game_id, ws.variant, ws.seats, ws.roles) == ("werewolf_v1", "12p", (), ("seer", "villager"))
    assert ws.options == {"wolf_king": True, "language": "zh"} and ws.bot == "heuristic" and ws.steps == 5


def test_bot_turns_render_the_observation_at_the_decision() -> None:
    """Observations render lazily: a turn's text is the one the seat saw then, not the game's end."""
    import random

    heuristic = get_game("werewolf_v1").bots["heuristic"]
    turns = bot_turns(_werewolf(roles=("witch",)), 2, heuristic)
    env = make_game("werewolf_v1", "6p")
    env.start(seed=2)
    rng = random.Random(2)
    seen: list[str] = []
    while not env.done and len(seen) < 2:
        moves = {}
        for seat in env.acting_seats():
            if seat == turns[0].seat:
                seen.append(env.observe(seat).text)
            moves[seat] = heuristic(env, seat, rng)
        env.step(moves)
    assert [t.observation for t in turns[:2]] == seen
    assert turns[0].observation != env.observe(turns[0].seat).text


def test_bf16_clone_trains_under_autocast(tmp_path: Any) -> None:
    """``precision: bf16`` builds a clone through bfloat16 autocast (on this CPU as on a GPU): it learns
    like the float32 clone (finite, falling loss) but is not the same model, and its record says so."""
    model = str(tiny_model(tmp_path / "models"))
    cfg = WarmStartConfig(game_id="ultimatum_v1", variant="easy", seats=(1,), episodes=8, steps=12,
                          batch_size=4, lr=3e-3)  # fmt: skip
    fp32 = clone_bot(model, cfg, tmp_path / "cache")
    bf16 = clone_bot(model, replace(cfg, precision="bf16"), tmp_path / "cache")
    assert fp32 != bf16
    records = [json.loads((Path(d) / RECORD).read_text()) for d in (fp32, bf16)]
    assert [r["precision"] for r in records] == ["fp32", "bf16"]
    assert records[1]["last_loss"] < records[1]["first_loss"]
    from transformers import AutoModelForCausalLM

    a, b = (AutoModelForCausalLM.from_pretrained(d).state_dict() for d in (fp32, bf16))
    gap = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert 0 < gap < 0.1  # autocast changed the arithmetic, not the training
    with pytest.raises(ValueError, match="fp32 or bf16"):
        clone_bot(model, replace(cfg, precision="fp16"), tmp_path / "cache")


def test_a_clones_record_reaches_the_runs_metrics_and_summary(tmp_path: Any) -> None:
    """``clone_record`` reads what ``clone_bot`` wrote; ``record_metrics`` and ``record_line`` report the
    build's seconds, pairs, losses and precision; a model that is no clone, or a damaged record, reports
    nothing instead of failing the run."""
    model = str(tiny_model(tmp_path / "models"))
    cfg = WarmStartConfig(game_id="ultimatum_v1", variant="easy", seats=(1,), episodes=8, steps=5,
                          batch_size=4, lr=3e-3, precision="bf16")  # fmt: skip
    clone = clone_bot(model, cfg, tmp_path / "cache")
    record = clone_record(clone)
    assert record is not None and record == json.loads((Path(clone) / RECORD).read_text())
    metrics = record_metrics(record)
    assert metrics == {
        "warmstart/bf16": 1.0,
        "warmstart/build_s": record["seconds"],
        "warmstart/pairs": float(record["pairs"]),
        "warmstart/first_loss": record["first_loss"],
        "warmstart/last_loss": record["last_loss"],
        "warmstart/pairs_s": record["pairs_s"],
        "warmstart/train_s": record["train_s"],
        "warmstart/check_s": record["check_s"],
    }
    assert metrics["warmstart/pairs"] > 0 and metrics["warmstart/build_s"] > 0
    # where the build's seconds went: the bot's games, the steps, the check and save, adding up to the build
    assert min(record["pairs_s"], record["train_s"], record["check_s"]) > 0
    assert record["pairs_s"] + record["train_s"] + record["check_s"] == pytest.approx(
        record["seconds"], abs=0.01
    )
    line = record_line(record)
    assert line.startswith(
        f"warm start: a clone of the random bot, {record['pairs']:,} pairs x 5 steps (bf16, cpu)"
    )
    assert f"its build took {record['seconds']:.0f} s (games {record['pairs_s']:.0f} s, steps " in line
    assert " -> " in line
    no_seconds = {"precision": "fp32", "seconds": True}  # a bool is no number of seconds
    assert record_metrics(no_seconds) == {"warmstart/bf16": 0.0}
    assert record_line({}) == "warm start: a clone of the ? bot"
    assert clone_record(model) is None  # the configured model: no clone, no record
    (Path(clone) / RECORD).write_text("{not json")
    assert clone_record(clone) is None


def _answer_rows(shapes: list[tuple[int, int]], seed: int) -> tuple[Any, Any, Any]:
    """Right-padded rows of random tokens, one per (prompt, answer) length pair, labels on each row's answer
    tokens only: the batches ``clone_bot`` builds. Returns ids, attention mask, labels."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 900, (len(shapes), max(p + a for p, a in shapes)), generator=gen)
    att = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, (prompt, answer) in enumerate(shapes):
        att[row, : prompt + answer] = 1
        labels[row, prompt : prompt + answer] = ids[row, prompt : prompt + answer]
    return ids, att, labels


def test_response_loss_is_the_models_loss_with_logits_only_where_labels_are(tmp_path: Any) -> None:
    """The clone's loss applies the output layer only at the positions that predict an answer token; value
    and gradients must be those of ``model(..., labels=...).loss`` (right-padded rows of different lengths,
    labels on each row's last tokens, as ``clone_bot`` builds them)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model(tmp_path / "models")), dtype=torch.float32)
    ids, att, labels = _answer_rows([(10, 4), (17, 7), (5, 2)], seed=3)
    ours = response_loss(model, ids, att, labels)
    ours.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    theirs = model(input_ids=ids, attention_mask=att, labels=labels).loss
    theirs.backward()
    assert abs(float(ours) - float(theirs)) < 1e-5
    assert grads and all(
        torch.allclose(grads[n], p.grad, atol=1e-6) for n, p in model.named_parameters() if n in grads
    )


def test_split_passes_keep_each_pass_under_the_budget_longest_first() -> None:
    lengths = [5, 40, 12, 12, 3, 90, 7]
    passes = split_passes(lengths, budget=48)
    assert sorted(i for rows in passes for i in rows) == list(range(len(lengths)))  # each row once
    assert passes[0] == [5]  # longer than the budget: a pass of its own
    for rows in passes:
        assert [lengths[i] for i in rows] == sorted((lengths[i] for i in rows), reverse=True)
        assert len(rows) == 1 or len(rows) * max(lengths[i] for i in rows) <= 48
    assert [[lengths[i] for i in rows] for rows in passes] == [[90], [40], [12, 12, 7, 5], [3]]
    assert split_passes(lengths, budget=10**6) == [[5, 1, 2, 3, 6, 0, 4]]  # one pass, longest first


def test_passes_add_up_to_the_batchs_loss_and_gradient(tmp_path: Any) -> None:
    """A batch cut into passes (each divided by the whole batch's answer tokens) gives the one-pass batch
    loss and gradient, with rows of different lengths and answer counts (so a mean of the passes' means
    would not)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model(tmp_path / "models")), dtype=torch.float32)
    shapes = [(30, 2), (6, 9), (14, 1), (3, 5), (20, 6)]
    ids, att, labels = _answer_rows(shapes, seed=5)
    whole = response_loss(model, ids, att, labels)
    whole.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    answers = int((labels[:, 1:] != -100).sum())
    passes = split_passes([p + a for p, a in shapes], budget=40)
    assert len(passes) >= 3
    total = 0.0
    for rows in passes:
        w = max(sum(shapes[i]) for i in rows)
        part = torch.tensor(rows)
        piece = response_loss(model, ids[part, :w], att[part, :w], labels[part, :w], denominator=answers)
        piece.backward()
        total += float(piece)
    assert abs(total - float(whole)) < 1e-5
    assert want and all(
        torch.allclose(want[n], p.grad, atol=1e-6) for n, p in model.named_parameters() if n in want
    )


def test_a_clone_in_small_passes_with_checkpointing_is_the_same_clone(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """``pass_tokens`` and gradient checkpointing change memory, not the clone: a clone built in passes of at
    most 64 tokens with checkpointing on (the long-pair threshold lowered) matches the one-pass clone to float
    rounding, its losses too, and both have one cache key."""
    from transformers import AutoModelForCausalLM

    import wolfpack_trainer.warmstart as ws

    model = str(tiny_model(tmp_path / "models"))
    cfg = WarmStartConfig(game_id="ultimatum_v1", variant="easy", seats=(1,), episodes=8, steps=6,
                          batch_size=4, lr=3e-3)  # fmt: skip
    small = replace(cfg, pass_tokens=64)
    assert cache_key(model, cfg) == cache_key(model, small)
    one = clone_bot(model, cfg, tmp_path / "one")
    monkeypatch.setattr(ws, "LONG_PAIR_TOKENS", 1)
    cut = clone_bot(model, small, tmp_path / "cut")
    records = [json.loads((Path(d) / RECORD).read_text()) for d in (one, cut)]
    assert [r["gradient_checkpointing"] for r in records] == [False, True]
    assert records[0]["longest_pair"] == records[1]["longest_pair"] > 64  # so some batches took passes
    for key in ("first_loss", "last_loss"):
        assert abs(records[0][key] - records[1][key]) < 1e-4
    # the weights: AdamW divides each gradient by its own running scale, so float-rounding differences in
    # near-zero gradients move single weights by up to ~lr; on the whole the two clones are one
    a, b, start = (AutoModelForCausalLM.from_pretrained(d).state_dict() for d in (one, cut, model))
    gap = sum(float((a[k] - b[k]).abs().sum()) for k in a)
    moved = sum(float((start[k] - a[k]).abs().sum()) for k in a)
    assert moved > 0 and gap < 0.002 * moved, (gap, moved)


def test_pass_tokens_reaches_the_warm_start() -> None:
    base = {"name": "t", "game": {"id": "ultimatum_v1"}, "policies": [{"id": "p", "seats": [1]}]}
    cfg = TrainConfig.model_validate({**base, "warmstart": {"pass_tokens": 4096}})
    ws_cfg = warmstart_config(cfg)
    assert ws_cfg is not None and ws_cfg.pass_tokens == 4096
    with pytest.raises(ValueError):
        WarmStartSection(pass_tokens=0)


def test_pairs_tokenised_in_one_batch_are_those_of_one_prompt_at_a_time(tokenizer: Any) -> None:
    """``bot_pairs`` tokenises a clone's prompts and answers in one call each (``policy_prompts``): every pair
    is exactly what the chat template tokenised on its own gives (``local_rollout.chat_ids``, the driver's
    encoder), cropped to ``max_prompt_tokens`` as the driver crops, in the bot's order."""
    from wolfpack_rollout.client import render_messages
    from wolfpack_trainer.local_rollout import chat_ids

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for cfg in (
        _werewolf(roles=("seer", "villager", "witch"), episodes=3),  # memory prompts, speeches, votes
        _werewolf(roles=("villager",), episodes=2, max_prompt_tokens=64),  # cropped
        replace(_werewolf(roles=("seer",), episodes=2), prompt_mode="full_history"),
    ):
        heuristic = get_game("werewolf_v1").bots["heuristic"]
        turns = [t for i in range(cfg.episodes) for t in bot_turns(cfg, cfg.seed_offset + i, heuristic)]
        expected = []
        for t in turns:
            messages = render_messages(
                t.observation, [], list(t.past), mode=cfg.prompt_mode, k=cfg.memory_steps,
                system_prompt=cfg.system_prompt,
            )  # fmt: skip
            prompt = chat_ids(tokenizer, [{"role": m.role, "content": m.content} for m in messages])
            if cfg.max_prompt_tokens > 0:
                prompt = prompt[-cfg.max_prompt_tokens :]
            expected.append((prompt, [*tokenizer.encode(t.text, add_special_tokens=False), eos]))
        assert turns and bot_pairs(cfg, tokenizer) == expected


def test_the_clone_check_answers_held_out_decisions_as_the_bot_did(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check_decisions``: the clone answers held-out decisions greedily, and its record, metrics and summary
    line say how often it answered as the bot did. The heuristic responder always accepts: a clone of one
    step never writes ACCEPT (0.00), one of 20 always does (1.00). The decisions come from games after the
    clone's own seeds (a spy on the pair builder, which it still calls)."""
    from wolfpack_trainer import warmstart

    seen: list[tuple[int, int]] = []
    real = warmstart.bot_pairs_and_speech

    def spy(cfg: WarmStartConfig, tokenizer: Any) -> Any:
        seen.append((cfg.seed_offset, cfg.episodes))
        return real(cfg, tokenizer)

    monkeypatch.setattr(warmstart, "bot_pairs_and_speech", spy)
    model = str(tiny_model(tmp_path / "models"))
    cfg = WarmStartConfig(game_id="ultimatum_v1", variant="easy", seats=(1,), episodes=16, steps=20,
                          batch_size=8, lr=1e-2, bot="heuristic", check_decisions=24)  # fmt: skip
    records = [clone_record(clone_bot(model, c, tmp_path / "cache")) for c in (replace(cfg, steps=1), cfg)]
    assert [r["agreement"] if r else None for r in records] == [
        {"moves": 0.0, "checked_moves": 24, "speeches": None, "checked_speeches": 0},
        {"moves": 1.0, "checked_moves": 24, "speeches": None, "checked_speeches": 0},
    ]
    assert (cfg.seed_offset, cfg.episodes) in seen  # the clone's own pairs, then one call a held-out game
    held_out = [offset for offset, episodes in seen if episodes == 1]
    assert held_out and min(held_out) >= cfg.seed_offset + cfg.episodes
    record = records[1]
    assert record is not None and record["check_s"] > 0
    assert record_metrics(record)["warmstart/agree_moves"] == 1.0
    assert "warmstart/agree_speeches" not in record_metrics(record)
    assert "answers 1.00 of 24 held-out moves as the bot did" in record_line(record)


def test_the_clone_check_counts_moves_and_speeches_apart(tmp_path: Any) -> None:
    model = str(tiny_model(tmp_path / "models"))
    cfg = _werewolf(roles=("villager", "seer", "witch"), episodes=2, steps=2, batch_size=4,
                    max_prompt_tokens=128, check_decisions=40)  # fmt: skip
    record = clone_record(clone_bot(model, cfg, tmp_path / "cache"))
    assert record is not None
    agreement = record["agreement"]
    assert agreement["checked_moves"] > 0 and agreement["checked_speeches"] > 0
    assert agreement["checked_moves"] + agreement["checked_speeches"] == 40
    assert 0.0 <= agreement["moves"] <= 1.0 and 0.0 <= agreement["speeches"] <= 1.0
    line = record_line(record)
    assert (
        f"of {agreement['checked_moves']} held-out moves and " in line
        and "held-out speeches as the bot did" in line
    )
    assert (
        clone_record(clone_bot(model, replace(cfg, check_decisions=0), tmp_path / "other"))["agreement"]
        is None
    )


def test_a_failed_clone_check_is_reported_not_raised(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is a report: where it fails, the clone is still built and its summary line says why."""
    from wolfpack_trainer import warmstart

    def broken(*args: Any) -> Any:
        raise RuntimeError("generate ran out of memory")

    monkeypatch.setattr(warmstart, "clone_agreement", broken)
    model = str(tiny_model(tmp_path / "models"))
    cfg = WarmStartConfig(game_id="ultimatum_v1", variant="easy", seats=(1,), episodes=4, steps=2,
                          batch_size=4, check_decisions=8)  # fmt: skip
    record = clone_record(clone_bot(model, cfg, tmp_path / "cache"))
    assert record is not None and record["agreement"] == {"error": "RuntimeError: generate ran out of memory"}
    assert "its agreement check failed (RuntimeError: generate ran out of memory)" in record_line(record)
    assert not any(k.startswith("warmstart/agree") for k in record_metrics(record))
