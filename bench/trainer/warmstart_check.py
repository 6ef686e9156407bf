"""Does the warm start make a model write valid actions? One command, one table of recipes.

Why: RL on a game gets no gradient while every episode of a group ends alike, and a real base model
(SmolLM2-135M-Instruct) writes prose, not ``FINAL_BID: 40`` or ``vote 3``. For each training config this
plays the config's bot games on held-out seeds (``eval.seed_offset`` onwards), takes ``--turns``
decisions of the trained seats (seats or roles; at most ``--speech-share`` of them free speech, which is
valid whatever is said), renders each prompt as the run's rollout driver does (``warmstart.policy_prompt``:
the driver's prompt mode, e.g. ``memory`` with the seat's earlier observations), samples an answer
at the config's ``rollout.temperature`` / ``max_tokens`` from the base model and from each warm-started
clone (``warmstart.clone_bot``: the code and cache the trainer uses), and asks the engine whether the
answer is a valid move (``step_seat`` on a copy of the game: the ``invalid_reason`` a rollout records).
"decisions" counts the turns that offer more than talk (a Werewolf vote or night action, a scenario turn
where a formal statement is legal) and, of those, the answers that are a valid move other than talk
(``FINAL_BID: 40``, ``ACCEPT``, ``vote 3``): a scenario's chat line is a valid move but decides nothing,
and 0 of 192 such decisions is why GRPO had no gradient on bargaining.

Warm starts: the config's own (``warmstart`` section, through ``warmstart_config``) or, for a recipe
without one, each ``--propose key=value,...`` (fields of ``WarmStartConfig``, e.g.
``bot=heuristic,format_only=1``; 200 games, 60 steps, lr 3e-5 unless given) on top of the recipe's
seats, roles, game options and language: a way to try a warm start a config cannot state yet (Werewolf's
role-based policies).

    # a staged GPU host (bench/trainer/stage.sh, `. bench/trainer/gpu_env.sh`, SmolLM2 joined by gpu_train.sh):
    python3 bench/trainer/warmstart_check.py --cache /tmp/wp/models --turns 32 --batch 32 \
        --propose bot=random,format_only=1 --propose bot=heuristic,format_only=1 configs/gpu-*-smollm2.yaml
    # the base model alone, on this CPU (minutes per recipe):
    .venv/bin/python bench/trainer/warmstart_check.py --base-only --turns 8 configs/gpu-ippo-smollm2.yaml
    # a bare GPU image (torch + transformers only): the plan here, the run there
    .venv/bin/python bench/trainer/warmstart_check.py --plan-out plan.json configs/gpu-*-smollm2.yaml
    python bench/trainer/warmstart_check.py --plan plan.json --model <converted SmolLM2 dir> --cache /tmp/c

With ``--cache`` the run directory's model cache (``<run_dir>/models``), the clones built here are the
ones ``wolfpack train`` then loads (same cache key), so the check costs the run nothing.

Cost: on these 2 shared CPU cores SmolLM2 prefills ~30 tokens/s, so the configured clones (60 steps of
16 prompts of 130..3800 tokens) take hours; run it on a GPU host. ``--plan-out`` writes everything the run
needs but the weights as JSON, and ``--plan`` runs from it with only torch, transformers, PyYAML and the
game library (a bare GPU image has no gRPC/OpenTelemetry stack to import the trainer's rollout module:
then ``chat_ids`` comes from this file's copy, which CPU runs check equal to the trainer's).
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import json
import random
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch


def _chat_ids(tokenizer: Any, messages: Any) -> list[int]:
    """``wolfpack_trainer.local_rollout.chat_ids``, for hosts that cannot import that module."""
    ids = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
    )
    if not isinstance(ids, list):
        ids = list(ids["input_ids"])
    return [int(t) for t in ids]


def _local_rollout_or_copy() -> bool:
    """Import the trainer's rollout module, or put this file's ``chat_ids`` in its place (what
    ``warmstart`` imports from it). True when the real one is there."""
    try:
        import wolfpack_trainer.local_rollout  # noqa: F401
    except ImportError:
        for name in [m for m in sys.modules if m.startswith("wolfpack_trainer.local_rollout")]:
            del sys.modules[name]
        stub = types.ModuleType("wolfpack_trainer.local_rollout")
        stub.chat_ids = _chat_ids  # type: ignore[attr-defined]
        sys.modules["wolfpack_trainer.local_rollout"] = stub
        try:  # the rollout client (Redis, gRPC, OpenTelemetry) re-exports the driver's prompt rendering
            import wolfpack_rollout.client  # noqa: F401
        except ImportError:
            from wolfpack_rollout import prompts

            client = types.ModuleType("wolfpack_rollout.client")
            client.render_messages = prompts.render_messages  # type: ignore[attr-defined]
            sys.modules["wolfpack_rollout.client"] = client
        return False
    return True


REAL_ROLLOUT = _local_rollout_or_copy()

from wolfpack_games import get_game, make_game  # noqa: E402
from wolfpack_trainer.local_rollout import chat_ids  # noqa: E402
from wolfpack_trainer.warmstart import WarmStartConfig, clone_bot, is_speech, policy_prompt  # noqa: E402

FREE_TEXT = {"say", "speak"}
"""Action kinds that are talk: a scenario's chat line is a valid move, but it decides nothing."""


@dataclasses.dataclass
class Decision:
    """A trained seat's decision point in a bot game, with a copy of the game to try answers on."""

    env: Any
    seat: int
    prompt: str
    speech: bool
    past: tuple[str, ...] = ()
    """The seat's observation texts at its earlier decisions of the game (the driver's memory)."""


def plan_of(path: Path, proposals: list[str]) -> dict[str, Any]:
    """Everything the check needs from a training config, as JSON (no pydantic on the other side)."""
    from wolfpack_trainer.config import game_options, load_config
    from wolfpack_trainer.local_rollout import rollout_config
    from wolfpack_trainer.warmstart import warmstart_config

    cfg = load_config(path)
    driver = rollout_config(cfg)
    prompt: dict[str, Any] = {"prompt_mode": driver.prompt_mode, "memory_steps": driver.memory_steps,
              "max_prompt_tokens": driver.max_prompt_tokens, "system_prompt": driver.system_prompt}  # fmt: skip
    seats = sorted({s for p in cfg.policies for s in p.seats})
    roles = sorted({r for p in cfg.policies for r in p.roles})
    options = game_options(cfg)
    variant = cfg.game.variant or get_game(cfg.game.id).default_variant
    warm: list[tuple[str, dict[str, Any]]] = []
    own = warmstart_config(cfg)
    if own is not None:
        warm.append(("configured", dataclasses.asdict(own)))
    for text in proposals if own is None else []:
        base = WarmStartConfig(
            game_id=cfg.game.id, variant=variant, seats=tuple(seats), roles=tuple(roles), options=options,
            episodes=200, steps=60, lr=3e-5, **prompt,
        )  # fmt: skip
        changes: dict[str, Any] = {}
        for item in text.split(","):
            key, _, value = item.partition("=")
            default = getattr(base, key.strip())
            changes[key.strip()] = type(default)(int(value) if isinstance(default, bool) else value)
        warm.append((f"proposed {text}", dataclasses.asdict(dataclasses.replace(base, **changes))))
    return {
        "name": cfg.name,
        "game": {"id": cfg.game.id, "variant": variant, "bot": cfg.game.bot, "options": options},
        "seats": seats,
        "roles": roles,
        "seed_offset": cfg.eval.seed_offset,
        "max_tokens": cfg.rollout.max_tokens,
        "temperature": cfg.rollout.temperature,
        "prompt": prompt,
        "model": cfg.policies[0].model,
        "warm": warm,
    }


def decisions(plan: dict[str, Any], turns: int, rng: random.Random, speech_share: float) -> list[Decision]:
    """``turns`` decisions of the trained seats, drawn from bot games on held-out seeds: at most
    ``speech_share`` of them free-speech turns (valid whatever is said, and the costliest to sample)."""
    game = plan["game"]
    seats, roles = set(plan["seats"]), set(plan["roles"])
    bot = get_game(game["id"]).bots[game["bot"]]
    pool: list[Decision] = []
    seed = plan["seed_offset"]
    while len(pool) < 4 * turns and seed < plan["seed_offset"] + 200:
        env = make_game(game["id"], game["variant"])
        env.start(seed=seed, options=dict(game["options"]))
        brng = random.Random(seed)
        past: dict[int, list[str]] = {}
        for _ in range(400):
            if env.done:
                break
            moves = {}
            for s in env.acting_seats():
                if s in seats or env.role(s) in roles:
                    obs = env.observe(s)
                    seen = past.setdefault(s, [])
                    talk = is_speech(obs.legal_actions)
                    pool.append(Decision(copy.deepcopy(env), s, obs.text, talk, tuple(seen)))
                    seen.append(obs.text)
                moves[s] = bot(env, s, brng)
            env.step(moves)
        seed += 1
    speech = [d for d in pool if d.speech]
    actions = [d for d in pool if not d.speech]
    n_speech = min(len(speech), round(turns * speech_share)) if actions else min(len(speech), turns)
    return rng.sample(speech, n_speech) + rng.sample(actions, min(len(actions), turns - n_speech))


@dataclasses.dataclass
class Rate:
    valid: int
    turns: int
    valid_actions: int
    actions: int
    examples: list[str]
    bad: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """The invalid decision answers (first 40 characters), to show what a model gets wrong most."""


def valid_rate(model_dir: str, plan: dict[str, Any], points: list[Decision], batch: int, seed: int) -> Rate:
    """How many of ``points`` the model at ``model_dir`` answers with a valid move."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok: Any = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.to(device)
    model.eval()
    eos = [int(tok.convert_tokens_to_ids("<|im_end|>"))]
    if tok.eos_token_id is not None:
        eos.append(int(tok.eos_token_id))
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else eos[0])
    torch.manual_seed(seed)
    rate = Rate(0, 0, 0, 0, [])
    # the driver's prompts: its mode (memory: the seat's earlier observations too), crop and system prompt
    shape = WarmStartConfig(**plan.get("prompt", {"prompt_mode": "memory"}))
    for i in range(0, len(points), batch):
        chunk = points[i : i + batch]
        prompts = [policy_prompt(tok, d.prompt, d.past, shape) for d in chunk]
        if REAL_ROLLOUT:  # this file's copy must be the trainer's function
            assert [chat_ids(tok, [{"role": "user", "content": d.prompt}]) for d in chunk] == [
                _chat_ids(tok, [{"role": "user", "content": d.prompt}]) for d in chunk
            ]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, p in enumerate(prompts):  # left padding
            ids[j, width - len(p) :] = torch.tensor(p)
            att[j, width - len(p) :] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.to(device), attention_mask=att.to(device), do_sample=True,
                temperature=max(plan["temperature"], 1e-3), top_k=0, top_p=1.0,
                max_new_tokens=plan["max_tokens"], eos_token_id=eos, pad_token_id=pad,
            )  # fmt: skip
        for d, row in zip(chunk, out[:, width:].tolist(), strict=True):
            text = str(tok.decode(row, skip_special_tokens=True))
            good = not copy.deepcopy(d.env).step_seat(d.seat, text).get("invalid_reason")
            rate.valid += good
            rate.turns += 1
            if not d.speech:  # a decision: a valid move that is not talk (FINAL_BID, ACCEPT, vote 3, ...)
                parsed = d.env.parse(d.seat, text)
                good = good and parsed.action is not None and parsed.action.kind not in FREE_TEXT
                rate.actions += 1
                rate.valid_actions += good
                if not good:
                    rate.bad[text.strip()[:40]] += 1
                if len(rate.examples) < 3:
                    rate.examples.append(f"{'ok ' if good else 'BAD'} {text.strip()[:80]!r}")
    return rate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", type=Path)
    ap.add_argument("--plan", type=Path, help="run from this plan (JSON from --plan-out) instead of configs")
    ap.add_argument("--plan-out", type=Path, help="write the plan of the configs here and exit")
    ap.add_argument("--propose", action="append", default=[], help="a warm start to try: key=value,...")
    ap.add_argument("--model", default="", help="model directory or spec instead of each config's")
    ap.add_argument("--cache", type=Path, default=Path(".wolfpack/models"), help="model + clone cache")
    ap.add_argument("--turns", type=int, default=24, help="decisions sampled per recipe")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-only", action="store_true", help="measure the base model only (no clones)")
    ap.add_argument("--speech-share", type=float, default=0.25, help="largest share of free-speech turns")
    args = ap.parse_args(argv)
    if args.plan:
        plans = json.loads(args.plan.read_text())
    else:
        plans = [plan_of(p, args.propose) for p in args.configs]
    if args.plan_out:
        args.plan_out.write_text(json.dumps(plans, indent=1))
        print(f"wrote {len(plans)} plans to {args.plan_out}")
        return 0
    print(f"device: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}")
    rows: list[tuple[str, str, Rate, float]] = []
    for plan in plans:
        if args.model and Path(args.model).is_dir():
            base = args.model
        else:
            from wolfpack.models import resolve_model

            base = resolve_model(args.model or plan["model"], args.cache)
        points = decisions(plan, args.turns, random.Random(args.seed), args.speech_share)
        t0 = time.monotonic()
        rows.append((plan["name"], "base model", valid_rate(base, plan, points, args.batch, args.seed), 0.0))
        _print_row(rows[-1], time.monotonic() - t0)
        for label, fields in [] if args.base_only else plan["warm"]:
            wcfg = WarmStartConfig(
                **{**fields, "seats": tuple(fields["seats"]), "roles": tuple(fields["roles"])}
            )
            t1 = time.monotonic()
            warm = clone_bot(base, wcfg, args.cache)
            built = time.monotonic() - t1
            note = f"{label}: {wcfg.bot} bot, {wcfg.episodes} games, {wcfg.steps} steps, lr {wcfg.lr:g}"
            rows.append((plan["name"], note, valid_rate(warm, plan, points, args.batch, args.seed), built))
            _print_row(rows[-1], time.monotonic() - t1)
    print()
    print("| recipe | policy | valid turns | valid action turns | warm start built in |")
    print("| --- | --- | --- | --- | --- |")
    for name, note, r, built in rows:
        when = f"{built:.0f} s" if note != "base model" else ""
        print(
            f"| {name} | {note} | {_rate(r.valid, r.turns)} | {_rate(r.valid_actions, r.actions)} | {when} |"
        )
    return 0


def _rate(ok: int, n: int) -> str:
    return f"{ok}/{n} ({ok / n:.0%})" if n else "-"


def _print_row(row: tuple[str, str, Rate, float], seconds: float) -> None:
    name, note, r, _ = row
    print(f"== {name} / {note}: valid {_rate(r.valid, r.turns)}, decisions {_rate(r.valid_actions, r.actions)} "
          f"({seconds:.0f} s)", flush=True)  # fmt: skip
    for line in r.examples:
        print(f"    {line}", flush=True)
    if r.bad:
        common = ", ".join(f"{text!r} x{n}" for text, n in r.bad.most_common(5))
        print(f"    most common invalid decisions: {common}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
