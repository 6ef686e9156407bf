"""The warm start trains what a run asks of the policy: answers the game accepts, on the prompts the rollout
driver sends.

Why these tests: a Werewolf format clone once learned an empty answer for every vote and night action (a
bot's ``Action(vote, 2)`` has no text, and the pairs took ``action.text``), on whole-observation prompts
while the driver's ``memory`` mode sends the opening context plus recent lines; a GPU run then had 75 % of
its turns invalid and won no game. The existing warm-start tests compared the pairs with the bot's turns,
which were equally wrong, so here every answer is judged by the engine at its decision, and every prompt
is compared token by token with what the real driver (``RolloutDriver`` over in-process backends, the code
service mode runs) recorded for the same observations.
"""

from __future__ import annotations

import copy
import itertools
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from wolfpack.v1 import common_pb2
from wolfpack_games import Action, get_game, make_game
from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import load_config
from wolfpack_trainer.local_rollout import Generated, Task, local_driver, play, render_prompt, rollout_config
from wolfpack_trainer.train import service_task
from wolfpack_trainer.warmstart import (
    FORMAT_ONLY_SPEECH,
    WarmStartConfig,
    bot_pairs,
    cache_key,
    move_text,
    policy_prompt,
    warmstart_config,
)

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "gpu-werewolf-6p-ppo-smollm2.yaml"
VILLAGE = ("seer", "villager", "witch")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model(tmp_path_factory.mktemp("models"))))


def _decisions(cfg: WarmStartConfig, seed: int) -> list[tuple[Any, int]]:
    """(copy of the game, seat) at every cloned decision of the bot game ``bot_turns`` plays at ``seed``
    (replayed here the same way: one RNG, acting seats in order)."""
    bot = get_game(cfg.game_id).bots[cfg.bot]
    env = make_game(cfg.game_id, cfg.variant)
    env.start(seed=seed, options=dict(cfg.options))
    cloned = set(cfg.seats) | {s for s in env.possible_agents if env.role(s) in cfg.roles}
    rng, out = random.Random(seed), []
    while not env.done:
        moves = {}
        for seat in env.acting_seats():
            if seat in cloned:
                out.append((copy.deepcopy(env), seat))
            moves[seat] = bot(env, seat, rng)
        env.step(moves)
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        WarmStartConfig(game_id="werewolf_v1", variant="6p", seats=(), roles=VILLAGE, bot="random", format_only=True),
        WarmStartConfig(game_id="werewolf_v1", variant="6p", seats=(), roles=VILLAGE, bot="heuristic"),
        WarmStartConfig(game_id="werewolf_v1", variant="12p", seats=(), roles=("villager", "seer", "wolf_king"),
                        bot="random", format_only=True, options={"language": "zh", "wolf_king": True}),
        WarmStartConfig(game_id="bargaining_v1", variant="medium", seats=(1,), bot="random"),
    ],
    ids=["werewolf-6p-random-format-only", "werewolf-6p-heuristic", "werewolf-12p-zh", "bargaining"],
)  # fmt: skip
def test_every_trained_answer_is_a_valid_move_at_its_decision(tokenizer: Any, cfg: WarmStartConfig) -> None:
    """Each (prompt, answer) pair's answer, decoded as the game will read it, is accepted by the engine at
    that decision; the non-speech ones are real moves (``vote 3``), not talk or nothing."""
    cfg = replace(cfg, episodes=3)
    pairs = bot_pairs(cfg, tokenizer)
    points = [p for i in range(cfg.episodes) for p in _decisions(cfg, cfg.seed_offset + i)]
    assert len(pairs) == len(points) > 0
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    moves = 0
    for (_, response), (env, seat) in zip(pairs, points, strict=True):
        assert response[-1] == eos and len(response) > 1, "an answer before the end-of-turn token"
        text = tokenizer.decode(response[:-1])
        assert text.strip()
        assert not copy.deepcopy(env).step_seat(seat, text).get("invalid_reason"), (seat, text)
        kinds = {a.kind for a in env.legal_actions(seat)}
        if cfg.game_id == "werewolf_v1" and kinds - {"speak"}:
            moves += 1
            parsed = env.parse(seat, text).action
            assert parsed is not None and parsed.kind in kinds - {"speak"}, text
    assert moves > 0 or cfg.game_id != "werewolf_v1"


def test_move_text_numbers_players_from_one_and_refuses_what_it_cannot_write() -> None:
    env, bot, rng = (
        make_game("werewolf_v1", "6p"),
        get_game("werewolf_v1").bots["heuristic"],
        random.Random(3),
    )
    env.start(seed=3)
    voters: list[int] = []
    while not env.done and not voters:
        voters = [s for s in env.acting_seats() if any(a.kind == "vote" for a in env.legal_actions(s))]
        if not voters:
            env.step({s: bot(env, s, rng) for s in env.acting_seats()})
    seat = voters[0]
    target = next(a for a in env.legal_actions(seat) if a.kind == "vote").targets[0]
    assert move_text(env, seat, Action("vote", target)) == f"vote {target + 1}"
    with pytest.raises(ValueError, match="no answer text reproduces"):
        move_text(env, seat, Action("dance", target))  # a move the game has no words for


def _recorded(cfg: Any, tokenizer: Any, seeds: range) -> list[Any]:
    """Trajectories of the recipe's village (a scripted answer for each turn: speeches, moves, invalid
    answers that re-prompt) through the real rollout driver with the recipe's driver settings."""
    answers = itertools.cycle(["I have nothing to add.", "pass", "vote 2", "", "inspect 1", "save 3"])
    eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))

    def policy(policy_id: str, prompts: list[list[int]], sampling: Any) -> list[Generated]:
        out = []
        for _ in prompts:
            ids = [*tokenizer.encode(next(answers), add_special_tokens=False), eos]
            out.append(Generated(ids, [-1.0] * len(ids), common_pb2.FINISH_REASON_STOP))
        return out

    roles = dict.fromkeys(VILLAGE, "village")
    tasks = [
        service_task(Task("werewolf_v1", "6p", s, {}, roles, bot="heuristic"), i) for i, s in enumerate(seeds)
    ]
    driver = local_driver(rollout_config(cfg), tokenizer, policy, lambda: {"village": 0})
    trajs = play(tasks, driver)
    assert driver.stats.episodes_failed == 0, driver.stats.recent_failures
    return trajs


@pytest.mark.parametrize("prompt", ["observation", "full_history"])
def test_the_clone_trains_on_the_prompts_the_driver_sends(tokenizer: Any, prompt: str) -> None:
    """For the recipe (and its ``full_history`` twin), ``policy_prompt`` given a seat's observations so far
    is token for token the prompt the driver sent; in ``memory`` mode it is not the whole observation
    (what the warm start used to train on) once a seat has decided twice."""
    cfg = load_config(RECIPE)
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"prompt": prompt})})
    wcfg = warmstart_config(cfg)
    assert wcfg is not None and wcfg.prompt_mode == ("memory" if prompt == "observation" else "full")
    checked = shortened = 0
    for traj in _recorded(cfg, tokenizer, range(2)):
        past: dict[int, list[str]] = {}
        for turn in traj.turns:
            if not turn.policy.policy_id:
                continue
            seen = past.setdefault(turn.seat, [])
            assert policy_prompt(tokenizer, turn.observation_text, seen, wcfg) == list(turn.prompt_token_ids)
            shortened += list(turn.prompt_token_ids) != render_prompt(
                tokenizer, turn.observation_text, wcfg.max_prompt_tokens
            )
            seen.append(turn.observation_text)
            checked += 1
    assert checked > 20
    assert (shortened > 0) == (prompt == "observation")


def test_format_only_speech_is_the_only_text_that_is_not_the_bots_move(tokenizer: Any) -> None:
    cfg = WarmStartConfig(game_id="werewolf_v1", variant="6p", seats=(), roles=VILLAGE, bot="random",
                          format_only=True, episodes=2)  # fmt: skip
    answers = {tokenizer.decode(r[:-1]) for _, r in bot_pairs(cfg, tokenizer)}
    assert FORMAT_ONLY_SPEECH["en"] in answers
    assert any(a.startswith("vote ") for a in answers) and "" not in answers


def test_clones_cached_before_driver_prompts_get_a_new_key() -> None:
    """A clone cached by the old code (whole-observation prompts, empty Werewolf answers; its key had no
    prompt fields) is not loaded again; a run without a system prompt keys as before it was a field."""
    import hashlib
    import json
    from dataclasses import asdict

    cfg = WarmStartConfig(game_id="werewolf_v1", variant="6p", seats=(), roles=VILLAGE, format_only=True)
    old_fields = {
        k: v for k, v in asdict(cfg).items() if k not in ("prompt_mode", "memory_steps", "system_prompt")
    }
    old = hashlib.sha256(json.dumps(["/m", old_fields], sort_keys=True).encode()).hexdigest()[:12]
    assert cache_key("/m", cfg) != old
    keys = {cache_key("/m", c) for c in (cfg, replace(cfg, prompt_mode="full"), replace(cfg, memory_steps=3),
                                         replace(cfg, system_prompt="Be brief."))}  # fmt: skip
    assert len(keys) == 4
