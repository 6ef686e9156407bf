"""Behaviour cloning of a scripted bot into a model: the optional warm start before RL.

Why: a randomly initialised tiny model (the CPU test model) never emits a formal statement such as
``ACCEPT`` by chance (six byte-level tokens out of ~1000), so RL from it has no signal at all. Cloning a
*weak, diverse* bot (the scenarios' ``random`` bot: random legal statements and chat) gives an initial
policy that sometimes acts well and sometimes badly, which is where RL has something to improve. The
improvement a run reports is always measured against this warm-started policy, never against the bot.

The clone is cached on disk, keyed by the warm-start settings, so it is part of set-up, not training.
``warmstart_config`` derives those settings from a training config (trained seats *or roles*, the game's
options and language), so every caller that needs the clone (the trainer's set-up, a job that must serve
the clone before the trainer starts, ``bench/trainer/warmstart_check.py``) names the same cache entry.

``format_only`` cloning keeps the bot's *actions* but not its free text: a speech turn (Werewolf day talk,
wolf chat, last words) is answered with one short neutral sentence instead of the bot's speech. Why: the
obstacle for a real model is the action format (the base SmolLM2 writes prose, not ``vote 3``); copying a
scripted bot's canned speeches as well would teach the policy the bot's talk, which RL then has to unlearn.

Two things make a clone answer as the policy must answer in a run (both once wrong for Werewolf: its
format clone answered every vote and night action with an empty text, 75 % of a run's turns invalid):

* The *answer* is the text the game reads back as the bot's move (``move_text``): a Werewolf bot's
  ``Action(vote, 2)`` carries no text, so its answer is ``vote 3`` (players are numbered from 1), checked by
  parsing it again; a move no text reproduces is an error, never an empty answer.
* The *prompt* is the one the rollout driver sends at that decision (``policy_prompt``): the driver's
  ``memory`` mode (``rollout.prompt: observation``) shows a seat the opening context plus what is new since
  its k-th last decision, not the whole observation, so the clone sees each seat's earlier observations too.
  In the ``conversation`` mode a seat's prompt is its whole conversation so far, grown by the driver's own
  ``prompts.conversation_turn`` with the bot's earlier answers as the assistant turns (over
  ``max_prompt_tokens`` it starts again as the driver's ``compress`` does).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from wolfpack_games import Action, GameEnv, get_game, make_game
from wolfpack_rollout.client import SeatChat, TokenizerCodec, conversation_turn, render_messages


@dataclass(frozen=True)
class WarmStartConfig:
    """``bot`` plays every seat; the messages of ``seats`` and of the seats dealt ``roles`` become (prompt,
    response) pairs."""

    game_id: str = "ultimatum_v1"
    variant: str = "easy"
    seats: tuple[int, ...] = (1,)
    roles: tuple[str, ...] = ()
    """Seats dealt these roles (Werewolf deals them per seed) are cloned too."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Engine ``start`` options (``game.options`` plus ``language``), as the run plays the game."""
    format_only: bool = False
    """Speech turns get ``FORMAT_ONLY_SPEECH`` instead of the bot's text (see the module docstring)."""
    bot: str = "random"
    episodes: int = 400
    seed_offset: int = 10_000_000
    """Seeds ``seed_offset + i``: disjoint from training and evaluation seeds."""
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    max_prompt_tokens: int = 0
    """As ``rollout.max_prompt_tokens``: the clone sees the prompts the policy will see."""
    prompt_mode: str = "memory"
    """The rollout driver's prompt mode for the run (``rollout_config``: ``memory`` for ``rollout.prompt:
    observation``, ``full`` for ``full_history``), so the clone's prompts are the run's."""
    memory_steps: int = 2
    """The driver's ``memory_steps`` (k of the ``memory`` mode)."""
    system_prompt: str = ""
    """The driver's ``system_prompt`` (none unless a run sets one)."""
    precision: str = "fp32"
    """``bf16``: forward passes under bfloat16 autocast (``WarmStartSection.precision``)."""
    pass_tokens: int = 16_384
    """Most padded tokens (rows x longest row) one forward/backward pass takes (``WarmStartSection``): a
    batch above it is trained in several passes whose gradients add up to the batch's (``split_passes``).
    Memory, not arithmetic: it never counts in the cache key."""
    check_decisions: int = 0
    """After its build, the clone answers this many of the bot's decisions from held-out games greedily
    (``clone_agreement``); how often it answers as the bot did goes into its record. A measurement, not the
    clone: it never counts in the cache key."""


FORMAT_ONLY_SPEECH = {"en": "I have nothing to add.", "zh": "我没有要补充的。"}
"""The speech a ``format_only`` clone learns for every speech turn, by language."""

MAX_STEPS = 400
"""Engine steps after which a warm-start game is cut (Werewolf 12p takes ~100 steps)."""


def bot_pairs(cfg: WarmStartConfig, tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) for every message the bot sent in the cloned seats."""
    return bot_pairs_and_speech(cfg, tokenizer)[0]


def bot_pairs_and_speech(
    cfg: WarmStartConfig, tokenizer: Any
) -> tuple[list[tuple[list[int], list[int]]], list[bool]]:
    """``bot_pairs`` and, for each pair, whether it answers a speech turn (free text) or a move."""
    bot = get_game(cfg.game_id).bots[cfg.bot]
    speech = FORMAT_ONLY_SPEECH.get(str(cfg.options.get("language", "en")), FORMAT_ONLY_SPEECH["en"])
    codec = TokenizerCodec(tokenizer) if cfg.prompt_mode == "conversation" else None
    decisions: list[tuple[str, tuple[str, ...]]] = []  # turn modes: each decision's observation and past,
    answers: list[str] = []  # and the bot's answer, tokenised together at the end (tokenised_pairs)
    pairs = []  # conversation mode: each pair as the seat's conversation grew
    speech_flags: list[bool] = []
    for i in range(cfg.episodes):
        chats: dict[int, SeatChat] = {}  # conversation mode: each cloned seat's conversation of this game
        for turn in bot_turns(cfg, cfg.seed_offset + i, bot):
            text = speech if cfg.format_only and turn.speech else turn.text
            if not text.strip():  # an empty answer is an invalid move everywhere but a speech turn
                raise ValueError(f"warm start: the {cfg.bot} bot's answer at seed {cfg.seed_offset + i}, "
                                 f"seat {turn.seat} is empty; the clone would learn to say nothing")  # fmt: skip
            speech_flags.append(turn.speech)
            if codec is None:
                decisions.append((turn.observation, turn.past))
                answers.append(text)
                continue
            # the seat's conversation as the driver grows it, the bot's earlier answers in it
            grown = conversation_turn(
                codec, chats.get(turn.seat), turn.observation, turn.past, budget=cfg.max_prompt_tokens,
                memory_steps=cfg.memory_steps, system_prompt=cfg.system_prompt,
            )  # fmt: skip
            assert grown is not None  # without truncate a conversation over budget starts again
            messages, prompt, _ = grown
            response = [*tokenizer.encode(text, add_special_tokens=False), _eos(tokenizer)]
            chats[turn.seat] = SeatChat(messages, text, [*prompt, *response], response, turn.observation)
            pairs.append((prompt, response))
    return (pairs if codec is not None else tokenised_pairs(tokenizer, decisions, answers, cfg)), speech_flags


def _eos(tokenizer: Any) -> int:
    """The end-of-turn id every cloned answer ends with (SmolLM2's ChatML ``<|im_end|>``)."""
    return int(tokenizer.convert_tokens_to_ids("<|im_end|>"))


def tokenised_pairs(
    tokenizer: Any, decisions: Sequence[tuple[str, Any]], answers: Sequence[str], cfg: WarmStartConfig
) -> list[tuple[list[int], list[int]]]:
    """The turn modes' (prompt ids, response ids) of ``decisions`` (observation, past) answered with
    ``answers``: the prompts, then the answers, each tokenised in one call (``policy_prompts`` says why)."""
    if not answers:
        return []
    eos = _eos(tokenizer)
    responses = [[*map(int, r), eos] for r in tokenizer(list(answers), add_special_tokens=False)["input_ids"]]
    return list(zip(policy_prompts(tokenizer, decisions, cfg), responses, strict=True))


def policy_prompt(tokenizer: Any, observation: str, past: Any, cfg: WarmStartConfig) -> list[int]:
    """The prompt ids the rollout driver sends for a seat's decision (``wolfpack_rollout.prompts.
    render_messages`` in the run's mode, the chat template, the last ``max_prompt_tokens``): ``past`` are the
    seat's earlier observation texts in this game, oldest first."""
    return policy_prompts(tokenizer, [(observation, past)], cfg)[0]


def policy_prompts(
    tokenizer: Any, decisions: Sequence[tuple[str, Any]], cfg: WarmStartConfig
) -> list[list[int]]:
    """``policy_prompt`` of each (observation, past) decision: every chat template rendered to text, then all
    tokenised in one call. Why: a clone of the heuristic village reads ~13,700 prompts, and one
    ``apply_chat_template(tokenize=True)`` a prompt spent most of its 2.8 ms on this CPU in the tokenizer's
    per-call overhead; one batch call is faster (bench/trainer/bench_warmstart_pairs.py) and spreads over the
    cores of a GPU host. The ids are those of ``apply_chat_template(tokenize=True)`` (it tokenises its
    rendered text without special tokens), hence the driver's (``local_rollout.chat_ids``): tested against it
    (test_warmstart.py) and against the rollout driver's own prompts (test_warmstart_answers.py)."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in render_messages(
                observation, [], list(past), mode=cfg.prompt_mode, k=cfg.memory_steps,
                system_prompt=cfg.system_prompt)],
            add_generation_prompt=True, tokenize=False,
        )
        for observation, past in decisions
    ]  # fmt: skip
    if not texts:
        return []
    out = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids = [int(t) for t in ids]
        out.append(ids[-cfg.max_prompt_tokens :] if cfg.max_prompt_tokens > 0 else ids)
    return out


def move_text(env: GameEnv, seat: int, action: Action) -> str:
    """The answer a policy writes for the bot's ``action``: its own text when that parses back to it (a
    scenario's formal statement, a speech), else ``"<kind> <player>"`` (player = seat + 1, how Werewolf
    prompts number them) or ``"<kind>"``. Checked with the game's parser; a move no candidate reproduces
    raises (a clone must not learn an answer the game reads as something else, or as nothing)."""
    candidates = [action.text] if action.text else []
    if action.target is not None:
        candidates.append(f"{action.kind} {action.target + 1}")
    candidates.append(action.kind)
    want = (action.kind, action.target, action.text)
    for text in candidates:
        parsed = env.parse(seat, text).action
        if parsed is not None and (parsed.kind, parsed.target, parsed.text) == want:
            return text
    raise ValueError(
        f"no answer text reproduces the bot's move {action} for seat {seat} (tried {candidates})"
    )


@dataclass(frozen=True)
class BotTurn:
    """One decision of a cloned seat in a bot game."""

    seat: int
    observation: str
    """The seat's observation text at the decision (rendered then: observations render lazily)."""
    past: tuple[str, ...]
    """The seat's observation texts at its earlier decisions of this game (the driver's ``past``)."""
    speech: bool
    """The seat was asked for free text (every legal action a ``speak``)."""
    text: str
    """What the bot answered, as text the game parses back to its move (``move_text``)."""


def bot_turns(cfg: WarmStartConfig, seed: int, bot: Any) -> list[BotTurn]:
    """Every decision of a cloned seat in one game at ``seed`` that the bot plays in every seat."""
    env = make_game(cfg.game_id, cfg.variant)
    env.start(seed=seed, options=dict(cfg.options))
    cloned = set(cfg.seats) | {s for s in env.possible_agents if env.role(s) in cfg.roles}
    rng = random.Random(seed)
    out = []
    past: dict[int, list[str]] = {}
    for _ in range(MAX_STEPS):
        if env.done:
            break
        moves = {}
        for seat in env.acting_seats():
            action = bot(env, seat, rng)
            if seat in cloned:
                obs = env.observe(seat)
                text = move_text(env, seat, action)
                seen = past.setdefault(seat, [])
                out.append(BotTurn(seat, obs.text, tuple(seen), is_speech(obs.legal_actions), text))
                seen.append(obs.text)
            moves[seat] = action
        env.step(moves)
    env.close()
    return out


def is_speech(legal_actions: Any) -> bool:
    """The seat is asked for free text (every legal action is a ``speak``)."""
    kinds = {a.kind for a in legal_actions}
    return bool(kinds) and kinds <= {"speak"}


def warmstart_config(cfg: Any) -> WarmStartConfig | None:
    """The warm start a ``TrainConfig`` asks for (``None`` when it asks for none): its game, variant,
    options and language, the trained policies' seats and roles, and the ``warmstart`` section."""
    ws = cfg.warmstart
    if ws is None or ws.steps <= 0:
        return None
    from wolfpack_trainer.config import game_options
    from wolfpack_trainer.local_rollout import rollout_config

    driver = rollout_config(cfg)  # the prompts the run's driver renders, in both rollout modes
    return WarmStartConfig(
        game_id=cfg.game.id,
        variant=cfg.game.variant or get_game(cfg.game.id).default_variant,
        seats=tuple(sorted({s for p in cfg.policies for s in p.seats})),
        roles=tuple(sorted({r for p in cfg.policies for r in p.roles})),
        options=game_options(cfg),
        bot=ws.bot,
        episodes=ws.episodes,
        steps=ws.steps,
        lr=ws.lr,
        max_prompt_tokens=driver.max_prompt_tokens,
        prompt_mode=driver.prompt_mode,
        memory_steps=driver.memory_steps,
        system_prompt=driver.system_prompt,
        format_only=bool(getattr(ws, "format_only", False)),
        precision=str(getattr(ws, "precision", "fp32")),
        pass_tokens=int(getattr(ws, "pass_tokens", WarmStartConfig.pass_tokens)),
        check_decisions=int(getattr(ws, "check_decisions", 0)),
    )


def cache_key(model_dir: str, cfg: WarmStartConfig) -> str:
    """The clone's cache key. Fields added after the first clones were cached (roles, options,
    format_only, system_prompt) count only when set, so a config that does not use them keeps its cached
    clone; ``prompt_mode`` and ``memory_steps`` always count: clones cached before them were trained on
    whole observations (and Werewolf ones on empty answers), which no run should load again. ``precision``
    counts only when it is not the default ``fp32`` (the clones cached before it were float32);
    ``pass_tokens`` and ``check_decisions`` never count (how a batch is cut into passes changes memory, not
    the loss; the check only measures the clone)."""
    fields = asdict(cfg)
    del fields["pass_tokens"], fields["check_decisions"]
    for name in ("roles", "options", "format_only", "system_prompt"):
        if not fields[name]:
            del fields[name]
    if fields["precision"] == "fp32":
        del fields["precision"]
    return hashlib.sha256(json.dumps([model_dir, fields], sort_keys=True).encode()).hexdigest()[:12]


def clone_dir(model_dir: str, cfg: WarmStartConfig, cache_dir: Path) -> Path:
    """Where ``clone_bot`` keeps the clone of ``model_dir`` for ``cfg`` (built or not)."""
    return cache_dir / f"warm-{Path(model_dir).name}-{cache_key(model_dir, cfg)}"


RECORD = "warmstart.json"
"""Written into every clone that ``clone_bot`` builds: how it was built (steps, losses, seconds, device),
so a run's base can be told apart from a second build of the same key."""


LONG_PAIR_TOKENS = 4_096
"""A clone whose longest pair is longer trains with gradient checkpointing (``clone_bot``). Why: a
``conversation`` run's pairs carry the seat's whole conversation (up to ~8k tokens for 12-player Werewolf),
and a pass keeps every layer's activations for the backward pass: the 12-player clone died out of memory on
an H200 (139.6 GiB in use) before this. Shorter pairs (every other recipe) keep the faster passes."""


def split_passes(lengths: list[int], budget: int) -> list[list[int]]:
    """The rows of a batch (their indices) cut into passes of at most ``budget`` padded tokens each (rows x
    the pass's longest row), longest rows first so that rows of like length share a pass; a row longer than
    the budget gets a pass of its own. Why longest first: each pass pads to its own longest row only."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    passes: list[list[int]] = []
    for i in order:
        if passes and (len(passes[-1]) + 1) * lengths[passes[-1][0]] <= budget:
            passes[-1].append(i)
        else:
            passes.append([i])
    return passes


def response_loss(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    denominator: int | None = None,
) -> torch.Tensor:
    """The causal-LM loss ``model(..., labels=labels).loss`` (mean next-token cross-entropy over the tokens
    whose label is not -100), with the output layer applied only at the positions that predict a label.
    With ``denominator`` the sum over this pass's label tokens is divided by it instead of by their count:
    a batch cut into passes (``split_passes``) divides each by the whole batch's label tokens, so the passes'
    losses and gradients add up to the batch's mean.

    Why: the clone's labels are the bot's few answer tokens after prompts of up to ~4k tokens, and the full
    forward keeps float32 logits (and their gradient) for every position: batch x 4k x 49k vocabulary for
    SmolLM2, 66 GB on an H100 for the 12-player recipe's clone (it died out of memory beside other jobs).
    Models whose head does more than a linear layer (logit soft-capping or scaling) take the full forward."""
    config = getattr(model, "config", None)
    plain_head = not any(
        getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    )
    if not (plain_head and hasattr(model, "get_decoder") and model.get_output_embeddings() is not None):
        full: torch.Tensor = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        if denominator is None:
            return full
        return full * int((labels[:, 1:] != -100).sum()) / denominator
    hidden = model.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False
    ).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep]).float()
    if denominator is None:
        return torch.nn.functional.cross_entropy(logits, target[keep])
    return torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum") / denominator


def _autocast(cfg: WarmStartConfig, device: str) -> contextlib.AbstractContextManager[Any]:
    """The clone's forward passes' context: bfloat16 autocast for ``precision: bf16``, else none."""
    if cfg.precision == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


AGREEMENT_GAMES = 200
"""Most held-out games ``clone_agreement`` plays to find its decisions."""


@torch.no_grad()
def clone_agreement(model: Any, tokenizer: Any, cfg: WarmStartConfig, device: str) -> dict[str, Any]:
    """How often the clone answers as the bot did, on ``cfg.check_decisions`` of the bot's decisions from
    games it never trained on (seeds after the clone's own), each answered greedily from the prompt the run's
    driver would send: ``{"moves": fraction, "checked_moves": n, "speeches": fraction, "checked_speeches":
    n}`` (a fraction is None where no decision of that kind came up). An answer agrees when its text, up to
    the end of the turn and stripped, is the bot's answer text (``move_text``: "vote 3"): a move worded
    otherwise that the game would read the same counts as a miss, so this is a lower bound. The check is
    part of a build: a clone found in the cache keeps its first build's.

    Why: a clone's last loss (0.168 for the 12p one, 0.127 for AIW's) does not say how many of its *moves*
    are the bot's, and a village's win rate falls steeply with every move that is not
    (``bench/trainer/village_fidelity.py``: at 12 seats, a move in ten at random costs the heuristic village
    0.51 -> 0.30). With this number a run that starts at 0.00 tells a poor clone from a hard table."""
    pairs: list[tuple[list[int], list[int]]] = []
    speech: list[bool] = []
    for game in range(AGREEMENT_GAMES):  # one game at a time, seeds after the clone's own
        if len(pairs) >= cfg.check_decisions:
            break
        more, flags = bot_pairs_and_speech(
            replace(cfg, seed_offset=cfg.seed_offset + cfg.episodes + game, episodes=1), tokenizer
        )
        pairs += more
        speech += flags
    pairs, speech = pairs[: cfg.check_decisions], speech[: cfg.check_decisions]
    eos, pad = _eos(tokenizer), int(tokenizer.pad_token_id or 0)
    new_tokens = max((len(r) for _, r in pairs), default=0) + 2
    agrees = [False] * len(pairs)
    was_training = model.training
    model.eval()
    for rows in split_passes([len(p) + new_tokens for p, _ in pairs], cfg.pass_tokens):
        width = max(len(pairs[i][0]) for i in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for j, i in enumerate(rows):  # left-padded: every prompt ends where generation starts
            prompt = pairs[i][0]
            ids[j, width - len(prompt) :] = torch.tensor(prompt)
            att[j, width - len(prompt) :] = 1
        with _autocast(cfg, device):
            out = model.generate(
                input_ids=ids.to(device), attention_mask=att.to(device), max_new_tokens=new_tokens,
                do_sample=False, eos_token_id=eos, pad_token_id=pad,
            )  # fmt: skip
        for j, i in enumerate(rows):
            answer = [int(t) for t in out[j, width:].tolist()]
            answer = answer[: answer.index(eos)] if eos in answer else answer
            bots = [t for t in pairs[i][1] if t != eos]
            agrees[i] = tokenizer.decode(answer).strip() == tokenizer.decode(bots).strip()
    model.train(was_training)

    def share(kind: bool) -> tuple[float | None, int]:
        hits = [a for a, s in zip(agrees, speech, strict=True) if s == kind]
        return (sum(hits) / len(hits) if hits else None), len(hits)

    (moves, n_moves), (speeches, n_speeches) = share(False), share(True)
    return {"moves": moves, "checked_moves": n_moves, "speeches": speeches, "checked_speeches": n_speeches}


def clone_bot(model_dir: str, cfg: WarmStartConfig, cache_dir: Path) -> str:
    """A checkpoint directory of ``model_dir`` fine-tuned on the bot's messages (built once)."""
    out = clone_dir(model_dir, cfg, cache_dir)
    if (out / "config.json").exists():
        return str(out)
    if cfg.precision not in ("fp32", "bf16"):  # before loading the model and playing the bot's games
        raise ValueError(f"warm start precision {cfg.precision!r}: fp32 or bf16")
    started = time.monotonic()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # On a GPU host the clone trains on the card (SmolLM2 on CPU cores takes minutes per few steps).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    pairs = bot_pairs(cfg, tok)
    paired_s = time.monotonic() - started  # the model's load and the bot's games, played and tokenised
    longest = max((len(p) + len(r) for p, r in pairs), default=0)
    if longest > LONG_PAIR_TOKENS:  # recompute each layer in the backward pass instead of keeping it
        model.gradient_checkpointing_enable()
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    model.train()
    rng = random.Random(0)
    pad = int(tok.pad_token_id or 0)
    losses = []
    for _ in range(cfg.steps):
        chunk = rng.sample(pairs, min(cfg.batch_size, len(pairs)))
        width = max(len(p) + len(r) for p, r in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, (p, r) in enumerate(chunk):
            seq = p + r
            ids[i, : len(seq)] = torch.tensor(seq)
            att[i, : len(seq)] = 1
            labels[i, len(p) : len(seq)] = torch.tensor(r)
        opt.zero_grad()
        answers = int((labels[:, 1:] != -100).sum())  # the batch's mean is over all its answer tokens
        loss = 0.0
        for rows in split_passes([len(p) + len(r) for p, r in chunk], cfg.pass_tokens):
            width = max(len(chunk[i][0]) + len(chunk[i][1]) for i in rows)
            part = torch.tensor(rows)
            with _autocast(cfg, device):
                piece = response_loss(
                    model, ids[part, :width].to(device), att[part, :width].to(device),
                    labels[part, :width].to(device), denominator=answers,
                )  # fmt: skip
            piece.backward()  # type: ignore[no-untyped-call]  # untyped in torch
            loss += float(piece.detach())
        opt.step()
        losses.append(loss)
    trained_s = time.monotonic() - started
    agreement: dict[str, Any] | None = None
    if cfg.check_decisions > 0:
        try:
            agreement = clone_agreement(model, tok, cfg, device)
        except Exception as exc:  # a report about the clone must never stop the run that needs the clone
            agreement = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    tmp = out.with_name(out.name + f".tmp{random.randrange(1 << 30)}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    ended_s = time.monotonic() - started  # one reading: the three parts add up to the build exactly
    record = {"model": model_dir, "config": asdict(cfg), "pairs": len(pairs), "device": device,
              "precision": cfg.precision, "longest_pair": longest,
              "gradient_checkpointing": longest > LONG_PAIR_TOKENS,
              "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
              "agreement": agreement, "pairs_s": round(paired_s, 3), "train_s": round(trained_s - paired_s, 3),
              "check_s": round(ended_s - trained_s, 3), "seconds": round(ended_s, 3)}  # fmt: skip
    (tmp / RECORD).write_text(json.dumps(record, indent=1, default=str))
    del model, opt
    if device == "cuda":  # the job's inference (vLLM) and learner start next, on the same card
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError):  # another process built the same clone first: theirs is identical
        tmp.rename(out)
    return str(out)


def clone_record(model_dir: str) -> dict[str, Any] | None:
    """The ``RECORD`` that ``clone_bot`` wrote into a clone (None for a model that is no clone, or a clone
    built before records, or an unreadable one: a report about the base must never stop the run)."""
    try:
        record = json.loads((Path(model_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


BUILD_PARTS = (("pairs_s", "games"), ("train_s", "steps"), ("check_s", "check and save"))
"""The clone's build split into its parts: the record's key (also the metric ``warmstart/<key>``) and the
summary line's word for it."""


def record_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """A clone's record as step-0 metrics (``warmstart/*``): how long the clone took to build (wherever it
    was built: a cached clone's seconds are its first build's), on how many pairs, its first and last loss,
    whether it trained under bf16, how often it answers held-out decisions as the bot did
    (``warmstart/agree_moves``, ``warmstart/agree_speeches``), and where the build's seconds went
    (``warmstart/pairs_s``: the model's load and the bot's games; ``train_s``: the optimiser steps;
    ``check_s``: the agreement check and the save; s25's 12p clone took 360 s, the 6p one 157 s for as many
    pairs, and nothing said which part). Why in the run's metrics: the warm start is
    part of a run's cost (~290 s of a Werewolf recipe's set-up on an H200 under fp32), and the GPU results
    compare it across runs and precisions, which the clone's own folder, left on the lent machine, could not
    show."""
    out = {"warmstart/bf16": float(record.get("precision") == "bf16")}
    named = [
        ("seconds", "build_s"),
        ("pairs", "pairs"),
        ("first_loss", "first_loss"),
        ("last_loss", "last_loss"),
    ]
    for key, name in named + [(key, key) for key, _ in BUILD_PARTS]:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"warmstart/{name}"] = float(value)
    agreement = record.get("agreement")
    if isinstance(agreement, Mapping):  # clone_agreement's check, where the clone had one
        for key in ("moves", "speeches"):
            value = agreement.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"warmstart/agree_{key}"] = float(value)
    return out


def record_line(record: Mapping[str, Any]) -> str:
    """One line for the run's summary: ``warm start: a clone of the heuristic bot, 13,667 pairs x 800 steps
    (bf16, cuda), loss 3.35 -> 0.12, its build took 98 s (games 20 s, steps 70 s, check and save 8 s)``;
    parts missing from the record are left out. "Its build": a clone found in the cache was built by an
    earlier run, in the seconds its record holds."""
    given = record.get("config")
    config: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    what = f"a clone of the {config.get('bot', '?')} bot"
    if isinstance(record.get("pairs"), int):
        what += f", {record['pairs']:,} pairs"
        if isinstance(config.get("steps"), int):
            what += f" x {config['steps']} steps"
    how = ", ".join(str(record[k]) for k in ("precision", "device") if record.get(k))
    parts = [f"warm start: {what}" + (f" ({how})" if how else "")]
    first, last = record.get("first_loss"), record.get("last_loss")
    if isinstance(first, (int, float)) and isinstance(last, (int, float)):
        parts.append(f"loss {first:.3g} -> {last:.3g}")
    agreement = record.get("agreement")
    if isinstance(agreement, Mapping):
        said = [
            f"{agreement[key]:.2f} of {agreement[f'checked_{key}']} held-out {key}"
            for key in ("moves", "speeches")
            if isinstance(agreement.get(key), (int, float))
            and isinstance(agreement.get(f"checked_{key}"), int)
        ]
        if said:
            parts.append(f"answers {' and '.join(said)} as the bot did")
        elif agreement.get("error"):
            parts.append(f"its agreement check failed ({agreement['error']})")
    if isinstance(record.get("seconds"), (int, float)):
        split = [
            f"{name} {record[key]:.0f} s"
            for key, name in BUILD_PARTS
            if isinstance(record.get(key), (int, float))
        ]
        parts.append(
            f"its build took {record['seconds']:.0f} s" + (f" ({', '.join(split)})" if split else "")
        )
    return ", ".join(parts)


@dataclass(frozen=True)
class RunBase:
    """The base model a run's learners load and its inference serves (``run_base``)."""

    path: str
    how: str
    """``checkpoint`` (the resumed run's own base), ``built`` (warm-started now), ``cached`` (a clone built
    earlier with the same settings) or ``model`` (no warm start: the first policy's model)."""
    warm: bool
    """The base is a warm-started clone (the config has a warm start), not the configured model."""


class BaseMissingError(RuntimeError):
    """A resumed run's base model is gone; the message is the one line to print."""


def checkpoint_base(run_dir: Path) -> str | None:
    """The base model path a run's latest checkpoint was trained from (``state.json``'s ``model_path``, as
    ``Trainer.setup`` resumes it), or None for a run without a checkpoint."""
    pointer = run_dir / "checkpoints" / "LATEST"
    if not pointer.exists():
        return None
    state = run_dir / "checkpoints" / pointer.read_text().strip() / "state.json"
    if not state.exists():
        return None
    path = json.loads(state.read_text()).get("model_path")
    return str(path) if path else None


def run_base(
    cfg: Any, run_dir: Path, cache_dir: Path, on_build: Callable[[WarmStartConfig], None] | None = None
) -> RunBase:
    """The base ``Trainer.setup`` will load for ``cfg`` in ``run_dir``, decided the same way and before it:
    a resumed run keeps the base of its checkpoint (never a second warm start: a LoRA checkpoint holds only
    the adapter, which belongs to the exact weights it was trained on); a fresh run with a warm start gets
    the clone, built now (``on_build`` is told first) unless cached; else the first policy's model.

    Why a job calls it before ``Trainer.setup``: in service mode the stack's inference must *serve* this
    base before any rollout, since a LoRA policy's versions reach inference as adapters, which only mean
    the trained policy on top of the base the learner trains them on. ``Trainer.setup`` then finds the
    same clone in the cache (same key, same ``cache_dir``) and does not train it again."""
    from wolfpack_trainer.learners.cpu import resolve_model_path

    saved = checkpoint_base(run_dir)
    wcfg = warmstart_config(cfg)
    if saved is not None:
        local = Path(saved).is_absolute() or wcfg is not None
        if local and not (Path(saved) / "config.json").exists():
            raise BaseMissingError(
                f"{run_dir} resumes from weights trained on the base {saved}, which is gone: restore it, or "
                "rerun with --fresh (a new warm start is other weights, so the checkpoint would not fit them)"
            )
        return RunBase(saved, "checkpoint", wcfg is not None)
    base = resolve_model_path(cfg.policies[0].model, str(cache_dir))
    if wcfg is None:
        return RunBase(base, "model", False)
    if (clone_dir(base, wcfg, cache_dir) / "config.json").exists():
        return RunBase(clone_bot(base, wcfg, cache_dir), "cached", True)
    if on_build is not None:
        on_build(wcfg)
    return RunBase(clone_bot(base, wcfg, cache_dir), "built", True)
