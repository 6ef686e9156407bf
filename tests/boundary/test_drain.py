"""SIGTERM drains in-flight calls: a server subprocess (the shared ``rpc.serve`` every service runs) gets
SIGTERM while a call is inside its handler; the call still completes OK, new calls are refused, and the
process exits 0 after logging the drain. With a zero grace (or no drain) the call is cancelled instead."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc

from .conftest import WAIT_S, ServerProcess

# A broken build may hang (a stuck event loop) instead of failing: bound each test.
pytestmark = pytest.mark.timeout(120)

# A RewardService whose ListRewardSpecs announces on stdout that it is running, then holds the call
# until the test creates the release file: "in flight" is an event here, not a sleep.
SERVER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from wolfpack import rpc
    from wolfpack.logs import setup_logging
    from wolfpack.settings import load_settings
    from wolfpack.v1 import reward_service_pb2 as pb, reward_service_pb2_grpc as pb_grpc

    release = Path(sys.argv[1])

    class Held(pb_grpc.RewardServiceServicer):
        async def ListRewardSpecs(self, request, context):
            print("in-flight", flush=True)
            while not release.exists():
                await asyncio.sleep(0.01)
            return pb.ListRewardSpecsResponse(specs=[pb.RewardSpecInfo(spec="drained")])

    def register(server):
        pb_grpc.add_RewardServiceServicer_to_server(Held(), server)
        return ["wolfpack.v1.RewardService"]

    settings = load_settings()
    setup_logging("drain-test", settings.log_level, settings.log_format)
    asyncio.run(rpc.serve("reward", register, settings, "127.0.0.1:0"))
    """
)


async def test_sigterm_drains_a_call_in_flight(spawn: Callable[..., ServerProcess], tmp_path: Path) -> None:
    script, release = tmp_path / "server.py", tmp_path / "release"
    script.write_text(SERVER)
    server = spawn([str(script), str(release)], {"WOLFPACK_GRPC_GRACE_S": "60"})
    target = f"127.0.0.1:{server.port()}"
    async with rpc.channel(target, load_settings(rpc_timeout_s=60)) as channel:
        stub = pb_grpc.RewardServiceStub(channel)
        call = asyncio.ensure_future(stub.ListRewardSpecs(pb.ListRewardSpecsRequest()))
        assert await asyncio.to_thread(server.stdout_line) == "in-flight\n"

        server.proc.send_signal(15)  # SIGTERM, as Kubernetes and `wolfpack up` send it
        await asyncio.to_thread(
            server.wait_log, lambda r: r.get("msg", "").startswith("shutting down"), "drain"
        )
        # Draining: new calls are refused (health first reports NOT_SERVING, then the port closes).
        assert await rpc.check_health(target, timeout_s=5) in ("NOT_SERVING", "UNREACHABLE")
        with_deadline = load_settings(rpc_timeout_s=5)
        async with rpc.channel(target, with_deadline) as fresh:
            try:
                await pb_grpc.RewardServiceStub(fresh).Score(pb.ScoreRequest(), wait_for_ready=False)
                refused = False
            except grpc.aio.AioRpcError as exc:
                refused = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED)
        assert refused

        release.touch()
        response = await asyncio.wait_for(call, timeout=60)
    assert [s.spec for s in response.specs] == ["drained"]
    assert await asyncio.to_thread(server.proc.wait, 60) == 0
    logs = await asyncio.to_thread(server.drain_logs)
    assert any(r.get("msg") == "stopped" for r in logs), logs[-5:]


async def test_shutdown_reports_not_serving_to_health_watchers_before_draining() -> None:
    """Load balancers watching health see NOT_SERVING as the shutdown starts (new calls are already
    refused by then, so a watch opened beforehand is how anyone can see it)."""

    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_RewardServiceServicer_to_server(pb_grpc.RewardServiceServicer(), server)
        return ["wolfpack.v1.RewardService"]

    server = await rpc.start_server("reward", register, load_settings(), "127.0.0.1:0")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        first = await asyncio.wait_for(watch.read(), timeout=WAIT_S)
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.ensure_future(server.stop(grace=1.0))  # the open watch is drained for 1 s
        second = await asyncio.wait_for(watch.read(), timeout=WAIT_S)
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await stopping
