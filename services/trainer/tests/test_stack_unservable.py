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


@pytest.mark.slow
def test_a_stack_that_exits_says_why_in_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The error carries the end of ``up.log``, not only its path (a lent machine's run directory is gone
    by the time anyone looks). Real ``wolfpack up``, refused at start by a bad setting."""
    monkeypatch.setenv("WOLFPACK_LOG_LEVEL", "CHATTY")
    cfg = load_config(DEMO)
    stack = child_stack(cfg, tmp_path / "stack", {"responder": str(tmp_path / "any")}, timeout_s=120)
    with pytest.raises(RuntimeError) as err, stack:
        pytest.fail("wolfpack up cannot start with an invalid log level")
    message = str(err.value)
    assert message.startswith("wolfpack up exited") and "its last lines:" in message, message
    assert "CHATTY" in message or "log_level" in message, message


@pytest.mark.slow
def test_the_jobs_stack_ignores_service_addresses_from_the_callers_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``WOLFPACK_ENVIRONMENT_ADDR`` exported for something else (the agent-loop script's own environment
    server, which main_ppo needs) must not reach the job's stack: it would bind that taken address and exit.
    Real ``wolfpack up`` with the tiny model, the address held by a listening socket."""
    import json
    import socket

    from wolfpack_inference.models import tiny_model

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = f"127.0.0.1:{held.getsockname()[1]}"
    monkeypatch.setenv("WOLFPACK_ENVIRONMENT_ADDR", taken)
    monkeypatch.setenv("WOLFPACK_INFERENCE_BACKEND", "transformers")
    monkeypatch.delenv("WOLFPACK_REDIS_URL", raising=False)
    cfg = load_config(DEMO)
    tiny = tiny_model(tmp_path / "models")
    try:
        with child_stack(cfg, tmp_path / "stack", {"responder": str(tiny)}, timeout_s=240) as run_dir:
            services = json.loads((run_dir / "up.json").read_text())["services"]
            assert services["environment"] != taken, services
    finally:
        held.close()
