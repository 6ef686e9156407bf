"""Methods grafted onto every vLLM GPU worker (``worker_extension_cls``), called through
``AsyncLLM.collective_rpc`` by name. They run inside the engine's worker process, where
``self.model_runner.model`` is the served ``nn.Module``; nothing here imports vLLM at module level, so the
module also imports on machines without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class WolfpackWorkerExtension:
    """Weight updates without restarting the engine."""

    model_runner: Any

    def wolfpack_load_safetensors(self, path: str) -> int:
        """Load every ``*.safetensors`` under ``path`` (a checkpoint dir, or one file) into the served
        model through its own ``load_weights`` (which handles fused/stacked parameters such as qkv_proj).
        Returns the number of tensors loaded."""
        from safetensors.torch import load_file

        p = Path(path)
        files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors under {path}")
        count = 0
        for f in files:
            tensors = load_file(str(f), device="cpu")
            count += len(tensors)
            self.model_runner.model.load_weights(weights=iter(tensors.items()))
        return count

    def wolfpack_weight_checksum(self) -> float:
        """Sum of all parameters (float64): lets a check script see that an update landed."""
        total = 0.0
        for p in self.model_runner.model.parameters():
            total += float(p.detach().double().sum().item())
        return total
