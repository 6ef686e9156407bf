"""The CPU learner: a transformers causal LM updated in this process with torch (full or LoRA via peft).

Why one process and plain torch: on a CPU machine the model is small (the tiny test model, SmolLM2-135M)
and Ray/FSDP would only add start-up cost; the loss terms are still verl's (``algos.policy_loss`` etc.),
so the maths is the same as the GPU learner's.

Logprobs are recomputed from the same token ids at ``config.temperature`` with the rollout's position ids
(left padding does not shift positions), so on unchanged weights they match the sampler's to float
rounding; the remaining gap is the "logprob mismatch" metric. With LoRA the reference policy (for the KL
term) is the base model with the adapter disabled: no second copy of the weights.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wolfpack_trainer import algos
from wolfpack_trainer.learners.base import (
    ExportedWeights,
    Learner,
    LearnerConfig,
    TrainBatch,
    register_learner,
    resolve_device,
    write_tokenizer,
)


def resolve_model_path(spec: str, cache_dir: str) -> str:
    """``tiny`` / ``smollm2`` / a path or HF id → a loadable checkpoint (the inference package builds
    and caches the first two in ``wolfpack.models``, the one place that knows how)."""
    if spec in ("tiny", "smollm2") or spec.endswith(".gguf"):
        from wolfpack.models import resolve_model

        return resolve_model(spec, Path(cache_dir))
    return spec


@register_learner("cpu")
class CpuLearner(Learner):
    """Full fine-tuning (``lora_rank: 0``) or LoRA; optional value head for PPO with GAE."""

    capabilities = frozenset({"lora", "value_head", "generate", "target_kl"})

    def __init__(self, config: LearnerConfig) -> None:
        super().__init__(config)
        from transformers import AutoModelForCausalLM

        torch.manual_seed(config.seed)
        self.model_path = resolve_model_path(config.model, config.cache_dir)
        dtype = getattr(torch, config.dtype)
        base = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        self.ref_model: nn.Module | None = None
        if config.lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(
                r=config.lora_rank,
                lora_alpha=config.lora_alpha,
                lora_dropout=config.lora_dropout,
                target_modules=list(config.lora_target_modules) or None,
                task_type="CAUSAL_LM",
            )
            self.model: nn.Module = get_peft_model(base, lora)
        else:
            self.model = base
            if config.loss.kl_coef > 0:
                self.ref_model = copy.deepcopy(base).eval().requires_grad_(False)  # type: ignore[no-untyped-call]
        self.value_head: nn.Linear | None = None
        if config.value_head:
            hidden = int(base.config.hidden_size)
            self.value_head = nn.Linear(hidden, 1)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
        # The ``cpu`` learner stays on the CPU under ``auto`` (its sampler and batches live there); an explicit
        # ``cuda[:n]`` moves it, and fails loudly where there is no such device.
        self.device = "cpu" if config.device in ("", "auto") else resolve_device(config.device)
        self.model.to(self.device)  # type: ignore[arg-type]
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            self.value_head.to(self.device)
            params += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, weight_decay=config.weight_decay, betas=config.betas
        )

    # --- forward -------------------------------------------------------------------------------------

    def _micro_batches(self, batch: TrainBatch, size: int) -> Iterator[list[int]]:
        rows = list(range(len(batch)))
        for i in range(0, len(rows), max(size, 1)):
            yield rows[i : i + size]

    def _forward(
        self, model: nn.Module, batch: TrainBatch, want_values: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Response logprobs [b, R], entropy [b, R] and (optionally) values [b, R] for a micro-batch."""
        dev = self.device
        out = model(
            input_ids=batch.input_ids.to(dev),
            attention_mask=batch.attention_mask.to(dev),
            position_ids=batch.position_ids.to(dev),
            output_hidden_states=want_values,
            use_cache=False,
        )
        r = batch.response_length
        logits = out.logits[:, -r - 1 : -1, :].float() / max(self.config.temperature, 1e-6)
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, batch.responses.to(dev).unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        values = None
        if want_values and self.value_head is not None:
            hidden = out.hidden_states[-1][:, -r - 1 : -1, :].float()
            values = self.value_head(hidden).squeeze(-1)
        return logp, entropy, values

    @torch.no_grad()
    def _no_grad_logprobs(self, model: nn.Module, batch: TrainBatch, ctx: Any = None) -> torch.Tensor:
        outs = []
        for rows in self._micro_batches(batch, self.config.micro_batch_size):
            mb = batch.select(rows)
            with ctx() if ctx is not None else nullcontext():
                logp, _, _ = self._forward(model, mb)
            outs.append(logp.cpu() * mb.response_mask)
        return torch.cat(outs, dim=0)

    def compute_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        self.model.eval()
        return self._no_grad_logprobs(self.model, batch)

    def compute_ref_log_probs(self, batch: TrainBatch) -> torch.Tensor | None:
        if self.config.lora_rank > 0:
            self.model.eval()
            disable: Any = self.model.disable_adapter  # type: ignore[operator]
            return self._no_grad_logprobs(self.model, batch, disable)
        if self.ref_model is None:
            return None
        return self._no_grad_logprobs(self.ref_model, batch)

    @torch.no_grad()
    def compute_values(self, batch: TrainBatch) -> torch.Tensor | None:
        if self.value_head is None:
            return None
        self.model.eval()
        outs = []
        for rows in self._micro_batches(batch, self.config.micro_batch_size):
            mb = batch.select(rows)
            _, _, values = self._forward(self.model, mb, want_values=True)
            assert values is not None
            outs.append(values.cpu() * mb.response_mask)
        return torch.cat(outs, dim=0)

    # --- update --------------------------------------------------------------------------------------

    def update(self, batch: TrainBatch) -> dict[str, float]:
        if batch.advantages is None or batch.old_log_probs is None:
            raise ValueError("update needs batch.advantages and batch.old_log_probs")
        cfg, loss_cfg = self.config, self.config.loss
        if loss_cfg.kl_coef > 0 and batch.ref_log_prob is None:
            raise ValueError("kl_coef > 0 needs batch.ref_log_prob")
        self.model.train()
        n = len(batch)
        mini = cfg.mini_batch_size if cfg.mini_batch_size > 0 else n
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}

        def add(key: str, value: float) -> None:
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1

        gen = torch.Generator().manual_seed(cfg.seed + self.step)
        kl_max, stopped = 0.0, False
        for _epoch in range(cfg.ppo_epochs):
            order = torch.randperm(n, generator=gen).tolist()
            for start in range(0, n, mini):
                rows = order[start : start + mini]
                self.optimizer.zero_grad(set_to_none=True)
                kl_sum = kl_tokens = 0.0
                for mrows in [
                    rows[i : i + cfg.micro_batch_size] for i in range(0, len(rows), cfg.micro_batch_size)
                ]:
                    mb = batch.select(mrows)
                    scale = len(mrows) / len(rows)
                    part, tokens = self._micro_step(mb, scale, add)
                    kl_sum, kl_tokens = kl_sum + part, kl_tokens + tokens
                # The policy's distance from where the update started, on this mini-batch, at the weights
                # the coming step would move: past ``target_kl`` the step is not taken and the update ends.
                kl = kl_sum / max(kl_tokens, 1.0)
                add("actor/approx_kl", kl)
                kl_max = max(kl_max, kl)
                if cfg.target_kl > 0 and kl > cfg.target_kl:
                    stopped = True
                    break
                params = [p for g in self.optimizer.param_groups for p in g["params"]]
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                add("actor/grad_norm", float(grad_norm))
                if torch.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    add("actor/skipped_nonfinite", 1.0)
            if stopped:
                break
        self.step += 1
        metrics = {k: sums[k] / counts[k] for k in sums}
        metrics["actor/lr"] = float(self.optimizer.param_groups[0]["lr"])
        # With one optimiser step per update the ratio is exactly 1, so the clip fraction and the PPO KL
        # cannot move; the summary shows them only when this count is above 1.
        metrics["actor/optimizer_steps"] = float(counts.get("actor/grad_norm", 0))
        metrics["actor/approx_kl_max"] = kl_max
        if cfg.target_kl > 0:
            metrics["actor/kl_early_stop"] = float(stopped)
        return metrics

    def _micro_step(self, mb: TrainBatch, scale: float, add: Any) -> tuple[float, float]:
        """Forward and backward of one micro-batch; returns (summed per-token k3 KL of the current
        policy from the update's start, response tokens) for the early stop on ``target_kl``."""
        loss_cfg = self.config.loss
        assert mb.advantages is not None and mb.old_log_probs is not None
        want_values = self.value_head is not None and mb.returns is not None and mb.values is not None
        logp, entropy, vpreds = self._forward(self.model, mb, want_values=want_values)
        mask = mb.response_mask
        with torch.no_grad():
            live = mask.cpu().bool()
            ratio = torch.where(live, logp.detach().cpu() - mb.old_log_probs, 0.0)
            k3 = (torch.exp(ratio) - 1 - ratio) * live
            kl_part, kl_tokens = float(k3.sum()), float(live.sum())
        pg_loss, pg_metrics = algos.policy_loss(
            mb.old_log_probs, logp, mb.advantages, mask, loss_cfg, is_weights=mb.is_weights
        )
        loss = pg_loss
        add("actor/pg_loss", float(pg_loss.detach()))
        for k, v in pg_metrics.items():
            add(k, v)
        ent = algos.agg_loss(entropy, mask, loss_cfg.loss_agg_mode)
        add("actor/entropy", float(ent.detach()))
        if loss_cfg.entropy_coeff:
            loss = loss - loss_cfg.entropy_coeff * ent
        if loss_cfg.kl_coef > 0 and mb.ref_log_prob is not None:
            kl = algos.kl_loss(logp, mb.ref_log_prob, mask, loss_cfg)
            loss = loss + loss_cfg.kl_coef * kl
            add("actor/kl_loss", float(kl.detach()))
        if want_values and vpreds is not None and mb.returns is not None and mb.values is not None:
            vf_loss, vf_clip = algos.value_loss(vpreds, mb.returns, mb.values, mask, loss_cfg)
            loss = loss + loss_cfg.value_coef * vf_loss
            add("critic/vf_loss", float(vf_loss.detach()))
            add("critic/vf_clipfrac", vf_clip)
        (loss * scale).backward()  # type: ignore[no-untyped-call]
        return kl_part, kl_tokens

    # --- state ---------------------------------------------------------------------------------------

    def _trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items() if self._is_trainable(k)}

    def _is_trainable(self, key: str) -> bool:
        return self.config.lora_rank == 0 or "lora_" in key

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "model": self._trainable_state(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(),
            "config_model": self.config.model,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = self.model.load_state_dict(state["model"], strict=False)
        unexpected = list(missing.unexpected_keys)
        if unexpected:
            raise ValueError(f"checkpoint has weights this model lacks: {unexpected[:5]}")
        if self.value_head is not None and state.get("value_head") is not None:
            self.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["py_rng"])

    def export_weights(self) -> ExportedWeights:
        if self.config.lora_rank > 0:
            from peft import get_peft_model_state_dict

            tensors = get_peft_model_state_dict(
                self.model, adapter_name="default", save_embedding_layers=False
            )
            cfg = self.model.peft_config["default"].to_dict()  # type: ignore[index,operator,union-attr]
            text = json.dumps(
                cfg, sort_keys=True, default=lambda o: sorted(o) if isinstance(o, set) else str(o)
            )
            return ExportedWeights({k: v.detach() for k, v in tensors.items()}, True, text)
        return ExportedWeights({k: v.detach() for k, v in self.model.state_dict().items()}, False)

    def save_pretrained(self, directory: Path) -> Path:
        """An HF (full) or peft (LoRA) directory that inference loads by path, with the tokenizer."""
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)  # type: ignore[operator,arg-type]
        if self.config.lora_rank == 0:
            write_tokenizer(self.model_path, directory)
        return directory

    def generation_model(self) -> AbstractContextManager[nn.Module]:
        """The current policy for in-process sampling (eval mode, no grad)."""
        self.model.eval()
        return _NoGrad(self.model)


class _NoGrad(AbstractContextManager[nn.Module]):
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._ctx = torch.no_grad()

    def __enter__(self) -> nn.Module:
        self._ctx.__enter__()
        return self.model

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(None, None, None)
