"""vLLM (v1 engine, ``AsyncLLM``) backend for GPUs, written against vLLM 0.24.

vLLM is imported lazily (inside methods), so this module imports where vLLM is absent; constructing the
backend there raises FAILED_PRECONDITION. It is exercised by the ``gpu``-marked tests
(``services/inference/tests/test_vllm_gpu.py``, ``test_vllm_logprobs.py``) on the GPU machine; CI deselects them.

- Prompts go in as token ids (``{"prompt_token_ids": [...]}``) and come out as token ids: the policy layer
  renders chat templates with the same HF tokenizer, so the ids are what RL trains on.
- Logprobs: ``logprobs=0`` asks for the sampled token's logprob only, and the engine runs with
  ``logprobs_mode="processed_logprobs"``. What vLLM 0.24's v1 sampler computes there (read in
  ``vllm/v1/sample/sampler.py`` and ``ops/topk_topp_sampler.py``): after penalties and logits processors
  (none used here), greedy rows get ``log_softmax(logits)``; sampled rows get ``log_softmax`` of the
  logits divided by the temperature *and masked by top-k/top-p* (renormalised over the kept tokens).
  ``raw_logprobs`` would be ``log_softmax(logits)`` whatever the temperature. So "processed" is the
  convention (``log_softmax(logits / T)``, T = 1 for greedy, before truncation) exactly when top-k and
  top-p are off, and requests asking for logprobs with either filter on are rejected (INVALID_ARGUMENT)
  instead of reporting renormalised values. ``tests/test_vllm_logprobs.py`` (``gpu``) checks it against a
  teacher-forced forward pass.
- Versions, two kinds:
  * LoRA (``adapter_path``): each version is a new ``LoRARequest`` (fresh ``lora_int_id``); a request
    carries the LoRARequest current at admission, so in-flight requests finish on the old adapter with
    no pause at all. Pushed LoRA tensors (PushWeights with ``is_adapter``) are written as a PEFT directory
    owned by the backend (``adapters.AdapterDirs``) and loaded the same way; the directory is kept while
    its version is current or a request bound to it is in flight (vLLM may re-read it when the adapter
    was evicted from its CPU cache), and deleted after.
  * Full weights (``model_path`` or PushWeights): the engine holds one set of weights, so the update
    closes an admission gate, waits for requests in flight to finish (they finish on the old version),
    loads the new tensors into the running workers through ``collective_rpc`` (methods of
    ``WolfpackWorkerExtension``), resets the prefix cache (its KV was computed by the old weights), bumps
    the version and reopens the gate. New requests wait during the swap instead of failing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

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
)
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.prompts import strip_think

log = logging.getLogger(__name__)
_FINISH = {"stop": Finish.STOP, "length": Finish.LENGTH, "abort": Finish.ABORT}
_lora_ids = itertools.count(1)
EXTENSION = "wolfpack_inference.backends.vllm_worker.WolfpackWorkerExtension"
LOGPROBS_MODE = "processed_logprobs"
"""The engine's logprobs mode: the logprob convention when top-k/top-p are off (module docstring)."""


def check_logprob_convention(s: Sampling) -> None:
    """Reject sampling settings under which ``LOGPROBS_MODE`` is not the logprob convention: logprobs
    asked for a sampled (not greedy) request with top-k or top-p on, which vLLM renormalises over the
    kept tokens."""
    if s.logprobs and not s.greedy and (s.top_k > 0 or s.top_p < 1.0):
        raise InferenceError(
            ErrorCode.INVALID_ARGUMENT,
            "vllm backend: logprobs with top_k/top_p would be renormalised over the kept tokens, not "
            "log_softmax(logits / T); leave top_k = 0 and top_p = 1 (or 0) when asking for logprobs",
        )


def _vllm() -> Any:
    try:
        import vllm  # type: ignore[import-not-found]  # GPU-only dependency
    except ImportError:
        raise InferenceError(
            ErrorCode.FAILED_PRECONDITION, "the vllm backend needs the `vllm` package (GPU machines only)"
        ) from None
    return vllm


def _export_package_path() -> None:
    """Put this package's root on ``PYTHONPATH``: vLLM's engine-core process (spawned, not forked) must
    import ``WolfpackWorkerExtension`` by name even when the caller only edited ``sys.path``."""
    root = str(Path(__file__).resolve().parents[2])
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *parts])


GIB = 1024**3


def memory_hint(utilization: float, free_bytes: int, total_bytes: int) -> str | None:
    """Why a vLLM engine could not start, when the card's free memory is the reason: vLLM asks for
    ``utilization`` x the card's total at start-up and refuses when less is free, but that refusal is logged
    by its engine-core process only, and the caller sees "Engine core initialization failed. See root cause
    above. Failed core proc(s): {}". Seen in s26 (bench/results/2026-11-28-h200x4-hold-s26.md): the GPU test
    beside a training run on the same card found 34.1 GiB free where 0.30 asked for 41.9. None when the free
    memory covers the request (the cause is elsewhere)."""
    wanted = utilization * total_bytes
    if total_bytes <= 0 or free_bytes >= wanted:
        return None
    return (
        f"the card has {free_bytes / GIB:.1f} GiB free of {total_bytes / GIB:.1f} GiB and "
        f"gpu_memory_utilization {utilization:.2f} asks for {wanted / GIB:.1f} GiB at start-up: lower the "
        f"policy's gpu_memory_utilization (a train config's inference.gpu_memory_utilization) to at most "
        f"{free_bytes / total_bytes:.2f}, or free the card (another process holds "
        f"{(total_bytes - free_bytes) / GIB:.1f} GiB)"
    )


def _free_memory_hint(utilization: float) -> str | None:
    """``memory_hint`` for this process's first visible card, read after the engine failed (reading it before
    would start CUDA in this process, which changes how vLLM starts its engine core); None where it cannot be
    read."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info()
    except Exception:  # a hint must never hide the engine's own error
        return None
    return memory_hint(utilization, int(free), int(total))


def _has_tokenizer(path: str) -> bool:
    p = Path(path)
    return not p.is_dir() or any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))


class VLLMBackend(Backend):
    name = "vllm"

    @classmethod
    def from_config(cls, cfg: PolicyConfig, cache_dir: Path) -> VLLMBackend:
        from wolfpack_inference.models import resolve_model

        return cls(resolve_model(cfg.model, cache_dir), cfg)

    def __init__(self, model_path: str, cfg: PolicyConfig) -> None:
        vllm = _vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs  # type: ignore[import-not-found]
        from vllm.v1.engine.async_llm import AsyncLLM  # type: ignore[import-not-found]

        self.cfg = cfg
        self.model = model_path
        self.adapter = ""
        self.version = cfg.version
        self.ignore_eos = cfg.ignore_eos
        with_tokenizer = _has_tokenizer(model_path)
        _export_package_path()
        args = AsyncEngineArgs(
            model=model_path,
            dtype="auto" if cfg.dtype == "auto" else cfg.dtype,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=cfg.enforce_eager,
            enable_lora=cfg.enable_lora,
            max_loras=cfg.max_loras,
            max_lora_rank=cfg.max_lora_rank,
            max_num_seqs=max(cfg.max_batch, 1),
            skip_tokenizer_init=not with_tokenizer,
            logprobs_mode=LOGPROBS_MODE,
            worker_extension_cls=EXTENSION,
            disable_log_stats=True,
        )
        try:
            self.engine = AsyncLLM.from_engine_args(args)
        except Exception as exc:
            hint = _free_memory_hint(cfg.gpu_memory_utilization)
            if hint is None:
                raise
            raise InferenceError(
                ErrorCode.FAILED_PRECONDITION, f"vllm engine did not start ({exc}): {hint}"
            ) from exc
        self.max_positions = int(self.engine.model_config.max_model_len)
        self._tokenizer: Any = None
        if with_tokenizer:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(model_path)
        self._lora: Any = None
        self._adapters = AdapterDirs()
        if cfg.adapter:
            self._lora = self._lora_request(cfg.adapter, self.version)
            self.adapter = cfg.adapter
        self._gate = asyncio.Event()
        self._gate.set()
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        log.info("vllm engine ready", extra={"model": model_path, "vllm": vllm.__version__})

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _lora_request(self, path: str, version: int) -> Any:
        from vllm.lora.request import LoRARequest  # type: ignore[import-not-found]

        # keywords: newer vLLM releases reorder the positional fields (lora_path before lora_int_id)
        return LoRARequest(
            lora_name=f"{self.cfg.policy_id}-v{version}", lora_int_id=next(_lora_ids), lora_path=path
        )

    def _params(self, s: Sampling, streaming: bool) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind  # type: ignore[import-not-found]

        return SamplingParams(
            n=s.n,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else -1,
            seed=s.seed,
            stop=list(s.stop) or None,
            logprobs=0 if s.logprobs else None,
            ignore_eos=self.ignore_eos,
            detokenize=self._detokenize_in_engine(s, streaming),
            skip_special_tokens=True,
            output_kind=RequestOutputKind.DELTA if streaming else RequestOutputKind.FINAL_ONLY,
        )

    def _detokenize_in_engine(self, s: Sampling, streaming: bool) -> bool:
        """Whether vLLM itself turns tokens into text for this request.

        Why not always: with logprobs on, vLLM's output loop decodes every sampled token twice (the
        incremental text and each logprob entry's text), in the API server's process, one token at a
        time; on the GPU rollout bench that was ~20 % of that process's CPU. A final-only request needs
        only the whole text once, which ``generate`` decodes itself. Streaming (text deltas) and stop
        strings (matched on text inside the engine) still need the engine's detokenizer."""
        if self._tokenizer is None:
            return False
        return streaming or bool(s.stop)

    async def _admit(self) -> tuple[int, Any]:
        """Wait for an open gate, then count the request in flight and bind it to the current version
        (and to its adapter directory, when that was pushed)."""
        await self._gate.wait()
        self._inflight += 1
        self._idle.clear()
        if self._lora is not None:
            self._adapters.acquire(self._lora.lora_path)
        return self.version, self._lora

    def _release(self, lora: Any) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()
        if lora is not None:
            self._adapters.release(lora.lora_path)

    def _set_lora(self, lora: Any) -> None:
        """Make ``lora`` (or no adapter) current; the current version holds one use of its directory."""
        if lora is not None:
            self._adapters.acquire(lora.lora_path)
        old, self._lora = self._lora, lora
        if old is not None:
            self._adapters.release(old.lora_path)

    @staticmethod
    def _logprobs(token_ids: list[int], entries: Any) -> list[float]:
        if not entries:
            return []
        # zip, not entries[i]: indexing vLLM's flat logprobs container builds a dict per call
        return [float(d[t].logprob) for d, t in zip(entries, token_ids, strict=True)]

    async def _run(self, request: Request, streaming: bool) -> AsyncIterator[tuple[int, Any]]:
        s = request.sampling
        check_logprob_convention(s)
        check_prompt_length(len(request.prompt_ids), s.max_tokens, self.max_positions)
        version, lora = await self._admit()
        try:
            rid = request.request_id or uuid.uuid4().hex
            async for out in self.engine.generate(
                {"prompt_token_ids": list(request.prompt_ids)},
                self._params(s, streaming),
                f"{rid}-{uuid.uuid4().hex[:8]}",
                lora_request=lora,
            ):
                yield version, out
        except InferenceError:
            raise
        except Exception as exc:  # vLLM validation errors are ValueError subclasses
            code = ErrorCode.INVALID_ARGUMENT if isinstance(exc, ValueError) else ErrorCode.INTERNAL
            raise InferenceError(code, f"vllm: {exc}") from exc
        finally:
            self._release(lora)

    async def generate(self, request: Request) -> Result:
        version, final = 0, None
        async for bound, out in self._run(request, streaming=False):
            version, final = bound, out
        if final is None:
            raise InferenceError(ErrorCode.INTERNAL, "vllm returned no output")
        completions = []
        decode_here = self._tokenizer is not None and not self._detokenize_in_engine(request.sampling, False)
        for o in sorted(final.outputs, key=lambda o: o.index):
            ids = list(o.token_ids)
            text = self._tokenizer.decode(ids, skip_special_tokens=True) if decode_here else (o.text or "")
            completions.append(
                Completion(
                    token_ids=ids,
                    logprobs=self._logprobs(ids, o.logprobs) if request.sampling.logprobs else [],
                    text=strip_think(text) if request.strip_think else text,
                    finish=_FINISH.get(o.finish_reason or "", Finish.ABORT),
                )
            )
        # the engine got its own copy of the prompt: this request's list is handed on as is
        return Result(completions, version, request.prompt_ids, len(request.prompt_ids))

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        if request.sampling.n != 1:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "streaming supports n == 1 only")
        async for version, out in self._run(request, streaming=True):
            o = out.outputs[0]
            ids = list(o.token_ids)
            finish = _FINISH.get(o.finish_reason or "", Finish.ABORT) if out.finished else None
            yield StreamChunk(
                ids,
                self._logprobs(ids, o.logprobs) if request.sampling.logprobs else [],
                o.text or "",
                version,
                finish,
            )

    async def load(self, version: int, model_path: str = "", adapter_path: str = "") -> None:
        if adapter_path:
            if not self.cfg.enable_lora:
                raise InferenceError(
                    ErrorCode.FAILED_PRECONDITION, "this vllm policy runs with enable_lora off"
                )
            lora = self._lora_request(adapter_path, version)
            try:
                await self.engine.add_lora(lora)  # load before switching, so admission never waits on disk
            except Exception as exc:  # vLLM reports a bad adapter (modules, rank, dtype) as ValueError
                code = ErrorCode.INVALID_ARGUMENT if isinstance(exc, ValueError) else ErrorCode.INTERNAL
                raise InferenceError(code, f"vllm: adapter {adapter_path}: {exc}") from exc
            self._set_lora(lora)
            self.adapter, self.version = adapter_path, version
            return
        await self._swap_weights(version, model_path or self.model)
        self.model = model_path or self.model

    async def update_weights(
        self,
        version: int,
        tensors: Mapping[str, Any],
        is_adapter: bool,
        adapter_config: Mapping[str, Any] | None = None,
    ) -> None:
        if is_adapter:
            await self._push_adapter(version, tensors, adapter_config)
            return
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="wolfpack-push-") as tmp:
            flat = {k: v.contiguous() for k, v in tensors.items()}
            await asyncio.to_thread(save_file, flat, str(Path(tmp) / "model.safetensors"))
            await self._swap_weights(version, tmp)

    async def _push_adapter(
        self, version: int, tensors: Mapping[str, Any], adapter_config: Mapping[str, Any] | None
    ) -> None:
        """Pushed LoRA tensors → a PEFT directory owned by this backend → ``load(adapter_path=...)``."""
        if adapter_config is None:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "pushed LoRA weights need their adapter config")
        if not self.cfg.enable_lora:
            raise InferenceError(ErrorCode.FAILED_PRECONDITION, "this vllm policy runs with enable_lora off")
        ranks = [int(t.shape[0]) for k, t in tensors.items() if "lora_A" in k or "lora_embedding_A" in k]
        if max(ranks, default=0) > self.cfg.max_lora_rank:
            raise InferenceError(
                ErrorCode.INVALID_ARGUMENT,
                f"adapter rank {max(ranks)} exceeds this engine's max_lora_rank ({self.cfg.max_lora_rank})",
            )
        path = await asyncio.to_thread(self._adapters.write, version, adapter_config, tensors)
        try:
            await self.load(version, adapter_path=str(path))
        except BaseException:
            self._adapters.discard(path)
            raise

    async def _swap_weights(self, version: int, path: str) -> None:
        """Gate closed → drain → load into workers → reset prefix cache → new version → gate open."""
        if self.cfg.enable_lora:
            # Measured on vLLM 0.24 (H200): with LoRA on, the linear layers are wrapped (``base_layer``)
            # and the model's weight loader no longer finds their parameters.
            raise InferenceError(
                ErrorCode.FAILED_PRECONDITION,
                "full-weight updates need a policy with enable_lora=false (vLLM wraps layers for LoRA); "
                "update LoRA policies by loading a new adapter",
            )
        self._gate.clear()
        try:
            await self._idle.wait()
            await self.engine.collective_rpc("wolfpack_load_safetensors", args=(path,))
            await self.engine.reset_prefix_cache()
            self._set_lora(None)  # a full checkpoint replaces base and adapter alike
            self.adapter = ""
            self.version = version
        finally:
            self._gate.set()

    async def weight_checksum(self) -> float:
        sums = await self.engine.collective_rpc("wolfpack_weight_checksum")
        return float(sum(sums))

    async def close(self) -> None:
        self.engine.shutdown()
        self._adapters.close()
