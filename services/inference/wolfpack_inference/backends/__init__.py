"""Generation backends: ``transformers`` (CPU/GPU, embedded default), ``vllm`` (GPU), ``openai`` (remote).

Heavy libraries (torch, transformers, vllm, httpx) are imported inside each backend module, so importing
this package stays cheap and works where an optional dependency is missing.

``BACKENDS`` is the registry (the shared ``wolfpack.registry`` shape): name -> factory with the one
signature ``(cfg: PolicyConfig, cache_dir: Path) -> Backend``, each calling its class's ``from_config``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from wolfpack.registry import Registry
from wolfpack_inference.backends.base import Backend, ErrorCode, InferenceError
from wolfpack_inference.config import PolicyConfig

BackendFactory = Callable[[PolicyConfig, Path], Backend]
BACKENDS: Registry[BackendFactory] = Registry(
    "inference backend", error=lambda message: InferenceError(ErrorCode.INVALID_ARGUMENT, message)
)


@BACKENDS.register("transformers")
def _transformers(cfg: PolicyConfig, cache_dir: Path) -> Backend:
    from wolfpack_inference.backends.transformers_backend import TransformersBackend

    return TransformersBackend.from_config(cfg, cache_dir)


@BACKENDS.register("vllm")
def _vllm(cfg: PolicyConfig, cache_dir: Path) -> Backend:
    from wolfpack_inference.backends.vllm_backend import VLLMBackend

    return VLLMBackend.from_config(cfg, cache_dir)


@BACKENDS.register("openai")
def _openai(cfg: PolicyConfig, cache_dir: Path) -> Backend:
    from wolfpack_inference.backends.openai_backend import OpenAIBackend

    return OpenAIBackend.from_config(cfg, cache_dir)


def build_backend(cfg: PolicyConfig, cache_dir: Path) -> Backend:
    """The backend ``cfg.backend`` names (its heavy dependencies are imported only then)."""
    return BACKENDS.get(cfg.backend)(cfg, cache_dir)
