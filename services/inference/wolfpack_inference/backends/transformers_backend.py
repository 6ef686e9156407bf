"""The embedded backend: a Hugging Face causal LM (CPU or GPU) behind a continuous (step-level) batcher.

How a request runs: ``generate`` binds the request to the weights current *now* (``_Weights``, one object
per version) and puts it in an inbox. One decode thread (started when work arrives, gone when idle) keeps a
*running batch*: a KV cache with every row right-aligned (left padding), an attention mask that marks the
pads, and per-row position ids. Between two decode steps the thread admits waiting jobs bound to the
batch's weights, up to ``max_batch`` rows: their prompts are prefilled together in one forward pass of
their own and their rows appended to the running cache (whichever side is shorter is left-padded to the
same width). Rows that finish stop being sampled at once and are dropped from the cache when at least a
quarter of the batch is done (or when newcomers are merged anyway); leading columns that no remaining
row uses are cut at the same time, so the cache stays as wide as its longest live row even when the batch
never empties. A request therefore waits at most one decode step (plus its prefill) to start, and
finishes when *its* rows do, not when the longest row of the batch does. Why a thread of its own rather
than a thread hop per step: a step of a small model takes about a millisecond on CPU, the same order as
an ``asyncio.to_thread`` round trip through a busy event loop.

Versions: rows bound to different weights never share a forward pass. A running batch keeps its weights;
jobs for a newer version wait until it drains (it admits no one else, so that takes at most its longest
remaining ``max_tokens``) and then start together as the next batch. Why not run a second batch
alongside: every step would then be two forward passes, slower for both versions, and versions change
once per training step, rarely compared with decode steps. Jobs bound to an older version keep that
version's model alive (they hold a reference to it) until they finish; then it is garbage-collected. This
is how "in-flight requests finish on the old version" holds without any pause.

Models whose cache is not a plain full-attention ``DynamicLayer`` per layer (sliding windows, linear
attention) cannot be re-aligned this way: their batches run to completion as before and admit no one.

Sampling is per row, so rows with different temperature/top-p/top-k/seed share a batch: each row has its
own ``torch.Generator`` (seeded rows are reproducible whatever else is in the batch).

Logprob convention (``Turn.response_logprobs`` in ``trajectory.proto``, shared by every backend): the
reported logprob of a sampled token is ``log_softmax(logits / T)[token]``, with ``T`` the request's
temperature (``T = 1`` for greedy), computed from the very logits the token was sampled from and before
top-k/top-p truncation. That is the sampling distribution up to the truncation, and what a learner
recomputes from the same token ids with one teacher-forced forward pass at the same temperature (verl's
``logprobs_from_logits(logits / T)``); it equals that recomputation up to float rounding.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from wolfpack_inference.adapters import AdapterDirs
from wolfpack_inference.backends.base import (
    Backend,
    Completion,
    ErrorCode,
    Finish,
    InferenceError,
    Request,
    Result,
    Sampling,
    StreamChunk,
    check_prompt_length,
    validate_tokens,
)
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.prompts import TextTracker, strip_think

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Weights:
    """One version of the policy's weights (compared by identity when grouping a batch)."""

    model: Any
    version: int
    model_path: str
    adapter: str = ""


@dataclass(eq=False)
class _Row:
    prompt: list[int]
    sampling: Sampling
    tracker: TextTracker
    generator: torch.Generator
    logprobs: list[float] = field(default_factory=list)
    finish: Finish | None = None


@dataclass(eq=False)
class _Job:
    weights: _Weights
    rows: list[_Row]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[None]
    chunks: asyncio.Queue[StreamChunk | None] | None = None
    """Streamed chunks; ``None`` means "decoding failed: see ``done``"."""
    cancelled: bool = False

    def notify(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the job's event loop (called from the decode thread). A loop that is closed
        has no one left to hear about the job: it is treated as cancelled, so its rows leave the batch."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            self.cancelled = True

    @property
    def finished(self) -> bool:
        return all(row.finish is not None for row in self.rows)


@dataclass(eq=False)
class _Batch:
    """Rows decoding together; only the decode thread touches it. Row ``i`` of ``mask``, ``next_pos``,
    ``feed`` and of every cache layer belongs to ``owners[i]``. Each row's tokens end at the last column;
    ``mask`` is 1 where the cache holds a real token of that row and 0 on its left padding."""

    weights: _Weights
    owners: list[tuple[_Job, _Row]]
    cache: Any
    mask: torch.Tensor
    """``[rows, width]`` long, on the model's device."""
    next_pos: torch.Tensor
    """``[rows]`` position id of each row's next token (its own length, whatever the padding)."""
    feed: list[int]
    """The token each row feeds at the next step (its last sample; the pad id once finished)."""
    joinable: bool
    """Whether the cache is plain full attention, which rows can be appended to and dropped from."""

    def live(self) -> list[int]:
        return [i for i, (_, row) in enumerate(self.owners) if row.finish is None]


def _set_done(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)  # type: ignore[no-any-return]


def load_causal_lm(path: str, device: str, dtype: torch.dtype, adapter: str = "") -> Any:
    """A model in eval mode on ``device``; with ``adapter``, a LoRA merged into a fresh copy of the base
    (merged so decoding runs at base speed, fresh so the previous version stays intact for its requests)."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model = model.to(device)
    if adapter:
        model = _apply_adapter(model, adapter)
    model.eval()
    return model


def _apply_adapter(model: Any, adapter: str) -> Any:
    """``model`` with the LoRA in directory ``adapter`` merged in. A directory that does not fit the base
    (target modules it lacks, wrong shapes, tensors missing for some targeted modules) is an
    INVALID_ARGUMENT: peft only warns about missing tensors and leaves those modules at their initial values,
    which for ``init_lora_weights: false`` are random."""
    peft = _peft()
    try:
        wrapped = peft.PeftModel.from_pretrained(model, adapter)
    except (ValueError, RuntimeError, KeyError, TypeError, OSError) as exc:
        raise InferenceError(ErrorCode.INVALID_ARGUMENT, f"adapter {adapter}: {exc}") from None
    weights = Path(adapter) / "adapter_model.safetensors"
    if weights.exists():
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as f:
            saved = set(f.keys())
        expected = set(peft.get_peft_model_state_dict(wrapped, save_embedding_layers=False))
        missing, extra = sorted(expected - saved), sorted(saved - expected)
        if missing or extra:
            raise InferenceError(
                ErrorCode.INVALID_ARGUMENT,
                f"adapter {adapter} does not fit the base model: missing tensors {missing[:4]}, "
                f"tensors for no module of the base {extra[:4]}",
            )
    return wrapped.merge_and_unload()


SMALL_MODEL_PARAMS = 20_000_000


def _set_threads(model: Any, device: str, threads: int) -> None:
    """CPU intra-op threads. ``0`` = auto: one thread for models under ``SMALL_MODEL_PARAMS``, whose
    matmuls are too small to split (on the 2-core dev machine, under load from other processes, a tiny
    model's decode step measured 17 ms with 2 threads and 1.2 ms with 1), and for any model on a machine
    of two cores or fewer, which this service shares with the environment, rollout and trainer processes
    (SmolLM2-135M there: a decode step 2.7-3.1 s with 2 threads against 0.25 s with 1 under load, and
    `wolfpack rollout --episodes 20` on a fresh stack 47.8 min against 8.7 min); torch's default otherwise."""
    if device != "cpu":
        return
    if threads == 0 and (
        (os.cpu_count() or 1) <= 2 or sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS
    ):
        threads = 1
    if threads > 0:
        torch.set_num_threads(threads)


def _peft() -> Any:
    try:
        import peft  # type: ignore[import-not-found]  # optional dependency, absent on the CPU venv
    except ImportError:
        raise InferenceError(
            ErrorCode.FAILED_PRECONDITION,
            "LoRA adapters need the `peft` package, which is not installed in this service's environment",
        ) from None
    return peft


class TransformersBackend(Backend):
    """A transformers causal LM with a KV cache and a micro-batching queue (see the module docstring)."""

    name = "transformers"

    @classmethod
    def from_config(cls, cfg: PolicyConfig, cache_dir: Path) -> TransformersBackend:
        from wolfpack_inference.models import resolve_model

        return cls(
            resolve_model(cfg.model, cache_dir), version=cfg.version, adapter=cfg.adapter, device=cfg.device,
            dtype=cfg.dtype, max_batch=cfg.max_batch, batch_wait_ms=cfg.batch_wait_ms, ignore_eos=cfg.ignore_eos,
            torch_threads=cfg.torch_threads,
        )  # fmt: skip

    def __init__(
        self,
        model_path: str,
        *,
        version: int = 0,
        adapter: str = "",
        device: str = "auto",
        dtype: str = "auto",
        max_batch: int = 32,
        batch_wait_ms: float = 5.0,
        ignore_eos: bool = False,
        torch_threads: int = 0,
    ) -> None:
        from transformers import AutoTokenizer

        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_ms / 1000
        self._tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = load_causal_lm(model_path, self.device, self.dtype, adapter)
        self._current = _Weights(model, version, model_path, adapter)
        _set_threads(model, self.device, torch_threads)
        cfg = model.config
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        self.vocab_size = int(cfg.vocab_size)
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self._tokenizer.eos_token_id is not None:
            eos_ids.add(self._tokenizer.eos_token_id)
        self.eos_ids = frozenset() if ignore_eos else frozenset(int(e) for e in eos_ids)
        pad = self._tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        self._inbox: deque[_Job] = deque()
        """Jobs not yet admitted, in arrival order (appended by event loops, taken by the decode thread)."""
        self._lock = threading.Lock()
        """Guards ``_inbox`` hand-over, ``_thread``, ``_start_loop`` and ``_closing``."""
        self._thread: threading.Thread | None = None
        self._start_loop: asyncio.AbstractEventLoop | None = None
        """The loop on which a start of the decode thread is scheduled, if any."""
        self._closing = False
        self.adapter_dirs = AdapterDirs()
        """Directories of pushed adapters, one per version that still names one."""

    # --- identity -------------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def version(self) -> int:  # type: ignore[override]
        return self._current.version

    @property
    def model(self) -> str:  # type: ignore[override]
        return self._current.model_path

    @property
    def adapter(self) -> str:  # type: ignore[override]
        return self._current.adapter

    @property
    def torch_model(self) -> Any:
        """The current model object (benches and tests call it directly)."""
        return self._current.model

    # --- requests -------------------------------------------------------------------------------------

    def _job(self, request: Request, streaming: bool) -> _Job:
        s = request.sampling
        check_prompt_length(len(request.prompt_ids), s.max_tokens, self.max_positions)
        validate_tokens(request.prompt_ids, self.vocab_size)
        loop = asyncio.get_running_loop()
        rows = []
        for i in range(s.n):
            gen = torch.Generator()
            gen.manual_seed(s.seed + i if s.seed is not None else random.getrandbits(63))
            tracker = TextTracker(self._decode, s.stop, request.strip_think)
            rows.append(_Row(request.prompt_ids, s, tracker, gen))  # read only: rows share the prompt
        chunks: asyncio.Queue[StreamChunk | None] | None = asyncio.Queue() if streaming else None
        return _Job(self._current, rows, loop, loop.create_future(), chunks)

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def _submit(self, job: _Job) -> None:
        """Hand ``job`` to the decode thread, starting it (on the loop's next turn) if it is idle. Jobs carry
        their own event loop, so one thread serves callers on any loop.

        Why start on the next turn: concurrent calls that arrive together are submitted in one turn of the
        loop, so they are all waiting when the thread's first ``batch_wait_ms`` window opens, which then
        ends after one quiet window (or at once for a full batch) instead of seeing them trickle in."""
        with self._lock:
            self._inbox.append(job)
            if self._thread is not None or self._start_loop is job.loop:
                return
            self._start_loop = job.loop  # another loop's pending start may never run: schedule one here too
        job.loop.call_soon(self._start_thread)

    def _start_thread(self) -> None:
        with self._lock:
            self._start_loop = None
            if self._thread is None and self._inbox:
                self._thread = threading.Thread(
                    target=self._decode_loop, name="transformers-batcher", daemon=True
                )
                self._thread.start()

    async def generate(self, request: Request) -> Result:
        job = self._job(request, streaming=False)
        self._submit(job)
        try:
            await asyncio.shield(job.done)
        except asyncio.CancelledError:
            job.cancelled = True
            raise
        return self._result(job, request)

    def _result(self, job: _Job, request: Request) -> Result:
        completions = []
        for row in job.rows:
            text = row.tracker.text if row.tracker.stopped else self._decode(row.tracker.token_ids)
            completions.append(
                Completion(
                    token_ids=row.tracker.token_ids,  # the row is finished: its lists are handed over
                    logprobs=row.logprobs if row.sampling.logprobs else [],
                    text=strip_think(text) if request.strip_think else text,
                    finish=row.finish or Finish.ABORT,
                )
            )
        return Result(completions, job.weights.version, request.prompt_ids, len(request.prompt_ids))

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        if request.sampling.n != 1:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "streaming supports n == 1 only")
        job = self._job(request, streaming=True)
        assert job.chunks is not None
        self._submit(job)
        try:
            while True:
                chunk = await job.chunks.get()
                if chunk is None:
                    break
                yield chunk
                if chunk.finish is not None:
                    break
            await job.done  # raises the batch's error, if any
        finally:
            job.cancelled = True  # no-op when finished; stops decoding when the client went away

    # --- the decode thread ----------------------------------------------------------------------------

    @torch.inference_mode()
    def _decode_loop(self) -> None:
        """Run iterations until no row is live and no job waits; then the thread ends (``_submit`` starts
        another when work comes)."""
        batch: _Batch | None = None
        while True:
            with self._lock:
                if self._closing:
                    self._closing = False
                    aborted = [job for job, _ in batch.owners] if batch is not None else []
                    aborted += self._inbox
                    self._inbox.clear()
                    self._abort(aborted)
                    batch = None
                if batch is None and not self._inbox:
                    self._thread = None
                    return
            try:
                batch = self._iteration(batch)
            except Exception as exc:  # a bug outside the forward passes: fail what is in flight, keep serving
                self._fail([job for job, _ in batch.owners] if batch is not None else [], exc)
                batch = None

    def _iteration(self, batch: _Batch | None) -> _Batch | None:
        """Admit and prefill newcomers, merge them in, drop finished rows when worthwhile, decode one step;
        the batch that runs on (``None`` when no row is live)."""
        if batch is None:
            self._gather()
        else:
            self._drop_cancelled(batch)
        newcomers = self._admit(batch)
        parts = [batch] if batch is not None else []
        if newcomers:
            try:
                parts.append(self._prefill(newcomers))
            except Exception as exc:  # a failed prefill fails its newcomers, not the running batch
                self._fail(newcomers, exc)
        try:
            merged = self._compacted(parts)
            if merged is not None:
                self._step(merged)
        except Exception as exc:  # a failed merge or step fails its batch, not the thread
            self._fail([job for part in parts for job, _ in part.owners], exc)
            return None
        return merged

    def _gather(self) -> None:
        """Before starting a batch from idle, wait ``batch_wait_ms`` for more jobs (not at all when a full
        batch is waiting), and keep waiting (up to 4x) while they keep coming.

        Why adaptive: a burst of N concurrent gRPC calls reaches the inbox spread over several milliseconds
        (each is deserialised on the event loop). Late members could join at the next step, but each join
        is a prefill pass of its own; one prefill for the whole burst is cheaper."""
        waited, step = 0.0, self.batch_wait_s
        # waiting jobs count as one row each here (n > 1 is rare); admission counts rows exactly
        while step > 0 and len(self._inbox) < self.max_batch and waited < 4 * self.batch_wait_s:
            before = len(self._inbox)
            time.sleep(step)
            waited += step
            if len(self._inbox) == before:
                break  # a quiet period: the burst is over
            step = self.batch_wait_s / 2

    def _admit(self, batch: _Batch | None) -> list[_Job]:
        """Waiting jobs that join now, in arrival order: bound to the batch's weights (the first job's when
        there is no batch), while their rows fit ``max_batch``. A job of another version stops admission,
        so versions are served in the order they were bound (see the module docstring)."""
        if batch is not None and not batch.joinable:
            return []
        weights = batch.weights if batch is not None else None
        rows = len(batch.live()) if batch is not None else 0
        taken: list[_Job] = []
        with self._lock:
            while self._inbox:
                job = self._inbox[0]
                if job.cancelled:
                    self._inbox.popleft()
                    job.notify(_set_done, job.done, None)
                    continue
                if weights is None:
                    weights = job.weights
                if job.weights is not weights or (rows and rows + len(job.rows) > self.max_batch):
                    break
                self._inbox.popleft()
                taken.append(job)
                rows += len(job.rows)
        return taken

    def _prefill(self, jobs: list[_Job]) -> _Batch:
        """A batch of ``jobs``' rows with their prompts in the cache and their first token sampled. Each
        job's prompt is computed once; its ``n`` rows then share copies of that cache row."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        weights, dev = jobs[0].weights, self.device
        prompts = [job.rows[0].prompt for job in jobs]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(jobs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=weights.model.config)
        mask = mask.to(dev)
        out = weights.model(
            input_ids=ids.to(dev),
            attention_mask=mask,
            position_ids=positions.to(dev),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :]
        next_pos = positions[:, -1].to(dev) + 1
        owners = [(job, row) for job in jobs for row in job.rows]
        if len(owners) > len(jobs):  # n > 1: one cache row per sample
            rows = torch.tensor([j for j, job in enumerate(jobs) for _ in job.rows], device=dev)
            cache.batch_select_indices(rows)
            logits, mask, next_pos = logits[rows], mask[rows], next_pos[rows]
        joinable = all(type(layer) is DynamicLayer for layer in cache.layers)
        batch = _Batch(weights, owners, cache, mask, next_pos, [self.pad_id] * len(owners), joinable)
        self._sample(batch, list(range(len(owners))), logits)
        return batch

    def _step(self, batch: _Batch) -> None:
        """One decode step: every row feeds its last token (finished rows still in the cache feed a pad and
        are not sampled)."""
        dev = self.device
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.owners), 1))], dim=1)
        out = batch.weights.model(
            input_ids=torch.tensor(batch.feed, dtype=torch.long)[:, None].to(dev),
            attention_mask=batch.mask,
            position_ids=batch.next_pos[:, None],
            past_key_values=batch.cache,
            use_cache=True,
        )
        batch.next_pos = batch.next_pos + 1
        self._sample(batch, batch.live(), out.logits[:, -1, :])

    def _sample(self, batch: _Batch, live: list[int], logits: torch.Tensor) -> None:
        """Sample the ``live`` rows from ``logits`` (one row per batch row), record and stream each token,
        finish rows, and complete jobs whose rows are all finished."""
        if len(live) < logits.shape[0]:
            logits = logits[torch.tensor(live, device=logits.device)]
        rows = [batch.owners[i][1] for i in live]
        failed: set[int] = set()
        tokens, logprobs = sample(
            logits.float().cpu(), [r.sampling for r in rows], [r.generator for r in rows], failed
        )
        version = batch.weights.version
        for k, (i, tok, lp) in enumerate(zip(live, tokens.tolist(), logprobs.tolist(), strict=True)):
            job, row = batch.owners[i]
            if k in failed:  # this row's distribution was not a distribution: its request fails alone
                self._fail_row(batch, i)
                continue
            if job.cancelled:
                row.finish = Finish.ABORT
            else:
                needs_text = bool(row.sampling.stop) or job.chunks is not None
                if needs_text:  # decoding every step only when stop strings or a stream need the text
                    stopped = row.tracker.add(tok)
                else:
                    row.tracker.token_ids.append(tok)
                    stopped = False
                row.logprobs.append(lp)
                if stopped or tok in self.eos_ids:
                    row.finish = Finish.STOP
                elif len(row.tracker.token_ids) >= row.sampling.max_tokens:
                    row.finish = Finish.LENGTH
                if job.chunks is not None:
                    final = row.finish is not None
                    chunk = StreamChunk(
                        [tok], [lp] if row.sampling.logprobs else [], row.tracker.delta(final), version,
                        row.finish,
                    )  # fmt: skip
                    job.notify(job.chunks.put_nowait, chunk)
            if row.finish is None:
                batch.feed[i] = tok
            else:
                batch.feed[i] = self.pad_id
                if job.finished:
                    job.notify(_set_done, job.done, None)

    def _fail_row(self, batch: _Batch, i: int) -> None:
        """End the request owning row ``i`` with an error; the other requests of the batch go on."""
        job, _ = batch.owners[i]
        for j, (other_job, other_row) in enumerate(batch.owners):
            if other_job is job and other_row.finish is None:
                other_row.finish = Finish.ABORT
                batch.feed[j] = self.pad_id
        err = InferenceError(
            ErrorCode.INTERNAL, "sampling failed for this request (non-finite probabilities)"
        )
        job.notify(_set_done, job.done, err)
        if job.chunks is not None:
            job.notify(job.chunks.put_nowait, None)

    def _drop_cancelled(self, batch: _Batch) -> None:
        """Finish the rows of jobs whose caller went away, before spending a step on them."""
        for i, (job, row) in enumerate(batch.owners):
            if job.cancelled and row.finish is None:
                row.finish = Finish.ABORT
                batch.feed[i] = self.pad_id
                if job.finished:
                    job.notify(_set_done, job.done, None)

    def _compacted(self, parts: list[_Batch]) -> _Batch | None:
        """The running batch after merging newcomers (``parts[1]``, if any) and maybe dropping finished
        rows; ``None`` when no row is live.

        Why a quarter: dropping rows copies the whole cache once (about what one step reads anyway), while a
        finished row left in place only costs its share of each step; past a quarter the copy pays off
        within a few steps. Merging copies everything anyway, so it always drops finished rows too."""
        if len(parts) == 1:
            batch = parts[0]
            rows, live = len(batch.owners), len(batch.live())
            if live == 0:
                return None
            if live == rows or not batch.joinable or 4 * (rows - live) < rows:
                return batch
        if not parts:
            return None
        return _rebuild(parts)

    def _fail(self, jobs: list[_Job], exc: Exception) -> None:
        log.error("batch failed", exc_info=exc)
        for job in dict.fromkeys(jobs):  # each job once, in order
            for row in job.rows:
                row.finish = row.finish or Finish.ABORT
            err = InferenceError(ErrorCode.INTERNAL, f"generation failed: {exc}")
            job.notify(_set_done, job.done, err)
            if job.chunks is not None:
                job.notify(job.chunks.put_nowait, None)

    def _abort(self, jobs: list[_Job]) -> None:
        """End ``jobs`` now: unfinished rows finish with ``ABORT`` (streams get a last, empty chunk)."""
        for job in dict.fromkeys(jobs):
            for row in job.rows:
                if row.finish is None:
                    row.finish = Finish.ABORT
                    if job.chunks is not None:
                        chunk = StreamChunk([], [], "", job.weights.version, Finish.ABORT)
                        job.notify(job.chunks.put_nowait, chunk)
            job.notify(_set_done, job.done, None)

    async def close(self) -> None:
        """Abort what is decoding or waiting (each job ends with its rows' ``ABORT``), so a closed policy
        stops using the CPU/GPU at the next step; the backend stays usable."""
        with self._lock:
            self._closing = self._thread is not None
        self.adapter_dirs.close()

    # --- new weights ----------------------------------------------------------------------------------

    async def load(self, version: int, model_path: str = "", adapter_path: str = "") -> None:
        self._current = await self._load(version, model_path, adapter_path)

    async def _load(self, version: int, model_path: str, adapter_path: str) -> _Weights:
        path = model_path or self._current.model_path
        if adapter_path:
            _peft()
        model = await asyncio.to_thread(load_causal_lm, path, self.device, self.dtype, adapter_path)
        if int(model.config.vocab_size) != self.vocab_size:
            raise InferenceError(
                ErrorCode.INVALID_ARGUMENT,
                f"{path}: vocab {model.config.vocab_size} differs from the served tokenizer's model "
                f"({self.vocab_size}); load a new policy id for a different model family",
            )
        return _Weights(model, version, path, adapter_path)

    async def update_weights(
        self,
        version: int,
        tensors: Mapping[str, Any],
        is_adapter: bool,
        adapter_config: Mapping[str, Any] | None = None,
    ) -> None:
        current = self._current
        if is_adapter:
            if adapter_config is None:
                raise InferenceError(
                    ErrorCode.INVALID_ARGUMENT, "pushed LoRA weights need their adapter config"
                )
            _peft()
            # The same path as LoadPolicy(adapter_path=...): a PEFT directory merged into a fresh base.
            path = await asyncio.to_thread(self.adapter_dirs.write, version, adapter_config, tensors)
            try:
                weights = await self._load(version, "", str(path))
            except BaseException:
                self.adapter_dirs.discard(path)
                raise
        else:
            model = await asyncio.to_thread(_updated_copy, current.model, tensors)
            weights = _Weights(model, version, current.model_path, current.adapter)
        # A pushed adapter's directory goes with the last version that names it: not current any more and
        # no job holding it (jobs keep their ``_Weights`` alive).
        self.adapter_dirs.bind(weights, weights.adapter)
        self._current = weights


def _rebuild(parts: list[_Batch]) -> _Batch | None:
    """One batch holding the unfinished rows of ``parts`` (all bound to the same weights, with plain
    full-attention caches), every row right-aligned in a cache as wide as the widest row needs.

    Each part's leading columns that none of its kept rows uses are cut, then the narrower parts are
    left-padded with zeros (masked out). Exact: a masked key/value gets zero attention weight whatever it
    holds, and position ids are per row, independent of the column a token sits in."""
    kept = []
    for part in parts:
        live = part.live()
        if live:
            kept.append((part, torch.tensor(live, device=part.mask.device)))
    if not kept:
        return None
    spans = []
    for part, idx in kept:
        mask = part.mask.index_select(0, idx)
        start = int(mask.any(dim=0).int().argmax())  # first column a kept row uses
        spans.append((idx, start, mask[:, start:]))
    width = max(mask.shape[1] for _, _, mask in spans)
    rows = sum(idx.numel() for idx, _, _ in spans)
    base = kept[0][0]
    merged_mask = base.mask.new_zeros((rows, width))
    offset = 0
    for idx, _, mask in spans:
        merged_mask[offset : offset + idx.numel(), width - mask.shape[1] :] = mask
        offset += idx.numel()
    for layer_no, layer in enumerate(base.cache.layers):
        for attr in ("keys", "values"):
            sources = [getattr(part.cache.layers[layer_no], attr) for part, _ in kept]
            first = sources[0]
            merged = first.new_zeros((rows, first.shape[1], width, first.shape[3]))
            offset = 0
            for source, (part, _), (idx, start, mask) in zip(sources, kept, spans, strict=True):
                if source.shape[2] != part.mask.shape[1]:  # a layout this code does not know: stop, loudly
                    raise RuntimeError(f"cache length {source.shape[2]} != mask width {part.mask.shape[1]}")
                n = idx.numel()
                merged[offset : offset + n, :, width - mask.shape[1] :] = source.index_select(0, idx)[
                    :, :, start:
                ]
                offset += n
            setattr(layer, attr, merged)
    owners = [part.owners[i] for part, idx in kept for i in idx.tolist()]
    feed = [part.feed[i] for part, idx in kept for i in idx.tolist()]
    next_pos = torch.cat([part.next_pos.index_select(0, idx) for part, idx in kept])
    return _Batch(base.weights, owners, base.cache, merged_mask, next_pos, feed, joinable=True)


def _updated_copy(model: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """A deep copy of ``model`` with ``tensors`` (a full or partial state dict) loaded into it; the
    original keeps serving the requests bound to it."""
    state = model.state_dict()
    unknown = sorted(set(tensors) - set(state))
    if unknown:
        raise InferenceError(ErrorCode.INVALID_ARGUMENT, f"unknown parameter names: {unknown[:5]}")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(state[name].shape):
            raise InferenceError(
                ErrorCode.INVALID_ARGUMENT,
                f"{name}: shape {tuple(t.shape)} != served {tuple(state[name].shape)}",
            )
    new = copy.deepcopy(model)
    with torch.no_grad():
        params = dict(new.named_parameters())
        buffers = dict(new.named_buffers())
        for name, t in tensors.items():
            target = params.get(name, buffers.get(name))
            if target is None:  # a tied alias in state_dict(): its owner is updated through the other name
                continue
            target.copy_(t.to(target.dtype))
    return new


def sample(
    logits: torch.Tensor,
    params: list[Sampling],
    generators: list[torch.Generator],
    failed: set[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its logprob under the logprob convention (see the module docstring):
    ``log_softmax(logits / T)`` at the token, T = 1 for greedy rows, before top-k/top-p.

    ``logits``: float32 ``[batch, vocab]`` raw logits. Greedy rows take the argmax; other rows apply
    temperature, top-k, then top-p (nucleus) to a copy, and draw from their own generator. With
    ``failed`` given, a row whose probabilities cannot be sampled (NaN/inf) is added to it instead of
    failing every row of the batch (its token is then meaningless).
    """
    temps = [1.0 if p.greedy else p.temperature for p in params]
    if all(t == 1.0 for t in temps):
        scaled = logits
    else:
        scaled = logits / torch.tensor(temps, dtype=logits.dtype, device=logits.device)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = scaled[i]
        if 0 < p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if 0 < p.top_p < 1:
            sorted_l, order = torch.sort(row, descending=True)
            cum = torch.softmax(sorted_l, dim=-1).cumsum(-1)
            drop = cum - torch.softmax(sorted_l, dim=-1) >= p.top_p  # keep the token that crosses top_p
            row = row.scatter(0, order[drop], float("-inf"))
        probs = torch.softmax(row, dim=-1)
        try:
            tokens[i] = torch.multinomial(probs, 1, generator=generators[i])[0]
        except RuntimeError:
            if failed is None:
                raise
            failed.add(i)
    return tokens, logp.gather(1, tokens[:, None])[:, 0]
