"""The vLLM backend on a real GPU (vLLM 0.24 ``AsyncLLM``, one GPU): ``gpu``-marked, deselected in CI.

Run on the GPU machine (after staging vLLM, see ../../shared/gpu/README.md)::

    . /tmp/site/env.sh && python3 -m pytest -m gpu services/inference/tests/test_vllm_gpu.py

Without CUDA or vLLM every test here is skipped with the reason; CI also deselects the ``gpu`` marker
(``-m "not gpu"`` in the pytest addopts), so they never run there.

Two engines on a random-weight small Qwen2 (hidden 256, 2 layers, head_dim 64, locally trained tokenizer):
engine A (float32, no LoRA) for exact checks and full-weight updates; engine B (bfloat16, LoRA, since
vLLM's LoRA kernels take only half precision) for adapter switches and pushes. Engine A lives for the
module; every test that changes its weights restores them. Each LoRA test starts its own engine B, so
test order (pytest-randomly) cannot leak an adapter from one test into another.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

for _key, _value in {
    "VLLM_HOST_IP": "127.0.0.1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    # AsyncLLM runs its engine core in a child process, and the tests use CUDA in this process (the
    # transformers references): a forked child cannot re-initialise CUDA, a spawned one can.
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    # torch.cuda.is_available() below asks NVML instead of initialising CUDA at collection time
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
}.items():  # fmt: skip
    os.environ.setdefault(_key, _value)


def _gpu_skip_reason() -> str:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    try:
        import vllm  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as exc:
        return f"vLLM is not importable: {exc}"
    return ""


_REASON = _gpu_skip_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(bool(_REASON), reason=_REASON or "GPU available"),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
]

from wolfpack_inference.backends.base import InferenceError, Request, Result, Sampling  # noqa: E402
from wolfpack_inference.config import PolicyConfig  # noqa: E402
from wolfpack_inference.models import perturbed_copy, tiny_model  # noqa: E402

GREEDY = Sampling(max_tokens=24, temperature=0.0, logprobs=True)
LONG = Sampling(max_tokens=200, temperature=0.0)
TOL = 0.1  # float32 engine vs float32 transformers: max |logprob diff| on a sampled completion


def _package_on_path() -> None:
    """The engine imports its worker extension by module name: the package must be importable there."""
    here = str(Path(__file__).resolve().parents[1])
    if here not in sys.path:
        sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-gpu")


@pytest.fixture(scope="module")
def model_dir(work: Path) -> Path:
    return tiny_model(work, hidden_size=256, layers=2)


@pytest.fixture(scope="module")
def prompt(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    from wolfpack_inference.prompts import render_chat

    tok = AutoTokenizer.from_pretrained(model_dir)
    return render_chat(tok, [{"role": "user", "content": "Bob says: vote Carol. Who is the wolf?"}])


def engine_config(model_dir: Path, **update: Any) -> PolicyConfig:
    cfg = PolicyConfig(
        policy_id="check", backend="vllm", model=str(model_dir), dtype="float32", enforce_eager=True,
        gpu_memory_utilization=0.3, max_batch=64, enable_lora=False, max_loras=2, max_lora_rank=8,
    )  # fmt: skip
    return cfg.model_copy(update=update)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(model_dir: Path) -> AsyncIterator[Any]:
    """Engine A: float32, no LoRA, for the module."""
    _package_on_path()
    from wolfpack_inference.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend(str(model_dir), engine_config(model_dir))
    yield backend
    await backend.close()


@pytest_asyncio.fixture(loop_scope="module")
async def lora_engine(model_dir: Path) -> AsyncIterator[Any]:
    """Engine B: bfloat16 with LoRA enabled, fresh per test (no adapter loaded at start)."""
    _package_on_path()
    from wolfpack_inference.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend(str(model_dir), engine_config(model_dir, dtype="bfloat16", enable_lora=True))
    yield backend
    await backend.close()


async def gen(engine: Any, s: Sampling, ids: list[int]) -> Result:
    result: Result = await engine.generate(Request(s, ids))
    return result


def hf_logprobs(model_dir: Path, prompt: list[int], completion: list[int], adapter: str = "") -> list[float]:
    """Teacher-forced float32 transformers logprobs of ``completion`` after ``prompt`` (the reference)."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    ids = torch.tensor([prompt + completion], device="cuda")
    with torch.no_grad():
        logp = model(ids).logits.float().log_softmax(-1)[0]
    return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(completion)]


def lora_model(model_dir: Path, seed: int) -> Any:
    """A peft LoRA (rank 8) with non-zero B, so it changes the output."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return peft_model


def max_diff(ref: list[float], got: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(ref, got, strict=True))


async def test_greedy_is_deterministic_alone_and_in_a_batch(engine: Any, prompt: list[int]) -> None:
    a, b = await gen(engine, GREEDY, prompt), await gen(engine, GREEDY, prompt)
    batch = await asyncio.gather(*[gen(engine, GREEDY, prompt) for _ in range(16)])
    ids = a.completions[0].token_ids
    assert len(ids) > 0
    assert b.completions[0].token_ids == ids
    assert all(r.completions[0].token_ids == ids for r in batch)


async def test_logprobs_match_a_transformers_forward(engine: Any, model_dir: Path, prompt: list[int]) -> None:
    out = await gen(engine, GREEDY, prompt)
    ids = out.completions[0].token_ids
    diff = max_diff(hf_logprobs(model_dir, prompt, ids), out.completions[0].logprobs)
    print(f"logprobs_vs_transformers max_abs_diff={diff:.5f} (float32)")
    assert diff < TOL


async def test_seeded_sampling_is_reproducible(engine: Any, prompt: list[int]) -> None:
    # no logprobs here: the backend refuses logprobs with top_p < 1 (they would be renormalised)
    seeded = Sampling(max_tokens=24, temperature=1.0, top_p=0.9, seed=7, n=2)
    s1, s2 = await gen(engine, seeded, prompt), await gen(engine, seeded, prompt)
    assert [c.token_ids for c in s1.completions] == [c.token_ids for c in s2.completions]
    other = await gen(engine, Sampling(max_tokens=24, temperature=1.0, top_p=0.9, seed=8, n=2), prompt)
    assert [c.token_ids for c in other.completions] != [c.token_ids for c in s1.completions]


async def test_stream_matches_unary(engine: Any, prompt: list[int]) -> None:
    chunks = [c async for c in engine.stream(Request(GREEDY, prompt))]
    final = await gen(engine, GREEDY, prompt)
    assert len(chunks) > 1
    assert [t for c in chunks for t in c.token_ids] == final.completions[0].token_ids


async def test_final_text_is_the_engines_text_and_stop_strings_still_stop(
    engine: Any, model_dir: Path, prompt: list[int]
) -> None:
    """A final-only request skips vLLM's per-token detokenizer and decodes once: the text must be what the
    engine's own detokenizer produces for the same tokens (the stream path keeps it), and a request with
    stop strings must still be matched on text inside the engine."""
    from transformers import AutoTokenizer

    chunks = [c async for c in engine.stream(Request(GREEDY, prompt))]
    final = (await gen(engine, GREEDY, prompt)).completions[0]
    streamed_text = "".join(c.text for c in chunks)
    assert final.text and final.text == streamed_text
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert final.text == tok.decode(final.token_ids, skip_special_tokens=True)
    # stop on the text of the 3rd..4th generated tokens: the completion must end before the full 24 tokens
    stop = tok.decode(final.token_ids[2:4], skip_special_tokens=True)
    assert stop, "the random model's 3rd and 4th tokens decode to nothing: pick another window"
    stopping = Sampling(max_tokens=24, temperature=0.0, stop=(stop,))
    stopped = (await gen(engine, stopping, prompt)).completions[0]
    assert stop not in stopped.text
    assert len(stopped.token_ids) < len(final.token_ids)


async def test_full_weight_update_from_a_checkpoint_then_pushed_tensors(
    engine: Any, model_dir: Path, work: Path, prompt: list[int]
) -> None:
    """A checkpoint directory changes the output (and matches transformers on the new weights); pushing the
    original weights back as in-memory tensors restores the original output exactly."""
    from safetensors.torch import load_file

    base = (await gen(engine, GREEDY, prompt)).completions[0].token_ids
    v2 = perturbed_copy(model_dir, work / "tiny-v2", scale=0.5)
    version = engine.version
    before = await engine.weight_checksum()
    try:
        await engine.load(version + 1, model_path=str(v2))
        r2 = await gen(engine, GREEDY, prompt)
        assert r2.version == version + 1
        assert await engine.weight_checksum() != before
        assert r2.completions[0].token_ids != base
        diff2 = max_diff(hf_logprobs(v2, prompt, r2.completions[0].token_ids), r2.completions[0].logprobs)
        assert diff2 < TOL
    finally:
        await engine.update_weights(
            version + 2, load_file(str(model_dir / "model.safetensors")), is_adapter=False
        )
    r3 = await gen(engine, GREEDY, prompt)
    assert r3.version == version + 2
    assert r3.completions[0].token_ids == base


async def test_lora_switch_keeps_inflight_requests_on_the_old_version(
    lora_engine: Any, model_dir: Path, work: Path, prompt: list[int]
) -> None:
    base = await gen(lora_engine, GREEDY, prompt)
    base_ids = base.completions[0].token_ids
    base_diff = max_diff(hf_logprobs(model_dir, prompt, base_ids), base.completions[0].logprobs)
    lora_dir = work / "lora-switch"
    lora_model(model_dir, seed=1).save_pretrained(lora_dir)
    inflight = [asyncio.create_task(gen(lora_engine, LONG, prompt)) for _ in range(8)]
    await asyncio.sleep(0.05)  # let them be admitted; the check below holds whatever their progress
    await lora_engine.load(1, adapter_path=str(lora_dir))
    after = await gen(lora_engine, GREEDY, prompt)
    old = await asyncio.gather(*inflight)
    assert {r.version for r in old} == {0}
    assert after.version == 1
    ids = after.completions[0].token_ids
    assert ids != base_ids
    # bf16 engine vs float32 reference: the adapter must be as close as the base model is (x2), not exact
    lora_diff = max_diff(
        hf_logprobs(model_dir, prompt, ids, adapter=str(lora_dir)), after.completions[0].logprobs
    )
    print(f"lora bf16 max_abs_diff={lora_diff:.5f} base bf16 max_abs_diff={base_diff:.5f}")
    assert lora_diff < max(TOL, 2 * base_diff)


async def test_full_weight_update_is_refused_with_lora(lora_engine: Any, model_dir: Path) -> None:
    with pytest.raises(Exception, match="enable_lora=false"):
        await lora_engine.load(9, model_path=str(model_dir))


async def test_lora_push_as_tensors(lora_engine: Any, model_dir: Path, work: Path, prompt: list[int]) -> None:
    """The PushWeights path: in-flight requests keep the previous version, the pushed adapter equals the
    same adapter loaded by path (same engine, exact), a rank-mismatched push is INVALID_ARGUMENT and
    changes nothing, and a pushed adapter's directory is deleted once a newer push replaced it."""
    from wolfpack_inference.policies import Policy, PolicyRegistry
    from wolfpack_inference.push import peft_adapter

    registry = PolicyRegistry(work, [Policy(lora_engine.cfg, lora_engine)])
    pushed = lora_model(model_dir, seed=2)
    ref_dir = work / "lora-pushed-ref"
    pushed.save_pretrained(ref_dir)
    state, config_json = peft_adapter(pushed)
    before = await gen(lora_engine, GREEDY, prompt)
    v = lora_engine.version
    inflight = [asyncio.create_task(gen(lora_engine, LONG, prompt)) for _ in range(8)]
    await asyncio.sleep(0.05)
    await registry.push("check", v + 1, state, True, config_json)
    pushed_dir = Path(lora_engine.adapter)
    after = await gen(lora_engine, GREEDY, prompt)
    old = await asyncio.gather(*inflight)
    assert {r.version for r in old} == {v}
    assert after.version == v + 1
    ids = after.completions[0].token_ids
    assert ids != before.completions[0].token_ids

    bad = json.dumps(json.loads(config_json) | {"r": 4})
    with pytest.raises(InferenceError, match="rank mismatch") as refused:
        await registry.push("check", v + 2, state, True, bad)
    assert refused.value.code.value == "INVALID_ARGUMENT"
    unchanged = await gen(lora_engine, GREEDY, prompt)
    assert unchanged.version == v + 1 and unchanged.completions[0].token_ids == ids
    assert pushed_dir.is_dir()

    next_state, next_config = peft_adapter(lora_model(model_dir, seed=3))
    await registry.push("check", v + 2, next_state, True, next_config)
    await gen(lora_engine, GREEDY, prompt)
    assert lora_engine.version == v + 2
    assert not pushed_dir.exists()

    await lora_engine.load(v + 3, adapter_path=str(ref_dir))
    loaded = await gen(lora_engine, GREEDY, prompt)
    assert loaded.completions[0].token_ids == ids
    assert max_diff(loaded.completions[0].logprobs, after.completions[0].logprobs) < 1e-3
