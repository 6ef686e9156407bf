"""Configuration of one served policy. Plain pydantic (no pydantic-settings), so backends and the GPU
check script import it on machines that only have vLLM's dependencies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class PolicyConfig(BaseModel):
    """One served policy. Several can be listed in ``WOLFPACK_INFERENCE_POLICIES_FILE`` (YAML list)."""

    policy_id: str = "default"
    backend: Literal["transformers", "vllm", "openai"] = "transformers"
    model: str = Field(
        default="smollm2", description="`tiny`, `smollm2`, a .gguf file, an HF id or a directory."
    )
    fallback_to_tiny: bool = Field(
        default=False,
        description="If the model cannot be prepared, serve `tiny` as `<policy_id>+tiny-fallback` (else: an error).",
    )
    adapter: str = Field(default="", description="LoRA adapter directory on top of `model`.")
    version: int = 0
    context_budget: int = Field(
        default=0, ge=0, description="Prompt+completion token budget; 0: model's positions."
    )
    compress: bool = Field(
        default=True, description="Compress chat prompts over budget instead of rejecting them."
    )
    prompt_cache_tokens: int = Field(
        default=4_000_000,
        ge=0,
        description="Token ids kept by the prompt token cache (LRU; ~15 bytes a token with its text); 0: off.",
    )
    prompt_cache_entries: int = Field(default=4096, ge=1, description="Prompts kept by that cache (LRU).")
    strip_think: bool = Field(default=False, description="Remove <think>…</think> from returned text.")
    device: str = "auto"
    dtype: str = "auto"
    max_batch: int = Field(default=32, ge=1)
    batch_wait_ms: float = Field(default=5.0, ge=0)
    torch_threads: int = Field(
        default=0, ge=0, description="CPU threads; 0: 1 for tiny models or on <= 2 cores, else torch's."
    )
    # vllm
    gpu_memory_utilization: float = 0.8
    enforce_eager: bool = False
    enable_lora: bool = Field(
        default=False,
        description="vLLM: serve LoRA adapters (then full-weight updates are refused; see VLLMBackend).",
    )
    max_loras: int = 4
    max_lora_rank: int = 64
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
