"""Fuzzing the edges with Hypothesis: every gRPC request type of the environment, inference and reward
services (messages generated from their descriptors, with plausible values mixed in so requests reach
deep code, not only the first check), and random JSON to the gateway and the inference HTTP front.
Any answer outside the documented statuses (docs/security.md) fails: INTERNAL or UNKNOWN means a
caller's input reached a bug.

The servers run on their own event loop in a thread; the tests use blocking clients, so Hypothesis
drives plain functions. Settings: derandomized (a fixed seed; a failure replays from the log), 20
examples per method by default (``WOLFPACK_FUZZ_EXAMPLES`` raises it), no deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wolfpack import auth, rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack.v1 import environment_service_pb2_grpc as env_grpc
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc
from wolfpack.v1 import reward_service_pb2 as rew_pb
from wolfpack.v1 import reward_service_pb2_grpc as rew_grpc
from wolfpack_environment.gateway import start_gateway
from wolfpack_environment.server import EnvironmentServicer
from wolfpack_environment.server import register as register_env
from wolfpack_environment.sessions import EpisodeManager, Limits
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.http_api import HttpFront
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import InferenceServicer
from wolfpack_inference.server import register as register_inf
from wolfpack_reward.server import register as register_rew

from .conftest import SECRET

FUZZ = settings(
    max_examples=int(os.environ.get("WOLFPACK_FUZZ_EXAMPLES", "20")),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNIMPLEMENTED,  # a backend that cannot load weights says so
}
BAD_ITEM_CODES = {
    "INTERNAL",
    "UNKNOWN",
    str(grpc.StatusCode.INTERNAL.value[0]),
    str(grpc.StatusCode.UNKNOWN.value[0]),
}


# --------------------------------------------------------------------------- servers in a thread


@dataclass
class Stack:
    loop: asyncio.AbstractEventLoop
    env: str
    inference: str
    reward: str
    gateway: str
    http: str
    episode_id: str
    seat_token: str
    admin_token: str

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[Stack]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    models = tmp_path_factory.mktemp("fuzz-models")
    started: Future[Any] = asyncio.run_coroutine_threadsafe(_start(models, tiny_dir), loop)
    parts, stop = started.result(timeout=300)
    try:
        yield Stack(loop, *parts)
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


async def _start(models: Path, tiny_dir: Path) -> tuple[tuple[Any, ...], Callable[[], Any]]:
    settings = load_settings(rpc_timeout_s=30, admin_secret=SECRET)
    servicer = EnvironmentServicer(EpisodeManager(Limits(max_episodes=300, max_text_chars=2000)))
    servicer.credential = auth.Credential(SECRET)
    env = await rpc.start_server("environment", lambda s: register_env(s, servicer), settings, "127.0.0.1:0")
    cfg = PolicyConfig(policy_id="tiny", model=str(tiny_dir), device="cpu", dtype="float32",
                       context_budget=128)  # fmt: skip
    registry = PolicyRegistry.from_configs([cfg], models / "cache")
    inf = await rpc.start_server(
        "inference", lambda s: register_inf(s, InferenceServicer(registry)), settings, "127.0.0.1:0"
    )
    rew = await rpc.start_server("reward", register_rew, settings, "127.0.0.1:0")
    gateway = await start_gateway("127.0.0.1", 0, f"127.0.0.1:{env.port}", settings=settings)
    front = HttpFront(registry, api_key="")
    http_port = await front.start("127.0.0.1", 0)
    req = env_pb.CreateEpisodeRequest(game=common_pb2.GameRef(game_id="werewolf_v1", variant="6p"), seed=1)
    req.seats.add(seat=0, controller=common_pb2.SEAT_CONTROLLER_EXTERNAL)
    async with rpc.channel(f"127.0.0.1:{env.port}", settings) as channel:
        created = await env_grpc.EnvironmentServiceStub(channel).CreateEpisode(req)

    async def stop() -> None:
        await front.stop()
        await gateway.stop()
        servicer.manager.close_all()
        for server in (env, inf, rew):
            await server.stop(0)
        await registry.close()

    parts = (f"127.0.0.1:{env.port}", f"127.0.0.1:{inf.port}", f"127.0.0.1:{rew.port}", gateway.url,
             f"http://127.0.0.1:{http_port}", created.episode_id, created.seat_tokens[0].token,
             created.admin_token)  # fmt: skip
    return parts, stop


# --------------------------------------------------------------------------- messages from descriptors


def hints(stack: Stack) -> dict[str, st.SearchStrategy[Any]]:
    """Plausible values by field name, mixed with arbitrary ones, so generated requests get past the
    first lookups (a real game, a live episode, a served policy) into the code behind them."""
    return {
        "game_id": st.sampled_from(["werewolf_v1", "bargaining_v1", "allocation_v1", "chess_v9"]),
        "variant": st.sampled_from(["", "6p", "9p", "12p", "zz"]),
        "episode_id": st.just(stack.episode_id),
        "token": st.sampled_from([stack.seat_token, stack.admin_token, "ü", ""]),
        "policy_id": st.sampled_from(["tiny", "", "nope"]),
        "spec": st.sampled_from(["", "werewolf_shaped", "werewolf_outcome", "scenario_shaped", "x@9"]),
        "max_tokens": st.integers(-2, 6),
        "n": st.integers(-1, 3),
        "kind": st.sampled_from(["vote", "speak", "pass", "kill", "fly"]),
        "role": st.sampled_from(["user", "system", "assistant", "tool"]),
        "bot": st.sampled_from(["", "random", "heuristic", "nope"]),
        "dtype": st.sampled_from(["float32", "bfloat16", "int8", "__class__", ""]),
        "language": st.sampled_from(["", "en", "zh", "xx"]),
        "default_bot": st.sampled_from(["", "random", "heuristic", "nope"]),
    }


OPTION_KEYS = st.sampled_from(["discussion_rounds", "roles", "max_days", "seat_roles", "tie_rule", "x"])
OPTION_VALUES = st.one_of(
    st.sampled_from(
        ["1", "2", "1e9", ".nan", "[1,", "{werewolf: 2, villager: 3}", "&a [*a]", "revote", "true"]
    ),
    st.text(max_size=20),
)


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return st.one_of(st.integers(-3, 12), st.integers(-(2**31), 2**31 - 1))
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return st.one_of(st.integers(-3, 12), st.integers(-(2**63), 2**63 - 1))
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.one_of(st.integers(0, 12), st.integers(0, 2**32 - 1))
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.one_of(st.integers(0, 12), st.integers(0, 2**64 - 1))
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.floats(-2, 200), st.floats(allow_nan=True, allow_infinity=True, width=32))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return st.text(max_size=24)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=48)
    if t == FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-2, 40))
    raise AssertionError(f"unhandled field type {t}")


@st.composite
def message(
    draw: st.DrawFn, desc: Descriptor, names: dict[str, st.SearchStrategy[Any]], depth: int = 0
) -> Any:
    from google.protobuf import message_factory

    msg = message_factory.GetMessageClass(desc)()
    for field in desc.fields:
        hinted = field.name in names and _hint_fits(field, names, field.name)
        if not hinted and draw(st.integers(0, 2)) == 0:  # about a third of the other fields stay unset
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, val_f = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            if val_f.message_type is not None:
                continue
            keys = OPTION_KEYS if field.name == "options" else scalar(key_f)
            vals = OPTION_VALUES if field.name == "options" else scalar(val_f)
            getattr(msg, field.name).update(draw(st.dictionaries(keys, vals, max_size=3)))
            continue
        if field.message_type is not None:
            if depth >= 3:
                continue
            sub = message(field.message_type, names, depth + 1)
            if field.is_repeated:
                getattr(msg, field.name).extend(draw(st.lists(sub, max_size=3)))
            else:
                getattr(msg, field.name).CopyFrom(draw(sub))
            continue
        strat = scalar(field)
        if hinted:  # mostly plausible, sometimes anything
            strat = st.one_of(names[field.name], names[field.name], names[field.name], strat)
        if field.is_repeated:
            getattr(msg, field.name).extend(draw(st.lists(strat, max_size=4)))
        else:
            setattr(msg, field.name, draw(strat))
    return msg


INT_HINTS = {"max_tokens", "n"}


def _hint_fits(field: FieldDescriptor, names: dict[str, Any], name: str) -> bool:
    """String hints go to string fields, integer hints to integer fields (a name like ``role`` may be
    an enum elsewhere)."""
    if name in INT_HINTS:
        return field.type in (
            FieldDescriptor.TYPE_INT32,
            FieldDescriptor.TYPE_INT64,
            FieldDescriptor.TYPE_UINT32,
        )
    return field.type == FieldDescriptor.TYPE_STRING


def expect_documented(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        assert code in DOCUMENTED, f"{code}: {exc.details()}"  # type: ignore[attr-defined]
        return None


# --------------------------------------------------------------------------- gRPC fuzz


def _channel(target: str, credential: bool) -> grpc.Channel:
    channel = grpc.insecure_channel(target)
    if credential:
        return grpc.intercept_channel(channel, _Credential())
    return channel


class _Credential(grpc.UnaryUnaryClientInterceptor, grpc.StreamUnaryClientInterceptor):  # type: ignore[misc]
    def _details(self, details: Any) -> Any:
        meta = [*(details.metadata or ()), (auth.METADATA_KEY, SECRET)]
        return details._replace(metadata=meta) if hasattr(details, "_replace") else _Details(details, meta)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)


class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, d: Any, metadata: Any) -> None:
        self.method, self.timeout, self.metadata = d.method, d.timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = (
            d.credentials,
            d.wait_for_ready,
            d.compression,
        )


ENV_UNARY = [
    "ListGames", "CreateEpisode", "GetObservation", "Act", "GetEpisode", "CloseEpisode", "ListEpisodes",
    "SpectateEpisode",
]  # fmt: skip


@pytest.mark.parametrize("method", ENV_UNARY)
def test_environment_unary_answers_only_documented_statuses(stack: Stack, method: str) -> None:
    stub = env_grpc.EnvironmentServiceStub(_channel(stack.env, credential=False))
    desc = env_pb.DESCRIPTOR.services_by_name["EnvironmentService"].methods_by_name[method].input_type

    @FUZZ
    @given(message(desc, hints(stack)))
    def check(req: Any) -> None:
        expect_documented(lambda: getattr(stub, method)(req, timeout=20))

    check()


def test_environment_streams_answer_only_documented_statuses(stack: Stack) -> None:
    stub = env_grpc.EnvironmentServiceStub(_channel(stack.env, credential=False))
    service = env_pb.DESCRIPTOR.services_by_name["EnvironmentService"]
    names = hints(stack)

    @FUZZ
    @given(message(service.methods_by_name["Observe"].input_type, names),
           st.lists(message(service.methods_by_name["PlaySeats"].input_type, names), min_size=1, max_size=3))  # fmt: skip
    def check(observe: Any, play: list[Any]) -> None:
        def first_observation() -> None:
            call = stub.Observe(observe, timeout=20)
            try:
                next(iter(call), None)
            finally:
                call.cancel()

        expect_documented(first_observation)

        def play_seats() -> None:
            responses = stub.PlaySeats(iter(play), timeout=20)
            for resp in responses:
                for c in resp.created:
                    assert str(c.error.code) not in BAD_ITEM_CODES, c.error.message
                for r in resp.results:
                    assert str(r.error.code) not in BAD_ITEM_CODES, r.error.message

        expect_documented(play_seats)

    check()


INF_METHODS = ["Generate", "GenerateStream", "GenerateBatch", "ListPolicies", "LoadPolicy", "PushWeights"]


@pytest.mark.parametrize("method", INF_METHODS)
def test_inference_answers_only_documented_statuses(stack: Stack, method: str) -> None:
    stub = inf_grpc.InferenceServiceStub(_channel(stack.inference, credential=True))
    desc = inf_pb.DESCRIPTOR.services_by_name["InferenceService"].methods_by_name[method].input_type
    names = hints(stack)

    @FUZZ
    @given(st.lists(message(desc, names), min_size=1, max_size=3))
    def check(reqs: list[Any]) -> None:
        req = reqs[0]
        if method == "PushWeights":
            expect_documented(lambda: stub.PushWeights(iter(reqs), timeout=20))
        elif method in ("GenerateStream", "GenerateBatch"):

            def drain() -> None:
                for resp in getattr(stub, method)(req, timeout=30):
                    for r in getattr(resp, "results", ()):
                        if r.HasField("error"):
                            assert str(r.error.code) not in BAD_ITEM_CODES, r.error.message

            expect_documented(drain)
        else:
            expect_documented(lambda: getattr(stub, method)(req, timeout=30))

    check()


def test_reward_answers_only_documented_statuses(stack: Stack) -> None:
    stub = rew_grpc.RewardServiceStub(_channel(stack.reward, credential=False))
    service = rew_pb.DESCRIPTOR.services_by_name["RewardService"]
    names = hints(stack)

    @FUZZ
    @given(message(service.methods_by_name["Score"].input_type, names),
           message(service.methods_by_name["ListRewardSpecs"].input_type, names))  # fmt: skip
    def check(score: Any, listing: Any) -> None:
        expect_documented(lambda: stub.Score(score, timeout=30))
        expect_documented(lambda: stub.ListRewardSpecs(listing, timeout=30))

    check()


# --------------------------------------------------------------------------- JSON fuzz

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def body(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Objects with some of ``fields`` (plausible or arbitrary values) and maybe a stray key, or any JSON."""
    known = st.fixed_dictionaries({}, optional={k: st.one_of(v, JSON) for k, v in fields.items()})
    return st.one_of(known, st.dictionaries(st.text(max_size=8), JSON, max_size=3), JSON)


GATEWAY_OK = {200, 201, 400, 401, 403, 404, 409, 413, 429}


def test_gateway_json_answers_only_documented_statuses(stack: Stack) -> None:
    create = body({
        "game": st.sampled_from(["werewolf_v1", "bargaining_v1", "x"]), "variant": st.sampled_from(["6p", "9p"]),
        "seed": st.integers(), "external_seats": st.lists(st.integers(-1, 12), max_size=3),
        "bots": st.dictionaries(st.sampled_from(["0", "1", "x", "99"]), st.sampled_from(["random", "x"])),
        "options": st.dictionaries(OPTION_KEYS, st.one_of(OPTION_VALUES, JSON), max_size=2),
        "turn_timeout_s": st.floats(allow_nan=False), "request_id": st.text(max_size=8),
    })  # fmt: skip
    step = body({
        "token": st.sampled_from([stack.seat_token, "x"]), "turn_id": st.integers(),
        "action": st.fixed_dictionaries({"kind": st.sampled_from(["vote", "speak"])},
                                        optional={"target": st.integers(), "text": st.text(max_size=8)}),
        "text": st.text(max_size=16), "wait_s": st.floats(allow_nan=False),
    })  # fmt: skip
    episode = f"/v1/episodes/{stack.episode_id}"

    @FUZZ
    @given(create, step, st.sampled_from(["/step", "/reset"]))
    def check(create_body: Any, step_body: Any, path: str) -> None:
        with httpx.Client(base_url=stack.gateway, timeout=30) as http:
            r = http.post("/v1/episodes", content=json.dumps(create_body))
            assert (r.status_code in GATEWAY_OK and "error" in r.json()) or r.status_code < 300, r.text
            if isinstance(step_body, dict):
                step_body = {**step_body, "wait_s": 0}
            r = http.post(episode + path, content=json.dumps(step_body))
            assert r.status_code in GATEWAY_OK, r.text
            assert r.status_code < 300 or set(r.json()) == {"error"}, r.text

    check()


def test_gateway_websocket_json_answers_only_documented_errors(stack: Stack) -> None:
    """Random messages over one WebSocket: every reply is an act_result, observation, pong or an error
    with a documented code, and the socket stays open."""
    message_body = body({
        "type": st.sampled_from(["act", "observe", "ping", "x"]), "turn_id": st.integers(),
        "text": st.text(max_size=8), "id": JSON,
        "action": st.fixed_dictionaries({"kind": st.sampled_from(["vote", "speak"])}, optional={"target": st.integers()}),
    })  # fmt: skip
    documented = {
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "NOT_FOUND",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
    }

    async def open_socket() -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
        http = aiohttp.ClientSession(stack.gateway)
        ws = await http.ws_connect(f"/v1/episodes/{stack.episode_id}/ws", params={"token": stack.seat_token})
        await ws.receive_json(timeout=10)  # the first observation
        return http, ws

    http, ws = stack.run(open_socket())

    async def exchange(payload: Any) -> Any:
        await ws.send_str(json.dumps(payload))
        while True:
            reply = await ws.receive_json(timeout=10)
            if (
                reply["type"] != "observation"
                or not isinstance(payload, dict)
                or payload.get("type") == "observe"
            ):
                return reply

    @FUZZ
    @given(message_body)
    def check(payload: Any) -> None:
        reply = stack.run(exchange(payload))
        assert reply["type"] in {"act_result", "observation", "pong", "error"}, reply
        if reply["type"] == "error":
            assert reply["code"] in documented, reply

    try:
        check()
    finally:
        stack.run(ws.close())
        stack.run(http.close())


def test_http_front_json_answers_only_documented_statuses(stack: Stack) -> None:
    fields = {
        "model": st.sampled_from(["tiny", "nope"]), "max_tokens": st.integers(-2, 4),
        "temperature": st.floats(allow_nan=False), "top_p": st.floats(allow_nan=False),
        "top_k": st.integers(), "n": st.integers(-1, 3), "seed": st.integers(), "stream": st.booleans(),
        "stop": st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=20)),
        "logprobs": st.booleans(),
    }  # fmt: skip
    chat = body({**fields, "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "x"]), "content": st.text(max_size=16)}), max_size=3)})  # fmt: skip
    completion = body(
        {**fields, "prompt": st.one_of(st.text(max_size=16), st.lists(st.integers(), max_size=4))}
    )

    @FUZZ
    @given(chat, completion)
    def check(chat_body: Any, completion_body: Any) -> None:
        with httpx.Client(base_url=stack.http, timeout=60) as http:
            for path, payload in (("/v1/chat/completions", chat_body), ("/v1/completions", completion_body)):
                r = http.post(path, content=json.dumps(payload))
                assert r.status_code in {200, 400, 404, 412, 413}, r.text
                if r.status_code != 200:
                    assert set(r.json()) == {"error"}, r.text

    check()
