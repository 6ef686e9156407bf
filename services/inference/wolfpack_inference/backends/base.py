"""The contract every backend implements, and the value types that cross it.

A backend serves one policy's weights and knows its current *version*. Each request is bound to the
weights that admitted it, and its result names that version, so a policy update never changes the
weights under a request in flight (see ``Backend.load``).

Logprob convention (stated in ``trajectory.proto`` at ``Turn.response_logprobs``): a reported logprob is
``log_softmax(logits / T)`` at the sampled token, T the request's temperature (1 for greedy), before
top-k/top-p truncation: what a learner recomputes with one teacher-forced forward pass at the same
temperature. A backend that cannot report exactly that for some sampling settings rejects the request
(INVALID_ARGUMENT) rather than report another quantity under the same name.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from wolfpack.errors import ServiceError

if TYPE_CHECKING:
    from wolfpack_inference.config import PolicyConfig


class ErrorCode(enum.Enum):
    """Error kinds, named after the gRPC status codes they map to."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"
    UNIMPLEMENTED = "UNIMPLEMENTED"


class InferenceError(ServiceError):
    """An error the caller can act on; ``code`` (the service's vocabulary, also used by the HTTP front)
    names the gRPC status it becomes."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message, grpc.StatusCode[code.value])
        self.code = code


class Finish(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


@dataclass(frozen=True)
class Sampling:
    """Validated sampling controls. ``temperature == 0`` is greedy; ``top_p == 1`` and ``top_k == 0``
    disable those filters; ``seed`` makes sampling reproducible whatever else shares the batch."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    logprobs: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Request:
    """One prompt to complete. ``prompt_ids`` for token backends; ``messages`` for remote chat backends
    (which render the template themselves). ``strip_think`` only changes the returned text."""

    sampling: Sampling
    prompt_ids: list[int] = field(default_factory=list)
    messages: list[dict[str, str]] | None = None
    request_id: str = ""
    strip_think: bool = False


@dataclass
class Completion:
    """One sampled completion; ``logprobs`` (when requested) follow the logprob convention above."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish: Finish


@dataclass
class Result:
    completions: list[Completion]
    version: int
    prompt_ids: list[int]
    prompt_tokens: int


@dataclass
class StreamChunk:
    """New tokens of a streamed completion. ``version`` is set on every chunk; ``finish`` on the last."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    version: int
    finish: Finish | None = None


class Backend(abc.ABC):
    """One policy's engine. Subclasses set ``name``, ``version``, ``model`` and ``max_positions``."""

    name: str = "base"
    version: int = 0
    model: str = ""
    adapter: str = ""
    max_positions: int = 0
    chat_only: bool = False
    """True for remote chat endpoints: they take messages, template them themselves, return no ids."""

    @classmethod
    def from_config(cls, cfg: PolicyConfig, cache_dir: Path) -> Backend:
        """The one constructor every registered backend offers (``backends.BACKENDS``): a policy's
        config, and the directory where model files are prepared."""
        raise NotImplementedError(f"{cls.__name__} is not constructible from a PolicyConfig")

    @property
    def tokenizer(self) -> Any | None:
        """The tokenizer prompts are rendered with; None for backends that take chat messages."""
        return None

    @abc.abstractmethod
    async def generate(self, request: Request) -> Result:
        """Complete ``request`` (``n`` completions) on the weights current at admission."""

    @abc.abstractmethod
    def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Complete ``request`` (``n == 1``), yielding chunks as tokens are produced."""

    async def load(self, version: int, model_path: str = "", adapter_path: str = "") -> None:
        """Switch to new weights as ``version``: a full checkpoint (``model_path``) or a LoRA adapter on the
        current base (``adapter_path``). Requests admitted before the switch finish on the old weights."""
        raise InferenceError(ErrorCode.UNIMPLEMENTED, f"backend {self.name} cannot load weights")

    async def update_weights(
        self,
        version: int,
        tensors: Mapping[str, Any],
        is_adapter: bool,
        adapter_config: Mapping[str, Any] | None = None,
    ) -> None:
        """Switch to ``tensors`` as ``version``: a full or partial state dict, or (``is_adapter``) a LoRA's
        PEFT state dict with its config (already checked by ``adapters.parse_config``/``check_tensors``),
        applied to the current base like ``load(adapter_path=...)``."""
        raise InferenceError(ErrorCode.UNIMPLEMENTED, f"backend {self.name} cannot take pushed weights")

    async def close(self) -> None:  # noqa: B027  # optional hook: most backends hold nothing to release
        """Release engine resources."""


def check_prompt_length(prompt_len: int, max_tokens: int, max_positions: int) -> None:
    """Reject prompts that cannot be completed within the model's positions (shared by token backends)."""
    if prompt_len == 0:
        raise InferenceError(ErrorCode.INVALID_ARGUMENT, "prompt is empty")
    if max_positions and prompt_len + max_tokens > max_positions:
        raise InferenceError(
            ErrorCode.INVALID_ARGUMENT,
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the model's "
            f"{max_positions} positions",
        )


def validate_tokens(ids: Sequence[int], vocab: int) -> None:
    bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
    if bad:
        raise InferenceError(ErrorCode.INVALID_ARGUMENT, f"token ids out of range [0, {vocab}): {bad[:5]}")
