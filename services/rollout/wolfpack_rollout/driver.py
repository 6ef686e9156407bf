"""The self-play driver: tasks → PlaySeats → GenerateBatch → Score → stream.

    driver = RolloutDriver(config, environment=env, inference_channel=ch_inf, reward_channel=ch_rew,
                           curriculum=curriculum, producer=producer)
    trajectories = await driver.play(tasks)          # eval: play these, return scored trajectories
    summary = await driver.run(200, split="train")   # train: pull tasks, play, append to the stream

How it is built, and why:

* **One PlaySeats stream** carries every episode of a call: creates, decisions and acts go both ways in
  batches (the environment's fast path). A create's ``request_id`` is the trajectory id; the server's
  episode id comes back with it and routes the episode's decisions and results.
* **Decisions that arrive together are generated together**: each server message's decisions become one
  GenerateBatch; every item carries its own turn's trace context. Results go back as raw text; the
  environment parses them.
* **Validity comes from the environment**: every act's result comes back (not ``rejected_results_only``:
  an accepted result carries the applied action, which goes into ``Turn.action``); a rejected one marks
  the attempt invalid (re-prompted) or defaulted; the re-prompt arrives as a decision with the same turn id.
* **A late answer is what the game made of it**: an answer that comes after the environment's turn timeout
  applied the default (the act's result is the timeout's, replayed) is recorded defaulted, in its turn's place
  among the seat's turns; in ``conversation`` mode the seat's chat moves on only with answers the game read
  (their result came back before the seat's next decision), so no later prompt carries a move never made.
* **Finishing is off the stream's path**: an ended episode is read (GetEpisode with the admin token: roles,
  outcomes, event log), closed, built into a ``Trajectory`` (``trajectory.py``), scored by the reward
  service and handed to the sink while the stream keeps playing the others. ``concurrency`` counts an
  episode until its trajectory is delivered, so a slow stream (backpressure) or reward service slows
  the creation of new episodes instead of piling work up.
* **Nothing is dropped silently**: an episode either yields a complete scored trajectory or is counted in
  ``stats.failures`` by reason; appends are one atomic, idempotent (by trajectory id) stream entry each.
* **One trace per episode**: an ``episode`` span is opened per episode; its context goes into the create
  request, each generate item and the trajectory (``Trajectory.trace``), and the Score call and the
  stream append run under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from wolfpack import stream as wolfpack_stream
from wolfpack import tracing
from wolfpack.errors import code_of
from wolfpack.stream import ProtoStreamProducer
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import curriculum_service_pb2 as cur_pb
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import reward_service_pb2 as rew_pb
from wolfpack_curriculum.client import CurriculumClient, outcome_of
from wolfpack_rollout.backends import Environment, EpisodeStream, GrpcInference, GrpcReward, Inference, Reward
from wolfpack_rollout.config import RolloutConfig, SamplingConfig
from wolfpack_rollout.prompts import ChatCodec, Message, SeatChat, conversation_turn, render_messages
from wolfpack_rollout.summary import EpisodeFailure, RolloutSummary, summarize
from wolfpack_rollout.trajectory import EpisodeResult, TurnRecord, build_trajectory

if TYPE_CHECKING:
    import grpc
    from opentelemetry.context import Context

__all__ = [
    "ChatCodec",
    "EpisodeFailed",
    "PromptEncoder",
    "RolloutConfig",
    "RolloutDriver",
    "RolloutStats",
    "RolloutSummary",
    "SamplingConfig",
    "Task",
]

Task = cur_pb.Task
PromptEncoder = Callable[[Sequence[common_pb2.ChatMessage]], list[int]]
"""Chat messages -> the policy's prompt token ids (its chat template, generation prompt included): what
``RolloutConfig.max_prompt_tokens`` crops. The trainer passes its tokenizer's; the services have none."""
log = logging.getLogger(__name__)
tracer = tracing.Tracer(__name__)  # spans once OpenTelemetry is loaded (services); none in local mode

TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})
"""The gRPC status codes (``grpc.StatusCode`` names) worth a retry. Names, so that the trainer's local
mode, which plays through this driver with no service, loads no gRPC."""


def _rpc_errors() -> tuple[type[grpc.aio.AioRpcError], ...]:
    """What a failed gRPC call raises, to catch: gRPC's ``AioRpcError`` once gRPC is loaded, else nothing
    (only gRPC, or a backend that imports it to raise it, can raise one)."""
    aio = sys.modules.get("grpc.aio")
    return (aio.AioRpcError,) if aio is not None else ()


# The stream's backpressure error (the lossless stream raises it once its wait ran out); absent from older
# versions of ``wolfpack.stream``, where appends never refuse.
_BACKPRESSURE: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(wolfpack_stream, "StreamBackpressureError", None),) if isinstance(t, type)
)


@dataclass(frozen=True)
class _CounterDelta:
    """The driver counters a ``run`` summarises (``summary._Counters``), as taken from ``RolloutStats``."""

    generated_tokens: int
    truncated_responses: int
    compressed_prompts: int
    backpressure_wait_s: float
    stale_acts: int

    @classmethod
    def of(cls, stats: RolloutStats) -> _CounterDelta:
        return cls(**{f.name: getattr(stats, f.name) for f in fields(cls)})

    def since(self, before: _CounterDelta) -> _CounterDelta:
        return _CounterDelta(
            **{f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self)}
        )


class EpisodeFailed(Exception):
    """An episode could not be completed; ``reason`` is the counted failure reason."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class RolloutStats:
    """Counters of one driver (what GetRolloutStatus and the CLI summary report)."""

    started_at: float = field(default_factory=time.monotonic)
    episodes_started: int = 0
    episodes_finished: int = 0
    episodes_failed: int = 0
    in_flight: int = 0
    turns: int = 0
    generated_tokens: int = 0
    truncated_responses: int = 0
    compressed_prompts: int = 0
    truncated_episodes: int = 0
    stale_acts: int = 0
    retries: int = 0
    backpressure_waits: int = 0
    backpressure_wait_s: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)
    recent_failures: deque[EpisodeFailure] = field(default_factory=lambda: deque(maxlen=256))
    """The latest failed episodes with their detail (bounded: a long-running worker keeps only these)."""

    def fail(self, reason: str, detail: str = "", task: cur_pb.Task | None = None) -> None:
        self.episodes_failed += 1
        self.failures[reason] += 1
        where = f"{task.bucket or task.game.game_id} seed {task.seed}" if task is not None else ""
        self.recent_failures.append(EpisodeFailure(self.episodes_failed, reason, detail, where))


@dataclass(frozen=True)
class _Asked:
    """A conversation prompt sent: its messages (ending with the new user message) and whether it started
    the seat's conversation again because the continued one passed ``max_prompt_tokens``."""

    messages: list[Message]
    restarted: bool


@dataclass(eq=False)
class _Episode:
    task: cur_pb.Task
    trajectory_id: str
    span: tracing.Span
    context: Context | None  # the episode span's; None where nothing traces (``tracing``)
    trace: common_pb2.TraceContext
    ended: asyncio.Future[None]
    policy_of: dict[int, str] = field(default_factory=dict)
    episode_id: str = ""
    admin_token: str = ""
    seat_tokens: dict[int, str] = field(default_factory=dict)
    records: list[TurnRecord] = field(default_factory=list)
    past: dict[int, list[str]] = field(default_factory=dict)
    last: dict[int, TurnRecord] = field(default_factory=dict)
    """Each seat's record of its newest turn answered (a late answer of an older turn does not move it)."""
    by_turn: dict[tuple[int, int], TurnRecord] = field(default_factory=dict)
    """The record of each (seat, turn id)'s latest attempt: what the environment's result of that act marks."""
    finals: dict[int, env_pb.Observation] = field(default_factory=dict)
    decisions: int = 0
    chats: dict[int, SeatChat] = field(default_factory=dict)
    """Each seat's conversation so far (``conversation`` prompt mode)."""
    asked: dict[tuple[int, int, int], _Asked] = field(default_factory=dict)
    """The conversation prompt of each request in flight, by (seat, turn id, attempt), until answered."""
    latest_ask: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Each seat's newest conversation prompt, (turn id, attempt): only its answer can move the chat on."""
    pending_chat: dict[int, tuple[int, SeatChat]] = field(default_factory=dict)
    """A seat's conversation with its newest answer, (turn id, chat), until the game has read that answer:
    its act's result makes it the seat's ``chats``; the seat's next decision coming first, or a result
    saying the game had already applied its default, drops it (the answer came after the turn timeout, and
    the game went on without it)."""
    truncated: str = ""
    failure: EpisodeFailed | None = None
    stream: _PlayStream | None = None
    started_at: float = field(default_factory=time.time)
    """Wall clock when the driver began the episode (``Trajectory.started_at``)."""

    @property
    def closed(self) -> bool:
        return self.ended.done()

    def end(self, *, truncated: str = "", failure: EpisodeFailed | None = None) -> None:
        if self.ended.done():
            return
        self.truncated = truncated
        self.failure = failure
        self.ended.set_result(None)


def _error_of(item: env_pb.SeatActResult | env_pb.CreatedEpisode) -> tuple[str, str]:
    """(status code name, message) of a PlaySeats item's request error; ("", "") when it has none."""
    if not item.HasField("error"):
        return "", ""
    return code_of(item.error).name, item.error.message


class _PlayStream:
    """The driver's side of one PlaySeats call: routes the server's messages to episodes (results to their
    records, ends to their futures) and hands decisions to ``on_decisions``; the transport is the
    environment backend's ``EpisodeStream`` (over gRPC: the environment client's ``PlayStream``)."""

    def __init__(
        self,
        transport: EpisodeStream,
        episodes: dict[str, _Episode],
        on_decisions: Callable[[list[tuple[_Episode, env_pb.Observation]]], None],
        stats: RolloutStats,
    ) -> None:
        self.transport = transport
        self.episodes = episodes
        self.on_decisions = on_decisions
        self.stats = stats
        self.failure: BaseException | None = None
        self.reader = asyncio.create_task(self._read_loop())

    async def close(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader
        with contextlib.suppress(Exception):
            await self.transport.close()

    @property
    def broken(self) -> bool:
        return self.failure is not None or self.reader.done()

    def create(self, req: env_pb.CreateEpisodeRequest) -> None:
        self.transport.create(req)

    def act(self, ep: _Episode, seat: int, turn_id: int, text: str) -> None:
        token = ep.seat_tokens.get(seat)
        if token is None or ep.closed:
            return
        self.transport.act(ep.episode_id, token, turn_id, text)

    def _broke(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        failure = EpisodeFailed("environment_stream", f"{type(exc).__name__}: {exc}")
        for ep in list(self.episodes.values()):
            ep.end(failure=failure)

    async def _read_loop(self) -> None:
        try:
            while True:
                self._handle(await self.transport.read())
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._broke(exc)

    def _handle(self, message: env_pb.PlaySeatsResponse) -> None:
        for created in message.created:
            ep = self.episodes.get(created.request_id)
            if ep is None:
                continue
            code, reason = _error_of(created)
            if code:
                ep.end(failure=EpisodeFailed("create_failed", f"{code}: {reason}"))
                continue
            ep.episode_id = created.episode.episode_id
            self.episodes[ep.episode_id] = ep  # decisions and results name the server's episode id
            ep.admin_token = created.episode.admin_token
            ep.seat_tokens = {t.seat: t.token for t in created.episode.seat_tokens}
            if not ep.seat_tokens:
                ep.end()  # every seat scripted: it ended inside CreateEpisode
        for result in message.results:
            ep = self.episodes.get(result.episode_id)
            if ep is None or ep.closed:
                continue
            code, reason = _error_of(result)
            pending = ep.pending_chat.get(result.seat)
            if pending is not None and pending[0] == result.turn_id:
                del ep.pending_chat[result.seat]
                if not (code or (result.defaulted and result.duplicate)):
                    ep.chats[result.seat] = pending[1]
            rec = ep.by_turn.get((result.seat, result.turn_id))
            if rec is None:
                continue
            if result.HasField("action"):  # what the environment applied: the parsed action or the default
                rec.action = result.action
            if code:  # a stale turn: the environment moved on (turn timeout) and applied its default
                self.stats.stale_acts += 1
                rec.valid, rec.defaulted, rec.invalid_reason = False, True, f"{code}: {reason}"
            elif result.defaulted:
                # The game applied its default, not this answer: the last re-prompt's, or (``duplicate``: the
                # timeout's own result replayed) an answer that came after the turn timeout had applied it.
                # Kept as given it would read as a move the game made (the scenario verifier's transcript).
                self.stats.stale_acts += result.duplicate
                rec.valid, rec.defaulted, rec.invalid_reason = False, True, result.reason or "defaulted"
            elif not result.accepted:  # re-prompted (a default is the branch above)
                rec.valid, rec.invalid_reason = False, result.reason or "rejected"
        due: list[tuple[_Episode, env_pb.Observation]] = []
        for obs in message.decisions:
            ep = self.episodes.get(obs.episode_id)
            if ep is None or ep.closed:
                continue
            if obs.done:
                ep.finals[obs.seat] = obs
                if ep.seat_tokens and len(ep.finals) >= len(ep.seat_tokens):
                    ep.end()
            elif obs.your_turn and obs.turn_id:
                due.append((ep, obs))
        if due:
            self.on_decisions(due)


class RolloutDriver:
    """Plays tasks through the environment, inference and reward services (see the module docstring)."""

    def __init__(
        self,
        config: RolloutConfig,
        *,
        environment: Environment,
        inference_channel: grpc.aio.Channel | None = None,
        reward_channel: grpc.aio.Channel | None = None,
        curriculum: CurriculumClient | None = None,
        producer: ProtoStreamProducer[trajectory_pb2.Trajectory] | None = None,
        inference: Inference | None = None,
        reward: Reward | None = None,
        encode_prompt: PromptEncoder | None = None,
        chat_codec: ChatCodec | None = None,
    ) -> None:
        """The services over gRPC (``environment`` an ``EnvironmentClient``, the channels of inference and
        reward), or any ``backends`` in their place (``inference``/``reward`` instead of the channels): the
        trainer's local mode plays in process this way. ``encode_prompt`` lets ``max_prompt_tokens`` crop;
        ``chat_codec`` (the policy's chat template and tokenizer) builds ``conversation`` prompts."""
        self.config = config
        self.environment = environment
        self._own_inference: GrpcInference | None = None
        if inference is None:
            if inference_channel is None:
                raise ValueError("RolloutDriver needs inference_channel or an inference backend")
            inference = self._own_inference = GrpcInference(inference_channel)
        if reward is None:
            if reward_channel is None:
                raise ValueError("RolloutDriver needs reward_channel or a reward backend")
            reward = GrpcReward(reward_channel)
        self.inference: Inference = inference
        self.reward: Reward = reward
        self.encode_prompt = encode_prompt
        self.chat_codec = chat_codec
        self.curriculum = curriculum
        self.producer = producer
        self.worker_id = config.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.stats = RolloutStats()
        self.trajectories: list[trajectory_pb2.Trajectory] = []  # of the current play()/run(), for summaries
        self.stop_event: asyncio.Event | None = None  # set it to make run() take no new task (drain)
        self._tasks: set[asyncio.Task[Any]] = set()

    async def close(self) -> None:
        """Close what the driver opened itself: the batch stream of the ``GrpcInference`` it made from
        ``inference_channel``. The channels and clients passed in stay the caller's."""
        if self._own_inference is not None:
            await self._own_inference.aclose()

    # ------------------------------------------------------------------ public API
    async def play(self, tasks: Sequence[cur_pb.Task]) -> list[trajectory_pb2.Trajectory]:
        """Play ``tasks`` (``config.concurrency`` at a time) and return their scored trajectories in task
        order; failed episodes are left out and counted in ``stats.failures``. Nothing is appended to the
        stream and nothing is reported (evaluation uses this).

        One call at a time per driver (``play`` and ``run`` alike): a call's end cancels every task the
        driver spawned, and callers that change ``config`` for a call (the trainer's evaluations set their
        temperature so) change it for the driver. To play two lists at once, use two drivers."""
        out: dict[int, trajectory_pb2.Trajectory] = {}

        async def keep(seq: int, task: cur_pb.Task, traj: trajectory_pb2.Trajectory) -> None:
            out[seq] = traj  # the n-th task drawn is tasks[n] (the same Task object may repeat)

        await self._drive(_aiter(tasks), keep)
        return [out[i] for i in sorted(out)]

    async def run(
        self, episodes: int, split: str = "train", *, on_episode: Callable[[], None] | None = None
    ) -> RolloutSummary:
        """Pull ``episodes`` tasks from the curriculum (rounded up to whole groups), play them, append each
        scored trajectory to the stream (when a producer is set; else report outcomes to the curriculum by
        RPC) and summarise. Setting ``stop_event`` stops pulling tasks; the episodes in flight finish."""
        if self.curriculum is None:
            raise ValueError("run() needs a curriculum client; use play(tasks) for a fixed task list")
        curriculum = self.curriculum
        self.trajectories = []
        started = time.monotonic()
        failed_before = Counter(self.stats.failures)
        numbered_before = self.stats.episodes_failed
        before = _CounterDelta.of(self.stats)

        async def tasks() -> AsyncIterator[cur_pb.Task]:
            left = episodes
            while left > 0 and not (self.stop_event is not None and self.stop_event.is_set()):
                want = min(left, self.config.concurrency)
                batch = await self._retrying(
                    lambda n=want: curriculum.next_tasks(n, split, self.worker_id),  # type: ignore[misc]
                    "curriculum_unavailable",
                )
                if not batch:
                    raise EpisodeFailed("curriculum_empty", f"NextTasks returned no task for split {split!r}")
                for task in batch:  # whole groups, even past ``episodes``: a cut group is useless to GRPO
                    yield task
                left -= len(batch)

        async def deliver(seq: int, task: cur_pb.Task, traj: trajectory_pb2.Trajectory) -> None:
            if self.producer is not None:
                await self._append(traj)
            else:
                await self._retrying(
                    lambda: curriculum.report_outcomes([outcome_of(traj)]), "curriculum_unavailable"
                )
            self.trajectories.append(traj)
            if on_episode is not None:
                on_episode()

        await self._drive(tasks(), deliver)
        failures = self.stats.failures - failed_before
        delta = _CounterDelta.of(self.stats).since(before)
        examples = [f for f in self.stats.recent_failures if f.number > numbered_before]
        return summarize(self.trajectories, failures, time.monotonic() - started, delta, examples)

    # ------------------------------------------------------------------ the loop
    async def _drive(
        self,
        tasks: AsyncIterator[cur_pb.Task],
        sink: Callable[[int, cur_pb.Task, trajectory_pb2.Trajectory], Awaitable[None]],
    ) -> None:
        """Play every task ``tasks`` yields (``concurrency`` at a time) and hand each scored trajectory to
        ``sink(seq, task, trajectory)``, ``seq`` being the task's position in ``tasks``. If ``tasks``
        raises, the episodes already started still finish (and are delivered) before it propagates."""
        if self.config.prompt_mode == "conversation":
            if self.chat_codec is None:
                raise ValueError(
                    "prompt_mode 'conversation' needs the policy's chat template and tokenizer "
                    "(RolloutDriver(chat_codec=...); the trainer passes its own)"
                )
        elif self.config.max_prompt_tokens and self.encode_prompt is None:
            raise ValueError(
                "max_prompt_tokens needs a prompt encoder (the policy's tokenizer: RolloutDriver(encode_prompt=...))"
            )
        episodes: dict[str, _Episode] = {}
        slots = asyncio.Semaphore(self.config.concurrency)
        lifecycles: set[asyncio.Task[None]] = set()
        stream: _PlayStream | None = None
        seq = -1
        try:
            try:
                async for task in tasks:
                    seq += 1
                    await slots.acquire()
                    if stream is None or stream.broken:
                        if stream is not None:
                            await stream.close()
                        # every act's result comes back (an accepted one carries the applied action)
                        transport = self.environment.play_stream(include_text=True, close_finished=False)
                        stream = _PlayStream(
                            transport, episodes, self._on_decisions_for(episodes), self.stats
                        )
                    ep = self._new_episode(task)
                    ep.stream = stream
                    episodes[ep.trajectory_id] = ep
                    stream.create(self._create_request(ep))
                    self.stats.episodes_started += 1
                    self.stats.in_flight += 1
                    life = asyncio.create_task(self._lifecycle(ep, episodes, slots, sink, seq))
                    lifecycles.add(life)
                    life.add_done_callback(lifecycles.discard)
            finally:  # the task source ended or failed: what was started finishes either way
                while lifecycles:
                    await asyncio.gather(*list(lifecycles))
        finally:
            for life in list(lifecycles):
                life.cancel()
            for pending in list(self._tasks):
                pending.cancel()
            if stream is not None:
                await stream.close()

    def _new_episode(self, task: cur_pb.Task) -> _Episode:
        trajectory_id = uuid.uuid4().hex
        span = tracer.start_span(
            "episode",  # no parent: a new trace per episode
            attributes={
                "wolfpack.trajectory_id": trajectory_id, "wolfpack.task_id": task.task_id,
                "wolfpack.game.id": task.game.game_id, "wolfpack.game.variant": task.game.variant,
                "wolfpack.seed": task.seed, "wolfpack.rollout.worker": self.worker_id,
            },
        )  # fmt: skip
        ctx = tracing.context_of(span)
        tc = common_pb2.TraceContext()
        if ctx is not None:
            tracing.inject_into(tc, ctx)
        ep = _Episode(task, trajectory_id, span, ctx, tc, asyncio.get_running_loop().create_future())
        ep.policy_of = {
            b.seat: b.policy.policy_id
            for b in task.seats
            if b.controller == common_pb2.SEAT_CONTROLLER_POLICY
        }
        return ep

    def _create_request(self, ep: _Episode) -> env_pb.CreateEpisodeRequest:
        t = ep.task
        req = env_pb.CreateEpisodeRequest(
            game=t.game, seed=t.seed, seats=list(t.seats), language=self.config.language,
            turn_timeout_s=self.config.turn_timeout_s, options=dict(t.options), scenario_id=t.scenario_id,
            request_id=ep.trajectory_id,
        )  # fmt: skip
        req.trace.CopyFrom(ep.trace)
        return req

    async def _lifecycle(
        self,
        ep: _Episode,
        episodes: dict[str, _Episode],
        slots: asyncio.Semaphore,
        sink: Callable[[int, cur_pb.Task, trajectory_pb2.Trajectory], Awaitable[None]],
        seq: int,
    ) -> None:
        try:
            await ep.ended
            if ep.failure is not None:
                raise ep.failure
            traj = await self._finish(ep)
            token = tracing.attach(ep.context)
            try:
                await sink(seq, ep.task, traj)
            finally:
                tracing.detach(token)
            self.stats.episodes_finished += 1
            if ep.truncated:
                self.stats.truncated_episodes += 1
        except EpisodeFailed as exc:
            self.stats.fail(exc.reason, exc.detail, ep.task)
            ep.span.set_attribute("error.type", exc.reason)
            log.warning(
                "episode failed: %s", exc, extra={"trajectory_id": ep.trajectory_id, "reason": exc.reason}
            )
            await self._close_quietly(ep)
        except Exception as exc:
            self.stats.fail(f"internal:{type(exc).__name__}", str(exc), ep.task)
            ep.span.record_exception(exc)
            log.exception("episode failed", extra={"trajectory_id": ep.trajectory_id})
            await self._close_quietly(ep)
        finally:
            episodes.pop(ep.trajectory_id, None)
            episodes.pop(ep.episode_id, None)
            self.stats.in_flight -= 1
            ep.span.end()
            slots.release()

    async def _close_quietly(self, ep: _Episode) -> None:
        if ep.admin_token:
            with contextlib.suppress(*_rpc_errors()):
                await self.environment.close_episode(ep.episode_id, ep.admin_token)

    async def _finish(self, ep: _Episode) -> trajectory_pb2.Trajectory:
        """Read the ended episode, release it, build and score its trajectory."""
        if not ep.admin_token:
            raise EpisodeFailed("create_failed", "the environment returned no admin token")
        state = await self._retrying(
            lambda: self.environment.get_episode(ep.episode_id, ep.admin_token), "environment_unavailable"
        )
        await self._close_quietly(ep)
        traj = build_trajectory(
            ep.task, trajectory_id=ep.trajectory_id, episode_id=ep.episode_id, records=ep.records,
            result=EpisodeResult.from_pb(state), trace=ep.trace, truncated=ep.truncated,
            worker_id=self.worker_id, started_at=ep.started_at,
        )  # fmt: skip
        if not traj.turns:
            raise EpisodeFailed("no_turns", _no_turns_detail(ep, self.config))
        token = tracing.attach(ep.context)
        t0 = time.monotonic()
        try:
            scored = await self._retrying(
                lambda: self.reward.score(rew_pb.ScoreRequest(trajectory=traj, spec=self.config.reward_spec)),
                "reward_unavailable",
            )
        finally:
            tracing.detach(token)
        out: trajectory_pb2.Trajectory = scored.trajectory
        out.score_ms = (time.monotonic() - t0) * 1e3
        return out

    # ------------------------------------------------------------------ generation
    def _on_decisions_for(
        self, episodes: dict[str, _Episode]
    ) -> Callable[[list[tuple[_Episode, env_pb.Observation]]], None]:
        def on_decisions(due: list[tuple[_Episode, env_pb.Observation]]) -> None:
            items: list[tuple[_Episode, env_pb.Observation]] = []
            for ep, obs in due:
                ep.decisions += 1
                if ep.decisions > self.config.max_turns:
                    ep.end(truncated="turn_cap")
                    continue
                if obs.seat not in ep.policy_of:
                    ep.end(failure=EpisodeFailed("unplayable_seat", f"seat {obs.seat} is not a policy seat"))
                    continue
                items.append((ep, obs))
            if not items:
                return
            self._spawn(self._generate(items))  # one GenerateBatch; each item carries its turn's trace

        return on_decisions

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._spawned_done)

    def _spawned_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("rollout task failed", exc_info=task.exception())

    def _request(
        self, ep: _Episode, obs: env_pb.Observation, span: tracing.Span
    ) -> inf_pb.GenerateRequest | None:
        """The turn's GenerateRequest; None when the turn is not generated (the episode ended here)."""
        cfg = self.config
        req = inf_pb.GenerateRequest(
            policy_id=ep.policy_of[obs.seat], sampling=cfg.sampling.to_pb(),
            request_id=f"{ep.trajectory_id}:{obs.seat}:{obs.turn_id}:{_attempt(ep, obs)}",
        )  # fmt: skip
        if cfg.prompt_mode == "conversation":
            ids = self._conversation_ids(ep, obs)
            if ids is None:
                return None
            req.tokens.token_ids.extend(ids)
        else:
            messages = render_messages(
                obs.text, obs.messages, ep.past.get(obs.seat, []), mode=cfg.prompt_mode, k=cfg.memory_steps,
                system_prompt=cfg.system_prompt,
            )  # fmt: skip
            if cfg.max_prompt_tokens and self.encode_prompt is not None:
                # the last N tokens of the templated prompt, sent as tokens (inference never re-crops them):
                # the same prompt in process and through the services
                req.tokens.token_ids.extend(self.encode_prompt(messages)[-cfg.max_prompt_tokens :])
            else:
                req.chat.messages.extend(messages)
        ctx = tracing.context_of(span)
        if ctx is not None:
            tracing.inject_into(req.trace, ctx)
        return req

    def _conversation_ids(self, ep: _Episode, obs: env_pb.Observation) -> list[int] | None:
        """The seat's conversation extended by this decision (``conversation`` mode), remembered until the
        answer comes (``_record``). Over ``max_prompt_tokens`` the ``context_overflow`` rule applies:
        ``truncate`` ends the episode here (None), ``compress`` starts the seat's conversation again from
        the ``memory``-mode view of the observation (opening context, what is new since the seat's
        ``memory_steps``-th last decision: short enough to leave the new conversation room). A template
        that cannot append (or raises) fails the episode (``prompt_template``), never the batch."""
        cfg = self.config
        codec = self.chat_codec
        assert codec is not None  # _drive refuses the mode without one
        # An answer whose result has not come before the seat's next decision was not read by the game (a
        # result comes before the decisions it leads to): its turn timed out, the chat goes on without it.
        ep.pending_chat.pop(obs.seat, None)
        try:
            turn = conversation_turn(
                codec, ep.chats.get(obs.seat), obs.text, ep.past.get(obs.seat, []), budget=cfg.max_prompt_tokens,
                memory_steps=cfg.memory_steps, system_prompt=cfg.system_prompt,
                truncate=cfg.context_overflow == "truncate",
            )  # fmt: skip
        except Exception as exc:  # a TemplateError, a template's or tokenizer's own error: the episode's
            ep.end(failure=EpisodeFailed("prompt_template", f"{type(exc).__name__}: {exc}"))
            return None
        if turn is None:
            ep.end(truncated="context_overflow")
            return None
        messages, ids, restarted = turn
        attempt = _attempt(ep, obs)
        ep.asked[(obs.seat, obs.turn_id, attempt)] = _Asked(messages, restarted)
        ep.latest_ask[obs.seat] = (obs.turn_id, attempt)
        return ids

    def _turn_span(self, ep: _Episode, obs: env_pb.Observation) -> tracing.Span:
        """The rollout's span of one policy decision (child of the episode span); the generate item is
        its child where GenerateRequest carries a trace context."""
        return tracer.start_span(
            "rollout.turn", ep.context,
            attributes={"wolfpack.seat": obs.seat, "wolfpack.turn_id": obs.turn_id, "wolfpack.attempt": _attempt(ep, obs),
                        "wolfpack.phase": obs.phase},
        )  # fmt: skip

    async def _generate(self, items: list[tuple[_Episode, env_pb.Observation]]) -> None:
        token = tracing.attach(None)  # the batch call belongs to no episode's trace
        try:
            attempt = 0
            while items:
                started, t0 = time.time(), time.monotonic()
                retry: list[tuple[_Episode, env_pb.Observation]] = []
                spans, requests, asked = [], [], []
                for ep, obs in items:
                    span = self._turn_span(ep, obs)
                    req = self._request(ep, obs, span)
                    if req is None:  # not generated: its episode ended at this turn
                        span.end()
                        continue
                    spans.append(span)
                    requests.append(req)
                    asked.append((ep, obs))
                items = asked
                if not items:
                    return
                try:
                    async for item in self.inference.generate_batch(
                        requests, timeout=self.config.generate_timeout_s
                    ):
                        ep, obs = items[item.index]
                        spans[item.index].end()
                        if item.response is not None:
                            self._record(ep, obs, item.response, started, (time.monotonic() - t0) * 1e3)
                        elif item.code.name in TRANSIENT and attempt < self.config.retries:
                            retry.append((ep, obs))
                        else:
                            ep.end(failure=_generate_failure(item.code, item.message))
                except _rpc_errors() as exc:
                    for span in spans:
                        if span.is_recording():
                            span.set_attribute("error.type", exc.code().name)
                            span.end()
                    if exc.code().name not in TRANSIENT or attempt >= self.config.retries:
                        for ep, _ in items:
                            ep.end(failure=_generate_failure(exc.code(), exc.details() or ""))
                        return
                    retry = items
                except Exception as exc:  # an in-process backend's bug: its episodes fail, the run goes on
                    for span in spans:
                        if span.is_recording():
                            span.end()
                    for ep, _ in items:
                        ep.end(failure=EpisodeFailed(f"internal:{type(exc).__name__}", str(exc)))
                    return
                items = [(ep, obs) for ep, obs in retry if not ep.closed]
                if items:
                    self.stats.retries += 1
                    await asyncio.sleep(self.config.backoff_s * 2**attempt)
                    attempt += 1
        finally:
            tracing.detach(token)

    def _record(
        self,
        ep: _Episode,
        obs: env_pb.Observation,
        resp: inf_pb.GenerateResponse,
        started: float,
        generate_ms: float,
    ) -> None:
        if ep.closed:
            return
        attempt = _attempt(ep, obs)
        asked = ep.asked.pop((obs.seat, obs.turn_id, attempt), None)
        if resp.prompt_compressed:
            if self.config.context_overflow == "truncate":
                ep.end(truncated="context_overflow")
                return
            self.stats.compressed_prompts += 1
        restarted = asked is not None and asked.restarted
        if restarted:
            self.stats.compressed_prompts += 1
        completion = resp.completions[0]
        rec = TurnRecord(
            seat=obs.seat, turn_id=obs.turn_id, phase=obs.phase, round=obs.round, observation_text=obs.text,
            prompt_token_ids=list(resp.prompt_token_ids), response_token_ids=list(completion.token_ids),
            response_logprobs=list(completion.logprobs), response_text=completion.text,
            finish_reason=int(completion.finish_reason), policy=resp.policy,
            sampling=self.config.sampling.to_pb(), started_at=started, generate_ms=generate_ms,
            attempt=attempt, compressed=resp.prompt_compressed or restarted,
        )  # fmt: skip
        # The next decision of this seat extends this prompt and answer once the game has read it
        # (``pending_chat``). An answer to a prompt older than the seat's newest came after the turn timeout
        # had defaulted the turn, and the newer prompt (built without it) is the seat's conversation: moving
        # the chat to the late answer would fork it, every later prompt carrying a move the game never made.
        if asked is not None and ep.latest_ask.get(obs.seat) == (obs.turn_id, attempt):
            ep.pending_chat[obs.seat] = (
                obs.turn_id,
                SeatChat(
                    asked.messages,
                    completion.text,
                    [*resp.prompt_token_ids, *completion.token_ids],
                    list(completion.token_ids),
                    obs.text,
                ),
            )
        ep.by_turn[(obs.seat, obs.turn_id)] = rec
        newest = ep.last.get(obs.seat)
        if newest is None or newest.turn_id <= obs.turn_id:
            ep.records.append(rec)
            ep.last[obs.seat] = rec
            ep.past.setdefault(obs.seat, []).append(obs.text)
        else:  # a late answer (its turn timed out, the seat has moved on): in its turn's place among the seat's
            at = next(i for i, r in enumerate(ep.records) if r.seat == obs.seat and r.turn_id > obs.turn_id)
            ep.records.insert(at, rec)
        self.stats.turns += 1
        self.stats.generated_tokens += len(completion.token_ids)
        if completion.finish_reason == common_pb2.FINISH_REASON_LENGTH:
            self.stats.truncated_responses += 1
        if ep.stream is not None:
            ep.stream.act(ep, obs.seat, obs.turn_id, completion.text)

    # ------------------------------------------------------------------ helpers
    async def _append(self, traj: trajectory_pb2.Trajectory) -> None:
        """Append one trajectory; on the stream's backpressure error wait and try again (never drop it).
        The append is idempotent by trajectory id, so a retry after a lost reply adds no duplicate."""
        assert self.producer is not None
        while True:
            try:
                await self.producer.append(traj)
                return
            except _BACKPRESSURE as exc:
                self.stats.backpressure_waits += 1
                log.warning("stream backpressure: waiting", extra={"detail": str(exc)})
                t0 = time.monotonic()
                await asyncio.sleep(self.config.backpressure_retry_s)
                self.stats.backpressure_wait_s += time.monotonic() - t0

    async def _retrying(self, call: Callable[[], Awaitable[Any]], reason: str) -> Any:
        """``call()`` with retries on transient gRPC failures; ``EpisodeFailed(reason)`` after the last."""
        for attempt in range(self.config.retries + 1):
            try:
                return await call()
            except _rpc_errors() as exc:
                if exc.code().name not in TRANSIENT or attempt == self.config.retries:
                    failure = (
                        reason
                        if exc.code().name in TRANSIENT
                        else f"{reason.split('_')[0]}_{exc.code().name.lower()}"
                    )
                    raise EpisodeFailed(failure, exc.details() or "") from None
                self.stats.retries += 1
                await asyncio.sleep(self.config.backoff_s * 2**attempt)
        raise AssertionError("unreachable")


def _attempt(ep: _Episode, obs: env_pb.Observation) -> int:
    """0 for a new decision; n for the n-th re-prompt of the same turn (the same when the request is built
    and when its answer is recorded, whatever other turns of the seat were answered in between)."""
    prev = ep.by_turn.get((obs.seat, obs.turn_id))
    return prev.attempt + 1 if prev is not None else 0


def _no_turns_detail(ep: _Episode, config: RolloutConfig) -> str:
    """Why an episode has no policy turn: the seat never had one (eliminated before acting), or every
    decision it was asked for was defaulted at the environment's turn timeout while the model was still
    generating (an overloaded policy: the fix is less load, not a retry)."""
    if not ep.decisions:
        return "the episode ended before any policy seat was asked to act (e.g. eliminated first)"
    return (
        f"{ep.decisions} decision(s) asked, none answered before the episode ended: the environment "
        f"defaulted them at its turn timeout while the model was generating (policy too slow for "
        f"concurrency {config.concurrency}, max_tokens {config.sampling.max_tokens}; lower them or raise "
        f"turn_timeout_s)"
    )


def _generate_failure(code: grpc.StatusCode, message: str) -> EpisodeFailed:
    low = message.lower()
    if code.name == "INVALID_ARGUMENT" and ("budget" in low or "too long" in low or "context" in low):
        return EpisodeFailed("context_overflow", message)
    if code.name in TRANSIENT:
        return EpisodeFailed("inference_unavailable", f"{code.name}: {message}")
    return EpisodeFailed(f"inference_{code.name.lower()}", message)


async def _aiter(items: Iterable[cur_pb.Task]) -> AsyncIterator[cur_pb.Task]:
    for item in items:
        yield item
