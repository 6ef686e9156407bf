"""A seat's observation stream ends when its running episode is closed (found by the web view's tests:
closing a running episode while a seat's ``Observe`` waited spun that watcher forever, holding the event
loop, since ``release`` ends an episode without bumping its version)."""

from __future__ import annotations

import asyncio

import pytest

from wolfpack_environment.sessions import EpisodeManager, SeatPlan

pytestmark = pytest.mark.timeout(10)  # without the fix the timeout ends the spin: then the asserts fail


async def test_a_waiting_watcher_of_a_running_episode_stops_when_it_is_closed() -> None:
    manager = EpisodeManager()
    ep = manager.create("werewolf_v1", "6p", seed=1, seats={s: SeatPlan("external") for s in range(6)})
    seen = []

    async def observe() -> None:
        async for obs in manager.watch(ep, 0):
            seen.append(obs)

    watcher = asyncio.create_task(observe())
    await asyncio.sleep(0.05)  # it has its first observation and waits for a change
    assert len(seen) == 1 and ep.watchers == 1 and not ep.done
    manager.close(ep.episode_id, ep.admin_token)
    started = asyncio.get_running_loop().time()
    done, _ = await asyncio.wait([watcher], timeout=5)  # without the fix: the watcher spins, holding the loop
    assert asyncio.get_running_loop().time() - started < 5
    assert done and watcher.result() is None and ep.watchers == 0
