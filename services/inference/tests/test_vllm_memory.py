"""The vLLM backend's start-up memory hint (CPU: no vLLM needed). vLLM refuses to start when less than
``gpu_memory_utilization`` x the card is free, but says why only in its engine-core process's log; the
backend adds the reason to the error its caller sees (s26's GPU test beside a training run: 34.1 GiB free,
41.9 asked)."""

from __future__ import annotations

from wolfpack_inference.backends.vllm_backend import GIB, _free_memory_hint, memory_hint

TOTAL = int(139.8 * GIB)


def test_the_hint_names_free_wanted_and_the_setting_to_lower() -> None:
    hint = memory_hint(0.3, int(34.06 * GIB), TOTAL)
    assert hint is not None
    assert "34.1 GiB free of 139.8 GiB" in hint
    assert "gpu_memory_utilization 0.30 asks for 41.9 GiB" in hint
    assert "inference.gpu_memory_utilization" in hint and "to at most 0.24" in hint
    assert "another process holds 105.7 GiB" in hint


def test_no_hint_when_the_free_memory_covers_the_request() -> None:
    assert memory_hint(0.3, int(41.95 * GIB), TOTAL) is None  # just enough: the cause is elsewhere
    assert memory_hint(0.9, TOTAL, TOTAL) is None
    assert memory_hint(0.3, 0, 0) is None  # nothing read: no claim


def test_no_hint_without_a_card() -> None:
    """On a machine without CUDA the engine's own error stands alone."""
    assert _free_memory_hint(0.3) is None
