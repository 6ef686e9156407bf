"""Client side of PushWeights, now in ``wolfpack_inference.client`` (the service's published client
module, which other services may import); this name stays for existing callers."""

from __future__ import annotations

from wolfpack_inference.client import CHUNK_BYTES, peft_adapter, push_adapter, push_weights, tensor_chunks

__all__ = ["CHUNK_BYTES", "peft_adapter", "push_adapter", "push_weights", "tensor_chunks"]
