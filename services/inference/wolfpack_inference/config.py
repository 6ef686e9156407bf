"""The inference service's own settings: ``WOLFPACK_INFERENCE_*`` variables (same prefix as the shared
``wolfpack.settings.Settings``, kept here because only this service reads them)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class PolicyConfig(BaseModel):
    """One served policy. Several can be listed in ``WOLFPACK_INFERENCE_POLICIES_FILE`` (YAML list)."""

    policy_id: str = "default"
    backend: Literal["transformers", "vllm", "openai"] = "transformers"
    model: str = Field(
        default="smollm2", description="`tiny`, `smollm2`, a .gguf file, an HF id or a directory."
    )
    adapter: str = Field(default="", description="LoRA adapter directory on top of `model`.")
    version: int = 0
    context_budget: int = Field(
        default=0, ge=0, description="Prompt+completion token budget; 0: model's positions."
    )
    compress: bool = Field(
        default=True, description="Compress chat prompts over budget instead of rejecting them."
    )
    strip_think: bool = Field(default=False, description="Remove <think>…</think> from returned text.")
    device: str = "auto"
    dtype: str = "auto"
    max_batch: int = Field(default=32, ge=1)
    batch_wait_ms: float = Field(default=5.0, ge=0)
    # vllm
    gpu_memory_utilization: float = 0.8
    enforce_eager: bool = False
    max_loras: int = 4
    ignore_eos: bool = Field(default=False, description="Benchmarks only: generate max_tokens every time.")
    # openai-compatible remote
    base_url: str = ""
    remote_model: str = ""
    api_key_env: str = Field(
        default="", description="Name of the env var holding the API key (never the key)."
    )
    max_concurrency: int = 8
    timeout_s: float = 60.0
    retries: int = 3


class InferenceSettings(BaseSettings):
    """``WOLFPACK_INFERENCE_<FIELD>``. Without a policies file, one policy is served from these fields."""

    model_config = SettingsConfigDict(env_prefix="WOLFPACK_INFERENCE_", extra="ignore", frozen=True)

    model: str = Field(default="smollm2", description="Model of the default policy (see PolicyConfig.model).")
    backend: Literal["transformers", "vllm", "openai"] = "transformers"
    policy_id: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    context_budget: int = 0
    strip_think: bool = False
    max_batch: int = 32
    batch_wait_ms: float = 5.0
    cache_dir: Path = Field(
        default=Path.home() / ".cache" / "wolfpack" / "inference", description="Models cache."
    )
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
                device=self.device,
                dtype=self.dtype,
                context_budget=self.context_budget,
                strip_think=self.strip_think,
                max_batch=self.max_batch,
                batch_wait_ms=self.batch_wait_ms,
            )
        ]
