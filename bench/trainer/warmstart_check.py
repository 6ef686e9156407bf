"""Does the configured warm start make a model write valid actions? One command, one table per recipe.

Why: RL on a game gets no gradient while every episode of a group ends alike, and a real base model
(SmolLM2-135M-Instruct) writes prose, not ``FINAL_BID: 40`` or ``vote 3``. For each training config this
plays the config's bot games on held-out seeds (``eval.seed_offset`` onwards), takes ``--turns``
decisions of the trained seats (seats or roles), renders each prompt as the trainer does
(``render_prompt``), samples an answer at the config's ``rollout.temperature`` / ``max_tokens`` from the
base model and from the warm-started clone (``warmstart.clone_bot``, the cache the trainer uses), and
asks the engine whether the answer is a valid move (``step_seat`` on a copy of the game: the
``invalid_reason`` the rollout records). "action" counts only the turns that are not free speech (a
Werewolf speech is valid whatever it says).

    .venv/bin/python bench/trainer/warmstart_check.py configs/gpu-*-smollm2.yaml
    .venv/bin/python bench/trainer/warmstart_check.py --model tiny --turns 8 configs/gpu-ippo-smollm2.yaml

On these 2 CPU cores SmolLM2 samples ~85 tok/s at batch 8 and the clone trains at several seconds a step,
so ``--steps`` / ``--episodes`` can shorten the warm start (the table says when they did); on a GPU host
it runs as configured.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from wolfpack_games import get_game, make_game
from wolfpack_trainer.config import game_options, load_config
from wolfpack_trainer.learners.cpu import resolve_model_path
from wolfpack_trainer.local_rollout import render_prompt, sample
from wolfpack_trainer.warmstart import clone_bot, is_speech, warmstart_config


@dataclasses.dataclass
class Decision:
    """A trained seat's decision point in a bot game, with a copy of the game to try answers on."""

    env: Any
    seat: int
    prompt: str
    speech: bool


def decisions(cfg: Any, turns: int, rng: random.Random) -> list[Decision]:
    """``turns`` decisions of the trained seats, drawn from bot games on held-out seeds."""
    seats = {s for p in cfg.policies for s in p.seats}
    roles = {r for p in cfg.policies for r in p.roles}
    bot = get_game(cfg.game.id).bots[cfg.game.bot]
    pool: list[Decision] = []
    seed = cfg.eval.seed_offset
    while len(pool) < 4 * turns and seed < cfg.eval.seed_offset + 200:
        env = make_game(cfg.game.id, cfg.game.variant)
        env.start(seed=seed, options=game_options(cfg))
        brng = random.Random(seed)
        for _ in range(400):
            if env.done:
                break
            moves = {}
            for s in env.acting_seats():
                if s in seats or env.role(s) in roles:
                    obs = env.observe(s)
                    pool.append(Decision(copy.deepcopy(env), s, obs.text, is_speech(obs.legal_actions)))
                moves[s] = bot(env, s, brng)
            env.step(moves)
        seed += 1
    return rng.sample(pool, min(turns, len(pool)))


def valid_rate(
    model_dir: str, cfg: Any, points: list[Decision], batch: int, seed: int
) -> tuple[int, int, int, int, list[str]]:
    """(valid, all, valid action turns, action turns, sample answers) of ``model_dir`` on ``points``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    eos = [int(tok.convert_tokens_to_ids("<|im_end|>"))]
    if tok.eos_token_id is not None:
        eos.append(int(tok.eos_token_id))
    gen = torch.Generator().manual_seed(seed)
    ok = ok_action = actions = 0
    shown: list[str] = []
    for i in range(0, len(points), batch):
        chunk = points[i : i + batch]
        prompts = [render_prompt(tok, d.prompt) for d in chunk]
        outs = sample(
            model, prompts, max_tokens=cfg.rollout.max_tokens, temperature=cfg.rollout.temperature,
            eos_ids=eos, pad_id=int(tok.pad_token_id or 0), generator=gen,
        )  # fmt: skip
        for d, out in zip(chunk, outs, strict=True):
            text = str(tok.decode(out.token_ids, skip_special_tokens=True))
            info = copy.deepcopy(d.env).step_seat(d.seat, text)
            good = not info.get("invalid_reason")
            ok += good
            if not d.speech:
                actions += 1
                ok_action += good
                if len(shown) < 3:
                    shown.append(f"{'ok ' if good else 'BAD'} {text.strip()[:70]!r}")
    return ok, len(points), ok_action, actions, shown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", type=Path)
    ap.add_argument("--model", default="", help="model spec instead of each config's (tiny, smollm2, a dir)")
    ap.add_argument("--cache", type=Path, default=Path(".wolfpack/models"), help="model + clone cache")
    ap.add_argument("--turns", type=int, default=24, help="decisions sampled per recipe")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument(
        "--steps", type=int, default=0, help="warm-start steps instead of the config's (0: config)"
    )
    ap.add_argument("--episodes", type=int, default=0, help="warm-start bot games instead of the config's")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    for path in args.configs:
        cfg = load_config(path)
        base = resolve_model_path(args.model or cfg.policies[0].model, str(args.cache))
        points = decisions(cfg, args.turns, random.Random(args.seed))
        t0 = time.monotonic()
        before = valid_rate(base, cfg, points, args.batch, args.seed)
        t_base = time.monotonic() - t0
        wcfg = warmstart_config(cfg)
        note = "no warm start"
        after: tuple[int, int, int, int, list[str]] | None = None
        t_warm = 0.0
        if wcfg is not None:
            changes = {k: v for k, v in (("steps", args.steps), ("episodes", args.episodes)) if v}
            wcfg = dataclasses.replace(wcfg, **changes)
            note = (
                f"{wcfg.bot} bot, {wcfg.episodes} games, {wcfg.steps} steps"
                + (" (shortened)" if changes else "")
                + (", format-only" if wcfg.format_only else "")
            )
            t1 = time.monotonic()
            warm = clone_bot(base, wcfg, args.cache)
            t_warm = time.monotonic() - t1
            after = valid_rate(warm, cfg, points, args.batch, args.seed)
        rows.append((cfg.name, note, before, after, t_base, t_warm))
        _print_row(rows[-1])
    print()
    print(
        f"{'recipe':42} {'base valid':>12} {'base action':>12} {'warm valid':>12} {'warm action':>12}  warm start"
    )
    for name, note, b, a, _, t_warm in rows:
        warm = (f"{_rate(a[0], a[1]):>12} {_rate(a[2], a[3]):>12}") if a else f"{'-':>12} {'-':>12}"
        print(f"{name:42} {_rate(b[0], b[1]):>12} {_rate(b[2], b[3]):>12} {warm}  {note}, {t_warm:.0f} s")
    return 0


def _rate(ok: int, n: int) -> str:
    return f"{ok}/{n} {ok / n:.0%}" if n else "-"


def _print_row(row: Any) -> None:
    name, note, before, after, t_base, t_warm = row
    print(f"== {name}: {note}; base sampled in {t_base:.0f} s, warm start {t_warm:.0f} s", flush=True)
    for label, res in (("base", before), ("warm", after)):
        if res is not None:
            print(f"  {label}: valid {_rate(res[0], res[1])}, action turns {_rate(res[2], res[3])}")
            for line in res[4]:
                print(f"    {line}")


if __name__ == "__main__":
    sys.exit(main())
