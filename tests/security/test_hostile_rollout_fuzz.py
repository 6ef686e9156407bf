"""Fuzzing the rollout service's wire surface with Hypothesis (issue 20: the fuzz tests covered every
service but rollout). ``GetRolloutStatus`` takes an empty request, so what a caller controls is the bytes
of that request (any well-formed protobuf: unknown fields of every wire type, nested, repeated), the
metadata and the credential; the server's side is its live counters (failures with odd reasons, zero
elapsed time). Every answer must be OK with a response that parses and says what the counters hold, or a
documented status (docs/security.md). Real server over gRPC on a loopback port.

Corrupt bytes (not a protobuf at all) are left out here: every server answers them INVALID_ARGUMENT before
any servicer runs (``rpc.ErrorInterceptor``), checked for every call kind in ``libs/tests/test_errors.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wolfpack import auth, rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import rollout_service_pb2 as pb
from wolfpack_rollout.server import RolloutServicer, register

from .test_fuzz import DOCUMENTED, FUZZ

SECRET = "rollout-fuzz-credential"
METHOD = "/wolfpack.v1.RolloutService/GetRolloutStatus"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


@st.composite
def unknown_fields(draw: st.DrawFn, depth: int = 0) -> bytes:
    """Well-formed protobuf bytes of fields the request does not declare: varints, fixed64/32 and
    length-delimited values (some of them nested messages of the same kind)."""
    out = b""
    for _ in range(draw(st.integers(0, 4))):
        number = draw(st.integers(1, 2**29 - 1).filter(lambda n: not 19000 <= n <= 19999))
        wire = draw(st.sampled_from([0, 1, 2, 5]))
        out += _varint(number << 3 | wire)
        if wire == 0:
            out += _varint(draw(st.integers(0, 2**64 - 1)))
        elif wire == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wire == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        else:
            payload = (
                draw(unknown_fields(depth + 1))
                if depth < 2 and draw(st.booleans())
                else draw(st.binary(max_size=64))
            )
            out += _varint(len(payload)) + payload
    return out


METADATA = st.lists(
    st.tuples(
        st.from_regex(r"\A[a-z0-9][a-z0-9_.-]{0,15}\Z").filter(
            lambda k: not k.startswith("grpc") and not k.endswith("-bin")
        ),
        st.from_regex(r"\A[ -~]{0,40}\Z"),
    ),
    max_size=4,
)


class Served:
    def __init__(self, loop: asyncio.AbstractEventLoop, target: str, servicer: RolloutServicer) -> None:
        self.loop, self.target, self.servicer = loop, target, servicer


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servicer = RolloutServicer()
    servicer.worker_id = "w-\u00e9\u6f22"
    servicer.stats.failures.update({"odd \u0000 reason \ud7ff": 3, "": 1, "x" * 500: 2})

    async def start() -> rpc.Server:
        settings = load_settings(admin_secret=SECRET)
        return await rpc.start_server("rollout", lambda s: register(s, servicer), settings, "127.0.0.1:0")

    started: Future[rpc.Server] = asyncio.run_coroutine_threadsafe(start(), loop)
    server = started.result(timeout=60)
    try:
        yield Served(loop, f"127.0.0.1:{server.port}", servicer)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def test_rollout_status_answers_only_documented_statuses(served: Served) -> None:
    with grpc.insecure_channel(served.target) as channel:
        call: Any = channel.unary_unary(METHOD)  # bytes in, bytes out: the fuzzer writes the wire itself

        @FUZZ
        @given(unknown_fields(), METADATA, st.booleans())
        def check(body: bytes, metadata: list[tuple[str, str]], credential: bool) -> None:
            meta = (*metadata, *([(auth.METADATA_KEY, SECRET)] if credential else []))
            try:
                raw = call(body, metadata=meta, timeout=30)
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                assert code in DOCUMENTED, f"{code}: {exc.details()}"  # type: ignore[attr-defined]
                return
            resp = pb.GetRolloutStatusResponse.FromString(raw)
            assert resp.worker_id == served.servicer.worker_id
            assert {f.reason: f.count for f in resp.failures} == dict(served.servicer.stats.failures)

        check()
