"""The service credential: one shared secret that privileged RPCs must present.

Why one shared secret and not per-user accounts: the privileged callers are Wolfpack's own processes (the
trainer pushing weights, an operator loading a policy or spectating an episode), all deployed together;
a Kubernetes Secret (``secrets.adminSecret`` in the Helm chart) puts the same value into every pod as
``WOLFPACK_ADMIN_SECRET``. Agents never need it; rollout workers use it to report outcomes.

- Server: ``CredentialInterceptor`` refuses the whole-method privileged RPCs (``PRIVILEGED_METHODS``:
  PushWeights, LoadPolicy, the curriculum's and trainer's writes) before their handler runs — before a
  single weight chunk is read — with UNAUTHENTICATED (no credential) or PERMISSION_DENIED (a wrong
  one). Handlers whose privilege depends on the request (the environment's full view of a running
  episode, closing it) call ``authorized``.
- Client: ``client_interceptors`` attach the credential to calls of ``CLIENT_METHODS`` only, so it never
  travels on ordinary calls.
- Off only on a loopback-only dev stack: ``check_bind`` refuses to start a server on a non-loopback
  address without a secret, and says at start-up when privileged RPCs are open.

The interceptors (gRPC classes) live in ``wolfpack.auth_grpc``, imported when one is made
(``auth.CredentialInterceptor`` still names it): code that only asks ``is_loopback`` (the trainer's
publisher, in local mode too) loads no gRPC.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc


log = logging.getLogger(__name__)

METADATA_KEY = "x-wolfpack-credential"
"""gRPC metadata key (and, in the gateway, HTTP header ``X-Wolfpack-Credential``) of the credential."""

PRIVILEGED_METHODS: frozenset[str] = frozenset(
    {
        "/wolfpack.v1.InferenceService/PushWeights",
        "/wolfpack.v1.InferenceService/LoadPolicy",
        # Writes to shared training state: outcomes move AIW weights and Elo ratings, registrations the
        # league, checkpoints the disk (rollout and the trainer hold the secret like every pod).
        "/wolfpack.v1.CurriculumService/ReportOutcomes",
        "/wolfpack.v1.CurriculumService/RegisterOpponent",
        "/wolfpack.v1.TrainerService/SaveCheckpoint",
        # Every episode's id and its full view (roles, private channels) by id alone: operators and the
        # web view only; no seat token can open either.
        "/wolfpack.v1.EnvironmentService/ListEpisodes",
        "/wolfpack.v1.EnvironmentService/SpectateEpisode",
    }
)
"""Methods refused as a whole without the credential."""

CLIENT_METHODS: frozenset[str] = PRIVILEGED_METHODS | {
    "/wolfpack.v1.EnvironmentService/GetEpisode",
    "/wolfpack.v1.EnvironmentService/CloseEpisode",
}
"""Methods our clients attach the credential to (the environment decides per request whether it is
needed: a running episode's full view and closing it)."""


class Credential:
    """A configured secret (or none: open, dev only). Compares bytes in constant time."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()

    @property
    def enabled(self) -> bool:
        return bool(self._secret)

    def matches(self, given: str | bytes | None) -> bool:
        """True when no secret is configured, or ``given`` is it."""
        if not self._secret:
            return True
        if not given:
            return False
        raw = given.encode() if isinstance(given, str) else given
        return secrets.compare_digest(raw, self._secret)

    def from_metadata(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> str | bytes | None:
        for key, value in metadata or ():
            if key == METADATA_KEY:
                return value
        return None

    def check(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> tuple[grpc.StatusCode, str] | None:
        """None when the call may proceed, else the status and message to refuse it with."""
        if not self._secret:
            return None
        import grpc

        given = self.from_metadata(metadata)
        if not given:
            return grpc.StatusCode.UNAUTHENTICATED, f"this call needs the service credential ({METADATA_KEY})"
        if not self.matches(given):
            return grpc.StatusCode.PERMISSION_DENIED, "wrong service credential"
        return None


def from_settings(settings: Any) -> Credential:
    secret = getattr(settings, "admin_secret", None)
    value = secret.get_secret_value() if secret is not None else ""
    return Credential(value)


def is_loopback(address: str) -> bool:
    """``host:port`` binds only a loopback interface (an empty host or ``[::]``/``0.0.0.0`` binds all)."""
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(credential: Credential, address: str, service: str) -> None:
    """Refuse to serve privileged RPCs unauthenticated beyond loopback; announce it on loopback."""
    if credential.enabled:
        return
    if not is_loopback(address):
        raise PermissionError(
            f"{service}: refusing to listen on {address} without WOLFPACK_ADMIN_SECRET: privileged RPCs "
            "(weight pushes, policy loading, episode admin) would be open to the network. Set the secret "
            "(Helm: secrets.adminSecret), or bind 127.0.0.1 for a dev stack."
        )
    log.warning(
        "privileged RPCs are open: WOLFPACK_ADMIN_SECRET is unset (allowed on a loopback-only dev stack)",
        extra={"service": service, "address": address},
    )


def authorized(credential: Credential | None, context: Any) -> bool:
    """For handlers whose privilege depends on the request: does this call carry the credential?"""
    if credential is None or not credential.enabled:
        return True
    return credential.check(context.invocation_metadata()) is None


def client_interceptors(settings: Any) -> list[Any]:
    """Interceptors that attach the configured credential to privileged calls (none when unset).
    One class per call kind: a grpc.aio channel files an interceptor under its first kind only."""
    secret = getattr(settings, "admin_secret", None)
    value = secret.get_secret_value() if secret is not None else ""
    if not value:
        return []
    from wolfpack.auth_grpc import StreamUnaryCredential, UnaryCredential

    return [UnaryCredential(value), StreamUnaryCredential(value)]


def __getattr__(name: str) -> Any:
    if name == "CredentialInterceptor":
        from wolfpack.auth_grpc import CredentialInterceptor

        return CredentialInterceptor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
