"""The training loop: trajectories from the stream in, better policies out. Reads top to bottom.

One update (CleanRL style):
1. make sure the stream holds this update's episodes (local mode plays them with the learner's weights
   and appends them; service mode leaves it to the rollout service);
2. read them through the trainer's consumer group, skip trajectory ids already used (idempotency) and
   drop those more than ``max_staleness`` versions behind (counted);
3. token-exact samples (``batch.py``) → advantages (``algos.py``, verl's estimators, each policy's on its
   own samples) → per learner (one per policy, or one for all under ``train.share_policy``: one batch of
   every policy's samples): recompute old logprobs, log their mismatch with the sampler's, truncated IS
   weights → one ``update``;
4. checkpoint (each learner once + used ids + versions), *then* ack: a crash before the checkpoint
   re-delivers the entries to the resumed run, a crash after it finds their ids already used (named crash
   points, ``WOLFPACK_TRAINER_CRASH_AT``, let tests end the process exactly between the two);
5. every ``push_every`` updates a new version of every policy (weights to inference in service mode, a
   versioned directory always; taken from each learner once, a shared one's too); every ``eval.every``
   updates the held-out evaluation. A fresh run with ``eval.base`` (by default when warm-started) first
   evaluates the base models the run started from (``evaluate_base``).

Model work (updates, local play, evaluation, checkpoints) runs in a worker thread, so the event loop keeps
answering TrainerService and its health checks meanwhile; the lock keeps an update and a checkpoint
whole. One Ctrl-C stops after the current update with a checkpoint (``run_training``), a second at once.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aioredis
import torch

from wolfpack.files import write_text_atomic
from wolfpack.settings import load_settings
from wolfpack.stream import (
    Delivery,
    ProtoStreamConsumer,
    ProtoStreamProducer,
    RetryPolicy,
    StreamUnavailableError,
)
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_rollout.client import TokenizerCodec
from wolfpack_trainer import algos
from wolfpack_trainer.batch import BuildStats, Sample, build_samples, collate, narrow, split_by_policy
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.intake import unusable, vocab_size
from wolfpack_trainer.learners.base import Learner, TrainBatch, get_learner
from wolfpack_trainer.local_rollout import (
    Generated,
    PolicyFn,
    Task,
    check_penalty,
    local_driver,
    play,
    prompt_encoder,
    rollout_config,
    sample,
)
from wolfpack_trainer.metrics import (
    TRAIN_MINUTES,
    Estimate,
    MetricsWriter,
    answer_metrics,
    episode_metrics,
    episode_time_split,
    transcript,
)
from wolfpack_trainer.offload import off_loop as _off_loop
from wolfpack_trainer.offload import side_by_side
from wolfpack_trainer.publish import Publisher
from wolfpack_trainer.state import RunState

if TYPE_CHECKING:
    from wolfpack_trainer.evaluate import PolicyScore

log = logging.getLogger(__name__)

MAX_USED_IDS = 200_000
CRASH_ENV = "WOLFPACK_TRAINER_CRASH_AT"
"""``<point>@<update>`` (e.g. ``checkpointed@1``): end the process at that crash point (tests only)."""
CRASH_EXIT = 75
TRANSCRIPTS_PER_EVAL = 3
"""Episodes written to TensorBoard text per evaluation (and from the update of an evaluation step)."""
T = TypeVar("T")


@dataclass
class EvalResult:
    """One held-out evaluation (``evaluate.py``): the policies at update ``step`` on the eval seeds."""

    step: int
    reward: Estimate
    win_rate: Estimate
    failed: int = 0
    """Episodes that failed to play (counted as losses in the estimates)."""
    trajectories: list[trajectory_pb2.Trajectory] = field(default_factory=list, repr=False)
    """The played episodes (sample transcripts); not saved with the checkpoint."""
    policies: dict[str, PolicyScore] = field(default_factory=dict)
    """Each trained policy's score on its own seats (``evaluate.policy_scores``; empty with one policy)."""
    base: EvalResult | None = None
    """The first evaluation of a fresh run with ``eval.base``: the base models on the same seeds, scored as
    the trained policies' seats (``Trainer.evaluate_base``)."""
    vs_bot: dict[str, PolicyScore] = field(default_factory=dict)
    """``eval.vs_bot``: each trained policy alone against ``game.bot`` in every other policy's seats."""

    def metric(self, name: str) -> Estimate:
        return self.win_rate if name == "win_rate" else self.reward


Progress = Callable[[str, int, int], None]
"""(phase, done, total): how the loop reports progress (the CLI draws it with rich)."""


class Trainer:
    def __init__(self, config: TrainConfig, run_dir: Path, redis_url: str, *, cache_dir: Path) -> None:
        self.cfg = config
        self.run_dir = run_dir
        self.cache_dir = cache_dir
        self.redis_url = redis_url
        self.state = RunState()
        self.metrics = MetricsWriter(
            run_dir, tracking=config.train.extra_trackers, project=config.train.tracking_project,
            experiment=config.name, config=config.model_dump(mode="json"),
        )  # fmt: skip
        self.learners: dict[str, Learner] = {}
        self.tokenizer: Any = None
        self.progress: Progress = lambda phase, done, total: None
        self._used: set[str] = set()
        self._pending_ack: list[Delivery[trajectory_pb2.Trajectory]] = []
        self.resumed_from: int | None = None
        self.serving_port: int | None = None
        self.setup_s = 0.0
        """Seconds of set-up (model build, warm start, resume): not part of the training time."""
        self.warmstart: dict[str, Any] | None = None
        """The warm-started base's build record (``warmstart.clone_record``); None without a warm start."""
        self._gen = torch.Generator().manual_seed(config.seed)
        self.publisher = Publisher(run_dir / "policies", save_dirs=config.train.save_versions)
        self.driver: Any = None
        """Service mode: a ``wolfpack_rollout`` driver (``connect(...)``) that plays through the services."""
        self.base_driver: Any = None
        """``eval.base_overlap``: a second driver for the base models' evaluation beside training (a driver
        plays one call at a time: ``RolloutDriver.play``)."""
        self.on_update: Callable[[int, int, dict[str, float]], None] = lambda step, total, metrics: None
        """(update, total, metrics) after each committed update: the CLI prints its metrics line."""
        self.crash_point: Callable[[str, int], None] = crash_from_env
        """Called at ``checkpointed``, ``ack`` and ``acked`` with the update: a test's way to crash there."""
        self.stop_requested = False
        """Set by the first Ctrl-C or SIGTERM (``stop_on_sigint``): the loop stops after the current update."""
        self.finish_requested = False
        """Set by SIGUSR1 (``stop_on_sigint``): the update running now is the run's last, followed by the final
        evaluation and the learning line, as when ``train.max_minutes`` runs out (a rerun resumes towards
        ``train.updates``)."""
        self.stop_signal = signal.SIGINT
        """The signal that asked for the stop (the CLI exits 128 + its number: 130, or 143 for SIGTERM)."""
        self.stopped = False
        """The loop ended on ``stop_requested`` (with a checkpoint) instead of at ``train.updates``."""
        self._lock = threading.RLock()
        """Held by an update and by a checkpoint: TrainerService's SaveCheckpoint runs in another thread."""
        self._checkpointed: int | None = None
        self.vocab_size = 0
        """Token ids the policies' embedding accepts (``setup``): larger ones are dead-lettered."""
        self.dead_lettered = 0
        """Stream entries this run refused (``intake.unusable``) and moved to ``<stream>:dead``."""
        self.stream_health: Callable[[bool], Awaitable[None]] | None = None
        """Told False while the stream stays unreachable past its retry window, True once it is back
        (``--serve``: the gRPC health of the TrainerService)."""
        self._kept_alive = 0.0

    # --- set-up ---------------------------------------------------------------------------------------

    def setup(self) -> None:
        """Build (or resume) the learners; warm-start the base model first when configured."""
        from transformers import AutoTokenizer

        from wolfpack_trainer.learners.cpu import resolve_model_path

        started = time.monotonic()
        torch.manual_seed(self.cfg.seed)
        random.seed(self.cfg.seed)
        resumed = self._latest_checkpoint()
        if resumed is not None:
            self.state = RunState(**json.loads((resumed / "state.json").read_text()))
            self._used = set(self.state.used_ids)
            self.resumed_from = self.state.step
        policies = self.cfg.policies
        base = self.state.model_path or resolve_model_path(policies[0].model, str(self.cache_dir))
        from wolfpack_trainer.warmstart import clone_bot, clone_record, warmstart_config

        wcfg = warmstart_config(self.cfg)
        if not self.state.model_path and wcfg is not None:
            self.progress("warm start", 0, 1)
            base = clone_bot(base, wcfg, self.cache_dir)
        self.warmstart = clone_record(base) if wcfg is not None else None
        self.state.model_path = base
        self.tokenizer = AutoTokenizer.from_pretrained(base)
        self.vocab_size = vocab_size(base, self.tokenizer)
        shared: Learner | None = None
        for p in policies:
            if self.cfg.train.share_policy and shared is not None:
                self.learners[p.id] = shared
                self.state.versions.setdefault(p.id, 0)
                continue
            learner = get_learner(p.learner)(self.cfg.learner_config(p, str(self.cache_dir), model=base))
            if resumed is not None:  # a shared learner's state is under its first id (``checkpoint``)
                learner.load(resumed / f"learner-{p.id}")
            self.learners[p.id] = shared = learner
            self.state.versions.setdefault(p.id, 0)
        self.setup_s = time.monotonic() - started

    def _latest_checkpoint(self) -> Path | None:
        pointer = self.run_dir / "checkpoints" / "LATEST"
        if not pointer.exists():
            return None
        path = self.run_dir / "checkpoints" / pointer.read_text().strip()
        return path if (path / "state.json").exists() else None

    # --- rollouts -------------------------------------------------------------------------------------

    def _policy_fn(
        self, models: dict[str, torch.nn.Module] | None = None, generator: torch.Generator | None = None
    ) -> PolicyFn:
        """How the in-process inference answers a batch of one policy's prompts: its learner's weights, or
        with ``models`` (policy id -> model: the base models' evaluation) that model, drawing from
        ``generator`` (default: the learners' sampling RNG)."""
        eos = [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        if self.tokenizer.eos_token_id is not None:
            eos.append(int(self.tokenizer.eos_token_id))
        pad = int(self.tokenizer.pad_token_id or 0)
        rng = generator if generator is not None else self._gen

        def generate(
            policy_id: str, prompts: list[list[int]], sampling: common_pb2.SamplingParams
        ) -> list[Generated]:
            def draw(model: torch.nn.Module) -> list[Generated]:
                return sample(
                    model,
                    prompts,
                    max_tokens=sampling.max_tokens,
                    temperature=sampling.temperature,
                    eos_ids=eos,
                    pad_id=pad,
                    generator=rng,
                )

            if models is not None:
                return draw(models[policy_id])
            learner = self.learners[policy_id]
            with learner.generation_model() as model:  # type: ignore[attr-defined]
                return draw(model)

        return generate

    def tasks(
        self, seeds: Sequence[int], group_size: int, group_prefix: str, bot_mix: bool = True
    ) -> list[Task]:
        """The episodes to play for ``seeds`` (``plan_tasks``)."""
        return plan_tasks(self.cfg, seeds, group_size, group_prefix, bot_mix)

    async def service_tasks(self, tasks: Sequence[Task]) -> list[Any]:
        """Service mode: the curriculum ``Task`` the driver plays for each planned episode (``service_task``).
        With a ``curriculum`` section each planned group's seed, task id and group come from the stack's
        curriculum service (``NextTasks``: past tasks replayed by AIW weight, ``replay_ratio`` of them, and
        fresh seeds), so the outcomes it reads from the trajectory stream reweight what is played next;
        seats, roles, options and opponents stay the plan's."""
        addr = self.publisher.curriculum_addr
        if self.cfg.curriculum is None or not addr:
            return [service_task(t, i) for i, t in enumerate(tasks)]
        from wolfpack_curriculum.client import CurriculumClient

        size = max(1, self.cfg.rollout.group_size)
        groups = -(-len(tasks) // size)
        async with CurriculumClient(addr, self.publisher.settings) as curriculum:
            drawn = await curriculum.next_tasks(groups * size, worker_id="trainer")
        heads: dict[str, Any] = {}
        for t in drawn:
            heads.setdefault(t.group_id, t)
        if len(heads) < groups:
            raise RuntimeError(f"the curriculum gave {len(heads)} groups for {groups} planned")
        order = list(heads.values())
        out = []
        for i, task in enumerate(tasks):
            head = order[i // size]
            bound = service_task(dataclasses.replace(task, seed=int(head.seed)), i)
            bound.task_id, bound.group_id, bound.bucket = head.task_id, head.group_id, head.bucket
            bound.scenario_id = head.scenario_id
            out.append(bound)
        return out

    def play_local(
        self, tasks: list[Task], temperature: float, split: str = "train"
    ) -> list[trajectory_pb2.Trajectory]:
        """Local mode: the rollout driver over in-process backends (``local_rollout``) plays ``tasks`` as
        service mode would (the same curriculum ``Task`` protos, ``service_task``), sampling with the
        learners' current weights. Runs its own event loop: call it from a worker thread (``off_loop``)."""
        for task in tasks:
            if task.opponent_policy:
                raise ValueError(
                    f"opponent policy {task.opponent_policy!r} is served by inference: service mode only"
                )
        served = [service_task(t, i) for i, t in enumerate(tasks)]
        for task in served:
            task.split = split
        return self._play_in_process(served, temperature, self._policy_fn(), lambda: self.state.versions)

    def _play_in_process(
        self, served: list[Any], temperature: float, policy: PolicyFn, versions: Callable[[], dict[str, int]]
    ) -> list[trajectory_pb2.Trajectory]:
        """Curriculum ``Task`` protos played by the rollout driver over in-process backends, ``policy``
        answering the policies' prompts."""
        for game_id in {t.game.game_id for t in served}:
            check_penalty(self.cfg.rollout.reward_spec, game_id, self.cfg.rollout.invalid_penalty)
        config = rollout_config(self.cfg, concurrency=len(served), temperature=temperature)
        return play(served, local_driver(config, self.tokenizer, policy, versions))

    def _play_base_locally(self, served: list[Any], temperature: float) -> list[trajectory_pb2.Trajectory]:
        """Local mode's base models' evaluation: each base loaded in process from its checkpoint (one copy per
        distinct checkpoint, on the CPU where local mode samples, in the learners' float32), sampled with an
        RNG of its own seeded like the learners' (see ``evaluate_base``); dropped afterwards."""
        from transformers import AutoModelForCausalLM

        from wolfpack_trainer.evaluate import base_models

        loaded: dict[str, torch.nn.Module] = {}
        models: dict[str, torch.nn.Module] = {}
        for base_id, path in base_models(self.cfg, self.cache_dir).items():
            if path not in loaded:
                model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
                loaded[path] = model.eval()
            models[base_id] = loaded[path]
        rng = torch.Generator().manual_seed(self.cfg.seed)
        return self._play_in_process(
            served, temperature, self._policy_fn(models, rng), lambda: dict.fromkeys(models, 0)
        )

    # --- evaluation ----------------------------------------------------------------------------------

    async def evaluate(self) -> EvalResult:
        """The current policies on the held-out seeds, played by the same player as training: with a
        rollout driver (service mode) the policies are the versions inference serves, so every learner,
        the verl FSDP one included, is evaluated alike; tasks carry split "eval" and ``driver.play`` puts
        nothing on the training stream. Without one (local mode) the in-process player samples from the
        learner's weights. A fresh run's first evaluation also measures the reference policies on the same
        seeds (``evaluate.references``) into the metrics. Failed episodes count as losses."""
        from wolfpack_trainer import evaluate as ev

        seeds = ev.eval_seeds(self.cfg)
        self.progress("eval", 0, len(seeds))
        trajs = await self._play_held_out(self.cfg, seeds)
        scored = [p.id for p in ev.eval_policies(self.cfg)]  # eval.replaces: their seats are the bot's
        rows, failed = ev.trajectory_rows(trajs, len(seeds), scored)
        reward, win_rate = ev.summarize(rows)
        per_policy = ev.policy_scores(trajs, len(seeds), scored)
        self.progress("eval", len(seeds), len(seeds))
        metrics = {"eval/failed_episodes": float(failed)}
        versions = [t.policy.version for tr in trajs for t in tr.turns if t.policy.policy_id in self.learners]
        if versions:
            metrics["eval/policy_version"] = float(max(versions))
        if not self.state.evals:
            metrics.update(ev.reference_metrics(ev.references(self.cfg)))
        vs_bot: dict[str, ev.PolicyScore] = {}
        if self.cfg.eval.vs_bot:
            for pid in (p.id for p in self.cfg.policies):
                self.progress(f"eval vs bot [{pid}]", 0, len(seeds))
                alone = ev.vs_bot_config(self.cfg, pid)
                played = await self._play_held_out(alone, seeds)
                vs_bot[pid] = ev.PolicyScore(*ev.summarize(ev.trajectory_rows(played, len(seeds), [pid])[0]))
                refs = ev.references(alone) if not self.state.evals else ()
                metrics.update(ev.vs_bot_metrics(pid, vs_bot[pid], refs))
                self.progress(f"eval vs bot [{pid}]", len(seeds), len(seeds))
        self.metrics.log(self.state.step, metrics)
        return EvalResult(self.state.step, reward, win_rate, failed, list(trajs), per_policy, vs_bot=vs_bot)

    async def _play_held_out(self, cfg: TrainConfig, seeds: Sequence[int]) -> list[trajectory_pb2.Trajectory]:
        """The held-out games of ``cfg`` (this run's config, or ``evaluate.vs_bot_config`` of it) played by the
        current policies at ``eval.temperature``: through the rollout driver in service mode (nothing on the
        training stream), else in process with the learners' weights."""
        from wolfpack_trainer.evaluate import play_served

        tasks = held_out_plan(cfg, seeds)
        temperature = cfg.eval.temperature
        if self.driver is not None:
            served = [service_task(t, i) for i, t in enumerate(tasks)]
            for task in served:
                task.split = "eval"
            return await play_served(self.driver, served, temperature)
        missing = [pid for pid, lr in self.learners.items() if not hasattr(lr, "generation_model")]
        if missing:
            raise RuntimeError(
                f"policies {missing}: their learner cannot sample in process, so rollout.mode local cannot "
                "evaluate them; use rollout.mode: service (inference serves the pushed weights)"
            )
        return list(await _off_loop(self.play_local, tasks, temperature, "eval"))

    async def evaluate_base(self, driver: Any = None) -> EvalResult:
        """The trained policies' base models (``eval.base``: each policy's ``model`` as configured, before the
        warm start, without LoRA) on the held-out seeds: ``evaluate``'s episodes (same seeds, opponents,
        prompts, ``eval.temperature``) with every trained seat bound to its policy's base
        (``evaluate.base_policy_ids``), scored as that policy's seats. Service mode: inference serves the
        bases as extra policies (the job's stack, ``stack.stack_policies``, or registered on a running
        one; a stack that lacks them is asked to load them first, ``stack.serve_missing``). Local mode:
        loaded in process, sampled with an RNG of its own seeded like the learners', so measuring the base
        changes nothing else the run samples, and draws exactly what a run without the warm start draws at
        its update-0 evaluation. Failed episodes count as losses. ``driver``: the one to play through
        (``eval.base_overlap``'s own), else the run's."""
        from wolfpack_trainer import evaluate as ev

        step = self.state.step  # when it started: beside training the step moves on
        driver = driver if driver is not None else self.driver
        seeds = ev.eval_seeds(self.cfg)
        self.progress("eval base", 0, len(seeds))
        served = [service_task(t, i) for i, t in enumerate(held_out_plan(self.cfg, seeds))]
        for task in served:
            task.split = "eval"
        owners = ev.bind_base(served, ev.base_policy_ids(self.cfg))
        if driver is not None:
            if self.publisher.inference_addr:  # a job's stack serves them already; a hand-built one may not
                from wolfpack_trainer.stack import serve_missing

                settings = self.publisher.service_settings
                bases = ev.base_models(self.cfg, self.cache_dir)
                for pid in await serve_missing(settings, self.publisher.inference_addr, bases):
                    log.info(
                        "serving a base model for its evaluation", extra={"policy": pid, "model": bases[pid]}
                    )
            played = await ev.play_served(driver, served, self.cfg.eval.temperature)
        else:
            played = await _off_loop(self._play_base_locally, served, self.cfg.eval.temperature)
        trajs = ev.unbind_base(played, owners)
        policies = [p.id for p in ev.eval_policies(self.cfg)]
        rows, failed = ev.trajectory_rows(trajs, len(seeds), policies)
        reward, win_rate = ev.summarize(rows)
        self.progress("eval base", len(seeds), len(seeds))
        per_policy = ev.policy_scores(trajs, len(seeds), policies)
        return EvalResult(step, reward, win_rate, failed, list(played), per_policy)

    # --- the loop ------------------------------------------------------------------------------------

    async def run(self, updates: int | None = None) -> list[EvalResult]:
        cfg = self.cfg
        total = updates if updates is not None else cfg.train.updates
        client = aioredis.Redis.from_url(self.redis_url)
        # The retry window and the dead-letter count are the deployment's WOLFPACK_STREAM_* settings, as for
        # every other consumer of the stream; the reclaim idle time is the run's own (``stream.claim_idle_ms``).
        stream_settings = self.publisher.service_settings
        consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory] = ProtoStreamConsumer(
            client,
            cfg.stream.name,
            cfg.stream.group,
            "trainer-0",
            trajectory_pb2.Trajectory,
            batch=cfg.rollout.episodes_per_update,
            block_ms=200,
            claim_idle_ms=cfg.stream.claim_idle_ms,
            max_deliveries=stream_settings.stream_max_deliveries,
            retry=RetryPolicy(timeout_s=stream_settings.stream_retry_timeout_s),
        )
        producer: ProtoStreamProducer[trajectory_pb2.Trajectory] = ProtoStreamProducer(
            client, cfg.stream.name, lambda t: t.trajectory_id
        )
        await consumer.ensure_group()
        evals = [EvalResult(**_eval_from_json(e)) for e in self.state.evals]
        self._checkpointed = self.resumed_from
        # A fresh run's baseline, or a finished run whose final evaluation a crash or Ctrl-C cut off.
        evaluate_first = not evals or (self.state.step >= total and evals[-1].step != self.state.step)
        # eval.base_overlap: the base models' evaluation as a task beside the first evaluation and the updates
        # (also on a resume whose first evaluation has no base yet: stopped before the task ended)
        base_task: asyncio.Task[EvalResult] | None = None
        overlap = self.base_driver is not None and self.cfg.eval_base
        try:
            if (
                overlap
                and (not evals or evals[0].base is None)
                and (self.state.step < total or evaluate_first)
            ):
                base_task = asyncio.create_task(self._evaluate_base(self.base_driver))
            if self.publisher.inference_addr and (self.state.step < total or evaluate_first):
                await self.publish_current()  # a finished, evaluated run plays nothing: nothing to serve
            if not evals:  # a fresh run: what its set-up cost, beside the base evaluation's time
                from wolfpack_trainer.warmstart import record_metrics

                setup = {"perf/setup_s": self.setup_s}
                self.metrics.log(0, setup | (record_metrics(self.warmstart) if self.warmstart else {}))
            if evaluate_first:
                sequential = not evals and self.cfg.eval_base and not overlap
                base = await self._evaluate_base() if sequential else None
                first = await self._evaluate()
                if base is not None:
                    first.base = base
                evals.append(self._record_eval(first))
                if self.state.step > 0:
                    await _off_loop(self.checkpoint)
            t_train = time.monotonic()
            minutes_before = self._train_minutes_so_far()
            while self.state.step < total and not self.stop_requested:
                t0 = time.monotonic()
                deliveries = await self._gather(consumer, producer, self.state.step)
                t_collect = time.monotonic() - t0
                metrics = await _off_loop(self._train_update, [d.message for d in deliveries])
                t_trained = time.monotonic()
                step = self.state.step
                if self.finish_requested or 0 < cfg.train.max_minutes * 60 < time.monotonic() - t_train:
                    total = step  # the time budget or SIGUSR1 ends the run here: commit, final eval, learning line
                if step % cfg.train.push_every == 0:
                    await self._publish()
                    recent = self.state.published[-len(self.learners) :]
                    metrics["perf/save_s"] = sum(float(p.get("save_s", 0.0)) for p in recent)
                    metrics["perf/push_s"] = sum(float(p.get("push_s", 0.0)) for p in recent)
                    if any(p.get("sync") for p in recent):  # 1: every version loaded by path (same host)
                        by_path = sum(p.get("sync") == "path" for p in recent)
                        metrics["perf/weight_sync_path"] = by_path / len(recent)
                t_published = time.monotonic()
                self._pending_ack = [*self._pending_ack, *deliveries]
                if step % cfg.train.checkpoint_every == 0 or step == total or self.stop_requested:
                    await self._commit(consumer)
                # The time split of an update: collect (play: generate + environment + reward, or the stream),
                # train (log-probs, advantages, optimiser), publish (directory + push), checkpoint + ack.
                metrics["perf/collect_s"] = t_collect
                metrics["perf/train_s"] = t_trained - t0 - t_collect
                metrics["perf/publish_s"] = t_published - t_trained
                metrics["perf/commit_s"] = time.monotonic() - t_published
                metrics["perf/update_s"] = time.monotonic() - t0 - t_collect
                metrics["stream/redelivered_skipped"] = float(self.state.redelivered_skipped)
                metrics[TRAIN_MINUTES] = minutes_before + (time.monotonic() - t_train) / 60
                self.metrics.log(step, metrics)
                self.on_update(step, total, metrics)
                self.progress("train", step, total)
                if step == total and base_task is not None and not self.stop_requested:
                    # before the final evaluation's checkpoint, which then keeps the base
                    await self._record_base(base_task, evals)
                    base_task = None
                if (step % cfg.eval.every == 0 or step == total) and not self.stop_requested:
                    res = self._record_eval(await self._evaluate())
                    evals.append(res)
                    await _off_loop(self.checkpoint)
            if base_task is not None and not self.stop_requested:  # no update left to run beside it
                await self._record_base(base_task, evals)
                base_task = None
                if self.state.step > 0:  # as after a first evaluation: a run of no updates keeps none
                    await _off_loop(self.checkpoint)
            if self.stop_requested:
                if self._checkpointed != self.state.step or self._pending_ack:
                    await self._commit(consumer)  # e.g. stopped during a fresh run's first evaluation
                self.stopped = True
        finally:
            if base_task is not None:  # stopped or failed: a resumed run evaluates the base again
                base_task.cancel()
                with contextlib.suppress(BaseException):
                    await base_task
            await client.aclose()
            self.metrics.write_csv()
            self.metrics.plot()
            self.metrics.close()
        return evals

    async def _record_base(self, task: asyncio.Task[EvalResult], evals: list[EvalResult]) -> None:
        """``eval.base_overlap``: wait for the base models' evaluation and record it with the first
        evaluation, as a run without the overlap records it (``state.json`` at the next checkpoint, the
        ``reference/base/...`` metrics at the first evaluation's step)."""
        try:
            base = await task
        except Exception as exc:  # the trained policies' run stands without it: its summary has no base line
            log.error(
                "the base models' evaluation failed (eval.base_overlap): %s: %s", type(exc).__name__, exc
            )
            return
        first = evals[0]
        base.step = first.step
        first.base = base
        self.state.evals = [_eval_to_json(first) if e["step"] == first.step else e for e in self.state.evals]
        self._log_base(first.step, base)

    def _train_minutes_so_far(self) -> float:
        """The training clock of the updates already done (a resumed run's curve against time goes on
        where it stopped, not from 0): the last ``TRAIN_MINUTES`` logged at or before the current step."""
        done = [
            r[TRAIN_MINUTES]
            for r in self.metrics.rows()
            if TRAIN_MINUTES in r and r["step"] <= self.state.step
        ]
        return float(done[-1]) if done else 0.0

    async def _evaluate(self) -> EvalResult:
        """``evaluate`` off the event loop (a coroutine ``evaluate`` plays through services: awaited), its
        sample transcripts to TensorBoard text and a few of its episodes as ``Trajectory`` files in the run
        dir (``evaluate.save_episodes``: the web view's training page replays them)."""
        evaluate: Callable[[], Any] = self.evaluate
        t0 = time.monotonic()
        if asyncio.iscoroutinefunction(evaluate):
            res = await evaluate()
        else:
            res = await _off_loop(evaluate)
        self._log_eval_time("eval", res, time.monotonic() - t0)
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        for i, traj in enumerate(list(getattr(res, "trajectories", None) or [])[:TRANSCRIPTS_PER_EVAL]):
            self.metrics.text(f"transcripts/eval/{i}", transcript(traj, decode), res.step)
        if getattr(res, "trajectories", None):
            from wolfpack_trainer.evaluate import save_episodes

            await _off_loop(save_episodes, self.run_dir, res.step, res.trajectories)
        return res  # type: ignore[no-any-return]

    async def _evaluate_base(self, driver: Any = None) -> EvalResult:
        """``evaluate_base`` (through ``driver``, else the run's), with its sample transcripts
        (``transcripts/eval_base/<i>``) and a few of its episodes as files in ``<run>/eval/base/``
        (``evaluate.base_episodes_dir``)."""
        from wolfpack_trainer.evaluate import base_episodes_dir, save_episodes

        t0 = time.monotonic()
        res = await self.evaluate_base(driver)
        self._log_eval_time("eval_base", res, time.monotonic() - t0)
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        for i, traj in enumerate(res.trajectories[:TRANSCRIPTS_PER_EVAL]):
            self.metrics.text(f"transcripts/eval_base/{i}", transcript(traj, decode), res.step)
        if res.trajectories:
            await _off_loop(
                functools.partial(save_episodes, directory=base_episodes_dir(self.run_dir)),
                self.run_dir, res.step, res.trajectories,
            )  # fmt: skip
        return res

    def _log_eval_time(self, name: str, res: Any, seconds: float) -> None:
        """An evaluation's wall time (``perf/<name>_s``) and where its episodes' time went
        (``perf/<name>_episode_s``, ``..._generate_s``, ``..._env_s``, ``..._score_s``: the training
        batches' split, ``metrics.episode_time_split``): held-out games are sequential in a way training
        batches are not (one game's turns one after another, nothing to overlap), so their time is its own
        question (a 12-player evaluation took 85-98 s with the card ~10 % busy)."""
        played = list(getattr(res, "trajectories", None) or [])
        split = episode_time_split(played)
        out = {f"perf/{name}_s": seconds}
        out.update({k.replace("perf/episode", f"perf/{name}_episode"): v for k, v in split.items()})
        out.update(answer_metrics(played, f"{name}_answers"))  # eval_answers/..., eval_base_answers/...
        self.metrics.log(res.step, out)

    def _train_update(self, trajectories: Sequence[trajectory_pb2.Trajectory]) -> dict[str, float]:
        """``train_step`` and the step count as one change under the lock (a worker thread runs it): a
        SaveCheckpoint from TrainerService sees an update whole or not at all. A few of the update's
        episodes go to TensorBoard text on evaluation steps."""
        with self._lock:
            metrics = self.train_step(trajectories)
            self.state.step += 1
        step, every = self.state.step, self.cfg.eval.every
        if trajectories and (step % every == 0 or step == 1):
            decode = self.tokenizer.decode if self.tokenizer is not None else None
            for i, traj in enumerate(trajectories[:TRANSCRIPTS_PER_EVAL]):
                self.metrics.text(f"transcripts/train/{i}", transcript(traj, decode), step)
        return metrics

    async def _commit(self, consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory]) -> None:
        """Checkpoint, *then* ack what the checkpointed updates used. Swapped, a crash between the two
        would lose entries: acked, so never delivered again, yet not in the checkpoint the run resumes
        from (``tests/test_train_crash_points.py`` fails on that order)."""
        await _off_loop(self.checkpoint)
        pending, self._pending_ack = self._pending_ack, []
        if pending:
            self.crash_point("ack", self.state.step)
            await consumer.ack(pending)
            self.crash_point("acked", self.state.step)

    def _record_eval(self, res: EvalResult) -> EvalResult:
        from wolfpack_trainer import evaluate as ev

        self.state.evals = [e for e in self.state.evals if e["step"] != res.step] + [_eval_to_json(res)]
        self.metrics.log(
            res.step,
            {
                "eval/reward_mean": res.reward.mean,
                "eval/reward_lo": res.reward.lo,
                "eval/reward_hi": res.reward.hi,
                "eval/win_rate": res.win_rate.mean,
                "eval/win_rate_lo": res.win_rate.lo,
                "eval/win_rate_hi": res.win_rate.hi,
                **ev.policy_metrics(getattr(res, "policies", {})),  # a stand-in evaluate's may lack them
            },
        )
        base = getattr(res, "base", None)
        if base is not None:
            self._log_base(res.step, base)
        return res

    def _log_base(self, step: int, base: EvalResult) -> None:
        """The base models' evaluation as ``reference/base/...`` metrics at the first evaluation's step."""
        from wolfpack_trainer import evaluate as ev

        self.metrics.log(step, ev.base_metrics(base.reward, base.win_rate, base.failed, base.policies))

    async def _gather(
        self,
        consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory],
        producer: ProtoStreamProducer[trajectory_pb2.Trajectory],
        step: int,
    ) -> list[Delivery[trajectory_pb2.Trajectory]]:
        """This update's deliveries: whatever the stream holds (re-deliveries after a crash first), topped
        up by playing this update's episodes locally when the stream runs dry.

        A delivery whose trajectory a committed update used (crash between checkpoint and ack) is acked at
        once and counted; one held by this or an uncommitted update (reclaimed while it waited) is acked
        with them, after their checkpoint, never before it."""
        need = self.cfg.rollout.episodes_per_update
        got: dict[str, Delivery[trajectory_pb2.Trajectory]] = {}
        produced = False
        idle_reads = 0
        while len(got) < need:
            await self._keep_alive(consumer, [*self._pending_ack, *got.values()])
            batch = await self._read(consumer)
            held = {d.message_id for d in self._pending_ack}
            done: list[Delivery[trajectory_pb2.Trajectory]] = []
            for d in batch:
                if d.message_id in got or d.message_id in held:
                    self._pending_ack.append(d)
                elif d.message_id in self._used:
                    self.state.redelivered_skipped += 1
                    done.append(d)
                elif self._stale(d.message):
                    self.state.dropped_stale += 1
                    done.append(d)
                elif why := unusable(d.message, self.learners, self.vocab_size):
                    log.warning("dead-lettering a trajectory the update cannot use",
                                extra={"entry": d.entry_id, "trajectory_id": d.message_id, "reason": why})  # fmt: skip
                    await consumer.dead_letter(d, why)
                    self.dead_lettered += 1
                else:
                    got[d.message_id] = d
            if done:
                await consumer.ack(done)  # acked now, so a later reclaim cannot count them twice
            if batch:
                idle_reads = 0
                continue
            idle_reads += 1
            if not produced and idle_reads * 200 < 5 * self.cfg.stream.claim_idle_ms + 2000:
                unclaimed = await consumer.pending_count() - len(got) - len(self._pending_ack)
                if unclaimed > 0:
                    continue  # read before a crash and never acked: wait until they are reclaimed
            if not produced:
                groups = need // self.cfg.rollout.group_size
                seeds = [step * groups + g for g in range(groups)]
                self.progress("rollout", 0, need)
                tasks = self.tasks(seeds, self.cfg.rollout.group_size, f"u{step}")
                if self.cfg.rollout.mode == "local":
                    trajs = await _off_loop(self.play_local, tasks, self.cfg.rollout.temperature)
                else:
                    if self.driver is None:
                        raise RuntimeError("rollout.mode service needs a rollout driver (Trainer.driver)")
                    trajs = await self.driver.play(await self.service_tasks(tasks))
                await producer.append_many(trajs)
                produced = True
            elif produced and idle_reads > 50:
                break  # fewer than planned survived the filters: train on what there is
        return list(got.values())

    async def _keep_alive(
        self, consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory], held: list[Delivery[Any]]
    ) -> None:
        """Reset the idle time of entries read but not yet acked (several updates' worth with
        ``checkpoint_every > 1``), at most every quarter of ``claim_idle_ms``: the consumer's reclaim scan
        lists idle entries of every consumer, its own included, so held entries were reclaimed again and
        again until ``max_deliveries`` dead-lettered them while still in use (and a crash then lost them)."""
        now = time.monotonic()
        if held and now - self._kept_alive >= self.cfg.stream.claim_idle_ms / 4000:
            with contextlib.suppress(StreamUnavailableError):  # Redis away: the read below waits for it
                await consumer.keep_alive(held)
                self._kept_alive = now

    async def _read(
        self, consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory]
    ) -> list[Delivery[trajectory_pb2.Trajectory]]:
        """``consumer.read()`` (which retries a Redis restart itself), waiting out a Redis that stays away
        longer than its retry window instead of ending the run: a warning per window, health NOT_SERVING
        meanwhile (``stream_health``), a line when it is back."""
        failures = 0
        while True:
            try:
                batch = await consumer.read()
            except StreamUnavailableError as exc:
                failures += 1
                log.warning("trajectory stream unreachable; the update waits for it",
                            extra={"stream": consumer.stream, "windows": failures, "error": str(exc)})  # fmt: skip
                if failures == 1 and self.stream_health is not None:
                    await self.stream_health(False)
                continue
            if failures:
                log.warning("trajectory stream reachable again", extra={"stream": consumer.stream})
                if self.stream_health is not None:
                    await self.stream_health(True)
            return batch

    def _stale(self, traj: trajectory_pb2.Trajectory) -> bool:
        bound = self.cfg.train.max_staleness
        for t in traj.turns:
            pid = t.policy.policy_id
            if pid in self.state.versions and self.state.versions[pid] - t.policy.version > bound:
                return True
        return False

    def train_step(self, trajectories: Sequence[trajectory_pb2.Trajectory]) -> dict[str, float]:
        """One update of every learner on ``trajectories``; returns the step's metrics. A learner shared by
        several policies (``train.share_policy``) takes one update over all their samples."""
        t0 = time.monotonic()
        stats = BuildStats()
        pad = int(self.tokenizer.pad_token_id or 0) if self.tokenizer is not None else 0
        samples = build_samples(trajectories, self.cfg.batch_config(pad), stats)
        metrics: dict[str, float] = {
            **episode_metrics(trajectories),
            **episode_time_split(trajectories),
            **answer_metrics(trajectories),
        }
        # turns -> samples: one each in the turn layout, one per seat-game for conversations in the episode
        # layout (split_sequences: a seat's turns that did not extend each other, so began a new sample)
        metrics.update(
            {"batch/samples": float(stats.samples), "batch/dropped_too_long": float(stats.dropped_too_long),
             "batch/turns": float(stats.turns), "batch/split_sequences": float(stats.split_sequences),
             "batch/skipped_actions": float(stats.skipped_actions)}
        )  # fmt: skip
        metrics["staleness/dropped_total"] = float(self.state.dropped_stale)
        lags = [
            self.state.versions.get(t.policy.policy_id, 0) - t.policy.version
            for tr in trajectories
            for t in tr.turns
            if t.policy.policy_id
        ]
        if lags:
            metrics["staleness/mean_versions"] = sum(lags) / len(lags)
        tokens = seq_tokens = 0  # trained (sampled) tokens; every real token the learner's passes read
        by_policy = split_by_policy(samples)

        def train_one(
            pids: list[str],
        ) -> tuple[list[tuple[str, dict[str, float]]], dict[str, float], TrainBatch]:
            learner = self.learners[pids[0]]
            batch = collate([s for pid in pids for s in by_policy[pid]], pad)
            if self.cfg.algo_config().estimator == "gae":
                batch.values = learner.compute_values(batch)  # GAE needs V(s) before the advantages
            adv, adv_metrics = self._advantages(batch, pids, by_policy)
            return adv_metrics, self._update(learner, batch, adv), batch

        groups = self._learner_groups(by_policy)
        # the metrics merged in the learners' order whichever finished first, so a run reads the same
        for pids, (adv_metrics, m, batch) in zip(groups, self._each_learner(train_one, groups), strict=True):
            for pid, part in adv_metrics:
                for k, v in part.items():
                    metrics[k if len(self.learners) == 1 else f"{pid}/{k}"] = v
                    metrics.setdefault(k, v)
            tokens += int(batch.response_mask.sum())
            seq_tokens += int(batch.attention_mask.sum())
            for k, v in m.items():
                if len(pids) > 1:  # a shared learner's metrics, once: its one update over every policy's rows
                    metrics[k] = v
                    continue
                metrics[k if len(self.learners) == 1 else f"{pids[0]}/{k}"] = v
                metrics.setdefault(k, v)
        for traj in trajectories:
            self._used.add(traj.trajectory_id)
            self.state.used_ids.append(traj.trajectory_id)
        self.state.used_ids = self.state.used_ids[-MAX_USED_IDS:]
        self.state.trajectories_used += len(trajectories)
        metrics["perf/train_tokens_per_s"] = tokens / max(time.monotonic() - t0, 1e-9)
        # Prompt + response tokens: what a learner's throughput is measured in (``perf/train_tokens_per_s``
        # counts only sampled tokens, a few per turn in Werewolf, so it says little about the learner).
        metrics["batch/sequence_tokens"] = float(seq_tokens)
        metrics["batch/trajectories"] = float(len(trajectories))
        return metrics

    def _each_learner(self, fn: Callable[[list[str]], T], groups: list[list[str]]) -> list[T]:
        """``fn`` of every learner's group, in the groups' order: side by side (``offload.side_by_side``) when
        there are several and ``train.parallel_learners`` (each learner's work touches only its own model,
        batch and workers), else one after the other."""
        if len(groups) < 2 or not self.cfg.train.parallel_learners:
            return [fn(pids) for pids in groups]
        return side_by_side(fn, groups, [f"learner-{pids[0]}" for pids in groups])

    def _learner_groups(self, pids: Iterable[str]) -> list[list[str]]:
        """``pids`` (the policy ids with samples, or every trained id: ``self.learners``) grouped by the
        learner that trains them, in first-seen order: one id each under IPPO, every id in one group under
        ``train.share_policy``. Ids without a learner (frozen opponents) are left out."""
        groups: dict[int, list[str]] = {}
        for pid in pids:
            learner = self.learners.get(pid)
            if learner is not None:
                groups.setdefault(id(learner), []).append(pid)
        return list(groups.values())

    def _advantages(
        self, batch: TrainBatch, pids: list[str], by_policy: dict[str, list[Sample]]
    ) -> tuple[algos.Advantages, list[tuple[str, dict[str, float]]]]:
        """Advantages of one learner's ``batch`` (``pids``' samples in that order), each policy's computed on
        its own rows at its own padding widths (``narrow``), exactly as it would be alone, with each policy's
        advantage metrics (``train_step`` names them ``<policy>/adv/...`` with several policies)."""
        config = self.cfg.algo_config()
        advantages = torch.zeros_like(batch.response_mask)
        returns = torch.zeros_like(batch.response_mask)
        start = 0
        per_policy: list[tuple[str, dict[str, float]]] = []
        for pid in pids:
            own = by_policy[pid]
            rows = slice(start, start + len(own))
            start += len(own)
            part = batch if len(pids) == 1 else narrow(batch.select(list(range(rows.start, rows.stop))))
            adv = algos.compute_advantages(part, own, config)
            if len(pids) == 1:
                advantages, returns = adv.advantages, adv.returns
            else:
                width = adv.advantages.shape[1]
                advantages[rows, :width] = adv.advantages
                returns[rows, :width] = adv.returns
            per_policy.append((pid, dict(adv.metrics)))
        return algos.Advantages(advantages, returns), per_policy

    def _update(self, learner: Learner, batch: TrainBatch, adv: algos.Advantages) -> dict[str, float]:
        """verl's recompute mode: old logprobs from the learner before the update (the ratio's anchor);
        the sampler's logprobs only enter through truncated IS weights and the mismatch metric."""
        loss = learner.config.loss
        batch.advantages = adv.advantages
        batch.returns = adv.returns
        batch.old_log_probs = learner.compute_log_probs(batch)
        metrics = algos.logprob_mismatch(batch.old_log_probs, batch.rollout_log_probs, batch.response_mask)
        if loss.tis_cap > 0:
            batch.is_weights = algos.truncated_is_weights(
                batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, loss.tis_cap
            )
        if loss.kl_coef > 0:
            batch.ref_log_prob = learner.compute_ref_log_probs(batch)
        metrics.update(learner.update(batch))
        return metrics

    async def publish_current(self) -> None:
        """Before any rollout: the learners' current weights (the warm-started clone on a fresh run, the
        checkpoint's on a resumed one) as a new version of each policy, so that inference samples with
        exactly the weights the learner recomputes logprobs with. Without it a fresh run would sample
        from whatever inference loaded (the un-cloned base) and a resumed one from a stale version."""
        await self._publish(freeze=False)
        self.progress("publish", 1, 1)

    async def _publish(self, freeze: bool | None = None) -> None:
        """A new version of each trained policy: directory, push to inference, league snapshot. The weights
        leave each learner once (a shared learner's too: ``Publisher.publish_learner``), and every policy id
        it trains gets the version (each is served by its own engine)."""
        if freeze is None:
            every = self.cfg.train.freeze_every
            freeze = every > 0 and self.state.step % every == 0
        planned: list[tuple[Learner, list[tuple[str, int]]]] = []
        for pids in self._learner_groups(self.learners):
            versions = []
            for pid in pids:
                self.state.versions[pid] = self.state.versions.get(pid, 0) + 1
                versions.append((pid, self.state.versions[pid]))
            planned.append((self.learners[pids[0]], versions))
        if len(planned) > 1 and self.cfg.train.parallel_learners:  # each learner's save and load side by side
            results = await asyncio.gather(
                *(
                    self.publisher.publish_learner(learner, versions, freeze=freeze)
                    for learner, versions in planned
                )
            )
        else:
            results = [
                await self.publisher.publish_learner(learner, versions, freeze=freeze)
                for learner, versions in planned
            ]
        for done in (d for published in results for d in published):  # in the learners' order
            self.state.published.append(done.__dict__)

    def checkpoint(self) -> Path:
        """Write learners + state to a new directory, then atomically point LATEST at it.

        A directory LATEST may point at is never rewritten: a second checkpoint of one update (after its
        evaluation, or SaveCheckpoint) gets the next free name (``update_000004.1``), so a crash at any
        moment leaves LATEST on a complete checkpoint. Thread-safe (the lock): the loop's worker thread and
        TrainerService's SaveCheckpoint both call it.

        One ``learner-<id>`` per learner: a shared learner (``train.share_policy``) is saved once, under its
        first policy id, where ``setup`` resumes it from (checkpoints written before saved the same state
        again under every other id; those copies are left unread)."""
        with self._lock:
            root = self.run_dir / "checkpoints"
            base = name = f"update_{self.state.step:06d}"
            n = 0
            while (root / name).exists():
                n += 1
                name = f"{base}.{n}"
            tmp = root / f".{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for pids in self._learner_groups(self.learners):
                self.learners[pids[0]].save(tmp / f"learner-{pids[0]}")
            self.state.used_ids = self.state.used_ids[-MAX_USED_IDS:]
            (tmp / "state.json").write_text(json.dumps(self.state.__dict__))
            final = root / name
            tmp.rename(final)
            write_text_atomic(root / "LATEST", name)
            for old in sorted(root.glob("update_*"), key=_checkpoint_order)[:-2]:  # keep the last two
                shutil.rmtree(old, ignore_errors=True)
            self._checkpointed = self.state.step
        self.crash_point("checkpointed", self.state.step)
        return final


def stable_seed(*parts: object) -> int:
    """A 64-bit seed from ``parts`` that is the same in every process (Python's ``hash()`` of a str is
    salted per process, so two runs of one config would draw different opponent mixes)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def held_out_plan(cfg: TrainConfig, seeds: Sequence[int]) -> list[Task]:
    """One held-out game per seed: the evaluation's seats and roles (``eval.roles`` and ``eval.replaces``,
    else the training ones), every other seat ``game.bot`` (no opponent mix)."""
    from wolfpack_trainer.evaluate import eval_role_map, eval_seat_map

    return plan_tasks(cfg, seeds, 1, "eval", False, roles=eval_role_map(cfg), seats=eval_seat_map(cfg))


def plan_tasks(
    cfg: TrainConfig,
    seeds: Sequence[int],
    group_size: int,
    group_prefix: str,
    bot_mix: bool = True,
    roles: Mapping[str, str] | None = None,
    seats: Mapping[int, str] | None = None,
) -> list[Task]:
    """``group_size`` episodes per seed: the config's game (variant, options, language), trained seats and
    roles (``seats`` / ``roles``: seat / role -> policy id instead of the policies' own), and who plays the
    other seats. With ``bot_mix`` each group draws from ``rollout.opponents`` (a scripted bot or a served
    opponent policy; ``game.bot`` for the remainder; an entry's ``replaces`` hands those trained policies'
    seats to it too) with an RNG seeded by (``seed``, ``group_prefix``) alone, so one config plans the same
    episodes in every process."""
    from wolfpack_trainer.config import game_options

    seats = dict(seats) if seats is not None else {s: p.id for p in cfg.policies for s in p.seats}
    roles = dict(roles) if roles is not None else {r: p.id for p in cfg.policies for r in p.roles}
    options = game_options(cfg)
    rng = random.Random(stable_seed(cfg.seed, group_prefix))
    out = []
    for g, seed in enumerate(seeds):
        bot, opponent, replaced = cfg.game.bot, "", frozenset[str]()
        opponent_roles, opponent_bot = frozenset[str](), ""
        if bot_mix:
            draw = rng.random()
            for mix in cfg.rollout.opponents:
                if draw < mix.fraction:
                    opponent, replaced = mix.policy, frozenset(mix.replaces)
                    if mix.roles:  # only these roles' untrained seats; the rest keep game.bot
                        opponent_roles, opponent_bot = frozenset(mix.roles), mix.bot
                    else:
                        bot = mix.bot or bot
                    break
                draw -= mix.fraction
        group_seats = {s: pid for s, pid in seats.items() if pid not in replaced}
        group_roles = {r: pid for r, pid in roles.items() if pid not in replaced}
        for _ in range(group_size):
            out.append(
                Task(
                    cfg.game.id,
                    cfg.game.variant,
                    seed,
                    group_seats,
                    group_roles,
                    bot=bot,
                    group_id=f"{group_prefix}-{g}" if group_size > 1 else "",
                    group_size=group_size,
                    options=options,
                    opponent_policy=opponent,
                    opponent_roles=opponent_roles,
                    opponent_bot=opponent_bot,
                )
            )
    return out


def service_task(task: Task, index: int) -> Any:
    """The curriculum ``Task`` the rollout driver plays for a local ``Task``: same game, variant, options
    and seed; trained seats bound to their policy by index and by role (the roles the environment will deal
    for this seed and these options, read from the same engine started the same way), every other seat
    scripted with ``task.bot`` or bound to the served opponent policy; with ``task.opponent_roles`` only the
    untrained seats dealt those roles go to the opponent (``opponent_bot`` / ``opponent_policy``)."""
    from wolfpack.v1 import curriculum_service_pb2 as cur_pb
    from wolfpack_games import make_game

    env = make_game(task.game_id, task.variant)
    env.start(seed=task.seed, options=dict(task.options))
    trainees = dict(task.trainee_seats)
    for seat in env.possible_agents:
        role = env.role(seat)
        if role in task.trainee_roles:
            trainees[seat] = task.trainee_roles[role]
    opponent = task.opponent_policy
    out = cur_pb.Task(
        task_id=f"{task.group_id or 'task'}-{task.seed}-{index}",
        seed=task.seed,
        bucket=f"{task.game_id}/{task.variant}",
        group_id=task.group_id or f"g-{task.seed}-{index}",
        group_size=task.group_size,
        opponent_kind=cur_pb.OPPONENT_KIND_EXTERNAL if opponent else cur_pb.OPPONENT_KIND_SCRIPTED,
        opponent_id=f"external:{opponent}" if opponent else f"scripted:{task.opponent_bot or task.bot}",
        split="train",
        options={k: json.dumps(v) for k, v in task.options.items()},  # YAML values (JSON is YAML)
    )
    out.game.game_id, out.game.variant = task.game_id, task.variant
    for seat in env.possible_agents:
        mixed = not task.opponent_roles or env.role(seat) in task.opponent_roles  # the opponent mix's seat
        if seat in trainees:
            out.trainee_seats.append(seat)
            b = out.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
            b.policy.policy_id = trainees[seat]
        elif opponent and mixed:
            b = out.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
            b.policy.policy_id = opponent
        else:
            bot = task.opponent_bot if mixed and task.opponent_bot else task.bot
            out.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_SCRIPTED, bot=bot)
    env.close()
    return out


def _eval_to_json(res: EvalResult) -> dict[str, Any]:
    out: dict[str, Any] = {"step": res.step, "reward": res.reward.__dict__, "win_rate": res.win_rate.__dict__}

    def scores(given: dict[str, PolicyScore]) -> dict[str, Any]:
        return {
            pid: {"reward": s.reward.__dict__, "win_rate": s.win_rate.__dict__} for pid, s in given.items()
        }

    policies: dict[str, PolicyScore] = getattr(res, "policies", {})
    if policies:  # a single-policy run's state.json stays as it was
        out["policies"] = scores(policies)
    vs_bot: dict[str, PolicyScore] = getattr(res, "vs_bot", {})
    if vs_bot:  # eval.vs_bot: the first evaluation's scores are the left side of a resumed run's lines
        out["vs_bot"] = scores(vs_bot)
    base = getattr(res, "base", None)
    if base is not None:  # the first evaluation of a run with eval.base: the base models', resumed with it
        out["base"] = {**_eval_to_json(base), "failed": base.failed}
    return out


def _eval_from_json(d: dict[str, Any]) -> dict[str, Any]:
    from wolfpack_trainer.evaluate import PolicyScore

    def scores(key: str) -> dict[str, PolicyScore]:
        return {
            pid: PolicyScore(Estimate(**s["reward"]), Estimate(**s["win_rate"]))
            for pid, s in d.get(key, {}).items()
        }

    out: dict[str, Any] = {
        "step": d["step"],
        "reward": Estimate(**d["reward"]),
        "win_rate": Estimate(**d["win_rate"]),
        "policies": scores("policies"),
        "vs_bot": scores("vs_bot"),
    }
    if "failed" in d:
        out["failed"] = int(d["failed"])
    if d.get("base"):
        out["base"] = EvalResult(**_eval_from_json(d["base"]))
    return out


def base_pending(cfg: TrainConfig, run_dir: Path) -> bool:
    """The run will evaluate the base models (``eval.base``) when it starts: it is on and the run directory
    holds no evaluated checkpoint (a resumed run measured them at its own start, or never: a run begun
    before the key existed). A job's stack serves the bases only then."""
    if not cfg.eval_base:
        return False
    pointer = run_dir / "checkpoints" / "LATEST"
    state = run_dir / "checkpoints" / pointer.read_text().strip() / "state.json" if pointer.exists() else None
    return state is None or not state.exists() or not json.loads(state.read_text()).get("evals")


def _learning(label: str, metric: str, a: Estimate, b: Estimate) -> str:
    return f"{label}: {metric} {a.mean:.2f} -> {b.mean:.2f} on {b.n} held-out episodes (95% CI {b.lo:.2f}..{b.hi:.2f})"


def learning_line(metric: str, first: EvalResult, last: EvalResult) -> str:
    """``learning: <metric> <initial> -> <final> on <n> held-out episodes (95% CI <lo>..<hi>)``."""
    return _learning("learning", metric, first.metric(metric), last.metric(metric))


def policy_learning_lines(metric: str, first: EvalResult, last: EvalResult) -> list[str]:
    """``learning[<policy>]: ...`` per trained policy of a multi-policy run, on its own seats (the overall
    line averages co-trained seats, so it cannot say which policy learned); none with one policy, or for a
    policy the first evaluation did not score (a run resumed from a checkpoint written before these
    scores existed)."""
    return [
        _learning(f"learning[{pid}]", metric, first.policies[pid].metric(metric), score.metric(metric))
        for pid, score in last.policies.items()
        if pid in first.policies
    ]


def vs_bot_lines(cfg: TrainConfig, first: EvalResult, last: EvalResult) -> list[str]:
    """``eval.vs_bot``'s summary, per trained policy: its ``reference:`` block against the bot (the update-0
    score as ``initial``, then constants, random and heuristic in its seats against the bot, and which of them
    the final CI lies above), each line prefixed ``vs-bot[<policy>]``, then ``learning vs-bot[<policy>]:``.
    None for a policy the first evaluation did not score (a run resumed from before ``vs_bot`` was set)."""
    from wolfpack_trainer.evaluate import reference_lines, vs_bot_config

    metric = cfg.eval.metric
    lines: list[str] = []
    for pid, score in last.vs_bot.items():
        if pid not in first.vs_bot:
            continue
        start, final = first.vs_bot[pid].metric(metric), score.metric(metric)
        block = reference_lines(vs_bot_config(cfg, pid), start, final)
        lines += [f"vs-bot[{pid}] {line.strip()}" for line in block]
        lines.append(_learning(f"learning vs-bot[{pid}]", metric, start, final))
    return lines


class ResumeError(RuntimeError):
    """The run directory holds a run that this job cannot resume (another config)."""


def config_fingerprint(config: TrainConfig) -> dict[str, Any]:
    """What a resumed run must share with the checkpoint: what the config file sets, but ``train.updates``
    and ``train.max_minutes`` (a finished run may be extended) and the trackers (watching is no change). Defaults are left out: a default changed in the code is not an
    edit of the recipe, and would otherwise refuse every earlier run directory."""
    data = config.model_dump(mode="json", exclude_unset=True)
    for key in ("updates", "max_minutes", "tracking", "tracking_project"):  # how long, and who watches
        data.get("train", {}).pop(key, None)
    return data


def check_resumable(run_dir: Path, config: TrainConfig) -> None:
    """Refuse, before any model is built, to resume a checkpoint trained with another config: resuming
    is the default, and a changed recipe would otherwise load mismatched weights or mix two experiments
    in one learning line."""
    pointer = run_dir / "checkpoints" / "LATEST"
    if not pointer.exists():
        return
    state = run_dir / "checkpoints" / pointer.read_text().strip() / "state.json"
    saved = json.loads(state.read_text()).get("config") if state.exists() else None
    if not saved:
        return  # a checkpoint from before configs were recorded
    before, now = _flat(saved), _flat(config_fingerprint(config))
    changed = sorted(k for k in {*before, *now} if before.get(k) != now.get(k))
    if changed:
        raise ResumeError(
            f"{run_dir} holds a run of another config (changed: {', '.join(changed)}); "
            "rerun with --fresh to start over, or give another --run-dir"
        )


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@contextlib.contextmanager
def stop_on_sigint(trainer: Trainer, notice: Callable[[str], None]) -> Iterator[None]:
    """The first Ctrl-C asks the loop to stop after the current update (with a checkpoint and its ack, so
    the rerun resumes exactly there); the second raises ``KeyboardInterrupt`` at once (the last checkpoint
    stays the resume point: that is what it is for). Main thread only, where Python delivers signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if trainer.stop_requested:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a third one during clean-up
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            notice(f"second {name}: quitting now")
            atexit.register(_exit_before_finalizing, 128 + int(signum))
            raise KeyboardInterrupt
        trainer.stop_requested = True
        trainer.stop_signal = signal.Signals(signum)
        notice(f"{name}: stopping after the current update, with a checkpoint ({name} again to quit now)")

    # asyncio.run installs its own SIGINT handler (cancel the main task) only over the default one.
    # SIGTERM (a pod being deleted, systemd, a job scheduler) is a polite stop too: by default it would kill
    # the process mid-update with no checkpoint and no clean-up of the stack's children.
    previous = signal.signal(signal.SIGINT, handler)
    previous_term = signal.signal(signal.SIGTERM, handler)
    # SIGUSR1 (POSIX): "finish now": the update running is the last, then the final evaluation and the
    # learning line, as a spent train.max_minutes ends a run; for a run that must give its card back early
    # and still say what it learned (a polite stop skips the evaluation, which may take minutes).
    usr1 = getattr(signal, "SIGUSR1", None)

    def finish(signum: int, frame: object) -> None:
        if not trainer.finish_requested:
            trainer.finish_requested = True
            notice("SIGUSR1: finishing after the current update, with the final evaluation and learning line")

    previous_usr1 = signal.signal(usr1, finish) if usr1 is not None else None
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
        if usr1 is not None:
            signal.signal(usr1, previous_usr1)


def run_training(
    config: TrainConfig,
    run_dir: Path,
    redis_url: str,
    cache_dir: Path,
    progress: Progress | None = None,
    updates: int | None = None,
    serve_address: str | None = None,
    driver: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
    publisher: Publisher | None = None,
    on_update: Callable[[int, int, dict[str, float]], None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> tuple[Trainer, list[EvalResult]]:
    """Set up and run a job; ``driver`` opens the rollout driver (service mode), ``publisher`` replaces
    the default (directories only) one, e.g. to push to inference; ``on_update`` gets each update's
    metrics, ``notice`` one-line messages (Ctrl-C). After a first Ctrl-C it returns with
    ``trainer.stopped`` set; raises ``ResumeError`` if ``run_dir`` holds a run of another config."""
    check_resumable(run_dir, config)
    trainer = Trainer(config, run_dir, redis_url, cache_dir=cache_dir)
    if progress is not None:
        trainer.progress = progress
    if publisher is not None:
        trainer.publisher = publisher
    if on_update is not None:
        trainer.on_update = on_update
    trainer.setup()
    trainer.state.config = config_fingerprint(config)
    with stop_on_sigint(trainer, notice or (lambda text: None)):
        evals = asyncio.run(_run_serving(trainer, updates, serve_address, driver))
    return trainer, evals


def crash_from_env(point: str, step: int) -> None:
    """Test hook for the delivery guarantee: with ``WOLFPACK_TRAINER_CRASH_AT=<point>@<update>`` the
    process ends at that point with ``os._exit(CRASH_EXIT)``: no ``finally``, no flush, like SIGKILL but
    at a chosen line rather than a chosen moment (points: ``checkpointed``, ``ack``, ``acked``)."""
    if os.environ.get(CRASH_ENV) == f"{point}@{step}":
        os._exit(CRASH_EXIT)


def _exit_before_finalizing(code: int) -> None:
    """At exit after a second Ctrl-C: if a worker thread is still inside the model (torch), end the
    process here. Interpreter finalization would stop that thread mid-call and abort the process
    (``terminate called without an active exception``, SIGABRT); the checkpoint on disk is what a rerun
    resumes from, and the caller's clean-up (``finally``, context managers) has already run."""
    if any(t.name.startswith("trainer:") and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _checkpoint_order(path: Path) -> tuple[int, int]:
    """``update_000004.1`` → (4, 1): checkpoints in the order they were written."""
    step, _, n = path.name.removeprefix("update_").partition(".")
    return int(step), int(n or 0)


async def _run_serving(
    trainer: Trainer,
    updates: int | None,
    address: str | None,
    driver: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
) -> list[EvalResult]:
    """The loop, with the rollout driver open (service mode) and the TrainerService in front of it on
    ``address`` when given."""
    if driver is not None:
        async with driver() as opened:
            if getattr(opened, "encode_prompt", False) is None:  # the trainer's tokenizer crops the prompts
                opened.encode_prompt = prompt_encoder(trainer.tokenizer)
            if getattr(opened, "chat_codec", False) is None:  # ... and builds conversation prompts
                opened.chat_codec = TokenizerCodec(trainer.tokenizer)
            trainer.driver = opened
            # eval.base_overlap: a second driver, the base models' evaluation plays through it
            second = driver() if trainer.cfg.base_beside_training else contextlib.nullcontext()
            async with second as beside:
                if beside is not None:
                    beside.encode_prompt, beside.chat_codec = opened.encode_prompt, opened.chat_codec
                    trainer.base_driver = beside
                return await _run_serving(trainer, updates, address)
    if address is None:
        return await trainer.run(updates)
    from wolfpack import rpc
    from wolfpack_trainer.server import SERVICE, register_live

    server = await rpc.start_server(SERVICE, register_live(trainer), load_settings(), address)
    trainer.serving_port = server.port
    trainer.stream_health = server.set_serving
    try:
        return await trainer.run(updates)
    finally:
        await server.stop(1.0)
