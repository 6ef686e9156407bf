"""Policy versions over real gRPC: LoadPolicy mid-traffic, PushWeights, monotonic versions, new policies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from safetensors.torch import load_file

from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc

from .test_generate import PROMPTS, chat  # type: ignore[import-not-found]


async def greedy(
    stub: pb_grpc.InferenceServiceStub, prompt: str, policy: str = "tiny"
) -> pb.GenerateResponse:
    return await stub.Generate(chat(prompt, policy, max_tokens=8, temperature=0, logprobs=True))


async def test_switch_mid_traffic_loses_nothing(
    stub: pb_grpc.InferenceServiceStub, tiny_v2_dir: Path
) -> None:
    """20 requests around the switch: one before it, nine in flight while it happens, ten after it; each
    finishes, on the old or the new version, with exactly that version's greedy tokens. (Ordered by
    awaiting, not by sleeps: which version an in-flight request gets may vary, what it returns may not.)"""
    old = {p: list((await greedy(stub, p)).completions[0].token_ids) for p in PROMPTS}

    def prompt(i: int) -> str:
        return PROMPTS[i % len(PROMPTS)]

    before = await greedy(stub, prompt(0))
    during = [asyncio.ensure_future(greedy(stub, prompt(i))) for i in range(1, 10)]
    loaded = await stub.LoadPolicy(
        pb.LoadPolicyRequest(policy_id="tiny", version=1, model_path=str(tiny_v2_dir))
    )
    after = await asyncio.gather(*[greedy(stub, prompt(i)) for i in range(10, 20)])
    responses = [before, *await asyncio.gather(*during), *after]
    assert loaded.policy.policy.version == 1 and loaded.policy.base_model == str(tiny_v2_dir)
    new = {p: list((await greedy(stub, p)).completions[0].token_ids) for p in PROMPTS}
    assert all(old[p] != new[p] for p in PROMPTS), "the perturbed copy must change greedy outputs"
    versions = []
    for i, r in enumerate(responses):
        expected = {0: old, 1: new}[r.policy.version][prompt(i)]
        assert list(r.completions[0].token_ids) == expected
        versions.append(r.policy.version)
    assert versions[0] == 0 and versions[10:] == [1] * 10  # admitted before / after the switch returned


async def test_version_must_increase(stub: pb_grpc.InferenceServiceStub, tiny_v2_dir: Path) -> None:
    await stub.LoadPolicy(pb.LoadPolicyRequest(policy_id="tiny", version=3, model_path=str(tiny_v2_dir)))
    for v in (3, 2):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.LoadPolicy(
                pb.LoadPolicyRequest(policy_id="tiny", version=v, model_path=str(tiny_v2_dir))
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "greater than the current 3" in (err.value.details() or "")


def chunks(policy: str, version: int, tensors: dict[str, object]) -> list[pb.PushWeightsRequest]:
    out = []
    for name, t in tensors.items():
        data = t.numpy().tobytes()  # type: ignore[attr-defined]
        half = len(data) // 2
        for offset, part in ((half, data[half:]), (0, data[:half])):  # out of order on purpose
            out.append(
                pb.PushWeightsRequest(
                    policy_id=policy, version=version, name=name, dtype="float32",
                    shape=list(t.shape), data=part, offset=offset,  # type: ignore[attr-defined]
                )
            )  # fmt: skip
    return out


async def test_push_weights_equals_load(stub: pb_grpc.InferenceServiceStub, tiny_v2_dir: Path) -> None:
    """Pushing v2's tensors in chunks gives the same greedy outputs as loading v2 from disk."""
    await stub.LoadPolicy(pb.LoadPolicyRequest(policy_id="tiny", version=1, model_path=str(tiny_v2_dir)))
    tensors = load_file(str(tiny_v2_dir / "model.safetensors"))
    pushed = await stub.PushWeights(iter(chunks("strict", 7, dict(tensors))))
    assert pushed.tensors == len(tensors) and pushed.policy.policy.version == 7
    for p in PROMPTS[:2]:
        a, b = await greedy(stub, p, "tiny"), await greedy(stub, p, "strict")
        assert b.policy.version == 7
        assert list(a.completions[0].token_ids) == list(b.completions[0].token_ids)
        assert (
            max(abs(x - y) for x, y in zip(a.completions[0].logprobs, b.completions[0].logprobs, strict=True))
            < 1e-4
        )


async def test_push_partial_and_bad_weights(stub: pb_grpc.InferenceServiceStub, tiny_v2_dir: Path) -> None:
    tensors = load_file(str(tiny_v2_dir / "model.safetensors"))
    name = next(k for k in tensors if "layers.0.mlp.up_proj" in k)
    before = await greedy(stub, PROMPTS[0], "strict")
    resp = await stub.PushWeights(iter(chunks("strict", 1, {name: tensors[name]})))
    assert resp.tensors == 1 and resp.policy.policy.version == 1
    assert (await greedy(stub, PROMPTS[0], "strict")).policy.version == 1
    bad = chunks("strict", 2, {"no.such.weight": tensors[name]})
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PushWeights(iter(bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no.such.weight" in (
        err.value.details() or ""
    )
    stale = chunks("strict", 1, {name: tensors[name]})
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PushWeights(iter(stale))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    missing = chunks("strict", 9, {name: tensors[name]})[:1]  # half the bytes
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PushWeights(iter(missing))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bytes" in (err.value.details() or "")
    assert before.policy.version == 0


async def test_load_new_policy_and_lora_precondition(
    stub: pb_grpc.InferenceServiceStub, tiny_v2_dir: Path, tmp_path: Path
) -> None:
    resp = await stub.LoadPolicy(
        pb.LoadPolicyRequest(policy_id="fresh", version=4, model_path=str(tiny_v2_dir))
    )
    assert resp.policy.policy.version == 4 and resp.policy.backend == "transformers"
    listed = await stub.ListPolicies(pb.ListPoliciesRequest())
    assert "fresh" in {p.policy.policy_id for p in listed.policies}
    assert (await greedy(stub, PROMPTS[0], "fresh")).policy.version == 4
    try:
        import peft  # noqa: F401
    except ImportError:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.LoadPolicy(
                pb.LoadPolicyRequest(policy_id="tiny", version=5, adapter_path=str(tmp_path))
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "peft" in (err.value.details() or "")
