"""Model resolution (tiny test model, SmolLM2, any HF id or directory), now in ``wolfpack.models`` so the
trainer can use it without importing this service; this name stays for existing callers."""

from __future__ import annotations

from wolfpack.models import (
    CHATML_TEMPLATE,
    SPECIAL_TOKENS,
    THINK_TOKENS,
    perturbed_copy,
    resolve_model,
    smollm2,
    tiny_model,
)

__all__ = [
    "CHATML_TEMPLATE",
    "SPECIAL_TOKENS",
    "THINK_TOKENS",
    "perturbed_copy",
    "resolve_model",
    "smollm2",
    "tiny_model",
]
