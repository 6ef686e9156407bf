"""Conformance checks every game's tests call (in the spirit of PettingZoo's ``api_test``/``seed_test``).

They are library code, not tests, so a new game gets the same guarantees by calling them:
API shape, determinism under a seed, and graceful handling of malformed actions; and ``compare_bots``,
which turns a bot-quality claim into a paired comparison over seeds with an effect size and a p-value.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from wolfpack_games.base import Action, GameEnv, Observation

BotFn = Callable[[GameEnv, int, random.Random], Action]
EnvFactory = Callable[[], GameEnv]


def play(env: GameEnv, bots: Mapping[int, BotFn] | BotFn, seed: int, max_steps: int = 10_000) -> int:
    """Play a whole game with bots (one per seat, or one for all); returns the number of steps."""
    rng = random.Random(seed)
    env.reset(seed=seed)
    steps = 0
    while not env.done:
        acting = env.acting_seats()
        if not acting:
            raise AssertionError("game not done but no seat is acting")
        actions = {}
        for seat in acting:
            bot = bots[seat] if isinstance(bots, Mapping) else bots
            actions[seat] = bot(env, seat, rng)
        env.step(actions)
        steps += 1
        if steps > max_steps:
            raise AssertionError(f"game did not finish within {max_steps} steps")
    return steps


def api_test(make_env: EnvFactory, bot: BotFn, seed: int = 0) -> None:
    """Check the API shape over one full game driven by ``bot``."""
    env = make_env()
    obs, infos = env.reset(seed=seed)
    assert set(obs) == set(env.possible_agents), "reset must return an observation for every seat"
    assert set(infos) == set(env.possible_agents), "reset must return infos for every seat"
    for seat, o in obs.items():
        assert isinstance(o, Observation) and o.seat == seat
        assert isinstance(o.text, str) and o.text, "every seat gets a non-empty observation text"
    rng = random.Random(seed)
    steps = 0
    while not env.done:
        acting = env.acting_seats()
        assert acting, "a running game always has acting seats"
        for seat in env.possible_agents:
            legal = env.legal_actions(seat)
            if seat in acting:
                assert legal, f"acting seat {seat} has no legal action"
                default = env.default_action(seat)
                assert any(la.kind == default.kind for la in legal), "default action must be legal"
            else:
                assert not legal, f"seat {seat} is not acting but has legal actions"
        result = env.step({seat: bot(env, seat, rng) for seat in acting})
        obs_, rewards, terms, truncs, infos_ = result
        for d in (obs_, rewards, terms, truncs, infos_):
            assert set(d) <= set(env.possible_agents)
        steps += 1
        assert steps < 100_000, "game did not terminate"
    assert env.acting_seats() == []
    out = env.outcome()
    assert set(out) == set(env.possible_agents)
    assert all(v in (-1, 0, 1) for v in out.values())
    for seat in env.possible_agents:
        assert env.observe(seat).done


def seed_test(make_env: EnvFactory, bot: BotFn, seed: int = 7) -> None:
    """Same seed and same bot decisions give the identical event log; a different seed usually not."""
    logs = []
    for _ in range(2):
        env = make_env()
        play(env, bot, seed)
        logs.append(list(env.events))
    assert logs[0] == logs[1], "same seed must reproduce the same game"


def malformed_action_test(make_env: EnvFactory, seed: int = 3, garbage: str = "¯\\_(ツ)_/¯ <<>>") -> None:
    """Garbage text never crashes a game: it is recorded as invalid and, repeated, defaulted."""
    env = make_env()
    env.reset(seed=seed)
    steps = 0
    saw_invalid = False
    while not env.done and steps < 2_000:
        acting = env.acting_seats()
        result = env.step({seat: garbage for seat in acting})
        infos: dict[int, dict[str, Any]] = result.infos
        for seat in acting:
            info = infos.get(seat, {})
            if info.get("invalid_reason"):
                saw_invalid = True
        steps += 1
    assert saw_invalid, "garbage actions must be reported with an invalid_reason in infos"
    assert env.done, "a game fed only garbage must still finish through default actions"


# --- bot-quality claims as paired statistical comparisons ------------------------------------------------

SeatBots = Callable[[GameEnv], Mapping[int, BotFn] | BotFn]
"""Bots for a game already reset with its seed (so a seat's role can choose its bot)."""


@dataclass(frozen=True)
class PairedComparison:
    """Two bot line-ups played on the same seeds; ``success`` judged per game.

    ``a_only``/``b_only`` are the discordant seeds (one line-up succeeded, the other not); the one-sided
    exact sign test on them (McNemar's exact test) asks whether A beats B by more than seed luck."""

    seeds: int
    a_successes: int
    b_successes: int
    a_only: int
    b_only: int

    @property
    def effect(self) -> float:
        """A's success rate minus B's, on the same seeds (the stated effect size of a claim)."""
        return (self.a_successes - self.b_successes) / self.seeds

    @property
    def p_value(self) -> float:
        """P(at least ``a_only`` of the discordant seeds favour A | A and B are equally good)."""
        n = self.a_only + self.b_only
        return sum(math.comb(n, k) for k in range(self.a_only, n + 1)) / 2**n if n else 1.0


def compare_bots(
    make_env: Callable[[int], GameEnv],
    a: SeatBots,
    b: SeatBots,
    success: Callable[[GameEnv], bool],
    seeds: Iterable[int],
) -> PairedComparison:
    """Play line-up ``a`` and line-up ``b`` on each seed (``make_env(seed)`` builds the game) and count
    which succeeded: the raw material of a claim such as "the heuristic village beats a random one"."""
    a_wins = b_wins = a_only = b_only = n = 0
    for seed in seeds:
        results = []
        for lineup in (a, b):
            env = make_env(seed)
            env.reset(seed=seed)
            play(env, lineup(env), seed=seed)
            results.append(success(env))
        won_a, won_b = results
        n += 1
        a_wins += won_a
        b_wins += won_b
        a_only += won_a and not won_b
        b_only += won_b and not won_a
    return PairedComparison(n, a_wins, b_wins, a_only, b_only)
