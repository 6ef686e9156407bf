"""The web view's settings: ``WOLFPACK_WEB_*`` variables, beside the stack's ``WOLFPACK_*`` ones.

Why a class of its own: the web view is not a gRPC service (it has no slot in ``wolfpack.SERVICES`` and no
base port), and its knobs (what it may show, how much it accepts) concern only it. The stack settings
(``wolfpack.settings.Settings``) still say where the environment and Redis are and hold the service
credential, which never leaves this process.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from wolfpack.settings import SettingsError

DEFAULT_PORT = 8470


class WebSettings(BaseSettings):
    """Each field is the variable ``WOLFPACK_WEB_<FIELD_NAME_UPPER>``."""

    model_config = SettingsConfigDict(env_prefix="WOLFPACK_WEB_", extra="ignore", frozen=True)

    addr: str = Field(default=f"127.0.0.1:{DEFAULT_PORT}", description="host:port the web view listens on.")
    spectate: bool = Field(
        default=True,
        description="Live spectating (every seat's role and the full log of a running game). false: the live "
        "page and its API answer 403, and the web view starts no games.",
    )
    trust_network: bool = Field(
        default=False,
        description="Allow listening beyond loopback while spectating is on (put an authenticating proxy in "
        "front: whoever reaches the page sees hidden roles of running games).",
    )
    runs: list[Path] = Field(
        default_factory=list,
        description="Extra run directories (or folders of them) for the training page, beside "
        "<WOLFPACK_RUN_DIR>/train. JSON list, e.g. '[\"runs/a\"]'.",
    )
    max_upload_mb: int = Field(default=16, ge=1, le=256, description="Largest trajectory file accepted, MiB.")
    max_games: int = Field(
        default=4, ge=0, le=64, description="Games the web view plays at once (Start game)."
    )
    max_watched: int = Field(default=256, ge=1, le=10_000, description="Episodes it remembers (LRU).")

    @field_validator("addr")
    @classmethod
    def _check_addr(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("must be host:port with a port between 0 and 65535 (0 picks a free one)")
        return v

    @property
    def host(self) -> str:
        return self.addr.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.addr.rpartition(":")[2])


def load_web_settings(**overrides: object) -> WebSettings:
    """``WebSettings`` from the environment, with validation errors as one readable ``SettingsError``."""
    try:
        return WebSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        lines = [
            f"  WOLFPACK_WEB_{'.'.join(str(p) for p in e['loc']).upper()}={e.get('input')!r}: {e['msg']}"
            for e in exc.errors()
        ]
        raise SettingsError("invalid web settings:\n" + "\n".join(lines)) from None
