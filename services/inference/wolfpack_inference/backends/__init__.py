"""Generation backends: ``transformers`` (CPU/GPU, embedded default), ``vllm`` (GPU), ``openai`` (remote).

Heavy libraries (torch, transformers, vllm, httpx) are imported inside each backend module, so importing
this package stays cheap and works where an optional dependency is missing.
"""
