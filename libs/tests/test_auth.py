"""The service credential over real gRPC: which calls the server refuses (and with which code), which
calls a configured client attaches the credential to, and the bind guard. Handlers here are generic
byte handlers on real sockets, so every call kind (unary, client/server/bidi streams) is exercised
without a model or a game behind it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from wolfpack import auth
from wolfpack.settings import load_settings

SECRET = "correct horse battery staple"
INFERENCE = "wolfpack.v1.InferenceService"
PUSH = f"/{INFERENCE}/PushWeights"  # client stream, privileged
LOAD = f"/{INFERENCE}/LoadPolicy"  # unary, privileged
GENERATE = f"/{INFERENCE}/Generate"  # unary, ordinary
BATCH = f"/{INFERENCE}/GenerateBatch"  # server stream
CHAT = f"/{INFERENCE}/Chat"  # bidi stream (a made-up method, to cover the fourth call kind)
GET_EPISODE = "/wolfpack.v1.EnvironmentService/GetEpisode"
CLOSE_EPISODE = "/wolfpack.v1.EnvironmentService/CloseEpisode"
CREATE_EPISODE = "/wolfpack.v1.EnvironmentService/CreateEpisode"
LIST_EPISODES = "/wolfpack.v1.EnvironmentService/ListEpisodes"
SPECTATE = "/wolfpack.v1.EnvironmentService/SpectateEpisode"


class Recorder:
    """Generic handlers that record each call's metadata and deadline; every one answers ``b"ok"``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str], float | None]] = []

    def _record(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        metadata = {
            k: v if isinstance(v, str) else v.decode() for k, v in context.invocation_metadata() or ()
        }
        self.calls.append((method, metadata, context.time_remaining()))

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        def unary(method: str) -> Any:
            async def handle(request: bytes, context: Any) -> bytes:
                self._record(method, context)
                return b"ok"

            return grpc.unary_unary_rpc_method_handler(handle)

        def client_stream(method: str) -> Any:
            async def handle(requests: AsyncIterator[bytes], context: Any) -> bytes:
                self._record(method, context)
                async for _ in requests:
                    pass
                return b"ok"

            return grpc.stream_unary_rpc_method_handler(handle)

        def server_stream(method: str) -> Any:
            async def handle(request: bytes, context: Any) -> AsyncIterator[bytes]:
                self._record(method, context)
                yield b"ok"

            return grpc.unary_stream_rpc_method_handler(handle)

        def bidi(method: str) -> Any:
            async def handle(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
                self._record(method, context)
                async for _ in requests:
                    yield b"ok"

            return grpc.stream_stream_rpc_method_handler(handle)

        inference = {
            "PushWeights": client_stream(PUSH),
            "LoadPolicy": unary(LOAD),
            "Generate": unary(GENERATE),
            "GenerateBatch": server_stream(BATCH),
            "Chat": bidi(CHAT),
        }
        environment = {
            "GetEpisode": unary(GET_EPISODE),
            "CloseEpisode": unary(CLOSE_EPISODE),
            "ListEpisodes": unary(LIST_EPISODES),
            "SpectateEpisode": unary(SPECTATE),
            "CreateEpisode": unary(CREATE_EPISODE),
        }
        return [
            grpc.method_handlers_generic_handler(INFERENCE, inference),
            grpc.method_handlers_generic_handler("wolfpack.v1.EnvironmentService", environment),
        ]


async def serve(interceptor: grpc.aio.ServerInterceptor) -> tuple[grpc.aio.Server, Recorder, str]:
    recorder = Recorder()
    server = grpc.aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers(recorder.handlers())
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, recorder, f"127.0.0.1:{port}"


async def chunks(n: int = 2) -> AsyncIterator[bytes]:
    for _ in range(n):
        yield b"chunk"


async def call(channel: grpc.aio.Channel, method: str, metadata: Any = None, timeout: float = 10) -> Any:
    """One call of ``method`` of whichever kind the test server gives it; the (last) reply."""
    if method == PUSH:
        return await channel.stream_unary(method)(chunks(), metadata=metadata, timeout=timeout)
    if method == BATCH:
        return [r async for r in channel.unary_stream(method)(b"req", metadata=metadata, timeout=timeout)]
    if method == CHAT:
        return [r async for r in channel.stream_stream(method)(chunks(), metadata=metadata, timeout=timeout)]
    return await channel.unary_unary(method)(b"req", metadata=metadata, timeout=timeout)


async def refusal(
    channel: grpc.aio.Channel, method: str, metadata: Any = None
) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        if method == CHAT:
            # A bidi call whose server aborts while the client is still writing ends INTERNAL now and then
            # on the client (grpcio; 10-30 % here, with any handler that aborts before reading): the
            # refused bidi call sends nothing, so only the code the interceptor chose can come back.
            await call_empty_bidi(channel, method, metadata)
        else:
            await call(channel, method, metadata)
    return err.value.code(), err.value.details() or ""


async def call_empty_bidi(channel: grpc.aio.Channel, method: str, metadata: Any) -> list[bytes]:
    return [r async for r in channel.stream_stream(method)(chunks(0), metadata=metadata, timeout=10)]


# --------------------------------------------------------------------------- Credential, pure


def test_credential_matches_only_the_configured_secret() -> None:
    cred = auth.Credential(SECRET)
    assert cred.enabled
    assert cred.matches(SECRET) and cred.matches(SECRET.encode())
    for wrong in ("", b"", None, "x", SECRET + " ", SECRET[:-1], SECRET.upper()):
        assert not cred.matches(wrong), wrong
    open_ = auth.Credential("")
    assert not open_.enabled
    assert all(open_.matches(anything) for anything in (None, "", "x", b"y"))


def test_check_says_which_status_refuses_the_call() -> None:
    cred = auth.Credential(SECRET)
    key = "x-wolfpack-credential"  # the documented header, spelled out rather than read from the module
    assert cred.check([("other", "v"), (key, SECRET)]) is None
    missing = cred.check([("other", SECRET)])
    assert missing is not None and missing[0] == grpc.StatusCode.UNAUTHENTICATED and key in missing[1]
    assert cred.check(None) == missing and cred.check([]) == missing and cred.check([(key, "")]) == missing
    wrong = cred.check([(key, "nope")])
    assert wrong == (grpc.StatusCode.PERMISSION_DENIED, "wrong service credential")
    # the first value of the key is the one checked
    assert cred.check([(key, SECRET), (key, "nope")]) is None
    assert cred.from_metadata([("a", "1"), (key, b"raw")]) == b"raw"
    # only that exact key: the secret under any other name (sorting before or after it) is no credential
    for other in ("x-wolfpack-credentials", "z-forwarded", "x-wolfpack", "authorization"):
        assert cred.from_metadata([(other, SECRET)]) is None, other
        assert cred.check([(other, SECRET)]) == missing, other
    assert cred.from_metadata([("a", "1")]) is None and cred.from_metadata(None) is None
    assert auth.Credential("").check(None) is None


def test_from_settings_reads_the_admin_secret() -> None:
    assert auth.from_settings(load_settings(admin_secret=SECRET)).matches(SECRET)
    assert not auth.from_settings(load_settings(admin_secret=SECRET)).matches("other")
    assert not auth.from_settings(load_settings()).enabled
    assert not auth.from_settings(object()).enabled  # settings without the field: open


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.3.4.5:1", True),  # all of 127/8 is loopback
        ("localhost:8080", True),
        ("[::1]:5", True),
        ("::1:5", True),  # unbracketed: the port is after the last colon
        (":5", False),  # an empty host binds every interface
        ("0.0.0.0:5", False),
        ("[::]:5", False),
        ("10.0.0.7:5", False),
        ("[fe80::1]:5", False),
        ("example.com:5", False),
        ("localhost.example.com:5", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert auth.is_loopback(address) is loopback


def test_check_bind_refuses_open_privileged_rpcs_beyond_loopback(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(PermissionError, match=r"environment: refusing to listen on 0\.0\.0\.0:1"):
        auth.check_bind(auth.Credential(""), "0.0.0.0:1", "environment")
    with caplog.at_level(logging.WARNING, logger="wolfpack.auth"):
        auth.check_bind(auth.Credential(""), "127.0.0.1:1", "environment")
    [warning] = [r for r in caplog.records if r.name == "wolfpack.auth"]
    assert warning.levelno == logging.WARNING and "open" in warning.getMessage()
    assert (warning.service, warning.address) == ("environment", "127.0.0.1:1")  # type: ignore[attr-defined]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="wolfpack.auth"):
        auth.check_bind(auth.Credential(SECRET), "0.0.0.0:1", "environment")  # a secret: any address
        auth.check_bind(auth.Credential(SECRET), "127.0.0.1:1", "environment")
    assert not [r for r in caplog.records if r.name == "wolfpack.auth"], "nothing to announce with a secret"


class _Context:
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata


def test_authorized() -> None:
    key = auth.METADATA_KEY
    assert auth.authorized(None, _Context([]))
    assert auth.authorized(auth.Credential(""), _Context([]))
    assert auth.authorized(auth.Credential(SECRET), _Context([(key, SECRET)]))
    assert not auth.authorized(auth.Credential(SECRET), _Context([]))
    assert not auth.authorized(auth.Credential(SECRET), _Context([(key, "nope")]))


# --------------------------------------------------------------------------- server interceptor, real gRPC


@pytest.mark.parametrize("method", [PUSH, LOAD])
async def test_privileged_methods_are_refused_before_the_handler_runs(method: str) -> None:
    server, recorder, target = await serve(auth.CredentialInterceptor(auth.Credential(SECRET)))
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            code, details = await refusal(ch, method)
            assert code == grpc.StatusCode.UNAUTHENTICATED and "x-wolfpack-credential" in details
            code, details = await refusal(ch, method, [(auth.METADATA_KEY, "nope")])
            assert (code, details) == (grpc.StatusCode.PERMISSION_DENIED, "wrong service credential")
            code, _ = await refusal(ch, method, [("z-wolfpack-credential", SECRET)])
            assert code == grpc.StatusCode.UNAUTHENTICATED, "the secret under another key is no credential"
            assert recorder.calls == [], "a refused call never reaches its handler"
            assert await call(ch, method, [(auth.METADATA_KEY, SECRET)]) == b"ok"
            # refused again after an authorized call: nothing is cached per method
            assert (await refusal(ch, method))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert [m for m, _md, _t in recorder.calls] == [method]
    finally:
        await server.stop(0)


async def test_every_call_kind_of_a_guarded_method_is_refused_with_its_code() -> None:
    """The interceptor builds its refusing handler of the same kind as the method's own."""
    guarded = frozenset({PUSH, LOAD, BATCH, CHAT})
    server, recorder, target = await serve(auth.CredentialInterceptor(auth.Credential(SECRET), guarded))
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            for method in (PUSH, LOAD, BATCH, CHAT):
                assert (await refusal(ch, method))[0] == grpc.StatusCode.UNAUTHENTICATED, method
                wrong = [(auth.METADATA_KEY, "nope")]
                assert (await refusal(ch, method, wrong))[0] == grpc.StatusCode.PERMISSION_DENIED, method
            assert recorder.calls == []
            for method in (PUSH, LOAD, BATCH, CHAT):
                reply = await call(ch, method, [(auth.METADATA_KEY, SECRET)])
                assert reply in (b"ok", [b"ok"], [b"ok", b"ok"]), method
            # not guarded: open without the credential
            assert await call(ch, GENERATE) == b"ok"
            # an unknown method stays UNIMPLEMENTED, with or without the credential
            unknown = f"/{INFERENCE}/Nope"
            for md in (None, [(auth.METADATA_KEY, "nope")], [(auth.METADATA_KEY, SECRET)]):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await ch.unary_unary(unknown)(b"x", metadata=md, timeout=10)
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(0)


async def test_ordinary_methods_and_an_open_server_need_nothing() -> None:
    server, recorder, target = await serve(auth.CredentialInterceptor(auth.Credential(SECRET)))
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            for method in (GENERATE, BATCH, CHAT, GET_EPISODE):
                assert await call(ch, method) in (b"ok", [b"ok"], [b"ok", b"ok"]), method
    finally:
        await server.stop(0)
    server, recorder, target = await serve(auth.CredentialInterceptor(auth.Credential("")))
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            assert await call(ch, PUSH) == b"ok"
            assert await call(ch, LOAD, [(auth.METADATA_KEY, "anything")]) == b"ok"
        assert [m for m, _md, _t in recorder.calls] == [PUSH, LOAD]
    finally:
        await server.stop(0)


# --------------------------------------------------------------------------- client interceptors, real gRPC


def test_client_interceptors_only_with_a_secret() -> None:
    assert auth.client_interceptors(load_settings()) == []
    assert auth.client_interceptors(object()) == []
    kinds = auth.client_interceptors(load_settings(admin_secret=SECRET))
    assert len(kinds) == 2
    assert isinstance(kinds[0], grpc.aio.UnaryUnaryClientInterceptor)
    assert isinstance(kinds[1], grpc.aio.StreamUnaryClientInterceptor)


async def test_a_configured_client_attaches_the_credential_to_privileged_calls_only() -> None:
    """The credential goes on exactly the privileged methods (PushWeights, LoadPolicy, GetEpisode,
    CloseEpisode, ListEpisodes, SpectateEpisode) and on no other; the caller's
    own metadata and deadline travel unchanged beside it."""
    server, recorder, target = await serve(auth.CredentialInterceptor(auth.Credential(SECRET)))
    interceptors = auth.client_interceptors(load_settings(admin_secret=SECRET))
    try:
        async with grpc.aio.insecure_channel(target, interceptors=interceptors) as ch:
            for method in (
                PUSH,
                LOAD,
                GET_EPISODE,
                CLOSE_EPISODE,
                LIST_EPISODES,
                SPECTATE,
                GENERATE,
                CREATE_EPISODE,
            ):
                await call(ch, method, [("x-caller", "kept")], timeout=30)
            # without metadata of its own, too
            await call(ch, LOAD)
            await call(ch, PUSH)
    finally:
        await server.stop(0)
    seen = {m: md for m, md, _t in recorder.calls[:8]}
    for method in (PUSH, LOAD, GET_EPISODE, CLOSE_EPISODE, LIST_EPISODES, SPECTATE):
        assert seen[method].get("x-wolfpack-credential") == SECRET, method
    for method in (GENERATE, CREATE_EPISODE):
        assert "x-wolfpack-credential" not in seen[method], method
    assert all(md.get("x-caller") == "kept" for md in seen.values())
    for method, md, _t in recorder.calls[8:]:
        assert md.get("x-wolfpack-credential") == SECRET, method
    for method, _md, remaining in recorder.calls[:8]:
        # the 30 s deadline arrives (grpc rounds it up a little); none would read as None
        assert remaining is not None and 0 < remaining < 31, (method, remaining)
