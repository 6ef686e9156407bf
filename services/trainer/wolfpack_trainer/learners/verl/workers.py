"""verl's ``TrainingWorker`` with the few calls the ``verl_fsdp`` learner needs beyond verl's own, and the one
way to run a set of them: in this process (one GPU, or the CPU) or as verl Ray worker groups (several GPUs,
this host or an existing Ray cluster).

Why a subclass: verl's worker trains and infers, but hands its weights only to a co-located vLLM through its
checkpoint engine. Wolfpack pushes weights to a separate inference service and checkpoints the whole run, so
the worker also gathers its full state (``full_state``, every rank takes part in the collective, rank 0
returns it) and loads one (``load_full_state``). They are registered with verl's dispatch modes, so the same
methods work on a local worker and across a worker group.

Why verl's worker groups rather than our own process pool: placement (``RayResourcePool``), rank set-up,
data-parallel dispatch of batches and the collection of results are verl's (``RayWorkerGroup``), the same
machinery ``main_ppo`` runs, and ``ray.init(address=...)`` joins a cluster that spans hosts.

This module imports verl at import time: the learner imports it only once verl is known to be there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import TrainingWorker

F = TypeVar("F", bound=Callable[..., Any])
_register: Any = register  # verl's decorators are untyped

LOGPROB_CHUNK_ROWS = 4096


class _BlockLogprobs(torch.autograd.Function):
    """log p(label) over ``(rows, vocab)`` logits, block by block, keeping only the logits for the backward.

    Why a Function: autograd on ``gather`` + per-block ``logsumexp(block.float())`` keeps every float32 block
    for the backward, i.e. a float32 copy of the micro-batch's packed logits (4 bytes per token x vocab, on
    top of the bf16 logits it also keeps). Here the backward recomputes ``softmax`` per block from the logits
    and the saved log-sum-exp, so a micro-batch holds 4 bytes per token x vocab less until its backward."""

    @staticmethod
    def forward(ctx: Any, flat: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        picked = flat.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
        lse = torch.cat(
            [torch.logsumexp(block.float(), dim=-1) for block in torch.split(flat, LOGPROB_CHUNK_ROWS)]
        )
        ctx.save_for_backward(flat, labels, lse)
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        flat, labels, lse = ctx.saved_tensors
        out = torch.empty_like(flat)
        for start in range(0, flat.shape[0], LOGPROB_CHUNK_ROWS):
            rows = slice(start, start + LOGPROB_CHUNK_ROWS)
            g = grad[rows].unsqueeze(-1)
            # d/dx (x[label] - logsumexp(x)) = onehot(label) - softmax(x), rounded as autograd rounds it
            # (the softmax part in float32 cast to the logits' dtype, then the label's part added in it), so
            # bf16 updates are the same as before this Function, not merely as close
            out[rows] = (flat[rows].float() - lse[rows].unsqueeze(-1)).exp_().mul_(-g)
            out[rows].scatter_add_(-1, labels[rows].unsqueeze(-1), g.to(out.dtype))
        return out, None


def chunked_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) as ``logit[label] - logsumexp(logits)``, the log-sum-exp taken over blocks of rows.

    verl's fallback when flash-attn's cross-entropy kernel is missing (``logprobs_from_logits_v2``; no
    flash-attn wheel exists for our GPU hosts) loops over the *first* dimension one row at a time; the engine
    hands it the packed ``(tokens, vocab)`` logits of a micro-batch, so it launched one kernel (and one
    autograd node) per token: 14 s of a 135M model's log-prob pass over 512 sequences on an H100 and most of
    its 48 s update. Blocks of rows keep the peak memory bounded the same way at a few kernels per micro-batch,
    and the backward keeps no float32 copy of the logits (``_BlockLogprobs``).
    bf16 logits are reduced in float32 (more exact than verl's bf16 ``log_softmax``); the result is float32.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    out: torch.Tensor = _BlockLogprobs.apply(flat, labels.reshape(-1))  # type: ignore[no-untyped-call]
    return out.view(labels.shape)


def _per_model_fused_forward(original: Callable[..., None]) -> Callable[..., None]:
    """verl's ``patch_forward_with_backends`` with its forward bound to the one model it is given.

    Why: verl installs its fused-kernel forward (the learner's ``extra.fused_kernels``: log-probs and entropy from the last
    hidden states, block by block, without the full-vocabulary logits) by assigning ``model.__class__.forward``,
    i.e. for every model of that class in the process. Beside a learner that asked for it live the reference
    and critic engines, other learners (tests build several in one process) and, in local rollouts, the
    transformers backend generating with the same class, all of which need the class's own forward (it
    returns logits). The forward verl chose is moved onto the instance and the class gets its own back."""

    def patch(model: Any, *args: Any, **kwargs: Any) -> None:
        cls = type(model)
        before = cls.__dict__.get("forward")
        original(model, *args, **kwargs)
        chosen = cls.__dict__.get("forward")
        if chosen is not before and chosen is not None:
            if before is None:
                delattr(cls, "forward")
            else:
                cls.forward = before
            model.forward = chosen.__get__(model, cls)

    patch.wolfpack_per_model = True  # type: ignore[attr-defined]
    return patch


def use_chunked_logprobs() -> None:
    """Route verl's row-loop fallback to ``chunked_logprobs`` and bind verl's fused-kernel forward per model
    (``_per_model_fused_forward``). Idempotent; also runs in every Ray worker, which imports this module to
    build its worker class."""
    import verl.models.transformers.monkey_patch as verl_patch
    import verl.utils.torch_functional as verl_f

    if verl_f.logprobs_from_logits_v2 is not chunked_logprobs:
        # verl's own kept beside it, for bench/trainer comparisons
        setattr(verl_f, "wolfpack_row_loop", verl_f.logprobs_from_logits_v2)  # noqa: B010
    verl_f.logprobs_from_logits_v2 = chunked_logprobs
    if not getattr(verl_patch.patch_forward_with_backends, "wolfpack_per_model", False):
        verl_patch.patch_forward_with_backends = _per_model_fused_forward(
            verl_patch.patch_forward_with_backends
        )


use_chunked_logprobs()


def _cloned(value: Any) -> Any:
    """``value`` with every tensor in it (nested dicts and lists) copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _cloned(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cloned(v) for v in value)
    return value


def _resharded(module: Any) -> None:
    """Free every FSDP2 unit's gathered parameters. With ``reshard_after_forward`` off they stay gathered
    after a forward (and a forward-only pass has no backward to free them), and then the module's parameters
    are the gathered plain tensors, in the compute dtype: a state read would see those, a state load would
    copy into them (and fail), and a later forward would not gather the loaded weights. No-op otherwise."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()


def _one_to_all(fn: F) -> F:
    """verl's ``ONE_TO_ALL`` dispatch: every rank runs the call with the same arguments."""
    out: F = _register(dispatch_mode=getattr(Dispatch, "ONE_TO_ALL"))(fn)  # noqa: B009 (untyped enum)
    return out


class StateWorker(TrainingWorker):  # type: ignore[misc]
    """``TrainingWorker`` + full-state gather/load and a memory probe (see the module docstring)."""

    def _model_state(self) -> dict[str, torch.Tensor]:
        """The full weights on the CPU (a collective: every rank must call it; rank 0 gets them all)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        engine: Any = self.engine
        _resharded(engine.module)
        # clone: with cpu_offload on a CPU engine the returned tensors alias the live parameters
        return {
            k: v.detach().clone()
            for k, v in get_model_state_dict(engine.module, options=opts).items()
            if isinstance(v, torch.Tensor)
        }

    @_one_to_all
    def full_state(self, with_optimizer: bool) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        engine: Any = self.engine
        out: dict[str, Any] = {"model": self._model_state()}
        optimizer = getattr(engine, "optimizer", None)
        # Not before its first step: torch's get_optimizer_state_dict fills an empty optimizer by stepping it
        # once with zero gradients (lr 0), which leaves Adam's step counts at 1 without moments, so the first
        # real update came out at ~0.74x its size (bias correction of step 2). There is nothing to keep yet.
        if with_optimizer and optimizer is not None and optimizer.state:
            # cloned too: on a CPU engine the moments alias the live ones, and Adam's step counts are CPU
            # tensors on any device, so without a copy a kept state moves on with later updates
            out["optimizer"] = _cloned(
                get_optimizer_state_dict(engine.module, engine.optimizer, options=opts)
            )
            scheduler = getattr(engine, "lr_scheduler", None)
            out["lr_scheduler"] = scheduler.state_dict() if scheduler is not None else None
        return out if self.rank == 0 else {}

    @_one_to_all
    def load_full_state(self, state: Mapping[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        engine: Any = self.engine
        _resharded(engine.module)
        set_model_state_dict(engine.module, dict(state["model"]), options=opts)
        if state.get("optimizer") is not None:
            # a copy: torch's optimizer keeps the step tensors it is given and counts on in them
            set_optimizer_state_dict(
                engine.module, engine.optimizer, _cloned(dict(state["optimizer"])), options=opts
            )
        scheduler = getattr(engine, "lr_scheduler", None)
        if scheduler is not None and state.get("lr_scheduler") is not None:
            scheduler.load_state_dict(state["lr_scheduler"])

    @_one_to_all
    def save_model(self, path: str, drop: list[str]) -> str:
        """Gather the full weights and write them from rank 0 as one safetensors file at ``path`` (keys in
        ``drop`` left out), returning rank 0's host name ("" elsewhere).

        Why: a worker group's ``full_state`` travels from rank 0 to the driver through Ray's object store
        before the driver writes it, which doubled the publish time of FSDP over two GPUs (3.2-3.9 s against
        1.1-1.8 s for one in-process worker, SmolLM2 full weights). Rank 0 writing the file itself skips that
        hop; the learner does so only when rank 0 runs on its own host (the path must be the same file)."""
        import socket

        from safetensors.torch import save_file

        state = self._model_state()
        if self.rank != 0:
            return ""
        dropped = set(drop)
        tensors = {k: v.contiguous() for k, v in state.items() if k not in dropped}
        save_file(tensors, path, metadata={"format": "pt"})
        return socket.gethostname()

    @_one_to_all
    def lora_state(self) -> dict[str, torch.Tensor]:
        """The LoRA parameters alone, full, on the CPU (every rank takes part; rank 0's copy), under the names
        ``full_state`` gives them. FSDP2 only (its parameters keep the module's names).

        Why: an adapter publish gathered the whole model (0.5 GB in float32 for SmolLM2, ~2 s of a
        self-play update's 2.4 s publish) to keep its ~1 % of LoRA tensors."""
        engine: Any = self.engine
        _resharded(engine.module)
        out = {}
        for name, param in engine.module.named_parameters():
            if ".lora_" not in name:
                continue
            full = param.full_tensor() if hasattr(param, "full_tensor") else param  # a collective per tensor
            out[name] = full.detach().to("cpu", copy=True)
        return out if self.rank == 0 else {}

    @_one_to_all
    def hostname(self) -> str:
        import socket

        return socket.gethostname() if self.rank == 0 else ""

    @_one_to_all
    def max_memory_gb(self) -> float:
        return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0

    @_one_to_all
    def peft_config_json(self) -> str:
        """The LoRA adapter's peft config as JSON ("" without one)."""
        import json

        engine: Any = self.engine
        module = getattr(engine.module, "_fsdp_wrapped_module", engine.module)
        if not hasattr(module, "peft_config"):
            return ""
        cfg = module.peft_config["default"].to_dict()
        return json.dumps(cfg, sort_keys=True, default=lambda o: sorted(o) if isinstance(o, set) else str(o))


class Workers:
    """Named ``StateWorker``s, local or a verl Ray worker group each; calls look the same either way.

    ``call(name, method, *args)``: a ``ONE_TO_ALL`` method, rank 0's result. ``data(name, method, td)``: a
    data-parallel method (``infer_batch``/``train_mini_batch``), the gathered result.
    """

    def __init__(
        self,
        configs: Mapping[str, Any],
        *,
        ray_gpus: int = 0,
        ray_address: str | None = None,
        cuda_index: int | None = None,
    ) -> None:
        self.ray = ray_gpus > 0
        self.world_size = max(ray_gpus, 1)
        # The card of an in-process learner on CUDA. The current CUDA device is per thread and the trainer
        # runs each update in a fresh thread (``offload.off_loop``), where it is card 0 again: verl places
        # every micro-batch on the current device, so a learner on ``cuda:1`` (the split layout) got its
        # batches on card 0 ("Expected all tensors to be on the same device", seen on 2 H200s). Each local
        # call sets it first.
        self.cuda_index = None if self.ray else cuda_index
        if not self.ray:
            self._pin()
            self.local = {name: StateWorker(config=cfg) for name, cfg in configs.items()}
            self.groups: dict[str, Any] = {}
            return
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.single_controller.ray.base import create_colocated_worker_cls

        if not ray.is_initialized():
            env = {
                k: v
                for k, v in os.environ.items()
                if k.startswith(("PYTHONPATH", "WOLFPACK_", "HF_", "VERL_"))
            }
            env.setdefault("TOKENIZERS_PARALLELISM", "false")
            ray.init(address=ray_address or None, runtime_env={"env_vars": env}, log_to_driver=True)
        remote = ray.remote(StateWorker)
        classes = {name: RayClassWithInitArgs(cls=remote, config=cfg) for name, cfg in configs.items()}
        pool = RayResourcePool(process_on_nodes=[ray_gpus], use_gpu=True, max_colocate_count=1)
        group: Any = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=create_colocated_worker_cls(class_dict=classes),
            device_name="cuda",
        )
        self.local = {}
        self.groups = group.spawn(prefix_set=classes.keys())

    def __contains__(self, name: str) -> bool:
        return name in self.local or name in self.groups

    def _pin(self) -> None:
        if self.cuda_index is not None:
            torch.cuda.set_device(self.cuda_index)

    def call(self, name: str, method: str, *args: Any) -> Any:
        if not self.ray:
            self._pin()
            return getattr(self.local[name], method)(*args)
        out = getattr(self.groups[name], method)(*args)
        return out[0] if isinstance(out, list) else out

    def data(self, name: str, method: str, td: Any) -> Any:
        if not self.ray:
            self._pin()
            return getattr(self.local[name], method)(td)
        out = getattr(self.groups[name], method)(td)
        return out.get() if hasattr(out, "get") else out

    def engine(self, name: str) -> Any:
        """The in-process engine (local workers only: tests and the CPU path inspect it)."""
        if self.ray:
            raise RuntimeError("the engine lives in Ray workers; use full_state / call")
        return self.local[name].engine
