"""Continuous batching in the transformers backend, on tiny random Qwen2 and Llama models on CPU.

The backend is driven directly (no gRPC) so a test can decide exactly when a request arrives relative to
the running batch: a long request is streamed, and the others are sent after it has produced some tokens,
i.e. while its batch is decoding. A forward pre-hook on the real model records the shape of every forward
pass (prefill: ``[rows, prompt width]``; decode step: ``[rows, 1]``), which shows who shared a step;
where the step a request joins at matters, a ``Stepper`` hook lets the decode thread run only the passes the
test allows, so the schedule is fixed by the test rather than by the machine's speed."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from wolfpack_inference.backends.base import ErrorCode, Finish, InferenceError, Request, Result, Sampling
from wolfpack_inference.backends.transformers_backend import TransformersBackend

POISON = 3
"""A token id no test prompt contains: a hook makes any prefill that feeds it fail."""


def ids(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 900) for _ in range(length)]


def req(prompt: Sequence[int], max_tokens: int, **sampling: Any) -> Request:
    params: dict[str, Any] = dict(temperature=0.0, logprobs=True) | sampling
    return Request(Sampling(max_tokens=max_tokens, **params), prompt_ids=list(prompt))


def assert_same(got: Result, alone: Result) -> None:
    """Same tokens and finish reasons as the request run alone; logprobs within float rounding."""
    assert len(got.completions) == len(alone.completions)
    for g, a in zip(got.completions, alone.completions, strict=True):
        assert g.token_ids == a.token_ids
        assert g.finish == a.finish
        assert len(g.logprobs) == len(a.logprobs) == len(a.token_ids)
        assert max(abs(x - y) for x, y in zip(g.logprobs, a.logprobs, strict=True)) < 1e-4


def assert_teacher_forced(model: Any, result: Result) -> None:
    """Every reported logprob equals log_softmax of one forward pass over prompt + completion."""
    for c in result.completions:
        seq = torch.tensor([result.prompt_ids + c.token_ids])
        with torch.no_grad():
            logp = model(seq).logits.float().log_softmax(-1)[0]
        start = len(result.prompt_ids) - 1
        ref = torch.tensor([float(logp[start + j, t]) for j, t in enumerate(c.token_ids)])
        assert torch.allclose(ref, torch.tensor(c.logprobs), atol=1e-4), (ref, c.logprobs)


class Shapes:
    """Records ``(rows, width)`` of every forward pass of a model."""

    def __init__(self, model: Any) -> None:
        self.calls: list[tuple[int, int]] = []
        self.masks: list[torch.Tensor] = []
        self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, _module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        rows, width = kwargs["input_ids"].shape
        self.calls.append((int(rows), int(width)))
        self.masks.append(kwargs["attention_mask"].clone())

    def steps(self) -> list[int]:
        """Rows of each decode step (width 1)."""
        return [rows for rows, width in self.calls if width == 1]

    def remove(self) -> None:
        self._handle.remove()


class Stepper:
    """Lets the decode thread run only the forward passes (prefills and decode steps) the test allows: who
    joins at which step is then decided by the test, not by how fast the thread runs against the event
    loop on a loaded machine. ``allow(n)`` grants ``n`` more passes; ``wait_held(k)`` waits until the k-th
    pass has arrived (and, with no permit left, is held there); ``run_free()`` lifts the limit. A pass waits
    at most ``HOLD_S`` for its permit, so a failing test cannot hang the thread."""

    HOLD_S = 120.0  # far beyond any test here; only bounds a failed test's leftover thread

    def __init__(self, model: Any) -> None:
        self.arrived = 0
        self._permits = threading.Semaphore(0)
        self._free = threading.Event()
        self._handle = model.register_forward_pre_hook(self._wait)

    def _wait(self, *_: Any) -> None:
        self.arrived += 1
        if not self._free.is_set() and not self._permits.acquire(timeout=self.HOLD_S):
            raise RuntimeError("Stepper: no pass allowed")

    def allow(self, n: int) -> None:
        self._permits.release(n)

    async def wait_held(self, k: int) -> None:
        """Bounded poll (passes take milliseconds; the bound only turns a hang into a failure)."""
        for _ in range(6000):
            if self.arrived >= k:
                assert self.arrived == k, f"pass {self.arrived} ran, but only {k - 1} were allowed"
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"pass {k} never arrived ({self.arrived})")

    def run_free(self) -> None:
        self._free.set()
        self._permits.release()  # wakes the pass that is held, if any

    def remove(self) -> None:
        self.run_free()
        self._handle.remove()


async def submitted(*coros: Any) -> list[asyncio.Future[Any]]:
    """Start ``coros`` as tasks and let each run to its first suspension: a ``generate`` call has then put
    its job in the batcher's inbox (submission is synchronous in its first step; tasks run in FIFO order)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    await asyncio.sleep(0)
    return tasks


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama (SmolLM2's architecture: no q/k/v bias, untied head) with the tiny model's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture
async def backend(tiny_dir: Path) -> AsyncIterator[TransformersBackend]:
    b = TransformersBackend(str(tiny_dir), device="cpu", dtype="float32", ignore_eos=True, batch_wait_ms=2)
    yield b
    await b.close()


async def start_stream(backend: TransformersBackend, request: Request, chunks: int) -> Any:
    """A stream that has produced ``chunks`` tokens: its batch is decoding now."""
    stream = backend.stream(request)
    for _ in range(chunks):
        await stream.__anext__()
    return stream


async def drain(stream: Any) -> list[int]:
    return [t async for chunk in stream for t in chunk.token_ids]


async def drain_n(stream: Any, chunks: int) -> list[int]:
    return [t for _ in range(chunks) for t in (await stream.__anext__()).token_ids]


async def test_request_arriving_mid_batch_finishes_first(backend: TransformersBackend) -> None:
    """A short request sent while a long one decodes joins its batch and completes first, with the same
    tokens and logprobs as when run alone; the long one is not disturbed either. The long request is held
    at its 6th pass while the short one is sent, so it surely is mid-batch then."""
    long, short = req(ids(20, 1), 200), req(ids(9, 2), 6)
    alone_long, alone_short = await backend.generate(long), await backend.generate(short)
    order: list[str] = []
    stepper = Stepper(backend.torch_model)
    stepper.allow(5)  # the prefill and 4 steps: 5 tokens
    stream = await start_stream(backend, long, 5)
    await stepper.wait_held(6)

    async def finish_long() -> list[int]:
        rest = await drain(stream)
        order.append("long")
        return rest

    async def finish_short() -> Result:
        result = await backend.generate(short)
        order.append("short")
        return result

    both = asyncio.gather(finish_long(), finish_short())
    await asyncio.sleep(0)  # finish_short's generate has submitted its job
    stepper.run_free()
    rest, got_short = await both
    stepper.remove()
    assert order == ["short", "long"]
    assert_same(got_short, alone_short)
    assert len(rest) == 200 - 5 and rest == alone_long.completions[0].token_ids[5:]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
async def test_joined_rows_equal_alone(arch: str, tiny_dir: Path, tiny_llama_dir: Path) -> None:
    """Requests joining a running batch at different steps, with prompts both longer and shorter than the
    running cache (either side gets padded), greedy and seeded n=2 sampling: each equals its run alone,
    and its logprobs equal a teacher-forced forward pass."""
    path = tiny_dir if arch == "qwen2" else tiny_llama_dir
    backend = TransformersBackend(str(path), device="cpu", dtype="float32", ignore_eos=True, batch_wait_ms=0)
    model = backend.torch_model
    first = req(ids(12, 3), 200)
    later = [
        req(ids(90, 4), 60),  # longer than the running batch's cache: the batch is padded on the left
        req(ids(4, 5), 40),  # much shorter: the newcomer is padded
        req(ids(30, 6), 20, temperature=1.0, top_k=20, seed=11, n=2),
    ]
    alone = [await backend.generate(r) for r in [first, *later]]
    shapes, stepper = Shapes(model), Stepper(model)
    stepper.allow(3)  # the prefill and 2 steps: 3 tokens of the first request; pass 4 (a step) is held
    stream = await start_stream(backend, first, 3)
    await stepper.wait_held(4)
    joined = await submitted(*[backend.generate(r) for r in later[:2]])
    stepper.allow(3)  # pass 4, the newcomers' prefill (5) and a step of all three rows (6); 7 is held
    await stepper.wait_held(7)
    third = await submitted(backend.generate(later[2]))
    stepper.run_free()
    rest = await drain(stream)
    results = [*await asyncio.gather(*joined, *third)]
    shapes.remove()
    stepper.remove()
    await backend.close()
    assert alone[0].completions[0].token_ids[3:] == rest
    for got, ref in zip(results, alone[1:], strict=True):
        assert_same(got, ref)
        assert_teacher_forced(model, got)
    assert len({tuple(c.token_ids) for c in results[2].completions}) == 2  # n = 2 are distinct draws
    # (rows, width) of the first passes, from the schedule above: each newcomer prefill (the two together,
    # then the third: one prompt row, sampled twice) is followed by a step over the running rows plus its
    # own, i.e. they joined while the first request decoded; it has 200 - 5 tokens still to go.
    assert shapes.calls[:9] == [
        (1, 12),
        (1, 1),
        (1, 1),
        (1, 1),  # the first request: prefill, 3 steps
        (2, 90),
        (3, 1),
        (3, 1),  # later[0:2] joined: prefill padded to 90, then 1 + 2 rows
        (1, 30),
        (5, 1),  # later[2] (n=2) joined: 3 + 2 rows
    ], shapes.calls[:9]


async def test_very_different_lengths_leave_a_narrow_cache(tiny_dir: Path) -> None:
    """A 2-token prompt wanting 3 tokens and a 200-token prompt wanting 60 share a batch: both equal their
    runs alone, and once the short row has left, steps run one row with no padding column."""
    # a long batch wait, so that both requests surely start together even on a loaded machine
    backend = TransformersBackend(
        str(tiny_dir), device="cpu", dtype="float32", ignore_eos=True, batch_wait_ms=50
    )
    short, long = req(ids(2, 7), 3), req(ids(200, 8), 60)
    alone = [await backend.generate(short), await backend.generate(long)]
    shapes = Shapes(backend.torch_model)
    got = await asyncio.gather(backend.generate(short), backend.generate(long))
    shapes.remove()
    await backend.close()
    for g, a in zip(got, alone, strict=True):
        assert_same(g, a)
    assert shapes.calls[0] == (2, 200)  # one prefill for both
    steps = [(c, m) for c, m in zip(shapes.calls, shapes.masks, strict=True) if c[1] == 1]
    assert [rows for (rows, _), _ in steps[:2]] == [2, 2]  # the short row's 2nd and 3rd tokens
    assert all(rows == 1 and bool(mask.all()) for (rows, _), mask in steps[3:])
    assert steps[-1][1].shape == (1, 200 + 60 - 1)  # exactly the long row's own tokens


async def test_cancelled_rows_leave_the_batch(backend: TransformersBackend) -> None:
    """A request cancelled mid-batch (generate task cancelled, stream closed by its reader) stops being
    decoded within a step or two; the request still running is unaffected."""
    keep, dropped = req(ids(15, 9), 150), req(ids(25, 10), 400)
    alone = await backend.generate(keep)
    shapes, stepper = Shapes(backend.torch_model), Stepper(backend.torch_model)
    stepper.allow(2)  # keep's prefill and 1 step: 2 tokens; pass 3 (a step) is held
    stream = await start_stream(backend, keep, 2)
    await stepper.wait_held(3)
    other = backend.stream(req(ids(7, 11), 400))
    (task, other_first) = await submitted(backend.generate(dropped), other.__anext__())
    stepper.allow(4)  # pass 3, the newcomers' prefill (4), 2 steps of 3 rows (5, 6); 7 is held
    await stepper.wait_held(7)
    assert len((await other_first).token_ids) == 1 and len(await drain_n(other, 2)) == 2  # its 3 tokens
    assert shapes.calls[3:7] == [(2, 25), (3, 1), (3, 1), (3, 1)]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await other.aclose()
    cancelled_at = len(shapes.calls)  # 7: the held pass, with both rows in it, is in flight
    stepper.run_free()
    rest = await drain(stream)
    shapes.remove()
    stepper.remove()
    assert alone.completions[0].token_ids[2:] == rest
    # keep has 6 tokens once pass 7 is done (prefill, passes 2, 3, 5, 6, 7); the cancelled rows leave at the
    # next step, so its remaining 144 tokens are decoded alone; were they kept, they would add rows.
    assert shapes.calls[cancelled_at:] == [(1, 1)] * (150 - 6)


async def test_max_batch_is_respected(tiny_dir: Path) -> None:
    """Seven requests (one with n=2) against max_batch=3: no forward pass has more than 3 rows, the
    waiting ones join as rows free up, and every result equals its run alone."""
    backend = TransformersBackend(str(tiny_dir), device="cpu", dtype="float32", ignore_eos=True, max_batch=3)
    reqs = [req(ids(5 + 7 * i, 20 + i), 4 + 9 * (i % 3)) for i in range(6)]
    reqs.append(req(ids(11, 30), 8, temperature=0.8, seed=5, n=2))
    alone = [await backend.generate(r) for r in reqs]
    shapes = Shapes(backend.torch_model)
    got = await asyncio.gather(*[backend.generate(r) for r in reqs])
    shapes.remove()
    await backend.close()
    for g, a in zip(got, alone, strict=True):
        assert_same(g, a)
    assert max(rows for rows, _ in shapes.calls) == 3, shapes.calls
    prefills = [i for i, (_, width) in enumerate(shapes.calls) if width > 1]
    joins = [i for i in prefills[1:] if shapes.calls[i + 1][0] > shapes.calls[i][0]]
    assert joins, shapes.calls  # a waiting job joined rows that were still decoding


async def test_newer_version_waits_for_the_running_batch(
    backend: TransformersBackend, tiny_v2_dir: Path
) -> None:
    """A request bound to a newer version while a batch of the old one decodes never shares its forward
    passes: it starts once the old batch has drained, and both results are their version's alone."""
    old_req, new_req = req(ids(10, 12), 40), req(ids(14, 13), 10)
    alone_old = await backend.generate(old_req)
    old_model = backend.torch_model
    stepper = Stepper(old_model)
    stepper.allow(2)  # prefill and 1 step: 2 tokens; pass 3 is held while the new version arrives
    stream = await start_stream(backend, old_req, 2)
    await stepper.wait_held(3)
    await backend.load(1, str(tiny_v2_dir))
    events: list[str] = []
    hooks = [
        old_model.register_forward_pre_hook(lambda *_: events.append("v0")),
        backend.torch_model.register_forward_pre_hook(lambda *_: events.append("v1")),
    ]
    (new_call,) = await submitted(backend.generate(new_req))
    stepper.run_free()
    got_new, rest = await asyncio.gather(new_call, drain(stream))
    stepper.remove()
    for h in hooks:
        h.remove()
    assert got_new.version == 1 and rest == alone_old.completions[0].token_ids[2:]
    # the old batch's 37 steps after the held one (40 tokens: prefill, passes 2 and 3, then 37) all ran
    # after the new request arrived, and before any pass of the new version
    assert events == ["v0"] * 37 + ["v1"] * events.count("v1") and events.count("v1") >= 1
    assert_same(got_new, await backend.generate(new_req))


async def test_a_failing_batch_fails_only_its_requests(backend: TransformersBackend) -> None:
    """A newcomer whose prefill fails gets INTERNAL while the running batch goes on; a failing decode step
    fails the running batch; the backend then serves the next request normally."""
    fail_steps = False

    def sabotage(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        x = kwargs["input_ids"]
        if (x.shape[1] > 1 and bool((x == POISON).any())) or (fail_steps and x.shape[1] == 1):
            raise RuntimeError("sabotaged")

    running = req(ids(8, 14), 50)
    alone = await backend.generate(running)
    handle = backend.torch_model.register_forward_pre_hook(sabotage, with_kwargs=True)
    stream = await start_stream(backend, running, 2)
    with pytest.raises(InferenceError) as err:
        await backend.generate(req([*ids(6, 15), POISON], 5))
    assert err.value.code == ErrorCode.INTERNAL and "sabotaged" in str(err.value)
    assert await drain(stream) == alone.completions[0].token_ids[2:]

    stepper = Stepper(backend.torch_model)
    stepper.allow(1)  # the prefill: 1 token; its first step is held until the steps fail
    doomed = await start_stream(backend, req(ids(8, 16), 50), 1)
    await stepper.wait_held(2)
    fail_steps = True
    stepper.run_free()
    with pytest.raises(InferenceError):
        await drain(doomed)
    fail_steps = False
    stepper.remove()
    handle.remove()
    after = await backend.generate(running)
    assert_same(after, alone)
    assert after.completions[0].finish == Finish.LENGTH
