"""Client side of PushWeights: a trainer streams new weights, or a LoRA adapter, to a running inference
service in one call, with no shared filesystem and no files written on its side.

    from wolfpack_inference.push import push_adapter, push_weights
    await push_adapter(stub, "wolf", version=step, model=peft_model)            # LoRA: tensors + config
    await push_weights(stub, "wolf", version=step, tensors=model.state_dict())  # full or partial weights

Tensors travel as raw little-endian bytes in chunks of at most ``chunk_bytes`` (below gRPC's message limit),
with their dtype and shape; the server reassembles them, checks them, and answers with the new version
only once the policy serves it. Imports torch/peft lazily, like the rest of the package's client paths.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from wolfpack.v1 import inference_service_pb2 as pb

if TYPE_CHECKING:  # the async stub class exists only in the typed stubs
    from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc

CHUNK_BYTES = 1 << 20
"""1 MiB per message: far below gRPC's default 4 MiB limit, large enough that framing costs nothing."""


def tensor_chunks(
    policy_id: str,
    version: int,
    tensors: Mapping[str, Any],
    *,
    is_adapter: bool = False,
    adapter_config_json: str = "",
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[pb.PushWeightsRequest]:
    """PushWeights messages for ``tensors`` (name → torch tensor, any device and dtype). The first message
    carries the policy, version, ``is_adapter`` and the adapter config; every message names its tensor."""
    import torch

    if sys.byteorder != "little":  # the wire format is little-endian raw bytes
        raise RuntimeError("PushWeights needs a little-endian host")
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be > 0")
    first = True
    for name, t in tensors.items():
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        raw = memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
        dtype = str(t.dtype).removeprefix("torch.")
        for offset in range(0, max(len(raw), 1), chunk_bytes):
            msg = pb.PushWeightsRequest(
                name=name, dtype=dtype, shape=list(t.shape), data=bytes(raw[offset : offset + chunk_bytes]),
                offset=offset,
            )  # fmt: skip
            if first:
                msg.policy_id, msg.version, msg.is_adapter = policy_id, version, is_adapter
                msg.adapter_config_json = adapter_config_json
                first = False
            yield msg


def peft_adapter(model: Any, adapter_name: str = "default") -> tuple[dict[str, Any], str]:
    """The adapter state dict (PEFT keys, adapter name removed) and config JSON of a peft ``PeftModel``:
    exactly what ``save_pretrained`` would write as ``adapter_model.safetensors`` and ``adapter_config.json``."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False)
    cfg = model.peft_config[adapter_name].to_dict()
    text = json.dumps(cfg, sort_keys=True, default=lambda o: sorted(o) if isinstance(o, set) else str(o))
    return dict(state), text


async def push_weights(
    stub: pb_grpc.InferenceServiceAsyncStub,
    policy_id: str,
    version: int,
    tensors: Mapping[str, Any],
    *,
    chunk_bytes: int = CHUNK_BYTES,
    timeout: float | None = None,
) -> pb.PushWeightsResponse:
    """Push a full or partial state dict; ``version`` must exceed the policy's current one."""
    chunks = tensor_chunks(policy_id, version, tensors, chunk_bytes=chunk_bytes)
    return await stub.PushWeights(chunks, timeout=timeout)


async def push_adapter(
    stub: pb_grpc.InferenceServiceAsyncStub,
    policy_id: str,
    version: int,
    model: Any,
    *,
    adapter_name: str = "default",
    chunk_bytes: int = CHUNK_BYTES,
    timeout: float | None = None,
) -> pb.PushWeightsResponse:
    """Push the LoRA ``adapter_name`` of peft ``model`` (tensors and config) as ``version`` of ``policy_id``;
    the server applies it to the policy's base weights."""
    state, config_json = peft_adapter(model, adapter_name)
    chunks = tensor_chunks(
        policy_id, version, state, is_adapter=True, adapter_config_json=config_json, chunk_bytes=chunk_bytes
    )
    return await stub.PushWeights(chunks, timeout=timeout)
