"""What the player (``driver.py``) plays against: three small interfaces, over gRPC or in process.

The driver needs little of each service, and that little is the seam:

* ``Environment`` — ``play_stream()`` (one PlaySeats call at the message level: create / act out,
  ``PlaySeatsResponse`` in), ``get_episode`` and ``close_episode``. ``EnvironmentClient`` is one as it is
  (its ``PlayStream`` is the one PlaySeats client). Over gRPC it opts in to the prompt sent once
  (``PlaySeatsRequest.omit_messages``: ``Observation.text`` only) and rebuilds ``Observation.messages``
  from the text exactly as the server would, so the driver, which passes ``obs.messages`` on to
  GenerateBatch, sees the same decisions for half the prompt bytes on the wire.
* ``Inference`` — ``generate_batch(requests)``: one ``BatchResult`` per request, as each finishes (over
  gRPC the inference client's ``BatchItem``, every batch a message of one GenerateBatchStream call, see
  ``BATCH_STREAM``).
* ``Reward`` — ``score(ScoreRequest)``.

``GrpcInference`` and ``GrpcReward`` put the services behind the last two. The trainer's local mode
passes in-process ones instead (the game engines, the learner's own weights, the reward library:
``wolfpack_trainer.local_rollout``), so every producer of trajectories plays through the same loop and
builds the same ``Trajectory`` protos. Errors: the driver retries ``grpc.aio.AioRpcError`` with a
transient code; anything else an in-process backend raises fails that episode as ``internal:<type>``.

gRPC (the stubs, the inference client) is imported by the gRPC backends when they are made: the local
mode loads none of it. ``BatchItem`` (the inference client's item) is imported when asked for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import reward_service_pb2 as rew_pb

if TYPE_CHECKING:
    import grpc

    from wolfpack_inference.client import BatchItem

__all__ = [
    "BatchItem", "BatchResult", "Environment", "EpisodeStream", "GrpcInference", "GrpcReward", "Inference",
    "Reward",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "BatchItem":
        from wolfpack_inference.client import BatchItem

        return BatchItem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class BatchResult(Protocol):
    """What the driver reads of one outcome of a batch: ``response`` when it succeeded, else the status
    ``code`` and ``message``. The inference client's ``BatchItem`` is one."""

    @property
    def index(self) -> int: ...

    @property
    def response(self) -> inf_pb.GenerateResponse | None: ...

    @property
    def code(self) -> grpc.StatusCode: ...

    @property
    def message(self) -> str: ...


class EpisodeStream(Protocol):
    """One PlaySeats call: requests are queued and flushed in batches, responses read one at a time."""

    def create(self, req: env_pb.CreateEpisodeRequest) -> None: ...

    def act(self, episode_id: str, token: str, turn_id: int, decision: str | common_pb2.Action) -> None: ...

    async def read(self) -> env_pb.PlaySeatsResponse:
        """The next server message; raises (e.g. ``ConnectionError``) when the stream is gone."""
        ...

    async def close(self) -> None: ...


class Environment(Protocol):
    def play_stream(
        self, *, include_text: bool = True, close_finished: bool = False, rejected_results_only: bool = False
    ) -> EpisodeStream:
        """With ``include_text`` every decision ``read`` returns has ``text`` and ``messages`` (one user
        message equal to the text), however the backend carries them."""
        ...

    async def get_episode(self, episode_id: str, token: str) -> env_pb.GetEpisodeResponse: ...

    async def close_episode(self, episode_id: str, admin_token: str) -> bool: ...


class Inference(Protocol):
    def generate_batch(
        self, requests: Sequence[inf_pb.GenerateRequest], *, timeout: float | None = None
    ) -> AsyncIterator[BatchResult]:
        """One ``BatchResult`` per request (its ``index`` into ``requests``), in any order."""
        ...


class Reward(Protocol):
    async def score(self, request: rew_pb.ScoreRequest) -> rew_pb.ScoreResponse: ...


BATCH_STREAM = True
"""``GrpcInference`` sends every batch as a message of one GenerateBatchStream call (``BatchStream``)
instead of a GenerateBatch call each: a rollout sends about one batch per two policy turns, and each call
cost both ends its setup, headers, status and interceptors. ``bench/rollout/bench_rollout.py --baseline``
turns it off to compare (then each batch is a GenerateBatch call, the path before)."""


class GrpcInference:
    """``Inference`` over the inference service: every batch a message of one long-lived
    GenerateBatchStream call (``BATCH_STREAM``), opened at the first batch and closed by ``aclose``."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc
        from wolfpack_inference.client import BatchStream

        self.stub = inf_grpc.InferenceServiceStub(channel)
        self.stream = BatchStream(self.stub)

    def generate_batch(
        self, requests: Sequence[inf_pb.GenerateRequest], *, timeout: float | None = None
    ) -> AsyncIterator[BatchItem]:
        if BATCH_STREAM:
            return self.stream.generate_batch(requests, timeout=timeout)
        from wolfpack_inference.client import generate_batch

        return generate_batch(self.stub, requests, timeout=timeout)

    async def aclose(self) -> None:
        await self.stream.aclose()


class GrpcReward:
    """``Reward`` over the reward service's Score."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        from wolfpack.v1 import reward_service_pb2_grpc as rew_grpc

        self.stub = rew_grpc.RewardServiceStub(channel)

    async def score(self, request: rew_pb.ScoreRequest) -> rew_pb.ScoreResponse:
        response: rew_pb.ScoreResponse = await self.stub.Score(request)
        return response
