"""The one error type of Wolfpack services and its mapping to gRPC status.

A handler (or the pure code under it) raises ``ServiceError`` with the gRPC status code the caller should
see; ``rpc.ErrorInterceptor`` turns it into that status for a whole call, and ``to_status`` turns it into
a ``google.rpc.Status`` for one item of a batched call (a PlaySeats act or create, a GenerateBatch item),
so a bad item and a bad call read the same: a code and a message, never a status name inside a string.
Each service keeps its own subclasses (``SessionError``, ``InferenceError``, ``ScoreError``) for its
vocabulary; nothing else needs to know them.
"""

from __future__ import annotations

import grpc
from google.rpc import status_pb2


class ServiceError(Exception):
    """An error the caller can act on. ``code`` is the gRPC status it becomes; subclasses set a class
    default, a raise site may pass another."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


def status_code(exc: BaseException) -> grpc.StatusCode:
    """The status code ``exc`` maps to: its own for a ``ServiceError``, INTERNAL for anything else
    (a bug: the caller cannot fix it by changing the request)."""
    return exc.code if isinstance(exc, ServiceError) else grpc.StatusCode.INTERNAL


def to_status(exc: BaseException) -> status_pb2.Status:
    """``exc`` as a ``google.rpc.Status`` (numeric code of the gRPC status, the message)."""
    message = str(exc) if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"
    return make_status(status_code(exc), message)


def make_status(code: grpc.StatusCode, message: str) -> status_pb2.Status:
    """A ``google.rpc.Status`` with gRPC's number for ``code``."""
    return status_pb2.Status(code=code.value[0], message=message)


_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def code_of(status: status_pb2.Status) -> grpc.StatusCode:
    """The gRPC status code of a ``google.rpc.Status`` (UNKNOWN for a number gRPC does not define)."""
    return _BY_NUMBER.get(status.code, grpc.StatusCode.UNKNOWN)
