"""Spare engines (``sessions.SPARE_ENGINES``): the engine of a released, finished episode starts the next
create of its game and variant instead of a new one.

What must hold: a game on a spare engine is the same game as on a fresh one (every seat's every
observation, prompt included, every result, the event log and the outcome), for 6/9/12 players in English
and Chinese, with scripted seats and options in play; and an engine is only kept when nothing can read it
any more (no PlaySeats stream watching, no Observe stream waiting, its game over), so no caller ever sees
another game through an old episode.
"""

from __future__ import annotations

import random

import pytest

from wolfpack_environment import sessions
from wolfpack_environment.sessions import EpisodeManager, Limits, SeatPlan


def play(
    manager: EpisodeManager, variant: str, seed: int, language: str, external: int
) -> tuple[list[str], int]:
    """One whole game through the manager, the first ``external`` seats answered with seeded text, the rest
    scripted; released at its end. Returns everything a client could see, and the engine's id."""
    plans = {s: SeatPlan("external") for s in range(external)}
    options = {"discussion_rounds": 2} if seed % 2 else None
    ep = manager.create("werewolf_v1", variant, seed, plans, language=language, options=options)
    engine = id(ep.env)
    token = {seat: t for t, seat in ep.tokens.items()}
    rng = random.Random(seed)
    seen: list[str] = []
    while not ep.done:
        for seat, turn_id in sorted(ep.open_turns.items()):
            obs = ep.env.observe(seat)
            seen.append(f"{seat} {turn_id} {obs.phase} {obs.round} {obs.feedback!r}\n{obs.text}")
            if rng.random() < 0.1:
                answer = "no idea"
            else:
                la = rng.choice(obs.legal_actions)
                answer = "I trust seat 2." if la.needs_text else (
                    f"{la.kind} {rng.choice(la.targets) + 1}" if la.targets else la.kind)  # fmt: skip
            r = manager.act(ep, token[seat], turn_id, None, answer)
            seen.append(f"{r.accepted} {r.reason} {r.action} {r.defaulted}")
    for seat in range(len(ep.seats)):
        seen.append(ep.env.observe(seat).text)
    seen.append(repr([(e.kind, e.channel, e.actor, e.target, e.text) for e in ep.env.events]))
    seen.append(repr(ep.env.outcome()))
    manager.release(ep)
    return seen, engine


@pytest.mark.parametrize("variant", ["6p", "9p", "12p"])
@pytest.mark.parametrize("language", ["en", "zh"])
def test_a_spare_engine_plays_the_same_game(
    variant: str, language: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    players = int(variant.removesuffix("p"))
    reused = EpisodeManager(Limits())
    games = [(seed, players if seed % 3 else 2) for seed in range(6)]  # every third game mostly scripted
    got = [play(reused, variant, seed, language, external) for seed, external in games]
    assert len({engine for _, engine in got}) == 1, "the first game's engine played every later one"
    monkeypatch.setattr(sessions, "SPARE_ENGINES", 0)
    fresh = EpisodeManager(Limits())
    want = [play(fresh, variant, seed, language, external) for seed, external in games]
    assert len({engine for _, engine in want}) > 1 or len(games) == 1
    for (seen, _), (expected, _) in zip(got, want, strict=True):
        assert seen == expected


def test_only_unreachable_finished_engines_are_kept() -> None:
    manager = EpisodeManager(Limits())
    plans = {s: SeatPlan("external") for s in range(6)}

    running = manager.create("werewolf_v1", "6p", 1, plans)
    manager.release(running)  # aborted mid-game: closed, not kept
    watched = manager.create("werewolf_v1", "6p", 2, {})  # all scripted: over at once
    watched.listeners.add(lambda ep: None)  # a PlaySeats stream still holds it
    manager.release(watched)
    observed = manager.create("werewolf_v1", "6p", 3, {})
    observed.watchers = 1  # an Observe stream waits on it
    manager.release(observed)
    assert not manager._spare.get(("werewolf_v1", "6p"))
    done = manager.create("werewolf_v1", "", 4, {})  # the default variant is 6p
    assert done.done
    manager.release(done)
    assert manager._spare[("werewolf_v1", "6p")] == [done.env]
    again = manager.create("werewolf_v1", "6p", 5, plans)
    assert again.env is done.env and not again.done and not manager._spare[("werewolf_v1", "6p")]
    other = manager.create("werewolf_v1", "9p", 5, {})
    assert other.env is not done.env  # another variant never takes it
