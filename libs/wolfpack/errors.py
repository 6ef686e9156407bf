"""The one error type of Wolfpack services and its mapping to gRPC status.

A handler (or the pure code under it) raises a ``ServiceError`` that knows the gRPC status the caller
should see (``status``). ``rpc.ErrorInterceptor``, installed on every server by ``rpc.start_server``,
turns it into that status for a whole call, so no servicer writes ``try/except/abort``; ``to_status``
turns it into a ``google.rpc.Status`` for one item of a batched call (a PlaySeats act or create, a
GenerateBatch item), so a bad item and a bad call read the same: a code and a message, never a status
name inside a string. Anything else a handler raises is a bug: logged with its traceback, answered
INTERNAL without internals.

Each service keeps its own subclasses for its vocabulary (``SessionError``, ``InferenceError``,
``ScoreError``); a subclass sets ``status``, or names it as a string class attribute ``code`` (e.g.
``code = "NOT_FOUND"``), checked when the class is defined.

gRPC itself is imported only where a status is read: code that runs in no service (the trainer's local
mode, whose libraries define these errors) loads none of it. A ``code`` name becomes gRPC's
``StatusCode`` member on first read of ``status``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from google.rpc import status_pb2

if TYPE_CHECKING:
    import grpc

CODE_NAMES = frozenset(
    {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
        "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
    }
)  # fmt: skip
"""The names of gRPC's status codes (those of ``grpc.StatusCode``, fixed by the gRPC spec)."""


class _NamedStatus:
    """A class's ``status`` given by name: ``grpc.StatusCode[name]``, gRPC imported on first read. Not a
    data descriptor, so an instance's own ``status`` (``ServiceError(msg, status)``) wins."""

    def __init__(self, name: str) -> None:
        if name not in CODE_NAMES:
            raise ValueError(f"{name!r} is not a gRPC status code name")
        self.name = name

    def __get__(self, obj: object, cls: type | None = None) -> grpc.StatusCode:
        import grpc

        return grpc.StatusCode[self.name]


class ServiceError(Exception):
    """An error the caller can act on; ``status`` is the gRPC status code it becomes."""

    if TYPE_CHECKING:
        status: grpc.StatusCode
    else:
        status = _NamedStatus("INTERNAL")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code")
        if isinstance(code, str):
            cls.status = _NamedStatus(code)  # type: ignore[assignment]  # over a parent's own ``status``

    def __init__(self, message: str, status: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


def status_code(exc: BaseException) -> grpc.StatusCode:
    """The status code ``exc`` maps to: its own for a ``ServiceError``, INTERNAL for anything else
    (a bug: the caller cannot fix it by changing the request)."""
    if isinstance(exc, ServiceError):
        return exc.status
    import grpc

    return grpc.StatusCode.INTERNAL


MAX_MESSAGE_CHARS = 512
"""Longest message sent to a caller. Why a cap: a message may quote the caller's own input (a bad option
value, an unparsable action), and gRPC carries it percent-encoded in a trailer; a message over the
client's metadata limit (8 KiB by default) turns the call into RESOURCE_EXHAUSTED, which reads as
retryable, instead of the real status. 512 characters stay under it even as 4-byte UTF-8, encoded."""


def public_message(exc: BaseException) -> str:
    """What the caller is told: a ``ServiceError``'s message (cut to ``MAX_MESSAGE_CHARS``); for anything
    else only that it was an internal error (the traceback goes to the server log, not over the wire)."""
    if not isinstance(exc, ServiceError):
        return f"internal error ({type(exc).__name__}); see the server log"
    return clip(str(exc))


def clip(message: str) -> str:
    """``message`` cut to ``MAX_MESSAGE_CHARS``, saying how long it was (for every status sent)."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    note = f"... [cut: {len(message)} characters]"
    return message[: MAX_MESSAGE_CHARS - len(note)] + note


def make_status(code: grpc.StatusCode, message: str) -> status_pb2.Status:
    """A ``google.rpc.Status`` with gRPC's number for ``code``."""
    return status_pb2.Status(code=code.value[0], message=message)


def to_status(exc: BaseException) -> status_pb2.Status:
    """``exc`` as a ``google.rpc.Status``: the code ``status_code`` gives, the ``public_message``."""
    return make_status(status_code(exc), public_message(exc))


@functools.cache
def _by_number() -> dict[int, grpc.StatusCode]:
    import grpc

    return {c.value[0]: c for c in grpc.StatusCode}


def code_of(status: status_pb2.Status) -> grpc.StatusCode:
    """The gRPC status code of a ``google.rpc.Status`` (UNKNOWN for a number gRPC does not define)."""
    codes = _by_number()
    return codes.get(status.code, codes[2])  # 2: UNKNOWN
