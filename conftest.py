"""Fixtures shared by every test folder: a real Redis, never a mock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from wolfpack.redis_server import EmbeddedRedis

# Hypothesis profiles. Locally the default explores new examples each run (and replays failures from its
# database); CI derandomizes so a red run is reproducible from the log alone and a green one is the same run
# every time. HYPOTHESIS_PROFILE picks one explicitly (e.g. `HYPOTHESIS_PROFILE=ci pytest ...`).
hypothesis_settings.register_profile("dev", deadline=None)
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)

# Tracing: the OpenTelemetry SDK is process-global and cannot be uninstalled, so a test that installs it
# changes every test after it. Each path therefore gets its own session. The default session is the
# production default (no OTEL_* set: no SDK, trace context only) and deselects `tracing_sdk` tests; the
# session started with WOLFPACK_TEST_TRACING=sdk installs the SDK before any test runs and runs only those
# (tests/test_tracing_sessions.py starts it as a subprocess, so `make test` runs both).
TRACING_SDK = os.environ.get("WOLFPACK_TEST_TRACING") == "sdk"
if TRACING_SDK:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from wolfpack import telemetry

    telemetry.setup_telemetry("tests", exporter=InMemorySpanExporter())
else:
    for _name in [n for n in os.environ if n.startswith("OTEL_")]:
        del os.environ[_name]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "tracing_sdk: needs the tracing SDK installed; runs in its own session (WOLFPACK_TEST_TRACING=sdk)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TRACING_SDK:
        return
    deselected = [item for item in items if item.get_closest_marker("tracing_sdk")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("tracing_sdk")]


@pytest.fixture(autouse=True)
def _no_tracing_sdk_in_default_session(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the test that installed the SDK in the default session (it would change every later test)."""
    yield
    if not TRACING_SDK:
        from wolfpack import telemetry

        if telemetry.sdk_active():
            pytest.fail(
                f"{request.node.nodeid} installed the tracing SDK: mark it tracing_sdk", pytrace=False
            )


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``WOLFPACK_TEST_REDIS_URL`` if set, else an embedded real server for the session."""
    url = os.environ.get("WOLFPACK_TEST_REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedRedis(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server.url


@pytest.fixture
def held_out_plans(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The ``eval.replaces`` of every held-out plan a run asks ``wolfpack_trainer.train.held_out_plan`` for,
    in order (the plans themselves unchanged): what an evaluation played, the pair or one policy alone
    against the bot (``eval.vs_bot``)."""
    from wolfpack_trainer import train as train_module

    planned: list[list[str]] = []
    real_plan = train_module.held_out_plan

    def recording_plan(cfg: object, seeds: object) -> object:
        planned.append(list(cfg.eval.replaces))  # type: ignore[attr-defined]
        return real_plan(cfg, seeds)  # type: ignore[arg-type]

    monkeypatch.setattr(train_module, "held_out_plan", recording_plan)
    return planned
