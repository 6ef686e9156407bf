"""A job whose own stack can never serve its model stops at once with the reason.

Seen on an H100: four recipes on one card, one inference service ran out of memory while preparing its model,
stayed up with health NOT_SERVING (as designed: no crash loop, every call says why), and its job waited the
whole start-up timeout in silence. Real ``wolfpack up`` here, a model path that does not exist."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from wolfpack_trainer.config import load_config
from wolfpack_trainer.stack import child_stack

DEMO = Path(__file__).resolve().parents[3] / "configs" / "demo-ultimatum.yaml"


@pytest.mark.slow
def test_an_unpreparable_model_stops_the_job_with_the_reason(tmp_path: Path) -> None:
    cfg = load_config(DEMO)
    missing = tmp_path / "no-such-model"
    started = time.monotonic()
    stack = child_stack(cfg, tmp_path / "stack", {"responder": str(missing)}, timeout_s=300)
    with pytest.raises(RuntimeError) as err, stack:
        pytest.fail("the stack cannot be healthy: its only model does not exist")
    took = time.monotonic() - started
    message = str(err.value)
    assert "cannot serve" in message and "cannot be prepared" in message, message
    assert str(missing) in message or "no-such-model" in message, message
    assert took < 120, f"waited {took:.0f}s: the reason was known long before the 300 s timeout"
