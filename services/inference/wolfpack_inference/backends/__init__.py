"""Generation backends: ``transformers`` (CPU/GPU, embedded default), ``vllm`` (GPU), ``openai`` (remote).

Heavy libraries (torch, transformers, vllm, httpx) are imported inside each backend module, so importing
this package stays cheap and works where an optional dependency is missing.

``BACKENDS`` is the registry (the shared ``wolfpack.registry`` shape): name -> factory with the one
signature ``(cfg: PolicyConfig, cache_dir: Path) -> Backend``, each calling its class's ``from_config``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
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


IMPORTS: dict[str, tuple[str, ...]] = {
    "transformers": (
        "wolfpack_inference.backends.transformers_backend",  # torch
        "transformers.models.auto.modeling_auto",  # transformers, its model base classes (torch._dynamo)
        "transformers.models.auto.tokenization_auto",
    ),
    "vllm": ("wolfpack_inference.backends.vllm_backend",),
    "openai": ("wolfpack_inference.backends.openai_backend",),
}
"""The modules each backend needs before it builds anything: ``import_backends`` imports them first, so
the service can freeze start-up's imports out of the cyclic collector before its models load."""


def import_backends(names: Iterable[str]) -> None:
    """Import what the backends ``names`` build with, building nothing. An import that fails is left to
    the build, which reports it as the policy's load error."""
    for name in dict.fromkeys(names):
        for module in IMPORTS.get(name, ()):
            try:
                importlib.import_module(module)
            except ImportError:
                break


def build_backend(cfg: PolicyConfig, cache_dir: Path) -> Backend:
    """The backend ``cfg.backend`` names (its heavy dependencies are imported only then)."""
    return BACKENDS.get(cfg.backend)(cfg, cache_dir)
