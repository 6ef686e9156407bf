"""The service credential's gRPC side (``wolfpack.auth``): the server interceptor that refuses privileged
methods without it, and the client interceptors that attach it. A module of its own so that
``wolfpack.auth`` loads no gRPC; ``auth.client_interceptors`` and ``auth.CredentialInterceptor`` lead here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from wolfpack.auth import CLIENT_METHODS, METADATA_KEY, PRIVILEGED_METHODS, Credential


class CredentialInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses ``methods`` without the credential, before the handler (or a streamed request) is read."""

    def __init__(self, credential: Credential, methods: frozenset[str] = PRIVILEGED_METHODS) -> None:
        self.credential = credential
        self.methods = methods

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = details.method  # type: ignore[attr-defined]
        if method not in self.methods or not self.credential.enabled:
            return await continuation(details)
        refusal = self.credential.check(details.invocation_metadata)  # type: ignore[attr-defined]
        if refusal is None:
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:
            return None
        code, message = refusal

        async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(code, message)

        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny, **kwargs)  # type: ignore[arg-type]
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny, **kwargs)  # type: ignore[arg-type]
        return grpc.unary_unary_rpc_method_handler(deny, **kwargs)


def _with_credential(details: Any, secret: str) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add(METADATA_KEY, secret)
    return grpc.aio.ClientCallDetails(
        method=details.method,
        timeout=details.timeout,
        metadata=metadata,
        credentials=details.credentials,
        wait_for_ready=details.wait_for_ready,
    )


def _method_name(details: Any) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


class UnaryCredential(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, secret: str) -> None:
        self.secret = secret

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if _method_name(details) in CLIENT_METHODS:
            details = _with_credential(details, self.secret)
        return await continuation(details, request)


class StreamUnaryCredential(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, secret: str) -> None:
        self.secret = secret

    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        if _method_name(details) in CLIENT_METHODS:
            details = _with_credential(details, self.secret)
        return await continuation(details, request_iterator)
