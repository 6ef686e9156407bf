"""LoRA adapters pushed as tensors (PushWeights with is_adapter) over real gRPC, on the tiny Qwen2 + peft."""

from __future__ import annotations

import copy
import gc
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference import adapters
from wolfpack_inference.backends.base import InferenceError
from wolfpack_inference.backends.transformers_backend import TransformersBackend
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.push import peft_adapter, push_adapter, push_weights, tensor_chunks

from .test_generate import PROMPTS, chat  # type: ignore[import-not-found]


def make_lora(base_dir: Path, *, r: int = 4, seed: int = 1, targets: tuple[str, ...] = ("q_proj", "v_proj", "o_proj")) -> Any:  # fmt: skip
    """A peft LoRA on a fresh copy of the base with non-zero B, so the adapter changes the output."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(targets), init_lora_weights=False)
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


def merged(peft_model: Any) -> Any:
    return copy.deepcopy(peft_model).merge_and_unload().eval()


async def greedy(
    stub: pb_grpc.InferenceServiceStub, prompt: str, policy: str, n: int = 10
) -> pb.GenerateResponse:
    return await stub.Generate(chat(prompt, policy, max_tokens=n, temperature=0, logprobs=True))


def backend(registry: PolicyRegistry, policy: str) -> TransformersBackend:
    b = registry.get(policy).backend
    assert isinstance(b, TransformersBackend)
    return b


async def test_pushed_lora_serves_base_plus_adapter(
    stub: pb_grpc.InferenceServiceStub, registry: PolicyRegistry, tiny_dir: Path
) -> None:
    """A peft model's adapter pushed in one call: the version bumps, greedy output moves away from the base,
    and every logprob equals a teacher-forced forward of base + adapter merged."""
    base = {p: await greedy(stub, p, "strict") for p in PROMPTS}
    lora = make_lora(tiny_dir)
    resp = await push_adapter(stub, "strict", 1, lora, chunk_bytes=1000)  # several chunks per tensor
    assert resp.policy.policy.version == 1 and resp.tensors == 2 * 3 * 2  # A+B x 3 modules x 2 layers
    assert resp.policy.adapter and Path(resp.policy.adapter).is_dir()
    reference = merged(lora)
    for p in PROMPTS:
        r = await greedy(stub, p, "strict")
        assert r.policy.version == 1
        c = r.completions[0]
        assert list(c.token_ids) != list(base[p].completions[0].token_ids), p
        ids = torch.tensor([list(r.prompt_token_ids) + list(c.token_ids)])
        with torch.no_grad():
            logp = reference(ids).logits.float().log_softmax(-1)[0]
        start = len(r.prompt_token_ids) - 1
        ref = torch.stack([logp[start + j, t] for j, t in enumerate(c.token_ids)])
        assert torch.allclose(ref, torch.tensor(list(c.logprobs)), atol=1e-4), (ref, list(c.logprobs))
        # greedy under the merged reference picks the same tokens
        assert all(int(logp[start + j].argmax()) == t for j, t in enumerate(c.token_ids))


async def test_push_equals_load_of_the_saved_adapter(
    stub: pb_grpc.InferenceServiceStub, tiny_dir: Path, tmp_path: Path
) -> None:
    """Pushing tensors + config is the same as LoadPolicy on the directory peft's save_pretrained writes."""
    lora = make_lora(tiny_dir, r=8, seed=3, targets=("q_proj", "k_proj", "up_proj"))
    lora.save_pretrained(tmp_path / "adapter")
    await stub.LoadPolicy(pb.LoadPolicyRequest(policy_id="tiny", version=2, adapter_path=str(tmp_path / "adapter")))  # fmt: skip
    await push_adapter(stub, "strict", 5, lora)
    for p in PROMPTS[:3]:
        a, b = await greedy(stub, p, "tiny"), await greedy(stub, p, "strict")
        assert (a.policy.version, b.policy.version) == (2, 5)
        assert list(a.completions[0].token_ids) == list(b.completions[0].token_ids)
        lp_a, lp_b = a.completions[0].logprobs, b.completions[0].logprobs
        assert max(abs(x - y) for x, y in zip(lp_a, lp_b, strict=True)) < 1e-5


async def test_inflight_streams_finish_on_the_old_version(
    stub: pb_grpc.InferenceServiceStub, tiny_dir: Path
) -> None:
    """Streams already decoding when the adapter lands keep the base weights to their last token."""
    expected = {p: list((await greedy(stub, p, "strict", 300)).completions[0].token_ids) for p in PROMPTS[:3]}
    calls = [
        stub.GenerateStream(
            pb.GenerateStreamRequest(request=chat(p, "strict", max_tokens=300, temperature=0))
        )
        for p in PROMPTS[:3]
    ]
    firsts = [await c.read() for c in calls]  # every stream is admitted and decoding
    assert all(isinstance(f, pb.GenerateStreamResponse) for f in firsts)
    pushed = await push_adapter(stub, "strict", 1, make_lora(tiny_dir))
    after = await greedy(stub, PROMPTS[0], "strict")
    for p, call, first in zip(PROMPTS[:3], calls, firsts, strict=True):
        chunks = [first]
        while (msg := await call.read()) is not grpc.aio.EOF:
            chunks.append(msg)
        assert {c.policy.version for c in chunks} == {0}
        assert [t for c in chunks for t in c.token_ids] == expected[p]
    assert pushed.policy.policy.version == 1 and after.policy.version == 1


async def expect_invalid(call: Any, words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert words in (err.value.details() or ""), err.value.details()


@pytest.mark.filterwarnings("ignore:Found missing adapter keys")
async def test_bad_adapter_pushes_change_nothing(
    stub: pb_grpc.InferenceServiceStub, registry: PolicyRegistry, tiny_dir: Path
) -> None:
    """Each malformed push is INVALID_ARGUMENT with a message naming the problem; the served version, its
    outputs and the backend's adapter directories are exactly as before."""
    good = make_lora(tiny_dir)
    await push_adapter(stub, "strict", 1, good)
    before = await greedy(stub, PROMPTS[0], "strict")
    live = backend(registry, "strict").adapter_dirs.live()
    assert len(live) == 1
    state, cfg_json = peft_adapter(good)
    cfg = json.loads(cfg_json)

    def push(tensors: dict[str, Any], config: str, version: int = 2) -> Any:
        return stub.PushWeights(tensor_chunks("strict", version, tensors, is_adapter=True, adapter_config_json=config))  # fmt: skip

    await expect_invalid(push(state, ""), "adapter_config_json is required")
    await expect_invalid(push(state, "{not json"), "not valid JSON")
    await expect_invalid(push(state, "[1, 2]"), "JSON object")
    await expect_invalid(push(state, json.dumps({**cfg, "peft_type": "IA3"})), "only LoRA")
    await expect_invalid(push(state, json.dumps({**cfg, "r": 0})), "r must be a positive integer")
    await expect_invalid(push(state, json.dumps({**cfg, "use_dora": True})), "DoRA")
    full = {
        k.replace(".lora_A", "").replace("base_model.model.", ""): v
        for k, v in state.items()
        if "lora_A" in k
    }
    await expect_invalid(push(full, cfg_json), "not LoRA tensor names")
    await expect_invalid(push(state, json.dumps({**cfg, "r": 8})), "rank mismatch")
    only_a = {k: v for k, v in state.items() if "lora_A" in k}
    await expect_invalid(push(only_a, cfg_json), "lora_B is missing")
    one_module = {k: v for k, v in state.items() if "q_proj" in k}
    await expect_invalid(push(one_module, cfg_json), "missing tensors")  # config targets v_proj, o_proj too
    ghost = {k.replace("layers.0.", "layers.7."): v for k, v in state.items()}
    await expect_invalid(push(ghost, cfg_json), "no module of the base")
    wide = {k: torch.cat([v, v], dim=1) if "q_proj.lora_A" in k else v for k, v in state.items()}
    await expect_invalid(push(wide, cfg_json), "size mismatch")
    await expect_invalid(
        stub.PushWeights(tensor_chunks("strict", 2, dict(state), adapter_config_json=cfg_json)),
        "adapter_config_json is set but is_adapter is not",
    )
    after = await greedy(stub, PROMPTS[0], "strict")
    assert after.policy.version == 1
    assert list(after.completions[0].token_ids) == list(before.completions[0].token_ids)
    assert backend(registry, "strict").adapter_dirs.live() == live


async def test_adapter_directories_go_with_their_versions(
    stub: pb_grpc.InferenceServiceStub, registry: PolicyRegistry, tiny_dir: Path, tiny_v2_dir: Path
) -> None:
    """A pushed adapter's directory exists while its version is served and is deleted once a newer version
    replaced it (no request holds it any more); a full checkpoint leaves none."""
    dirs = backend(registry, "strict").adapter_dirs
    v1 = Path((await push_adapter(stub, "strict", 1, make_lora(tiny_dir))).policy.adapter)
    assert (
        dirs.live() == [v1] and (v1 / adapters.CONFIG_FILE).exists() and (v1 / adapters.WEIGHTS_FILE).exists()
    )
    v2 = Path((await push_adapter(stub, "strict", 2, make_lora(tiny_dir, seed=2))).policy.adapter)
    await greedy(stub, PROMPTS[0], "strict")
    gc.collect()
    assert dirs.live() == [v2] and not v1.exists()
    # partial full-weight push on top of the adapter: v3 is derived from v2's merged weights and names it
    up = {k: v for k, v in load_file(str(tiny_v2_dir / "model.safetensors")).items() if "mlp.up_proj" in k}
    v3 = await push_weights(stub, "strict", 3, up)
    assert v3.policy.adapter == str(v2) and v3.tensors == 2
    gc.collect()
    assert dirs.live() == [v2]
    await stub.LoadPolicy(pb.LoadPolicyRequest(policy_id="strict", version=4, model_path=str(tiny_v2_dir)))
    await greedy(stub, PROMPTS[0], "strict")
    gc.collect()
    assert dirs.live() == []


def test_config_and_tensor_checks_without_a_server() -> None:
    """rank_pattern gives some modules another rank; names must be PEFT keys without the adapter name."""
    cfg = adapters.parse_config(json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj", "v_proj"],
                                            "rank_pattern": {"v_proj": 2}}))  # fmt: skip
    key = "base_model.model.model.layers.0.self_attn.{}.lora_{}.weight"
    ok = {key.format("q_proj", "A"): torch.zeros(4, 8), key.format("q_proj", "B"): torch.zeros(8, 4),
          key.format("v_proj", "A"): torch.zeros(2, 8), key.format("v_proj", "B"): torch.zeros(8, 2)}  # fmt: skip
    adapters.check_tensors(cfg, ok)
    with pytest.raises(InferenceError, match="rank mismatch"):
        adapters.check_tensors(cfg, {**ok, key.format("v_proj", "A"): torch.zeros(4, 8)})
    named = {k.replace("lora_A.weight", "lora_A.default.weight"): v for k, v in ok.items()}
    with pytest.raises(InferenceError, match="without the adapter name"):
        adapters.check_tensors(cfg, named)
    with pytest.raises(InferenceError, match="at least one"):
        adapters.check_tensors(cfg, {})
    with pytest.raises(InferenceError, match="target_modules"):
        adapters.parse_config(json.dumps({"peft_type": "LORA", "r": 4}))


def test_tensor_chunks_round_trip_any_dtype() -> None:
    """bfloat16 (no numpy dtype) and empty tensors survive chunking and the server's reassembly."""
    from wolfpack_inference.policies import TensorAssembler

    tensors = {"a": torch.randn(7, 5).to(torch.bfloat16), "b": torch.arange(10, dtype=torch.int64), "c": torch.zeros(0, 3)}  # fmt: skip
    chunks = list(tensor_chunks("p", 1, tensors, chunk_bytes=16))
    assert chunks[0].policy_id == "p" and all(not c.policy_id for c in chunks[1:])
    assembler = TensorAssembler()
    for c in reversed(chunks):
        assembler.add(c.name, c.dtype, c.shape, c.data, c.offset)
    out = assembler.tensors()
    assert set(out) == set(tensors)
    for k, t in tensors.items():
        assert out[k].dtype == t.dtype and torch.equal(out[k], t)


@pytest.mark.filterwarnings("ignore:Found missing adapter keys")
def test_loaded_adapter_dir_is_checked_like_a_push(tiny_dir: Path, tmp_path: Path) -> None:
    """LoadPolicy's path refuses a saved adapter whose file lacks modules the config targets, instead of
    serving those modules with random initial weights."""
    from safetensors.torch import save_file

    from wolfpack_inference.backends.transformers_backend import load_causal_lm

    make_lora(tiny_dir).save_pretrained(tmp_path)
    weights = tmp_path / adapters.WEIGHTS_FILE
    save_file({k: v for k, v in load_file(str(weights)).items() if "o_proj" not in k}, str(weights))
    with pytest.raises(InferenceError, match="missing tensors"):
        load_causal_lm(str(tiny_dir), "cpu", torch.float32, str(tmp_path))
