"""Regression tests over the real wire (gRPC and the HTTP/WebSocket gateway) for issue 12's environment
items: token theft through request_id, option bounds and the NaN deadline, exhaustion of the episode table,
statuses of malformed values, isolation of PlaySeats creates, the gateway's header timeout and
connection cap, and the credential for spectating and closing a running episode."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp
import grpc
import pytest

from wolfpack import auth, rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient
from wolfpack_environment.gateway import RunningGateway
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import EpisodeManager, Limits
from wolfpack_games import get_game

from .conftest import SECRET, EnvStack

EXTERNAL = common_pb2.SEAT_CONTROLLER_EXTERNAL


def create_req(seed: int = 1, external: tuple[int, ...] = (0,), **kw: Any) -> pb.CreateEpisodeRequest:
    req = pb.CreateEpisodeRequest(
        game=common_pb2.GameRef(game_id="werewolf_v1", variant="6p"), seed=seed, **kw
    )
    for seat in external:
        req.seats.add(seat=seat, controller=EXTERNAL)
    return req


async def code_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code()


# --------------------------------------------------------------------------- token theft


async def test_request_id_equal_to_someone_elses_episode_id_returns_no_tokens(env: EnvStack) -> None:
    victim = await env.client.stub.CreateEpisode(create_req(external=(0, 1, 2)))
    # The attacker saw the episode id in an observation and sends it as its own request_id.
    thief = await env.client.stub.CreateEpisode(create_req(external=(0, 1, 2), request_id=victim.episode_id))
    assert thief.episode_id != victim.episode_id
    stolen = {t.token for t in thief.seat_tokens} | {thief.admin_token}
    assert not stolen & ({t.token for t in victim.seat_tokens} | {victim.admin_token})


async def test_request_id_replays_only_the_same_request(env: EnvStack) -> None:
    first = await env.client.stub.CreateEpisode(create_req(request_id="r-7f3a"))
    again = await env.client.stub.CreateEpisode(create_req(request_id="r-7f3a"))
    assert again == first  # a retry gets the same episode and tokens
    other = env.client.stub.CreateEpisode(create_req(seed=2, request_id="r-7f3a"))
    assert await code_of(other) == grpc.StatusCode.ALREADY_EXISTS
    too_long = env.client.stub.CreateEpisode(create_req(request_id="x" * 500))
    assert await code_of(too_long) == grpc.StatusCode.INVALID_ARGUMENT


async def test_request_id_theft_through_the_gateway_and_play_seats(
    env: EnvStack, gateway: RunningGateway
) -> None:
    victim = await env.client.stub.CreateEpisode(create_req(external=(0, 1)))
    async with aiohttp.ClientSession(gateway.url) as http:
        body = {
            "game": "werewolf_v1",
            "variant": "6p",
            "external_seats": [0, 1],
            "request_id": victim.episode_id,
        }
        async with http.post("/v1/episodes", json=body) as resp:
            assert resp.status == 201
            got = await resp.json()
    assert got["episode_id"] != victim.episode_id and got["admin_token"] != victim.admin_token

    async def requests() -> Any:
        yield pb.PlaySeatsRequest(create=[create_req(external=(0, 1), request_id=victim.episode_id)])

    async for msg in env.client.stub.PlaySeats(requests(), timeout=10):
        if msg.created:
            created = msg.created[0]
            assert created.episode.episode_id != victim.episode_id
            assert created.episode.admin_token != victim.admin_token
            break


# --------------------------------------------------------------------------- bounds, NaN deadline


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"discussion_rounds": "100000"}, "discussion_rounds"),
        ({"wolf_chat_rounds": "100000"}, "wolf_chat_rounds"),
        ({"roles": "{werewolf: 2, villager: 100000000}"}, "villager"),
        ({"max_days": "1e9"}, "max_days"),
        ({"max_days": ".nan"}, "max_days"),
        ({"discussion_rounds": "[1, 2"}, "discussion_rounds"),  # YAML syntax error
        ({"seat_roles": "&a [*a]"}, "seat_roles"),  # YAML alias error
    ],
)
async def test_unbounded_or_malformed_options_are_invalid_argument_naming_the_field(
    env: EnvStack, options: dict[str, str], field: str
) -> None:
    req = create_req()
    req.options.update(options)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.client.stub.CreateEpisode(req, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or "")


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -1.0, 1e12])
async def test_turn_timeout_must_be_finite_and_bounded(env: EnvStack, timeout: float) -> None:
    req = create_req(turn_timeout_s=timeout)
    assert await code_of(env.client.stub.CreateEpisode(req)) == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_nan_deadline_cannot_switch_off_other_episodes_timeouts(env: EnvStack) -> None:
    """The NaN create is refused, so the short-timeout episode after it still gets its default action."""
    nan = env.client.stub.CreateEpisode(create_req(turn_timeout_s=math.nan))
    assert await code_of(nan) == grpc.StatusCode.INVALID_ARGUMENT
    short = await env.client.stub.CreateEpisode(create_req(turn_timeout_s=0.2, external=(0, 1, 2, 3, 4, 5)))
    ep = env.manager.get(short.episode_id)
    deadline = time.monotonic() + 60  # bounded wait (300x the turn timeout): only a hung sweeper reaches it
    while ep.timeouts == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert ep.timeouts > 0


# --------------------------------------------------------------------------- exhaustion, isolation


async def test_abandoned_episodes_are_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock the test moves: the TTL is exact whatever the machine's load (with a real 0.3 s TTL the
    first episodes could expire before the table was even full). The clock starts at the real time and
    jumps 700 s, far past the 60 s TTL, because ``Episode.last_active``'s default reads the real clock."""
    from wolfpack_environment import sessions

    now = [time.monotonic()]

    class Clock:  # the ``time`` module as sessions sees it, with monotonic() moved only by the test
        monotonic = staticmethod(lambda: now[0])

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

    monkeypatch.setattr(sessions, "time", Clock())
    limits = Limits(max_episodes=5, abandoned_ttl_s=60, collect_every_s=0.05)
    servicer = EnvironmentServicer(EpisodeManager(limits))
    settings = load_settings(rpc_timeout_s=10)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    try:
        async with EnvironmentClient(f"127.0.0.1:{server.port}", settings) as client:
            for seed in range(5):  # fill the table with long-timeout episodes nobody plays
                await client.stub.CreateEpisode(create_req(seed=seed, turn_timeout_s=800))
            full = client.stub.CreateEpisode(create_req(seed=9))
            assert await code_of(full) == grpc.StatusCode.RESOURCE_EXHAUSTED
            now[0] += 700  # past abandoned_ttl_s (documented rule: no seat touched), before the 800 s turns
            await client.stub.CreateEpisode(create_req(seed=10))
            assert len(servicer.manager.episodes) == 1
    finally:
        servicer.manager.close_all()
        await server.stop(0)


async def test_a_bot_that_raises_leaves_no_episode_and_play_seats_goes_on(
    env: EnvStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = get_game("werewolf_v1")

    def broken(*_: Any) -> Any:
        raise RuntimeError("bot bug")

    monkeypatch.setitem(spec.bots, "broken", broken)
    before = len(env.manager.episodes)
    bad = create_req(external=(0,), default_bot="broken")
    assert await code_of(env.client.stub.CreateEpisode(bad)) == grpc.StatusCode.INTERNAL
    assert len(env.manager.episodes) == before

    queue: asyncio.Queue[pb.PlaySeatsRequest | None] = asyncio.Queue()

    async def requests() -> Any:
        while (item := await queue.get()) is not None:
            yield item

    call = env.client.stub.PlaySeats(requests(), timeout=20)
    await queue.put(pb.PlaySeatsRequest(create=[create_req(external=(0,), request_id="good-1")]))
    await queue.put(pb.PlaySeatsRequest(create=[bad, create_req(seed=3, external=(0,), request_id="good-2")]))
    seen: dict[str, int] = {}
    async for msg in call:
        for c in msg.created:
            seen[c.request_id] = c.error.code
        if len(seen) == 3:
            break
    await queue.put(None)
    assert seen["good-1"] == 0 and seen["good-2"] == 0
    assert seen[""] == grpc.StatusCode.INTERNAL.value[0]


# --------------------------------------------------------------------------- statuses


async def test_non_ascii_tokens_are_permission_denied(env: EnvStack) -> None:
    created = await env.client.stub.CreateEpisode(create_req())
    for call in (
        env.client.stub.GetEpisode(pb.GetEpisodeRequest(episode_id=created.episode_id, token="ünïcode")),
        env.client.stub.CloseEpisode(pb.CloseEpisodeRequest(episode_id=created.episode_id, token="ü")),
        env.client.stub.Act(pb.ActRequest(episode_id=created.episode_id, token="ü", turn_id=1, raw_text="x")),
    ):
        assert await code_of(call) == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    "body",
    [
        {"game": "werewolf_v1", "seed": 2**64},
        {"game": "werewolf_v1", "seed": -1},
        {"game": "werewolf_v1", "external_seats": [2**40]},
        {"game": "werewolf_v1", "turn_timeout_s": 1e308 * 10},
        {"game": "werewolf_v1", "unknown_field": 1},
        {"game": "werewolf_v1", "bots": {"99999999999": "random"}},
        {"game": "werewolf_v1", "options": {"max_days": "[1,"}},
        {"game": "werewolf_v1", "options": {"max_days": 10**30}},
    ],
)
async def test_gateway_out_of_range_values_are_400_json(
    gateway: RunningGateway, body: dict[str, Any]
) -> None:
    async with aiohttp.ClientSession(gateway.url) as http:
        import json as _json

        raw = _json.dumps(body).replace("Infinity", "1e999")
        async with http.post("/v1/episodes", data=raw, headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400, await resp.text()
            assert (await resp.json())["error"]["code"] == "INVALID_ARGUMENT"


async def test_gateway_step_out_of_range_turn_id_and_target_are_400(
    env: EnvStack, gateway: RunningGateway
) -> None:
    created = await env.client.stub.CreateEpisode(create_req())
    token = created.seat_tokens[0].token
    step = f"/v1/episodes/{created.episode_id}/step"
    async with aiohttp.ClientSession(gateway.url) as http:
        for body in (
            {"token": token, "turn_id": 2**63, "text": "x"},
            {"token": token, "turn_id": 1, "action": {"kind": "vote", "target": 2**31}},
            {"token": token, "turn_id": 1, "action": {"kind": "vote", "target": 1, "extra": 1}},
        ):
            async with http.post(step, json=body) as resp:
                assert resp.status == 400, await resp.text()
                assert (await resp.json())["error"]["code"] == "INVALID_ARGUMENT"


# --------------------------------------------------------------------------- gateway connection limits


async def test_gateway_partial_headers_neither_starve_healthz_nor_live_forever(
    gateway: RunningGateway,
) -> None:
    """Twice the connection cap of half-sent requests: /healthz still answers, and the half-open
    connections are closed by the header timeout (fixture: 1 s) instead of living forever."""
    writers = []
    for _ in range(128):  # max_connections is 64 in the fixture
        reader, writer = await asyncio.open_connection(gateway.host, gateway.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        writers.append((reader, writer))
    await asyncio.gather(*(w.drain() for _, w in writers))
    async with (
        aiohttp.ClientSession(gateway.url) as http,
        http.get("/healthz", timeout=aiohttp.ClientTimeout(total=5)) as resp,
    ):
        assert resp.status == 200
    reader = writers[-1][0]
    data = await asyncio.wait_for(reader.read(), timeout=10)  # EOF once the header timeout fires
    assert data == b"" or data.startswith(b"HTTP/1.1 4")
    for _, w in writers:
        w.close()


async def test_gateway_oversized_header_is_rejected(gateway: RunningGateway) -> None:
    async with (
        aiohttp.ClientSession(gateway.url) as http,
        http.get("/healthz", headers={"X-Big": "a" * 20_000}) as resp,
    ):
        assert resp.status in (400, 431)


# --------------------------------------------------------------------------- credential


async def test_spectating_and_closing_a_running_episode_need_the_credential(env: EnvStack) -> None:
    env.servicer.credential = auth.Credential(SECRET)
    created = await env.client.stub.CreateEpisode(create_req())
    admin = created.admin_token
    get = pb.GetEpisodeRequest(episode_id=created.episode_id, token=admin)
    assert await code_of(env.client.stub.GetEpisode(get)) == grpc.StatusCode.PERMISSION_DENIED
    wrong = [(auth.METADATA_KEY, "nope")]
    assert await code_of(env.client.stub.GetEpisode(get, metadata=wrong)) == grpc.StatusCode.PERMISSION_DENIED
    ok = [(auth.METADATA_KEY, SECRET)]
    full = await env.client.stub.GetEpisode(get, metadata=ok)
    assert all(s.role for s in full.seats)
    # a seat still sees its own view without any credential
    seat = await env.client.stub.GetEpisode(
        pb.GetEpisodeRequest(episode_id=created.episode_id, token=created.seat_tokens[0].token)
    )
    assert sum(1 for s in seat.seats if s.role) == 1
    close = pb.CloseEpisodeRequest(episode_id=created.episode_id, token=admin)
    assert await code_of(env.client.stub.CloseEpisode(close)) == grpc.StatusCode.PERMISSION_DENIED
    assert (await env.client.stub.CloseEpisode(close, metadata=ok)).closed


async def test_clients_configured_with_the_secret_attach_it(env: EnvStack) -> None:
    env.servicer.credential = auth.Credential(SECRET)
    created = await env.client.stub.CreateEpisode(create_req())
    settings = load_settings(rpc_timeout_s=10, admin_secret=SECRET)
    async with EnvironmentClient(env.target, settings) as privileged:
        state = await privileged.get_episode(created.episode_id, created.admin_token)
        assert all(s.role for s in state.seats)


async def test_gateway_forwards_only_the_callers_credential(env: EnvStack, gateway: RunningGateway) -> None:
    env.servicer.credential = auth.Credential(SECRET)
    created = await env.client.stub.CreateEpisode(create_req())
    path = f"/v1/episodes/{created.episode_id}"
    async with aiohttp.ClientSession(gateway.url) as http:
        async with http.get(path, params={"token": created.admin_token}) as resp:
            assert resp.status == 403
        headers = {"X-Wolfpack-Credential": SECRET}
        async with http.get(path, params={"token": created.admin_token}, headers=headers) as resp:
            assert resp.status == 200
        for odd in ("wrong", "caf\u00e9".encode().decode("latin-1"), "a\tb"):
            async with http.get(
                path, params={"token": created.admin_token}, headers={"X-Wolfpack-Credential": odd}
            ) as resp:
                assert resp.status == 403, odd
                assert (await resp.json())["error"]["code"] == "PERMISSION_DENIED"


async def test_non_loopback_bind_without_a_secret_refuses_to_start() -> None:
    servicer = EnvironmentServicer(EpisodeManager())
    with pytest.raises(PermissionError, match="WOLFPACK_ADMIN_SECRET"):
        await rpc.start_server("environment", lambda s: register(s, servicer), load_settings(), "0.0.0.0:0")
    assert auth.is_loopback("127.0.0.1:5") and auth.is_loopback("[::1]:5") and not auth.is_loopback(":5")


@pytest.mark.parametrize(
    ("options", "field"),
    [({"max_reprompts": "1000000000"}, "max_reprompts"), ({"difficulty": "[]"}, "difficulty")],
)
async def test_scenario_game_options_are_bounded(env: EnvStack, options: dict[str, str], field: str) -> None:
    req = pb.CreateEpisodeRequest(game=common_pb2.GameRef(game_id="bargaining_v1"), seed=1)
    req.options.update(options)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.client.stub.CreateEpisode(req, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or "") or "difficult" in (err.value.details() or "")


def test_scenario_models_refuse_non_finite_numbers() -> None:
    from wolfpack_games.scenarios import Scenario, generate_scenario

    data = generate_scenario("bargaining", 1, "easy").model_dump()
    data["id"] = ""
    key = next(k for k, v in data["params"].items() if isinstance(v, int | float) and not isinstance(v, bool))
    data["params"][key] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        Scenario.model_validate(data)


async def test_worst_case_legal_episodes_beside_normal_traffic(env: EnvStack) -> None:
    """GetObservation latency while a client creates worst-case legal episodes back to back (19
    scripted seats, every option at its bound: a whole scripted game each), as a ratio to an idle run
    and to the same client creating ordinary 6-player episodes. Before the bounds one such create held
    the event loop for minutes; now scripted play runs in slices (``ADVANCE_SLICE_S``), so a worst-case
    loop turn adds at most one slice to other callers' requests. Generous bound: two shared cores."""
    import statistics

    env.manager.limits = Limits(max_episodes=100_000)  # finished episodes pile up for finished_ttl_s
    normal = await env.client.stub.CreateEpisode(create_req(external=(0,)))
    get = pb.GetObservationRequest(episode_id=normal.episode_id, token=normal.seat_tokens[0].token)

    async def latencies(n: int) -> float:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await env.client.stub.GetObservation(get)
            out.append(time.perf_counter() - t)
            await asyncio.sleep(0.005)
        return statistics.median(out)

    async def beside(template: pb.CreateEpisodeRequest) -> tuple[float, int]:
        stop = asyncio.Event()
        created = 0

        async def abuse() -> None:
            nonlocal created
            async with EnvironmentClient(env.target, env.settings) as other:
                while not stop.is_set():
                    req = pb.CreateEpisodeRequest()
                    req.CopyFrom(template)
                    req.seed = created
                    await other.stub.CreateEpisode(req)
                    created += 1

        abuser = asyncio.ensure_future(abuse())
        await asyncio.sleep(0.2)
        busy = await latencies(20)
        stop.set()
        await abuser
        return busy, created

    await latencies(3)
    idle = await latencies(20)
    ordinary, _ = await beside(create_req(external=()))
    worst = create_req(external=())
    worst.options.update({
        "roles": "{werewolf: 6, villager: 9, seer: 1, witch: 1, hunter: 1, guard: 1}", "discussion_rounds": "5",
        "wolf_chat_rounds": "5", "max_days": "30", "max_reprompts": "5", "sheriff": "true", "tie_rule": "revote",
    })  # fmt: skip
    busy, created = await beside(worst)
    assert created > 2
    finished = [
        ep for ep in env.manager.episodes.values() if len(ep.env.possible_agents) == 19 and ep.env.done
    ]
    assert len(finished) >= 2  # the worst-case games really played to the end, slice by slice
    # measured on the 2-core dev box: idle ~0.9 ms, ordinary creates ~2 ms, worst-case creates 20-50 ms
    # (a worst-case game is ~25 ms of CPU, cut into 5 ms slices; before the bounds: minutes)
    assert busy / idle < 150, (idle, ordinary, busy)
