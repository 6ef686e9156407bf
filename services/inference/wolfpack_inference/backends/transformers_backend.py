"""The embedded backend: a Hugging Face causal LM (CPU or GPU) behind a micro-batching queue.

How a request runs: ``generate`` binds the request to the weights current *now* (``_Weights``, one object
per version) and queues it. A worker task takes the first queued job, waits ``batch_wait_ms`` for more,
and runs each group of jobs that share the same weights as one left-padded batch with an attention mask
and a KV cache, in a thread so the event loop keeps serving. Jobs bound to an older version keep that
version's model alive (they hold a reference to it) until they finish; then it is garbage-collected. This
is how "in-flight requests finish on the old version" holds without any pause.

Sampling is per row, so rows with different temperature/top-p/top-k/seed share a batch: each row has its
own ``torch.Generator`` (seeded rows are reproducible whatever else is in the batch).

Logprob convention: the reported logprob of a sampled token is ``log_softmax(raw_logits)[token]`` at
temperature 1, computed from the very logits the token was sampled from, i.e. the log-probability under
the *policy's* distribution, independent of the request's temperature/top-p/top-k. That is what RL
importance ratios and KL terms need (the trainer recomputes the same quantity with a teacher-forced
forward pass), and it equals such a recomputation up to float rounding.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
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
        """Run ``fn(*args)`` on the job's event loop (called from the decode thread)."""
        self.loop.call_soon_threadsafe(fn, *args)


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
    model's decode step measured 17 ms with 2 threads and 1.2 ms with 1); torch's default otherwise."""
    if device != "cpu":
        return
    if threads == 0 and sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS:
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
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held: list[_Job] = []
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

    async def _submit(self, job: _Job) -> None:
        if self._loop is not job.loop:  # first use, or a new event loop (an asyncio.Queue binds to one)
            self._loop, self._queue, self._worker, self._held = job.loop, asyncio.Queue(), None, []
        assert self._queue is not None
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run_worker(), name="transformers-batcher")
        await self._queue.put(job)

    async def generate(self, request: Request) -> Result:
        job = self._job(request, streaming=False)
        await self._submit(job)
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
        await self._submit(job)
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

    # --- the batching worker --------------------------------------------------------------------------

    async def _run_worker(self) -> None:
        assert self._queue is not None
        while True:
            jobs = self._held or [await self._queue.get()]
            self._held = []
            await self._gather_more(jobs)
            batch: list[_Job] = []
            rows = 0
            for job in jobs:
                if job.cancelled:
                    _set_done(job.done, None)
                elif batch and (rows + len(job.rows) > self.max_batch or job.weights is not batch[0].weights):
                    self._held.append(job)  # next round: too many rows or another version
                else:
                    batch.append(job)
                    rows += len(job.rows)
            if not batch:
                continue
            try:
                await asyncio.to_thread(self._run_batch, batch)
            except Exception as exc:  # a failed batch fails its requests, not the worker
                log.exception("batch failed")
                for job in batch:
                    err = InferenceError(ErrorCode.INTERNAL, f"generation failed: {exc}")
                    _set_done(job.done, err)
                    if job.chunks is not None:
                        job.chunks.put_nowait(None)

    async def _gather_more(self, jobs: list[_Job]) -> None:
        """Wait ``batch_wait_ms`` for more jobs, and keep waiting (up to 4x) while they keep coming.

        Why adaptive: a burst of N concurrent gRPC calls reaches the queue spread over several
        milliseconds (each is deserialised on the event loop); a fixed window cut such bursts in two
        batches decoded one after the other."""
        assert self._queue is not None
        waited, step = 0.0, self.batch_wait_s
        # queued jobs count as one row each here (n > 1 is rare); the batch itself is cut exactly later
        while (
            step > 0 and len(jobs) + self._queue.qsize() < self.max_batch and waited < 4 * self.batch_wait_s
        ):
            before = self._queue.qsize()
            await asyncio.sleep(step)
            waited += step
            if self._queue.qsize() == before:
                break  # a quiet period: the burst is over
            step = self.batch_wait_s / 2
        while not self._queue.empty():
            jobs.append(self._queue.get_nowait())

    @torch.inference_mode()
    def _run_batch(self, jobs: list[_Job]) -> None:
        """Decode one batch to completion (runs in a worker thread)."""
        model = jobs[0].weights.model
        version = jobs[0].weights.version
        owners = [(job, row) for job in jobs for row in job.rows]
        rows = [row for _, row in owners]
        b = len(rows)
        width = max(len(r.prompt) for r in rows)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[i, width - len(r.prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        dev = self.device
        out = model(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        next_pos = positions[:, -1] + 1
        steps = max(r.sampling.max_tokens for r in rows)
        for step in range(steps):
            logits = out.logits[:, -1, :].float().cpu()
            tokens, logprobs = sample(logits, [r.sampling for r in rows], [r.generator for r in rows])
            for i, (job, row) in enumerate(owners):
                if row.finish is not None:
                    continue
                tok, lp = int(tokens[i]), float(logprobs[i])
                if job.cancelled:
                    row.finish = Finish.ABORT
                    continue
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
            if all(r.finish is not None for r in rows) or step == steps - 1:
                break
            feed = torch.tensor(
                [[t if r.finish is None else self.pad_id] for t, r in zip(tokens.tolist(), rows, strict=True)]
            )
            mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
            out = model(
                input_ids=feed.to(dev),
                attention_mask=mask.to(dev),
                position_ids=next_pos[:, None].to(dev),
                past_key_values=cache,
                use_cache=True,
            )
            next_pos = next_pos + 1
        for job in jobs:
            for row in job.rows:
                if row.finish is None:
                    row.finish = Finish.ABORT
                    if job.chunks is not None:
                        job.notify(job.chunks.put_nowait, StreamChunk([], [], "", version, Finish.ABORT))
            job.notify(_set_done, job.done, None)

    async def close(self) -> None:
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
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
    logits: torch.Tensor, params: list[Sampling], generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its logprob at temperature 1 (see the module docstring).

    ``logits``: float32 ``[batch, vocab]`` raw logits. Greedy rows take the argmax; other rows apply
    temperature, top-k, then top-p (nucleus) to a copy, and draw from their own generator.
    """
    logp = torch.log_softmax(logits, dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = logits[i] / p.temperature
        if 0 < p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if 0 < p.top_p < 1:
            sorted_l, order = torch.sort(row, descending=True)
            cum = torch.softmax(sorted_l, dim=-1).cumsum(-1)
            drop = cum - torch.softmax(sorted_l, dim=-1) >= p.top_p  # keep the token that crosses top_p
            row = row.scatter(0, order[drop], float("-inf"))
        probs = torch.softmax(row, dim=-1)
        tokens[i] = torch.multinomial(probs, 1, generator=generators[i])[0]
    return tokens, logp.gather(1, tokens[:, None])[:, 0]
