"""Settings: one prefix, defaults that work, and errors a person can act on."""

from __future__ import annotations

import pytest

from wolfpack.settings import SettingsError, describe_settings, load_settings


def test_defaults_and_service_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WOLFPACK_REDIS_URL", raising=False)
    monkeypatch.setenv("WOLFPACK_BASE_PORT", "6000")
    monkeypatch.setenv("WOLFPACK_REWARD_ADDR", "reward.svc:7000")
    s = load_settings()
    assert s.redis_url is None
    assert s.service_addr("environment") == "127.0.0.1:6000"
    assert s.service_addr("inference") == "127.0.0.1:6001"
    assert s.service_addr("reward") == "reward.svc:7000"


def test_errors_name_every_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WOLFPACK_BASE_PORT", "not-a-port")
    monkeypatch.setenv("WOLFPACK_REDIS_URL", "http://localhost:6379")
    monkeypatch.setenv("WOLFPACK_TRAINER_ADDR", "localhost")
    monkeypatch.setenv("WOLFPACK_LOG_LEVEL", "LOUD")
    with pytest.raises(SettingsError) as err:
        load_settings()
    text = str(err.value)
    for var in ("WOLFPACK_BASE_PORT", "WOLFPACK_REDIS_URL", "WOLFPACK_TRAINER_ADDR", "WOLFPACK_LOG_LEVEL"):
        assert var in text
    assert "redis://" in text and "host:port" in text
    assert "Traceback" not in text


def test_unknown_service_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="unknown service 'gpu'"):
        load_settings().service_addr("gpu")


def test_every_setting_is_documented() -> None:
    rows = describe_settings()
    assert rows and all(var.startswith("WOLFPACK_") and doc for var, _default, doc in rows)
