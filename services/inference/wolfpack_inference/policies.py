"""The policy registry: policy id → backend + versioned weights, and the request path that does not
depend on the backend (prompt templating, context budget, validation).

Versions: every policy has a monotonic version; ``load``/``push`` must name a larger one, checked under a
per-policy lock so two concurrent updates cannot both win. The backend binds each request to the weights
current at admission, so a response's version is the one that produced all its tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wolfpack_inference import adapters, prompts, token_cache
from wolfpack_inference.backends.base import Backend, ErrorCode, InferenceError, Request, Sampling
from wolfpack_inference.config import PolicyConfig

log = logging.getLogger(__name__)


def build_backend(cfg: PolicyConfig, cache_dir: Path) -> Backend:
    """Construct the backend named by ``cfg.backend`` through the ``backends.BACKENDS`` registry."""
    from wolfpack_inference.backends import build_backend as build

    return build(cfg, cache_dir)


FALLBACK_SUFFIX = "+tiny-fallback"
"""Appended to the id of a policy served by the tiny random model because its own model could not be
prepared (``fallback_to_tiny``): every response's ``PolicyRef`` and ListPolicies then say so."""


class PolicyLoadError(RuntimeError):
    """A configured policy's model could not be prepared (and no fallback was asked for)."""


def build_policy(cfg: PolicyConfig, cache_dir: Path) -> Policy:
    """The policy ``cfg`` describes, or an error naming it and why its model could not be prepared.

    Only with ``cfg.fallback_to_tiny`` does a failure serve the tiny random model instead, and then
    visibly: a WARNING log with the reason, the policy id ``<id>+tiny-fallback`` in every response and
    in ListPolicies (requests may still name ``<id>``), and ``Policy.fallback_reason`` set."""
    try:
        return Policy(cfg, build_backend(cfg, cache_dir))
    except Exception as exc:
        reason = f"policy {cfg.policy_id!r}: model {cfg.model!r} cannot be prepared: {exc}"
        if not cfg.fallback_to_tiny or cfg.model == "tiny" or cfg.backend == "openai":
            raise PolicyLoadError(reason) from exc
    log.warning(
        "serving the tiny random model instead (fallback_to_tiny is set)",
        extra={"policy_id": cfg.policy_id + FALLBACK_SUFFIX, "reason": reason},
    )
    tiny = cfg.model_copy(
        update=dict(policy_id=cfg.policy_id + FALLBACK_SUFFIX, model="tiny", fallback_to_tiny=False)
    )
    policy = Policy(tiny, build_backend(tiny, cache_dir))
    policy.fallback_reason = reason
    return policy


@dataclass
class Prepared:
    request: Request
    compressed: bool


class CompressionNeeded(Exception):
    """Raised by ``Policy.prepare(inline=True)`` when compressing the chat would tokenize more than
    ``INLINE_COMPRESS_CHARS``: compression may take up to ``prompts.MAX_RENDERS`` renders, so the caller
    moves the request off the event loop and prepares it again there."""


SEED_PART_CHARS = 512
"""The longest message of an over-budget chat is cached from the chat's render before the cut when it is
at least this long (``token_cache.PrefixTokenCache.remember_part``); a shorter one costs little to
tokenize whole."""

COUNT_MEMO_CHARS = 4096
"""Token counts of chats of at most this many characters (all contents) are remembered per policy
tokenizer (``COUNT_MEMO_ENTRIES`` of them, with the prompt token cache on; 0 turns it off). A token cut
renders its chat with the cut message reduced to the marker on every turn (``prompts._token_cut``): for
a game's prompts that is the same short chat (system message, marker) each time, ~0.1 ms of template
and tokenizing for a count that cannot change."""
COUNT_MEMO_ENTRIES = 256

INLINE_COMPRESS_CHARS = 16_384
"""Most characters an inline preparation (``prepare(inline=True)``, on the event loop) may render and
tokenize while compressing, about as much work as ``server.INLINE_COST`` allows a prompt that fits.

Why compress inline at all: a game transcript over the budget of a small model (the tiny model's 512
positions) is compressed on *every* turn. With a token cut that costs about four passes over the prompt
(the whole render, the message's two end windows, the cut render), ~1 ms for a 2k-character Werewolf
prompt. Sending each such prompt to a worker thread cost more than that: the inline attempt's render was
thrown away and done again in the thread, plus the hop there and back (in the CPU rollout bench the
prompts that went to the thread cost ~1.9 ms of CPU each, ~1.1 ms prepared inline). A compression that
outgrows the bound (long chats, the character search's many renders) still moves to the thread."""


class Policy:
    """A served policy: its config, its backend, and the prompt path in front of it."""

    def __init__(self, cfg: PolicyConfig, backend: Backend) -> None:
        self.cfg = cfg
        self.backend = backend
        self.lock = asyncio.Lock()
        self.fallback_reason = ""
        """Why this policy serves the tiny fallback model instead of its own (empty: it does not)."""
        self._token_cache: tuple[Any, token_cache.PrefixTokenCache | None] | None = None
        """(the tokenizer it belongs to, the cache or ``None`` when that tokenizer does not qualify)."""
        self._counts: dict[tuple[Any, ...], int] = {}
        """Token counts of short chats (``COUNT_MEMO_CHARS``) under the cache's tokenizer: emptied with
        the cache when the tokenizer changes."""

    @property
    def policy_id(self) -> str:
        return self.cfg.policy_id

    @property
    def version(self) -> int:
        return self.backend.version

    @property
    def context_budget(self) -> int:
        """Prompt + completion tokens allowed: the configured budget, capped by the model's positions."""
        limit = self.backend.max_positions
        if self.cfg.context_budget and limit:
            return min(self.cfg.context_budget, limit)
        return self.cfg.context_budget or limit

    def prepare(
        self,
        sampling: Sampling,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        token_ids: Sequence[int] | None = None,
        add_generation_prompt: bool | None = None,
        request_id: str = "",
        inline: bool = False,
    ) -> Prepared:
        """Validate and turn a prompt into a backend request, compressing chat prompts over budget.
        A ``token_ids`` list becomes the request's own (not copied: callers pass a fresh one).

        ``add_generation_prompt=None`` (the caller did not say): add the assistant prompt unless the last
        message is the assistant's, which the model then continues.

        ``inline=True`` (a caller on the event loop with a cheap prompt): compress only while that
        renders and tokenizes at most ``INLINE_COMPRESS_CHARS`` characters, else raise
        ``CompressionNeeded`` (the caller prepares the request again in a worker thread)."""
        tok = self.backend.tokenizer
        if messages is not None:
            if len(messages) > MAX_CHAT_MESSAGES:
                raise InferenceError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"chat.messages: at most {MAX_CHAT_MESSAGES} messages, got {len(messages)}",
                )
            if sum(len(m.get("content") or "") for m in messages) > MAX_PROMPT_CHARS:
                raise InferenceError(
                    ErrorCode.INVALID_ARGUMENT, f"chat.messages: at most {MAX_PROMPT_CHARS} characters in all"
                )
            msgs = [{k: v for k, v in m.items() if v or k == "content"} for m in messages]
            if not msgs or all(not m.get("content") for m in msgs):
                raise InferenceError(ErrorCode.INVALID_ARGUMENT, "prompt is empty")
            for m in msgs:
                if m.get("role") not in ("system", "user", "assistant"):
                    raise InferenceError(ErrorCode.INVALID_ARGUMENT, f"bad message role {m.get('role')!r}")
            if self.backend.chat_only:  # remote chat backend: it templates and truncates itself
                return Prepared(Request(sampling, [], msgs, request_id, self.cfg.strip_think), False)
            if tok is None:
                raise InferenceError(
                    ErrorCode.INVALID_ARGUMENT, f"policy {self.policy_id} has no tokenizer: send token ids"
                )
            add_gen = (
                msgs[-1]["role"] != "assistant" if add_generation_prompt is None else add_generation_prompt
            )
            ids, compressed = self._render(msgs, add_gen, sampling.max_tokens, inline)
            return Prepared(Request(sampling, ids, msgs, request_id, self.cfg.strip_think), compressed)
        if token_ids is not None and len(token_ids) > MAX_PROMPT_TOKENS:
            raise InferenceError(
                ErrorCode.INVALID_ARGUMENT, f"tokens.token_ids: at most {MAX_PROMPT_TOKENS} ids"
            )
        ids = token_ids if isinstance(token_ids, list) else list(token_ids or [])  # a list is taken as is
        if not ids:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "prompt is empty")
        if self.backend.chat_only:
            raise InferenceError(
                ErrorCode.INVALID_ARGUMENT, f"policy {self.policy_id} takes chat prompts, not token ids"
            )
        return Prepared(Request(sampling, ids, None, request_id, self.cfg.strip_think), False)

    def _render(
        self, msgs: list[dict[str, str]], add_gen: bool, max_tokens: int, inline: bool = False
    ) -> tuple[list[int], bool]:
        tok = self.backend.tokenizer
        budget = self.context_budget
        cache = self._cache(tok)
        encode = cache.encode if cache is not None else None
        if cache is not None:
            text = prompts.render_text(tok, msgs, add_gen)
            ids = cache.encode(text)
        else:
            ids = prompts.render_chat(tok, msgs, add_gen)
        if not budget or len(ids) + max_tokens <= budget or not self.cfg.compress:
            return ids, False  # the backend rejects what does not fit its positions
        room = budget - max_tokens
        if room <= 0:
            raise InferenceError(
                ErrorCode.INVALID_ARGUMENT,
                f"max_tokens ({max_tokens}) leaves no room for a prompt in the context budget ({budget})",
            )
        last: tuple[list[dict[str, str]], list[int]] = (msgs, ids)  # the latest render, reused at the end
        spent = sum(len(m.get("content") or "") for m in msgs)  # characters tokenized so far (inline bound)

        def spend(chars: int) -> None:
            nonlocal spent
            spent += chars
            if inline and spent > INLINE_COMPRESS_CHARS:
                raise CompressionNeeded

        counts = self._counts if cache is not None and COUNT_MEMO_CHARS else None

        def count(m: Sequence[dict[str, str]]) -> int:
            nonlocal last
            if list(m) == last[0]:
                return len(last[1])
            chars = sum(len(x.get("content") or "") for x in m)
            key = None
            if counts is not None and chars <= COUNT_MEMO_CHARS:
                key = (add_gen, *(tuple(x.items()) for x in m))
                known = counts.get(key)
                if known is not None:
                    return known
            spend(chars)
            last = (list(m), prompts.render_chat(tok, m, add_gen, encode))
            if key is not None and counts is not None:
                if len(counts) >= COUNT_MEMO_ENTRIES:
                    counts.clear()
                counts[key] = len(last[1])
            return len(last[1])

        codec = prompts.TextCodec.of(
            tok,
            encode,
            cache.encode_suffix if cache is not None else None,
            cache.known_head if cache is not None else None,
        )
        if inline:
            codec = codec.metered(spend)
        if inline and spent * 4 > INLINE_COMPRESS_CHARS:
            raise CompressionNeeded  # a token cut alone takes about four passes: not worth starting here
        if cache is not None:
            # the message a cut takes first (the longest), cached from this render's ids: its end windows
            # then tokenize a line or two instead of the whole message (``token_cache.remember_part``);
            # one message only, so a chat of many long ones costs one lookup, not one per message
            content = max((m.get("content") or "" for m in msgs), key=len)
            at = text.find(content) if len(content) >= SEED_PART_CHARS else -1
            if at >= 0:
                cache.remember_part(text, at, at + len(content))
        try:
            kept, _ = prompts.compress_messages(msgs, count, room, codec)
        except prompts.PromptTooLong as exc:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, str(exc)) from None
        return (last[1] if kept == last[0] else prompts.render_chat(tok, kept, add_gen, encode)), True

    def _encoder(self, tok: Any) -> Callable[..., list[int]] | None:
        """This policy's cached tokenizer (``token_cache.PrefixTokenCache.encode``), or ``None`` when the
        cache is off or the tokenizer does not qualify (see ``_cache``)."""
        cache = self._cache(tok)
        return cache.encode if cache is not None else None

    def _cache(self, tok: Any) -> token_cache.PrefixTokenCache | None:
        """This policy's prompt token cache for ``tok``, or ``None`` when the cache is off
        (``prompt_cache_tokens: 0``) or the tokenizer does not qualify. A new tokenizer object (new
        weights loaded with their own) gets a new, empty cache: ids never cross tokenizers."""
        if not self.cfg.prompt_cache_tokens:
            return None
        state = self._token_cache
        if state is None or state[0] is not tok:
            reason = token_cache.unsupported_reason(tok)
            cache = None
            if reason:
                log.info("prompt token cache off", extra={"policy_id": self.policy_id, "reason": reason})
            else:
                cache = token_cache.PrefixTokenCache(
                    tok, max_entries=self.cfg.prompt_cache_entries, max_tokens=self.cfg.prompt_cache_tokens
                )
            state = self._token_cache = (tok, cache)
            self._counts = {}
        return state[1]


@contextlib.contextmanager
def _load_errors(model_path: str, adapter_path: str) -> Iterator[None]:
    """A path that cannot be loaded is the caller's error (INVALID_ARGUMENT naming the path), not an
    UNKNOWN status carrying a loader's traceback text."""
    try:
        yield
    except InferenceError:
        raise
    except Exception as exc:
        log.warning("LoadPolicy failed", exc_info=True)
        what = " / ".join(p for p in (model_path, adapter_path) if p) or "the current model"
        raise InferenceError(
            ErrorCode.INVALID_ARGUMENT, f"cannot load {what}: {type(exc).__name__}"
        ) from None


MAX_CHAT_MESSAGES = 4096
MAX_PROMPT_CHARS = 1_000_000
MAX_PROMPT_TOKENS = 1 << 20
"""Bounds of one prompt (documented in the inference README): with ``prompts.MAX_RENDERS`` they bound
the work of preparing any request."""


class PolicyRegistry:
    """Policies by id. ``load`` creates a policy or moves it to new weights."""

    def __init__(self, cache_dir: Path, policies: Iterable[Policy] = (), unavailable: str = "") -> None:
        self.cache_dir = cache_dir
        self._policies: dict[str, Policy] = {p.policy_id: p for p in policies}
        self._create_lock = asyncio.Lock()
        self.unavailable = unavailable
        """Why the configured policies could not be served (the server then reports NOT_SERVING and
        answers every call UNAVAILABLE with this reason); empty when they are."""

    @classmethod
    def from_configs(cls, configs: Iterable[PolicyConfig], cache_dir: Path) -> PolicyRegistry:
        """Build every configured policy; raises ``PolicyLoadError`` when one cannot be prepared."""
        return cls(cache_dir, [build_policy(c, cache_dir) for c in configs])

    def add(self, policy: Policy) -> None:
        """Serve ``policy`` (replacing one with the same id)."""
        self._policies[policy.policy_id] = policy

    def get(self, policy_id: str) -> Policy:
        if not policy_id:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "policy_id is required")
        if self.unavailable:
            raise InferenceError(ErrorCode.UNAVAILABLE, self.unavailable)
        try:
            return self._policies.get(policy_id) or self._policies[policy_id + FALLBACK_SUFFIX]
        except KeyError:
            known = ", ".join(sorted(self._policies)) or "none"
            raise InferenceError(
                ErrorCode.NOT_FOUND, f"unknown policy {policy_id!r}; served: {known}"
            ) from None

    def list(self) -> list[Policy]:
        return [self._policies[k] for k in sorted(self._policies)]

    async def load(
        self, policy_id: str, version: int, model_path: str = "", adapter_path: str = ""
    ) -> Policy:
        """Create ``policy_id`` from ``model_path`` (like the first served policy) or move it to new
        weights as ``version``, which must exceed the current version."""
        if not policy_id:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "policy_id is required")
        async with self._create_lock:
            policy = self._policies.get(policy_id)
            if policy is None:
                if not model_path:
                    raise InferenceError(
                        ErrorCode.INVALID_ARGUMENT, f"new policy {policy_id!r} needs a model_path"
                    )
                template = next(iter(self._policies.values()), None)
                base = template.cfg if template is not None else PolicyConfig()
                cfg = base.model_copy(
                    update=dict(policy_id=policy_id, model=model_path, adapter=adapter_path, version=version)
                )
                if cfg.backend == "openai":
                    cfg = cfg.model_copy(update=dict(backend="transformers"))
                with _load_errors(model_path, adapter_path):
                    backend = await asyncio.to_thread(build_backend, cfg, self.cache_dir)
                policy = Policy(cfg, backend)
                self._policies[policy_id] = policy
                return policy
        async with policy.lock:
            self._check_version(policy, version)
            with _load_errors(model_path, adapter_path):
                await policy.backend.load(version, model_path, adapter_path)
        return policy

    async def push(
        self,
        policy_id: str,
        version: int,
        tensors: Mapping[str, Any],
        is_adapter: bool,
        adapter_config_json: str = "",
    ) -> Policy:
        """Move ``policy_id`` to pushed ``tensors`` as ``version``: full or partial weights, or a LoRA
        (``is_adapter``) described by its PEFT ``adapter_config_json``. Everything wrong with the request is
        reported before any weights change, so a refused push leaves the current version serving."""
        policy = self.get(policy_id)
        config = None
        if is_adapter:
            config = adapters.parse_config(adapter_config_json)
            adapters.check_tensors(config, tensors)
        elif adapter_config_json:
            raise InferenceError(
                ErrorCode.INVALID_ARGUMENT, "adapter_config_json is set but is_adapter is not"
            )
        async with policy.lock:
            self._check_version(policy, version)
            await policy.backend.update_weights(version, tensors, is_adapter, config)
        return policy

    @staticmethod
    def _check_version(policy: Policy, version: int) -> None:
        if version <= policy.version:
            raise InferenceError(
                ErrorCode.FAILED_PRECONDITION,
                f"policy {policy.policy_id}: version {version} must be greater than the current "
                f"{policy.version}",
            )

    async def close(self) -> None:
        for p in self._policies.values():
            await p.backend.close()


MAX_TENSOR_DIMS = 8
MAX_PUSH_BYTES = 64 << 30
"""Most bytes one PushWeights call may declare or send (all tensors together): a 30B-parameter model in
bf16 fits; a chunk cannot make the server reserve more than it will ever receive (see TensorAssembler)."""


class TensorAssembler:
    """Rebuilds tensors from PushWeights chunks (``name``, ``dtype``, ``shape``, ``data`` at ``offset``).

    Chunks of one tensor may arrive in any order; each tensor is complete when all its bytes arrived.
    Memory follows what was received, never what a chunk claims: chunks are kept as they come and each
    tensor's buffer is allocated only in ``tensors()``, once its bytes all arrived. (Allocating from the
    declared shape let a 40-byte chunk with ``shape=[2**29]`` make the server zero-fill 2 GiB.) Shapes
    are validated first: at most ``MAX_TENSOR_DIMS`` non-negative dimensions, and the declared and the
    received bytes of one call at most ``max_bytes``.
    """

    def __init__(self, max_bytes: int = MAX_PUSH_BYTES) -> None:
        self.max_bytes = max_bytes
        self._declared = 0
        self._received = 0
        # name -> (declared byte size, dtype, shape, [(offset, data)])
        self._parts: dict[str, tuple[int, str, tuple[int, ...], list[tuple[int, bytes]]]] = {}

    def add(self, name: str, dtype: str, shape: Sequence[int], data: bytes, offset: int) -> None:
        import torch

        def bad(msg: str) -> InferenceError:
            return InferenceError(ErrorCode.INVALID_ARGUMENT, msg)

        if not name:
            raise bad("chunk without a tensor name")
        entry = self._parts.get(name)
        if entry is None:
            if len(name) > 1024:
                raise bad("tensor names are at most 1024 characters")
            dt = getattr(torch, dtype, None) if dtype.isidentifier() else None
            if not isinstance(dt, torch.dtype):
                raise bad(f"{name}: unknown dtype {dtype!r}")
            dims = tuple(int(d) for d in shape)
            if len(dims) > MAX_TENSOR_DIMS or any(d < 0 for d in dims):
                raise bad(f"{name}: shape must have at most {MAX_TENSOR_DIMS} non-negative dimensions, got {list(dims)}")  # fmt: skip
            size = torch.empty((), dtype=dt).element_size()
            for d in dims:
                size *= d
                if size > self.max_bytes:
                    break
            if self._declared + size > self.max_bytes:
                raise bad(f"{name}: shape {list(dims)} exceeds the push limit of {self.max_bytes} bytes")
            self._declared += size
            entry = (size, dtype, dims, [])
            self._parts[name] = entry
        size, first_dtype, dims, parts = entry
        if dtype != first_dtype or tuple(shape) != dims:
            raise bad(f"{name}: every chunk of a tensor must repeat its dtype and shape")
        if offset < 0 or offset + len(data) > size:
            raise bad(f"{name}: chunk beyond the tensor's bytes")
        self._received += len(data)
        if self._received > self.max_bytes:
            raise bad(f"the push sent more than {self.max_bytes} bytes")
        parts.append((offset, bytes(data)))

    def tensors(self) -> dict[str, Any]:
        import torch

        out = {}
        for name, (size, dtype, shape, parts) in self._parts.items():
            covered, end = 0, 0
            for a, data in sorted(parts, key=lambda p: p[0]):
                b = a + len(data)
                covered += max(0, b - max(a, end))
                end = max(end, b)
            if covered != size:
                raise InferenceError(ErrorCode.INVALID_ARGUMENT, f"{name}: got {covered} of {size} bytes")
            buf = bytearray(size)  # every byte of it was received: the size is real now
            for a, data in parts:
                buf[a : a + len(data)] = data
            parts.clear()
            dt = getattr(torch, dtype)
            flat = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
            out[name] = flat.reshape(shape).clone()
        return out


MAX_N = 64
MIN_TEMPERATURE = 1e-2
"""Smallest sampling temperature above 0: below it logits / temperature overflow to inf and the softmax
to NaN, which fails the whole engine batch (every caller's request in it). 0 means greedy."""
MAX_TEMPERATURE = 100.0
MAX_TOKENS = 1 << 20
MAX_TOP_K = 1 << 20
MAX_STOPS = 16
MAX_STOP_CHARS = 256
MAX_SEED = 2**63 - 1 - MAX_N  # row i of a request samples with seed + i (a torch seed: 64 bits)


def make_sampling(
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    stop: Sequence[str],
    seed: int | None,
    n: int,
    logprobs: bool,
) -> Sampling:
    """Validated ``Sampling`` from wire values (proto defaults: ``top_p == 0`` and ``n == 0`` mean 1)."""

    def bad(msg: str) -> InferenceError:
        return InferenceError(ErrorCode.INVALID_ARGUMENT, msg)

    if not 0 < max_tokens <= MAX_TOKENS:
        raise bad(f"sampling.max_tokens must be in [1, {MAX_TOKENS}], got {max_tokens}")
    # ``not a <= x`` forms also reject NaN
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
        raise bad(
            f"sampling.temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], "
            f"got {temperature}"
        )
    if not 0 <= top_p <= 1:
        raise bad(f"sampling.top_p must be in [0, 1], got {top_p}")
    if not 0 <= top_k <= MAX_TOP_K:
        raise bad(f"sampling.top_k must be in [0, {MAX_TOP_K}], got {top_k}")
    if not 0 <= n <= MAX_N:
        raise bad(f"sampling.n must be in [0, {MAX_N}], got {n}")
    if len(stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise bad(f"sampling.stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise bad(f"sampling.seed must be in [0, {MAX_SEED}], got {seed}")
    return Sampling(
        max_tokens=max_tokens,
        temperature=float(temperature),
        top_p=float(top_p) or 1.0,
        top_k=top_k,
        stop=tuple(s for s in stop if s),
        seed=seed,
        n=n or 1,
        logprobs=logprobs,
    )
