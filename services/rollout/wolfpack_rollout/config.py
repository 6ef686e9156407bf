"""``RolloutConfig``: every knob of the self-play driver in one documented dataclass (CleanRL's ``Args``).

Why a dataclass and not settings: a trainer builds one per run (from its YAML config) and may hold several
(train vs eval sampling); ``from_mapping`` reads the same fields from a dict with unknown keys rejected.
The rules below are the *documented, counted* ones the rollout summary reports:

* **Over-long turn**: a response that hits ``sampling.max_tokens`` (finish reason LENGTH) is sent to the
  environment as is (the game parses what is there; an unparsable one is re-prompted, then defaulted) and
  counted as ``truncated_responses``. The reward spec may penalise it.
* **Context overflow** (``context_overflow``): the inference service compresses a chat prompt that does
  not fit the policy's budget (oldest history first); in the ``conversation`` prompt mode the driver
  applies the rule at ``max_prompt_tokens`` (the inference service never compresses a token prompt).
  ``"compress"`` accepts that and counts the turn as ``compressed_prompts``; ``"truncate"`` ends the
  episode at that turn instead (the trajectory is kept, marked ``metadata["truncated"] =
  "context_overflow"``, outcomes ABORTED). A prompt that cannot fit even compressed fails the episode
  with reason ``context_overflow``.
* **Turn cap** (``max_turns``): at most this many policy decisions per episode (re-prompts count). The
  decision past the cap is not generated: the episode is closed, kept as a truncated trajectory
  (``metadata["truncated"] = "turn_cap"``, outcomes ABORTED) and counted as ``truncated_episodes``.
* **Retries**: a generation or scoring call that fails with a transient status (UNAVAILABLE,
  DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED) is retried ``retries`` times with exponential backoff
  from ``backoff_s``; after that the episode fails with a reason (``inference_unavailable``, ...). A failed
  episode is counted by reason and never appended half-written.

The dataclass defaults suit a GPU policy or the tiny test model. ``cpu_profile`` gives the overrides for a
policy generated on the same few CPU cores as the services (``wolfpack rollout`` applies them to the flags
it is not given when the machine has at most ``CPU_PROFILE_MAX_CORES`` cores).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from wolfpack.v1 import common_pb2

PromptMode = Literal["full", "memory", "conversation"]
OverflowRule = Literal["compress", "truncate"]


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling of every policy turn (the trajectory records it per turn)."""

    max_tokens: int = 64
    """Maximum new tokens per turn; a longer answer is cut (finish reason LENGTH)."""
    temperature: float = 1.0
    """Sampling temperature; 1.0 for on-policy RL (logprobs are at this temperature)."""
    top_p: float = 1.0
    """Nucleus mass."""
    top_k: int = 0
    """Top-k cutoff; 0 disables it."""
    stop: tuple[str, ...] = ()
    """Stop strings."""

    def to_pb(self, seed: int | None = None) -> common_pb2.SamplingParams:
        params = common_pb2.SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            stop=list(self.stop), logprobs=True,
        )  # fmt: skip
        if seed is not None:
            params.seed = seed
        return params


@dataclass(frozen=True)
class RolloutConfig:
    """How the driver plays episodes. Defaults suit a CPU test stack; the trainer's YAML overrides them."""

    concurrency: int = 16
    """Episodes in flight at once over the PlaySeats stream."""
    prompt_mode: PromptMode = "full"
    """``full``: the environment's rendered observation (rules, role, whole visible history, instruction).
    ``memory``: step-independent prompts: the opening context, then only what happened since the seat's
    ``memory_steps``-th last decision, then the instruction (see ``prompts.render_messages``).
    ``conversation``: one growing chat per (episode, seat): the first decision sees the whole observation,
    each later one the previous prompt, the answer as sampled and a user message of what is new since the
    seat's previous observation, sent as token ids that extend the previous prompt + answer exactly (so the
    trainer's ``batch.layout: episode`` trains one sequence per seat-game, as verl's agent loop does).
    Needs the policy's tokenizer (``RolloutDriver``'s ``chat_codec``, which the trainer passes); a
    re-prompt or a timed-out answer stays in the conversation; see ``max_prompt_tokens`` for its budget."""
    memory_steps: int = 2
    """k of the ``memory`` prompt mode."""
    system_prompt: str = ""
    """Optional system message put before every prompt."""
    max_prompt_tokens: int = 0
    """Keep only the last N tokens of each templated prompt (0: all), sent as a token prompt: the latest part
    of the observation and the generation prompt. Needs the policy's tokenizer (``RolloutDriver``'s
    ``encode_prompt``, which the trainer passes), so the trainer's local and service modes see one prompt.
    In the ``conversation`` mode it is the conversation's budget instead (a crop would break the prefix the
    next turn extends): a seat's first prompt keeps its last N tokens, and a later prompt that would pass N
    is the context overflow of ``context_overflow`` (``compress``: the seat starts a new conversation from
    the ``memory``-mode view of the current observation, counted as ``compressed_prompts``; ``truncate``:
    the episode ends there). 0: no budget here (the inference service refuses a token prompt past the
    model's context; the episode fails)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling of policy turns."""
    max_turns: int = 64
    """Per-episode cap on policy decisions (re-prompts count); see the module docstring."""
    context_overflow: OverflowRule = "compress"
    """What a compressed (over-budget) prompt does: ``compress`` (accept, count) or ``truncate``."""
    retries: int = 3
    """Retries of a transient generation / scoring failure before the episode fails."""
    backoff_s: float = 0.2
    """First retry delay; doubles each retry."""
    generate_timeout_s: float = 300.0
    """Deadline of one GenerateBatch call."""
    reward_spec: str = ""
    """Reward spec for Score (``name`` or ``name@version``); empty: the game's default."""
    language: str = "en"
    """Prompt language pack for CreateEpisode."""
    turn_timeout_s: float = 0.0
    """Seconds a policy seat may stay silent before the environment defaults it; 0: server default."""
    worker_id: str = ""
    """This worker's id for the curriculum and logs; empty: hostname-pid."""
    backpressure_retry_s: float = 1.0
    """Pause after the stream refused an append for backpressure, before trying again (never dropped)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.prompt_mode not in ("full", "memory", "conversation"):
            raise ValueError(
                f"prompt_mode must be 'full', 'memory' or 'conversation', not {self.prompt_mode!r}"
            )
        if self.memory_steps < 1:
            raise ValueError("memory_steps must be >= 1")
        if self.max_prompt_tokens < 0:
            raise ValueError("max_prompt_tokens must be >= 0")
        if self.max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        if self.context_overflow not in ("compress", "truncate"):
            raise ValueError(
                f"context_overflow must be 'compress' or 'truncate', not {self.context_overflow!r}"
            )
        if self.sampling.max_tokens < 1:
            raise ValueError("sampling.max_tokens must be >= 1")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RolloutConfig:
        """Build from a dict (a YAML section); unknown keys are an error naming the valid ones."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown rollout option(s) {sorted(unknown)}; valid: {sorted(known)}")
        values = dict(data)
        if isinstance(values.get("sampling"), Mapping):
            sampling = dict(values["sampling"])
            if "stop" in sampling:
                sampling["stop"] = tuple(sampling["stop"])
            values["sampling"] = SamplingConfig(**sampling)
        return cls(**values)


CPU_PROFILE_MAX_CORES = 8
"""Machines with at most this many cores get ``cpu_profile`` from ``wolfpack rollout``."""


def cpu_profile(cpus: int) -> dict[str, Any]:
    """``RolloutConfig`` overrides for a policy generated on the same ``cpus`` CPU cores as the services.

    Why: with the dataclass defaults on two cores (16 episodes in flight, 64 tokens, the whole history in
    every prompt, SmolLM2-135M) one GenerateBatch of sixteen 400-700-token Werewolf prompts outlasted the
    environment's 120 s turn timeout: every policy move was defaulted while the model was still
    generating, no generation was recorded in 15 minutes, and Werewolf episodes whose trainee had only
    defaulted moves failed ``no_turns``. So: a few episodes in flight (enough to batch the decode steps),
    short answers (a move is a line; 32 tokens hold a sentence and a ``FINAL_BID``), the ``memory`` prompt
    (opening context plus the last steps, not the growing history), and a turn timeout and generate
    deadline long enough that a slow model is waited for instead of having its moves defaulted (a
    trajectory of defaulted moves teaches nothing) or its batch generated again from scratch."""
    return {
        "concurrency": max(2, min(cpus, 4)),
        "prompt_mode": "memory",
        "max_tokens": 32,
        "turn_timeout_s": 600.0,
        "generate_timeout_s": 600.0,
    }
