"""The GPU learner: verl 0.9.1's FSDP training engine (``TrainingWorker``, as ``ActorRolloutRefWorker`` builds
it) behind Wolfpack's ``Learner`` contract, registered as ``verl_fsdp``.

Why verl's engine rather than our own FSDP code: it is what stock verl PPO runs (FSDP1/FSDP2 wrapping,
mixed precision, gradient accumulation over micro-batches, the LR schedule, log-probs and entropy on
no-padding batches) and its loss is verl's ``ppo_loss`` configured from our ``LossConfig``, so a batch
trained here and one trained by ``main_ppo`` see the same maths. The trainer loop hands a ``TrainBatch``
(verl key names already); this module only turns it into the TensorDicts verl's worker takes, the way
``verl/trainer/ppo/ray_trainer.py`` does, and back.

One process drives one engine on a single GPU (or the CPU), or verl's Ray worker groups drive one rank per
GPU (``extra.ray_gpus``); under ``torchrun`` each rank must call the same methods with the same batch. Attention is
``sdpa`` without padding removal (no flash-attn wheel on the GPU hosts). On a machine without CUDA the
learner still runs (FSDP2 on gloo) through a small CPU platform for verl, which has none: slow, but it
lets CI exercise this exact code path.

``config.extra`` keys: ``strategy`` ("fsdp2" default, or "fsdp" = FSDP1), ``param_offload``,
``optimizer_offload``, ``gradient_checkpointing`` (the decoder layers' activations recomputed in the
backward: ~27 KB per token per layer of SmolLM2 kept → ~1 KB, what lets a recipe run larger micro-batches),
``reshard_after_forward`` (default true, verl's; false keeps each layer's gathered parameters from its forward
to its backward and across forward-only micro-batches instead of gathering them again: one GPU, a bf16 copy of
the model more memory, less fixed cost per micro-batch; see bench/results/2026-11-27-learner-microbatch-cpu.md),
``fused_kernels`` (default false: verl's fused-kernel forward, torch backend, for the policy and its KL
reference: log-probs and entropy computed from the last hidden states 512 tokens at a time and recomputed in
the backward, so a micro-batch keeps no full-vocabulary logits (~0.4 MB per token of SmolLM2 on a GPU,
``bench/trainer/bench_learner_memory.py``); what lets long-prompt recipes run larger micro-batches),
``infer_micro_batch_size``, ``total_training_steps``
(LR schedule length), ``warmup_steps``, ``critic_lr`` (default 10 x ``lr``), ``mixed_precision``;
``sort_by_length`` (default true: micro-batches of rows of like length, see below), ``short_padding_rows``
(default true: padding rows two tokens long); ``ray_gpus`` (or ``ray: true`` = every visible GPU) runs the
workers as verl Ray worker groups with FSDP over that many GPUs, ``ray_address`` joining an existing Ray
cluster (``workers.py``).

LoRA (``lora_rank`` > 0) goes through verl's own FSDP + peft path; its KL reference is the base with the
adapter disabled, and versions leave as peft adapters. ``value_head`` (PPO with GAE) adds verl's critic (a
value model on the same base, verl's value loss, its own optimiser). Batches of any size are padded with
rows that train on nothing to the even splits verl's dispatch and micro-batches need.

Padding. Without padding removal verl's engine pads each micro-batch to its own longest row
(``prepare_model_inputs``: nested rows → ``to_padded_tensor`` at the micro-batch's max length) and computes
the model, the full-vocabulary logits and their log-softmax/entropy over every padded position. Micro-batches
are cut in order from each mini-batch verl's shuffle draws, so a micro-batch of 8 random Werewolf turns
(300-700 prompt tokens) is padded to nearly the longest turn of the update. With ``sort_by_length`` the
learner hands verl the very mini-batches its shuffle would draw (``train_order``), each ordered longest
first, so micro-batches hold rows of like length; the loss is normalised over the whole mini-batch before
the split (``batch_num_tokens``, ``global_batch_size``) and the gradient is the sum over micro-batches, so
the step is the same up to float rounding. Forward-only passes (log-probs, values) take the whole batch
longest first (``infer_order``) and map the results back to the batch's order. Per update the metrics report
``perf/learner_{infer,train}_pad_frac``: the share of computed tokens that were padding.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import socket
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch

from wolfpack_trainer.learners.base import (
    ExportedWeights,
    Learner,
    LearnerConfig,
    TrainBatch,
    register_learner,
    resolve_device,
    write_tokenizer,
)

_METRIC_NAMES = {
    "actor/pg_loss": "actor/pg_loss",
    "actor/pg_clipfrac": "actor/pg_clipfrac",
    "actor/ppo_kl": "actor/ppo_kl",
    "actor/pg_clipfrac_lower": "actor/pg_clipfrac_lower",
    "actor/entropy": "actor/entropy",
    "actor/entropy_loss": "actor/entropy",  # verl's name for the mean entropy it aggregates into the loss
    "entropy_loss": "actor/entropy",
    "actor/kl_loss": "actor/kl_loss",
    "kl_loss": "actor/kl_loss",
    "grad_norm": "actor/grad_norm",
    "actor/grad_norm": "actor/grad_norm",
    "loss": "actor/loss",
    "lr": "actor/lr",
    "actor/lr": "actor/lr",
}


def resolve_model_path(spec: str, cache_dir: str) -> str:
    """``tiny`` / ``smollm2`` / a GGUF file → a checkpoint directory (``wolfpack.models`` builds and caches
    those, for inference too); anything else is a local directory or HF id, used as is."""
    if spec in ("tiny", "smollm2") or spec.endswith(".gguf"):
        from wolfpack.models import resolve_model

        return resolve_model(spec, Path(cache_dir))
    return spec


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def use_cpu_platform() -> None:
    """Give verl a CPU "device" (verl 0.9.1 has no CPU platform: with no GPU it assumes CUDA and calls
    ``torch.cuda`` everywhere). Must run before ``verl.workers`` modules are imported, since some read
    the platform at import time. Idempotent."""
    from verl.plugin.platform.platform_cuda import PlatformCUDA
    from verl.plugin.platform.platform_manager import get_platform, set_platform

    if get_platform().device_name == "cpu":
        return

    class _CpuModule:
        """Stands in for ``torch.cuda``: memory queries report 0, everything else is a no-op."""

        @staticmethod
        def mem_get_info(*_a: Any, **_k: Any) -> tuple[int, int]:
            return (0, 0)

        @staticmethod
        def get_device_name(*_a: Any, **_k: Any) -> str:
            return "cpu"

        def __getattr__(self, name: str) -> Any:
            found = getattr(torch.cpu, name, None)
            return found if found is not None else (lambda *_a, **_k: 0)

    class PlatformCPU(PlatformCUDA):  # type: ignore[misc]
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: _CpuModule())

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, *_a: Any, **_k: Any) -> None:
            return None

        def synchronize(self, *_a: Any, **_k: Any) -> None:
            return None

        def empty_cache(self, *_a: Any, **_k: Any) -> None:
            return None

        def set_allocator_settings(self, *_a: Any, **_k: Any) -> None:
            return None

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def communication_backend_name(self) -> str:
            return "gloo"

        def nvtx_range(self, msg: str) -> Any:
            return nullcontext()

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return (None, None)

    set_platform(PlatformCPU())
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"  # verl registers its FSDP engines under the cuda/npu keys only


def use_sdpa_value_model() -> None:
    """verl 0.9.1 builds its critic with ``attn_implementation="flash_attention_2"`` hard-coded (falling back
    to trl's value-head wrapper); flash-attn has no wheel for these hosts and trl is not a dependency, so the
    critic is loaded the same way with sdpa attention, like the actor (``override_config`` above). Idempotent."""
    import verl.utils.model as verl_model

    if getattr(verl_model.load_valuehead_model, "wolfpack_sdpa", False):
        return

    def load(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool) -> Any:
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification.from_pretrained(
            local_path, dtype=torch_dtype, config=model_config, attn_implementation="sdpa",
            trust_remote_code=trust_remote_code,
        )  # fmt: skip

    load.wolfpack_sdpa = True  # type: ignore[attr-defined]
    verl_model.load_valuehead_model = load


def cuda_index(device: str, env: Mapping[str, str]) -> int:
    """The card a one-process learner trains on: each rank's ``LOCAL_RANK`` under torchrun (several ranks),
    else the index of ``cuda:N`` — so ``device: cuda:1`` puts the learner on the second card while vLLM keeps
    the first (the split layout on a 2-GPU host) — else ``LOCAL_RANK`` or 0."""
    if int(env.get("WORLD_SIZE", "1")) > 1:
        return int(env.get("LOCAL_RANK", "0"))
    if device.startswith("cuda:"):
        return int(device.split(":", 1)[1])
    return int(env.get("LOCAL_RANK", "0"))


def _init_process_group(use_cuda: bool, device: str = "cuda") -> None:
    """A process group for verl's engine: torchrun's when launched by it, else a one-process group."""
    import torch.distributed as dist

    if use_cuda:  # before any engine is built: verl places its modules on the current device
        torch.cuda.set_device(cuda_index(device, os.environ))
    if dist.is_initialized():
        return
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                       ("LOCAL_WORLD_SIZE", "1")):  # fmt: skip
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", _free_port())
    dist.init_process_group(
        backend="cpu:gloo,cuda:nccl" if use_cuda else "gloo",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )


def _scalar(value: Any) -> float:
    return float(value.value if hasattr(value, "value") else value)


def _means(metrics: Mapping[str, Any], name: Callable[[str], str]) -> dict[str, float]:
    """verl's per-micro-batch metric lists (or scalars) as one mean each, under ``name(key)``; empty lists
    are left out."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        values = [_scalar(v) for v in (value if isinstance(value, list) else [value])]
        if values:
            out[name(key)] = sum(values) / len(values)
    return out


def longest_first(rows: list[int], lengths: list[int]) -> list[int]:
    """``rows`` ordered by ``lengths[row]``, longest first; ties keep their order (deterministic)."""
    return sorted(rows, key=lambda row: -lengths[row])


def infer_order(lengths: list[int], world: int) -> list[int]:
    """The row order a forward-only pass gets: all rows longest first, dealt round-robin to the ``world``
    ranks (verl's dispatch hands rank r the r-th contiguous slice), so every micro-batch holds neighbours
    in length and every rank a like share of the work. The caller maps the results back."""
    ranked = longest_first(list(range(len(lengths))), lengths)
    return [row for rank in range(world) for row in ranked[rank::world]]


def train_order(
    lengths: list[int], world: int, mini: int, epochs: int, seed: int, sort: bool = True
) -> list[int]:
    """The rows of ``epochs`` epochs, in the order verl's ``train_mini_batch`` would visit them, each
    mini-batch longest first; one block per rank (the rank's slice of the batch, as dispatched).

    The mini-batches are verl's own: the same shuffle (``tensordict_utils.make_iterator`` with the seed
    ``seed + rank`` it is given there) run here on row indices. Only the order inside a mini-batch changes,
    which decides how it is cut into micro-batches; the mini-batch's loss is normalised over the whole
    mini-batch (``batch_num_tokens`` / ``global_batch_size``, set before the split), and the gradient is
    the sum over its micro-batches, so the step is the same up to float rounding. Fed to verl as one epoch
    without shuffling. ``sort=False``: verl's own order (what it visits when it shuffles itself)."""
    from tensordict import TensorDict  # type: ignore[import-untyped]
    from verl.utils import tensordict_utils as tu

    n = len(lengths)
    local, local_mini = n // world, mini // world
    out: list[int] = []
    for rank in range(world):
        rows = TensorDict({"row": torch.arange(local)}, batch_size=[local])
        batches = tu.make_iterator(rows, mini_batch_size=local_mini, epochs=epochs, seed=seed + rank,
                                   dataloader_kwargs={"shuffle": True})  # fmt: skip
        for part in batches:
            picked = [rank * local + int(i) for i in part["row"].tolist()]
            out += longest_first(picked, lengths) if sort else picked
    return out


def padded_tokens(lengths: list[int], order: list[int], micro: int, real: int) -> tuple[int, int]:
    """(tokens the real rows hold, tokens computed) when the rows ``order`` lists are cut into micro-batches
    of ``micro`` rows, each padded to its longest row (verl's layout without padding removal). Rows
    numbered ``real`` and up are padding rows: what they hold counts as padding."""
    held = sum(lengths[row] for row in order if row < real)
    computed = sum(
        len(part) * max(lengths[row] for row in part)
        for part in (order[i : i + micro] for i in range(0, len(order), micro))
    )
    return held, computed


@register_learner("verl_fsdp")
class VerlFsdpLearner(Learner):
    """``Learner`` on verl's FSDP ``TrainingWorker`` (see the module docstring)."""

    capabilities = frozenset(
        {"lora", "value_head"}
    )  # no in-process sampling: evaluation goes through inference

    def __init__(self, config: LearnerConfig) -> None:
        super().__init__(config)
        extra = dict(config.extra)
        # ``auto`` takes CUDA where there is one; ``cuda`` without one is an error (resolve_device), never a
        # silent CPU run. verl's CPU platform shim is installed only for an explicit or resolved ``cpu``.
        self.device = resolve_device(config.device)
        self._timing = dict.fromkeys(
            ("perf/learner_prep_s", "perf/learner_infer_s", "perf/learner_train_s"), 0.0
        )
        # tokens held by real rows / tokens computed (micro-batch rows x longest row), per kind of pass
        self._tokens = {"infer": [0, 0], "train": [0, 0]}
        # micro-batches of rows of like length (the same mini-batches, the same gradient; see train_order)
        self.sort_by_length = bool(extra.get("sort_by_length", True))
        self.short_padding_rows = bool(extra.get("short_padding_rows", True))
        self.use_cuda = self.device.startswith("cuda")
        # ``ray_gpus`` > 0 (or ``ray: true`` = every visible GPU): the workers run as verl Ray worker groups,
        # FSDP over that many GPUs; ``ray_address`` joins an existing cluster. Else one in-process worker.
        ray_gpus = int(extra.get("ray_gpus", 0)) or (torch.cuda.device_count() if extra.get("ray") else 0)
        if ray_gpus and not self.use_cuda:
            raise ValueError("verl_fsdp over Ray needs CUDA devices (ray_gpus > 0 with device cpu)")
        if ray_gpus and self.device.startswith("cuda:"):
            raise ValueError(
                f"device {self.device} with ray_gpus: Ray places the workers on its GPUs; use device cuda"
            )
        if not self.use_cuda:
            use_cpu_platform()
        for key, value in (("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                           ("VERL_LOGGING_LEVEL", "WARN")):  # fmt: skip
            os.environ.setdefault(key, value)
        if not ray_gpus:
            _init_process_group(self.use_cuda, self.device)
        torch.manual_seed(config.seed)
        random.seed(config.seed)

        from verl.workers.config import (
            FSDPActorConfig,
            FSDPEngineConfig,
            FSDPOptimizerConfig,
            HFModelConfig,
            PolicyLossConfig,
            TrainingWorkerConfig,
        )
        from verl.workers.utils.losses import ppo_loss

        from wolfpack_trainer.learners.verl.workers import Workers

        self.strategy = str(extra.get("strategy", "fsdp2"))
        if not self.use_cuda and self.strategy != "fsdp2":
            raise ValueError("without CUDA only FSDP2 runs (verl's FSDP1 path syncs module states over NCCL)")
        self.model_path = resolve_model_path(config.model, config.cache_dir)
        loss = config.loss
        micro = max(1, config.micro_batch_size)
        infer_micro = int(extra.get("infer_micro_batch_size", micro))
        self._micro, self._infer_micro = micro, infer_micro
        self.fused = bool(extra.get("fused_kernels", False))
        self.model_config = HFModelConfig(
            path=self.model_path, load_tokenizer=False, use_remove_padding=False,
            enable_gradient_checkpointing=bool(extra.get("gradient_checkpointing", False)),
            # verl's fused-kernel forward, torch backend: log-probs and entropy from the last hidden states in
            # blocks of 512 tokens, recomputed in the backward, so no full-vocabulary logits are kept
            use_fused_kernels=self.fused, fused_kernel_options={"impl_backend": "torch"} if self.fused else {},
            override_config={"attn_implementation": "sdpa"},
            # LoRA through verl's own FSDP + peft path (the engine wraps the model with get_peft_model)
            lora_rank=config.lora_rank, lora_alpha=config.lora_alpha,
            target_modules=list(config.lora_target_modules) or "all-linear",
        )  # fmt: skip

        # FSDP2 on CPU reduces bf16 LoRA gradients into float32 adapter parameters and torch refuses the
        # dtype mix there; on CPU a LoRA run computes in float32 instead (``extra.mixed_precision`` overrides).
        mixed = extra.get("mixed_precision") or (
            {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
            if not self.use_cuda and config.lora_rank > 0
            else None
        )

        def engine(forward_only: bool) -> Any:
            return FSDPEngineConfig(
                strategy=self.strategy, use_torch_compile=False, use_dynamic_bsz=False, use_remove_padding=False,
                micro_batch_size_per_gpu=micro, infer_micro_batch_size_per_gpu=infer_micro,
                param_offload=bool(extra.get("param_offload", False)), mixed_precision=mixed,
                optimizer_offload=bool(extra.get("optimizer_offload", False)), forward_only=forward_only,
                reshard_after_forward=bool(extra.get("reshard_after_forward", True)),
            )  # fmt: skip

        self.actor_config = FSDPActorConfig(
            strategy=self.strategy, rollout_n=1, ppo_mini_batch_size=max(1, config.mini_batch_size or 1),
            ppo_micro_batch_size_per_gpu=micro, ppo_epochs=config.ppo_epochs, clip_ratio=loss.clip_ratio,
            clip_ratio_low=loss.clip_ratio_low if loss.clip_ratio_low is not None else loss.clip_ratio,
            clip_ratio_high=loss.clip_ratio_high if loss.clip_ratio_high is not None else loss.clip_ratio,
            clip_ratio_c=loss.clip_ratio_c, loss_agg_mode=loss.loss_agg_mode, entropy_coeff=loss.entropy_coeff,
            use_kl_loss=loss.kl_coef > 0, kl_loss_coef=loss.kl_coef, kl_loss_type=loss.kl_type,
            use_dynamic_bsz=False, use_remove_padding=False, ulysses_sequence_parallel_size=1,
            use_torch_compile=False, policy_loss=PolicyLossConfig(loss_mode=loss.policy_loss),
            optim=FSDPOptimizerConfig(
                optimizer="AdamW", lr=config.lr, weight_decay=config.weight_decay, betas=(config.betas[0], config.betas[1]),
                clip_grad=config.max_grad_norm, total_training_steps=int(extra.get("total_training_steps", 1000)),
                lr_warmup_steps=int(extra.get("warmup_steps", 0)),
            ),
            fsdp_config=engine(False),
        )  # fmt: skip
        self.actor_config.model_config = self.model_config
        actor_engine: Any = (
            self.actor_config.engine
        )  # typed as verl's BaseConfig; it is the FSDP engine config
        configs: dict[str, Any] = {
            "actor": TrainingWorkerConfig(
                model_type="language_model", model_config=self.model_config, engine_config=actor_engine,
                optimizer_config=self.actor_config.optim, checkpoint_config=self.actor_config.checkpoint,
            )
        }  # fmt: skip
        self.lora = config.lora_rank > 0
        if loss.kl_coef > 0 and not self.lora:  # the initial policy, frozen, for the KL term
            # Forward-only on a GPU (verl then offloads its params to pinned CPU memory between calls); on
            # CPU pinning needs an accelerator, so it is a regular engine whose optimizer never steps.
            frozen_engine: Any = engine(self.use_cuda)
            configs["ref"] = TrainingWorkerConfig(
                model_type="language_model", model_config=self.model_config, engine_config=frozen_engine,
                optimizer_config=None if self.use_cuda else self.actor_config.optim,  # type: ignore[arg-type]
                checkpoint_config=self.actor_config.checkpoint,
            )  # fmt: skip
        critic_loss: Any = None
        if (
            config.value_head
        ):  # PPO with GAE: verl's critic, a value model on the same base, its own optimiser
            from verl.workers.config import FSDPCriticConfig
            from verl.workers.utils.losses import value_loss

            use_sdpa_value_model()
            critic_lr = float(extra.get("critic_lr", config.lr * 10))
            self.critic_config = FSDPCriticConfig(
                strategy=self.strategy, ppo_micro_batch_size_per_gpu=micro, rollout_n=1,
                ppo_mini_batch_size=max(1, config.mini_batch_size or 1), ppo_epochs=config.ppo_epochs,
                cliprange_value=loss.cliprange_value, loss_agg_mode=loss.loss_agg_mode, fsdp=engine(False),
                optim=FSDPOptimizerConfig(
                    optimizer="AdamW", lr=critic_lr, weight_decay=config.weight_decay, clip_grad=config.max_grad_norm,
                    total_training_steps=int(extra.get("total_training_steps", 1000)),
                ),
                model=self.model_config,
            )  # fmt: skip
            configs["critic"] = TrainingWorkerConfig(
                # its own copy: verl's worker writes the model type (and num_labels=1) into the config it gets
                model_type="value_model", model_config=self._critic_model_config(),
                engine_config=self.critic_config.fsdp,
                optimizer_config=self.critic_config.optim, checkpoint_config=self.critic_config.checkpoint,
            )  # fmt: skip
            critic_loss = partial(value_loss, config=self.critic_config)
        self._rank0_host: str | None = None  # asked once, when a Ray worker group first saves
        self.workers = Workers(
            configs,
            ray_gpus=ray_gpus,
            ray_address=extra.get("ray_address"),
            cuda_index=cuda_index(self.device, os.environ) if self.use_cuda and not ray_gpus else None,
        )
        for name in configs:
            self.workers.call(name, "reset")  # from_pretrained + FSDP wrap + AdamW + LR scheduler
        self.workers.call("actor", "set_loss_fn", partial(ppo_loss, config=self.actor_config))
        if critic_loss is not None:
            self.workers.call("critic", "set_loss_fn", critic_loss)

    # --- batches -------------------------------------------------------------------------------------

    @property
    def engine(self) -> Any:
        """The actor's in-process engine (not with Ray: its engines live in the workers)."""
        return self.workers.engine("actor")

    def _critic_model_config(self) -> Any:
        """The critic's own copy of the model config (verl's worker writes the model type and num_labels=1
        into the one it gets), without fused kernels: a value model has no vocabulary head to fuse."""
        model_config = copy.deepcopy(self.model_config)
        # verl's configs refuse attribute writes after construction; this copy is the critic's alone
        object.__setattr__(model_config, "use_fused_kernels", False)
        object.__setattr__(model_config, "fused_kernel_options", {})
        return model_config

    def _padded(self, batch: TrainBatch, multiple: int) -> TrainBatch:
        """``batch`` grown to a multiple of ``multiple`` rows that train on nothing (response mask,
        advantages, rewards and log-probs 0): verl's data-parallel dispatch, mini- and micro-batches need
        even splits, while an update's sample count is whatever the episodes produced.

        With ``short_padding_rows`` (default) such a row is two tokens long (the last prompt token and
        the first response token of row 0, attention on those two only), so a micro-batch of them costs
        next to nothing; without, it is a full copy of row 0 (what every padding row cost before). Either
        way its loss mask is 0, so it adds exactly nothing to any loss or gradient."""
        n = len(batch)
        short = -n % max(multiple, 1)
        if short == 0:
            return batch
        out = batch.select(list(range(n)) + [0] * short)
        for key in ("response_mask", "advantages", "token_level_rewards", "returns", "values", "old_log_probs",
                    "ref_log_prob", "is_weights"):  # fmt: skip
            value = getattr(out, key)
            if value is not None:
                value[n:] = 0
        if self.short_padding_rows:
            width = out.prompts.shape[1]
            out.attention_mask[n:] = 0
            out.attention_mask[n:, width - 1 : width + 1] = 1
            out.position_ids[n:] = 0
            out.position_ids[n:, width] = 1
        return out

    def _dataproto(self, batch: TrainBatch, with_training: bool) -> Any:
        from verl import DataProto

        tensors: dict[str, Any] = {
            "prompts": batch.prompts.long(),
            "responses": batch.responses.long(),
            "input_ids": batch.input_ids.long(),
            "attention_mask": batch.attention_mask.long(),
            "position_ids": batch.position_ids.long(),
            "response_mask": (batch.response_mask > 0).long(),
        }
        if with_training:
            assert batch.old_log_probs is not None and batch.advantages is not None
            tensors["old_log_probs"] = batch.old_log_probs.float()
            tensors["advantages"] = batch.advantages.float()
            tensors["token_level_rewards"] = batch.token_level_rewards.float()
            if batch.ref_log_prob is not None:
                tensors["ref_log_prob"] = batch.ref_log_prob.float()
            if batch.is_weights is not None:
                tensors["rollout_is_weights"] = batch.is_weights.float()
            if batch.values is not None and batch.returns is not None:  # the critic's targets
                tensors["values"] = batch.values.float()
                tensors["returns"] = batch.returns.float()
        meta = {
            "temperature": self.config.temperature,
            "global_token_num": batch.attention_mask.sum(-1).tolist(),
        }
        return DataProto.from_single_dict(tensors, meta_info=meta)

    def _tensordict(self, batch: TrainBatch, with_training: bool, **non_tensor: Any) -> Any:
        """DataProto → TensorDict → no-padding (jagged) layout + non-tensor keys, as ray_trainer does."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        td = left_right_2_no_padding(self._dataproto(batch, with_training).to_tensordict())
        tu.assign_non_tensor(td, **non_tensor)
        return td

    def _infer(self, worker: str, batch: TrainBatch, key: str = "log_probs", **flags: Any) -> torch.Tensor:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        n, world = len(batch), self.workers.world_size
        t0 = time.perf_counter()
        padded = self._padded(batch, world * self._infer_micro)
        lengths = padded.attention_mask.sum(-1).tolist()
        order = infer_order(lengths, world) if self.sort_by_length else list(range(len(padded)))
        self._count("infer", lengths, order, self._infer_micro, n)
        if key == "log_probs":  # a language model's forward; the critic's has no entropy to skip
            flags.setdefault("calculate_entropy", False)
        td = self._tensordict(padded.select(order), False, compute_loss=False, **flags)
        t1 = time.perf_counter()
        out = self.workers.data(worker, "infer_batch", td)
        t2 = time.perf_counter()
        arranged = no_padding_2_padding(tu.get(out, key), td).float().cpu()
        got = torch.empty_like(arranged)
        got[torch.as_tensor(order)] = arranged  # row order[i] of the batch came back as row i
        got = got[:n]
        self._timing["perf/learner_prep_s"] += t1 - t0 + time.perf_counter() - t2
        self._timing["perf/learner_infer_s"] += t2 - t1
        return got * (batch.response_mask > 0).float()

    def compute_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        return self._infer("actor", batch)

    def compute_values(self, batch: TrainBatch) -> torch.Tensor | None:
        """V(s) per response token from verl's critic (None without ``value_head``)."""
        return self._infer("critic", batch, "values") if "critic" in self.workers else None

    def compute_ref_log_probs(self, batch: TrainBatch) -> torch.Tensor | None:
        """The KL reference: the frozen initial weights, or with LoRA the base with the adapter disabled
        (verl's "ref in actor": no second copy of the model)."""
        if self.lora and self.config.loss.kl_coef > 0:
            return self._infer("actor", batch, no_lora_adapter=True)
        return self._infer("ref", batch) if "ref" in self.workers else None

    def update(self, batch: TrainBatch) -> dict[str, float]:
        if batch.advantages is None or batch.old_log_probs is None:
            raise ValueError("update needs batch.advantages and batch.old_log_probs")
        if self.config.loss.kl_coef > 0 and batch.ref_log_prob is None:
            raise ValueError("kl_coef > 0 needs batch.ref_log_prob")
        from verl.utils import tensordict_utils as tu

        n, world = len(batch), self.workers.world_size
        want = self.config.mini_batch_size if 0 < self.config.mini_batch_size <= n else n
        unit = world * self._micro  # every rank gets whole micro-batches of every mini-batch
        mini = -(-want // unit) * unit
        padded = self._padded(batch, mini)
        epochs, seed = self.config.ppo_epochs, self.config.seed + self.step
        lengths = padded.attention_mask.sum(-1).tolist()
        # the rows as each rank visits them, mini-batch by mini-batch: longest first, or verl's shuffled order
        order = train_order(lengths, world, mini, epochs, seed, sort=self.sort_by_length)
        for _ in range(2 if "critic" in self.workers else 1):  # the critic trains on the same micro-batches
            self._count("train", lengths, order, self._micro, n)
        if self.sort_by_length:  # verl's mini-batches, each longest first, all epochs spelled out
            arranged = padded.select(order)
            visits: dict[str, Any] = {"epochs": 1, "seed": seed, "dataloader_kwargs": {"shuffle": False}}
        else:  # verl shuffles and splits into mini-batches itself
            arranged = padded
            visits = {"epochs": epochs, "seed": seed, "dataloader_kwargs": {"shuffle": True}}

        def td() -> Any:  # one per worker: train_mini_batch consumes its non-tensor keys
            return self._tensordict(
                arranged, True, calculate_entropy=True, compute_loss=True, global_batch_size=mini, mini_batch_size=mini,
                **visits,
            )  # fmt: skip

        t0 = time.perf_counter()
        data = td()
        t1 = time.perf_counter()
        metrics = tu.get(self.workers.data("actor", "train_mini_batch", data), "metrics")
        self._timing["perf/learner_prep_s"] += t1 - t0
        self._timing["perf/learner_train_s"] += time.perf_counter() - t1
        self.step += 1
        out = _means(metrics, lambda key: _METRIC_NAMES.get(key, key if "/" in key else f"actor/{key}"))
        if self.use_cuda:  # evidence in the metrics that the update ran on the card(s), and how much it took
            out["perf/learner_max_memory_gb"] = float(self.workers.call("actor", "max_memory_gb"))
        out["actor/optimizer_steps"] = float(
            len(metrics.get("grad_norm", [])) or len(padded) // mini * self.config.ppo_epochs
        )
        out["perf/learner_gpus"] = float(world if self.use_cuda else 0)
        if "critic" in self.workers:
            if batch.values is None or batch.returns is None:
                raise ValueError("value_head needs batch.values and batch.returns (GAE)")
            t0 = time.perf_counter()
            critic = tu.get(self.workers.data("critic", "train_mini_batch", td()), "metrics")
            self._timing["perf/learner_train_s"] += time.perf_counter() - t0
            out.update(_means(critic, lambda key: key if key.startswith("critic/") else f"critic/{key}"))
        # where the learner's time went since the last update: forward-only passes (old/ref log-probs,
        # values), the training passes, and building verl's tensordicts on the CPU around them
        out.update(self._timing)
        self._timing = dict.fromkeys(self._timing, 0.0)
        # the share of the tokens the passes computed that were padding (to the micro-batch's longest row,
        # and padding rows): what ordering by length saves, in a number that does not depend on the device
        for kind, (held, computed) in self._tokens.items():
            if computed:
                out[f"perf/learner_{kind}_pad_frac"] = 1.0 - held / computed
        self._tokens = {kind: [0, 0] for kind in self._tokens}
        return out

    def _count(self, kind: str, lengths: list[int], order: list[int], micro: int, real: int) -> None:
        held, computed = padded_tokens(lengths, order, micro, real)
        self._tokens[kind][0] += held
        self._tokens[kind][1] += computed

    # --- state ---------------------------------------------------------------------------------------

    def _full_state(self) -> dict[str, torch.Tensor]:
        """The actor's full weights on the CPU (a collective over its ranks; rank 0's copy)."""
        state: dict[str, torch.Tensor] = self.workers.call("actor", "full_state", False)["model"]
        return state

    def state_dict(self) -> dict[str, Any]:
        actor = self.workers.call("actor", "full_state", True)
        out = {
            "step": self.step,
            "model": actor["model"],
            "optimizer": actor.get("optimizer"),
            "lr_scheduler": actor.get("lr_scheduler"),
            "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(),
            "config_model": self.config.model,
        }
        if "critic" in self.workers:
            out["critic"] = self.workers.call("critic", "full_state", True)
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.workers.call(
            "actor", "load_full_state",
            {"model": state["model"], "optimizer": state.get("optimizer"), "lr_scheduler": state.get("lr_scheduler")},
        )  # fmt: skip
        if "critic" in self.workers and "critic" in state:
            self.workers.call("critic", "load_full_state", state["critic"])
        self.step = int(state["step"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["py_rng"])

    def _adapter(self) -> tuple[dict[str, torch.Tensor], str]:
        """The LoRA adapter as peft saves it (``lora_A``/``lora_B`` keys without the adapter name) and its
        ``adapter_config.json`` text: the same format as the cpu learner's adapters."""
        lora = (
            self.workers.call("actor", "lora_state")
            if self.strategy == "fsdp2"
            else {k: v for k, v in self._full_state().items() if ".lora_" in k}
        )
        tensors = {k.replace(".default.", "."): v for k, v in lora.items()}
        return tensors, str(self.workers.call("actor", "peft_config_json"))

    def export_weights(self) -> ExportedWeights:
        """Full weights under HF names, or the LoRA adapter (what inference's PushWeights takes)."""
        if self.lora:
            tensors, text = self._adapter()
            return ExportedWeights(tensors, True, text)
        return ExportedWeights(self._full_state(), False)

    def _rank0_on_this_host(self) -> bool:
        """Whether the actor's rank 0 is a Ray worker on this host, so a path it writes is this path (an
        in-process worker gains nothing from writing itself: the weights are already in this process)."""
        if not self.workers.ray:
            return False
        if self._rank0_host is None:
            self._rank0_host = str(self.workers.call("actor", "hostname"))
        return self._rank0_host == socket.gethostname()

    def save_pretrained(self, directory: Path) -> Path:
        """An HF directory (config, safetensors, tokenizer when the source has one) inference loads by path."""
        from safetensors.torch import save_file
        from transformers import AutoConfig

        directory.mkdir(parents=True, exist_ok=True)
        if self.lora:  # a peft adapter directory on top of the base (inference: model + adapter)
            tensors, text = self._adapter()
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "adapter_model.safetensors"),
                      metadata={"format": "pt"})  # fmt: skip
            (directory / "adapter_config.json").write_text(text)
            return directory
        config = AutoConfig.from_pretrained(self.model_path)
        config.save_pretrained(directory)
        drop = ["lm_head.weight"] if getattr(config, "tie_word_embeddings", False) else []
        if self._rank0_on_this_host():  # rank 0 writes the file: no trip of the weights through Ray
            self.workers.call("actor", "save_model", str(directory / "model.safetensors"), drop)
        else:
            state = {k: v.contiguous() for k, v in self._full_state().items() if k not in drop}
            save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
        # a model without a tokenizer (token ids only): inference then needs skip_tokenizer_init
        with contextlib.suppress(OSError, ValueError):
            write_tokenizer(self.model_path, directory)
        return directory
