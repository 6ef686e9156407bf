"""The session rules of the environment service at their exact bounds, over real gRPC where a client can
see them: seat tokens, the default and maximum turn timeouts, deadlines of turns opened at different
times, the act-rate bucket, the finished-episode TTL, collection of abandoned episodes, the bounds of
``options`` and ``request_id``, and scripted play cut into slices.

Time is a fake clock (the session manager's ``time.monotonic``), so every bound is checked exactly; the
oracles are the numbers documented in ``Limits`` and ``sessions.py``, written out here by hand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment import sessions
from wolfpack_environment.client import EnvironmentClient, episode_request
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import EpisodeManager, Limits, SeatPlan

pytestmark = pytest.mark.timeout(120)  # a broken build may hang the loop instead of failing


class FakeClock:
    """``time`` as the session manager sees it: ``monotonic()`` moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str) -> Any:  # perf_counter, time_ns, ...: the real ones
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(sessions, "time", fake)
    return fake


@pytest.fixture
def limits() -> Limits:
    return Limits(
        max_episodes=50, max_text_chars=2_000, acts_per_second=1.0, burst=3, finished_ttl_s=60.0,
        abandoned_ttl_s=1_000.0, collect_every_s=10.0,
    )  # fmt: skip


@pytest.fixture
async def stack(clock: FakeClock, limits: Limits) -> AsyncIterator[tuple[EpisodeManager, EnvironmentClient]]:
    """A real environment service on a loopback port whose manager reads the fake clock."""
    manager = EpisodeManager(limits)
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server(
        "environment", lambda s: register(s, EnvironmentServicer(manager)), settings, "127.0.0.1:0"
    )
    async with EnvironmentClient(f"127.0.0.1:{server.port}", settings) as client:
        yield manager, client
    manager.close_all()
    await server.stop(0)


async def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code(), err.value.details() or ""


async def alive(client: EnvironmentClient, ep: Any) -> bool:
    """Whether the service still holds ``ep`` (NOT_FOUND once it was released)."""
    try:
        await client.get_episode(ep.episode_id, ep.admin_token)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND
        return False
    return True


def create_req(**kw: Any) -> pb.CreateEpisodeRequest:
    kw.setdefault("external_seats", (0,))
    return episode_request("werewolf_v1", "6p", **kw)


# --------------------------------------------------------------------------- seat tokens


async def test_seat_tokens_are_distinct_144_bit_secrets_bound_to_their_seat(stack: Any) -> None:
    _manager, client = stack
    tokens: set[str] = set()
    for seed in (1, 2):
        ep = await client.create_episode("werewolf_v1", "12p", seed=seed, external_seats=tuple(range(12)))
        secret = [*ep.seat_tokens.values(), ep.admin_token]
        assert sorted(ep.seat_tokens) == list(range(12))
        for token in secret:  # 144 bits = 36 lowercase hex characters, each
            assert len(token) == 36 and set(token) <= set("0123456789abcdef"), token
        tokens.update(secret)
        for seat, token in ep.seat_tokens.items():
            obs = await client.seat(ep.episode_id, token).observation()
            assert obs.seat == seat
        # the admin token holds no seat: it cannot act
        code, _ = await code_of(client.seat(ep.episode_id, ep.admin_token).act(1, "pass"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
    assert len(tokens) == 26, "13 secrets per episode, none shared within or across episodes"


# --------------------------------------------------------------------------- turn timeouts


async def test_a_zero_turn_timeout_means_the_documented_120_s(stack: Any, clock: FakeClock) -> None:
    manager, client = stack
    ep = await client.create_episode("werewolf_v1", "6p", seed=1, external_seats=(0,))
    seat = client.seat(ep.episode_id, ep.seat_tokens[0])
    first = await seat.observation()
    assert first.your_turn
    clock.advance(119.5)
    assert manager.expire(clock.now) == 0
    assert (await seat.observation()).turn_id == first.turn_id
    clock.advance(0.5)  # exactly 120 s after the turn opened: due
    assert manager.expire(clock.now) == 1
    late = await seat.act(first.turn_id, "too late")
    assert late.duplicate and late.defaulted and "timed out" in late.reason


@pytest.mark.parametrize(("timeout", "ok"), [(0.0, True), (900.0, True), (900.5, False), (-0.5, False)])
async def test_turn_timeout_bounds_are_inclusive(stack: Any, timeout: float, ok: bool) -> None:
    _manager, client = stack
    call = client.stub.CreateEpisode(create_req(turn_timeout_s=timeout))
    if ok:
        assert (await call).episode_id
    else:
        code, details = await code_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "turn_timeout_s" in details


async def test_a_turn_opened_later_keeps_its_own_deadline(stack: Any, clock: FakeClock) -> None:
    """The deadline heap holds one entry per episode, at the oldest open turn's deadline; when it comes up
    while a younger turn is still open, the episode is scheduled again for that turn."""
    manager, client = stack
    ep = await client.create_episode(
        "werewolf_v1", "6p", seed=1, external_seats=tuple(range(6)), turn_timeout_s=30.0
    )
    seats = {s: client.seat(ep.episode_id, t) for s, t in ep.seat_tokens.items()}
    first = [o for o in [await seats[s].observation() for s in range(6)] if o.your_turn]
    assert len(first) == 1  # the night opens with one wolf's chat turn (t = 1000, due at 1030)
    clock.advance(10.0)
    resp = await seats[first[0].seat].act(first[0].turn_id, "Let us take player 1 tonight.")
    assert resp.accepted
    second = [o for o in [await seats[s].observation() for s in range(6)] if o.your_turn]
    assert second  # opened at t = 1010: due at 1040
    clock.advance(20.0)  # t = 1030: the first turn's deadline, answered already
    assert manager.expire(clock.now) == 0
    assert [(await seats[o.seat].observation()).turn_id for o in second] == [o.turn_id for o in second]
    clock.advance(10.0)  # t = 1040
    assert manager.expire(clock.now) == len(second)
    for o in second:
        late = await seats[o.seat].act(o.turn_id, "late")
        assert late.duplicate and late.defaulted


# --------------------------------------------------------------------------- act rate


async def test_the_act_bucket_holds_at_most_burst_and_refills_at_the_rate(
    stack: Any, clock: FakeClock
) -> None:
    """acts_per_second=1, burst=3 (fixture): after any idle time three acts pass at once, the fourth is
    refused; half a second refills half an act (still refused), a whole second one act."""
    _manager, client = stack
    ep = await client.create_episode("werewolf_v1", "6p", seed=1, external_seats=(0,))
    seat = client.seat(ep.episode_id, ep.seat_tokens[0])

    async def refused() -> bool:
        try:
            await seat.act(10_000, common_pb2.Action(kind="pass"))  # never a real turn: after the rate check
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        raise AssertionError("turn 10000 was accepted")

    assert not await refused()  # the seat's bucket exists from its first act on
    clock.advance(1_000.0)  # a long idle time must not bank 1000 acts
    assert [await refused() for _ in range(4)] == [False, False, False, True]
    clock.advance(0.5)
    assert await refused()
    clock.advance(0.5)
    assert [await refused() for _ in range(2)] == [False, True]


# --------------------------------------------------------------------------- collection


async def test_a_finished_episode_is_kept_exactly_finished_ttl_s(stack: Any, clock: FakeClock) -> None:
    _manager, client = stack
    ep = await client.create_episode("werewolf_v1", "6p", seed=2)  # all scripted: finished at t = 1000
    clock.advance(60.0)  # exactly the TTL: not yet "longer than" it
    await client.create_episode("werewolf_v1", "6p", seed=3)  # a create collects
    assert (await client.get_episode(ep.episode_id, ep.admin_token)).done
    clock.advance(0.5)
    await client.create_episode("werewolf_v1", "6p", seed=4)
    code, details = await code_of(client.get_episode(ep.episode_id, ep.admin_token))
    assert code == grpc.StatusCode.NOT_FOUND and "60s" in details


async def test_abandoned_episodes_go_after_abandoned_ttl_s_checked_every_collect_every_s(
    stack: Any, clock: FakeClock
) -> None:
    """abandoned_ttl_s=1000, collect_every_s=10 (fixture). Episode A is never touched after t = 1000; B's
    seat reads its observation again at t = 1500."""
    _manager, client = stack
    a = await client.create_episode("werewolf_v1", "6p", seed=1, external_seats=(0,), turn_timeout_s=800)
    b = await client.create_episode("werewolf_v1", "6p", seed=2, external_seats=(0,), turn_timeout_s=800)

    for ep in (a, b):  # a seat read sets the last activity on the manager's (fake) clock
        await client.seat(ep.episode_id, ep.seat_tokens[0]).observation()
    clock.advance(500.0)
    await client.seat(b.episode_id, b.seat_tokens[0]).observation()
    clock.advance(500.0)  # t = 2000: A untouched for exactly 1000 s, not longer
    await client.create_episode("werewolf_v1", "6p", seed=5)
    assert await alive(client, a) and await alive(client, b)
    clock.advance(5.0)  # t = 2005: A is overdue, but the last collection was 5 s ago (< 10 s)
    await client.create_episode("werewolf_v1", "6p", seed=6)
    assert await alive(client, a)
    clock.advance(5.0)  # t = 2010: 10 s since the last collection
    await client.create_episode("werewolf_v1", "6p", seed=7)
    assert not await alive(client, a)
    assert await alive(client, b)  # touched 510 s ago
    code, _ = await code_of(client.seat(a.episode_id, a.seat_tokens[0]).observation())
    assert code == grpc.StatusCode.NOT_FOUND  # its token opens nothing any more


# --------------------------------------------------------------------------- request bounds


async def test_request_id_bound_is_128_characters(stack: Any) -> None:
    _manager, client = stack
    assert (await client.stub.CreateEpisode(create_req(request_id="r" * 128))).episode_id
    code, details = await code_of(client.stub.CreateEpisode(create_req(request_id="r" * 129)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "128" in details


async def test_options_bounds_count_size_and_depth(stack: Any) -> None:
    """64 options of 16384 characters, nested 20 deep, pass the service's bounds (the game then refuses
    the unknown names or values with its own message); one more of each is refused by the bound."""
    _manager, client = stack

    async def details(options: dict[str, str]) -> str:
        code, text = await code_of(client.stub.CreateEpisode(create_req(options=options)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        return text

    many = {f"opt{i}": "1" for i in range(64)}
    assert "unknown werewolf option" in await details(many)
    assert "65 entries; the limit is 64" in await details({**many, "opt64": "1"})
    long_text = "#" + "x" * 16_380 + "\n99"  # 16384 characters of YAML for the number 99
    assert len(long_text) == 16_384
    assert "out of range" in await details({"max_days": long_text})  # at the bound: reaches the game
    assert "longer than 16384" in await details({"max_days": long_text + " "})
    assert "out of range" in await details({"max_days": "[" * 20 + "1" + "]" * 20})  # 1 at depth 20
    assert "nested too deeply" in await details({"max_days": "[" * 21 + "1" + "]" * 21})


def _aliased_list(extra: int) -> str:
    """YAML for a list of 99 aliases of one 99-zero list plus ``extra`` zeros: 1 + 99 x 100 + extra
    nodes once the aliases are expanded, in under 1 KiB of text."""
    zeros = ", ".join(["0"] * 99)
    return f"[&a [{zeros}], {', '.join(['*a'] * 98)}, {', '.join(['0'] * extra)}]"


async def test_option_values_are_walked_up_to_10000_nodes(stack: Any) -> None:
    """The walk that looks for NaN is bounded at 10000 nodes (aliases count once per use). The option's
    name is unknown to the game, whose refusal names the option but does not quote the value."""
    _manager, client = stack

    async def details(text: str) -> str:
        code, msg = await code_of(client.stub.CreateEpisode(create_req(options={"big": text})))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        return msg

    assert "unknown werewolf option 'big'" in await details(_aliased_list(99))  # 10000: reaches the game
    assert "too large or nested too deeply" in await details(_aliased_list(100))  # 10001


def test_the_python_api_seed_defaults_to_zero() -> None:
    """``EpisodeManager.create`` without a seed plays the game of seed 0 (an all-scripted game: its whole
    log is determined by the seed)."""
    manager = EpisodeManager()

    def log(**kw: Any) -> list[tuple[str, int, int, str]]:
        ep = manager.create("werewolf_v1", "6p", **kw)
        return [(e.kind, e.actor, e.target, e.text) for e in ep.env.events]

    assert log() == log(seed=0)
    assert log(seed=0) != log(seed=1)  # the comparison can tell seeds apart


# --------------------------------------------------------------------------- scripted play in slices


def test_without_an_event_loop_scripted_play_is_never_sliced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a loop (tests, CLI) there is nothing to yield to: even with a zero slice, a create plays
    every scripted seat to the end at once."""
    monkeypatch.setattr(sessions, "ADVANCE_SLICE_S", 0.0)
    ep = EpisodeManager().create("werewolf_v1", "6p", seed=3)
    assert ep.done and ep.env.winner()


async def test_an_act_between_slices_completes_the_scripted_run_first(
    monkeypatch: pytest.MonkeyPatch, stack: Any
) -> None:
    """With a zero slice, a create on the loop returns after one scripted move; the external seat's first
    decision (turn 1, hand-known: turn ids count per seat from 1) can still be answered at once, because
    an act finishes the run (``sliced=False``) before looking at the turn."""
    manager, _client = stack
    monkeypatch.setattr(sessions, "ADVANCE_SLICE_S", 0.0)
    reference = await asyncio.to_thread(  # off the loop: played in one go
        EpisodeManager().create, "werewolf_v1", "6p", seed=1, seats={0: SeatPlan("external")}
    )
    assert reference.open_turns == {0: 1}
    ep = manager.create("werewolf_v1", "6p", seed=1, seats={0: SeatPlan("external")})
    assert ep.advancing and not ep.open_turns  # the run was cut: the seat's turn is not open yet
    token = next(iter(ep.tokens))
    result = manager.act(ep, token, 1, None, "I am a simple villager.")
    assert result.accepted, result.reason
    assert len(ep.env.events) > len(reference.env.events)  # played on from where the reference stopped
    assert [e.text for e in ep.env.events[: len(reference.env.events)]] == [
        e.text for e in reference.env.events
    ]


@pytest.mark.parametrize("limits", [Limits(max_episodes=50, max_unclaimed=3, unclaimed_ttl_s=100.0,
                                           abandoned_ttl_s=1_000.0, collect_every_s=10.0)])  # fmt: skip
async def test_episodes_nobody_joins_are_capped_and_released_early(stack: Any, clock: FakeClock) -> None:
    """Issue 20: creates with an external seat nobody ever joins (no credential needed) filled the episode
    table for the whole abandonment time. At most ``max_unclaimed`` such episodes exist at once (others, and
    all-bot ones, can still be created), and one still unjoined after ``unclaimed_ttl_s`` is released."""
    _manager, client = stack
    idle = [
        await client.create_episode("werewolf_v1", "6p", seed=i, external_seats=(0,), turn_timeout_s=900)
        for i in range(3)
    ]
    code, details = await code_of(client.create_episode("werewolf_v1", "6p", seed=9, external_seats=(0,)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "nobody has joined" in details
    await client.create_episode("werewolf_v1", "6p", seed=10)  # all bots: not held back
    await client.seat(idle[0].episode_id, idle[0].seat_tokens[0]).observation()  # joined: no longer counted
    joined_late = await client.create_episode("werewolf_v1", "6p", seed=11, external_seats=(0,))

    clock.advance(111.0)  # past unclaimed_ttl_s and collect_every_s, far below abandoned_ttl_s
    await client.create_episode("werewolf_v1", "6p", seed=12)  # a create runs the collection
    assert await alive(client, idle[0])  # joined: the abandonment time applies
    assert (
        not await alive(client, idle[1])
        and not await alive(client, idle[2])
        and not await alive(client, joined_late)
    )
    await client.create_episode("werewolf_v1", "6p", seed=13, external_seats=(0,))  # room again
