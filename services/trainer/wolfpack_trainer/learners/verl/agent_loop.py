"""A verl agent loop that plays Wolfpack games through the rollout driver (the AgentLoop plug-in).

Why: people who run stock verl PPO/GRPO (``python -m verl.trainer.main_ppo``) can train on our games
without the rest of Wolfpack. verl asks the loop for one trajectory per dataset row; the loop plays it
through the one episode player every other producer uses, ``wolfpack_rollout``'s ``RolloutDriver``
(create → decisions → generate → act → close → build ``Trajectory`` → score), over three backends:

* environment: the environment service over gRPC (``EnvironmentClient``, the driver's PlaySeats stream),
  wrapped by ``AutopilotEnvironment``: it feeds each decision's observation into the seat's chat and,
  once the response budget is spent, answers the decision itself with the first legal action
  ("autopilot") so the game still reaches an outcome; those turns carry no tokens and are no policy turns;
* inference: ``VerlInference``, the driver's ``Inference`` over verl's server handle
  (``LLMServerClient.generate``: token ids in, token ids and logprobs out); the prompt is the seat's whole
  conversation so far as one continuous token stream (verl's ``ct_*`` builders), never re-tokenised;
* reward: ``LibraryReward``, the reward specs of ``wolfpack_rewards`` in process, off the event loop (the
  same code and numbers as the reward service's ``Score``, without a service to run).

The ``AgentLoopOutput`` is read off the scored ``Trajectory`` (``agent_output_tokens``): its first turn's
prompt is verl's prompt; the response is the rest of the conversation, mask 1 on the policy's tokens
(with their logprobs) and 0 on the observation and chat-template tokens between them.

Whatever the model answers (empty, blank, binary) is sent as its move: the environment's game judges it
(an invalid move is re-prompted, then defaulted, and the reward spec's penalty applies), so no answer
loses the episode.

Register it with an agent-loop config file (``agent_loops.yaml`` beside this module)::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=<path>/agent_loops.yaml
    actor_rollout_ref.rollout.agent.default_agent_loop=wolfpack

Each dataset row says which game to play in ``extra_info["wolfpack"]`` (or a top-level ``wolfpack``
column): ``game_id``, ``variant``, ``seed``, ``seat``, ``default_bot``, ``bots``, ``reward_spec``, ...
(``EpisodeSpec``). Rows with the same seed are the same game, so GRPO's n samples of one row compare
answers in one game. ``python -m wolfpack_trainer.learners.verl.agent_loop --help`` writes such a dataset.

The environment service's address comes from the agent-loop config key ``environment`` or from
``WOLFPACK_ENVIRONMENT_ADDR`` (the Ray workers inherit the driver's environment).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

import wolfpack_rewards
from wolfpack.settings import Settings, load_settings
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import curriculum_service_pb2 as cur_pb
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import reward_service_pb2 as rew_pb
from wolfpack_environment.client import EnvironmentClient
from wolfpack_games import get_game, make_game
from wolfpack_games.scenarios import GAME_CLASSES as SCENARIO_GAMES
from wolfpack_rollout.client import (
    BatchItem,
    EpisodeStream,
    RolloutConfig,
    RolloutDriver,
    SamplingConfig,
    new_lines,
)
from wolfpack_trainer.skips import skipped_kinds

log = logging.getLogger(__name__)

AGENT_NAME = "wolfpack"
CONFIG_PATH = Path(__file__).with_name("agent_loops.yaml")
"""The agent-loop config file that registers this loop under ``AGENT_NAME``."""
POLICY_ID = "verl"
"""The policy id of the seat verl plays (its ``Trajectory`` turns and ``policy_versions`` name it)."""
MAX_DECISIONS = 1_000_000
"""The driver's per-episode decision cap: never reached here; the response budget and
``max_policy_turns`` put the seat on autopilot instead, so the game always ends with an outcome."""


@dataclass(frozen=True)
class EpisodeSpec:
    """Which game one dataset row plays, and how.

    ``seat`` is the seat the policy plays; every other seat is a scripted bot (``bots`` by seat, else
    ``default_bot``). ``observation`` "delta" sends only what is new since the seat's previous
    observation (the text view of a game grows append-only, so the full text each turn would grow the
    context quadratically); "full" sends the whole text every turn. ``max_turn_tokens`` caps one
    answer. ``reward_spec`` empty means the game's default spec.
    """

    game_id: str = "werewolf_v1"
    variant: str = ""
    seed: int = 0
    seat: int = 0
    default_bot: str = "heuristic"
    bots: Mapping[int, str] = field(default_factory=dict)
    options: Mapping[str, str] = field(default_factory=dict)
    scenario_id: str = ""
    language: str = "en"
    reward_spec: str = ""
    observation: str = "delta"
    max_turn_tokens: int = 256
    turn_timeout_s: float = 0.0
    skip_actions: tuple[str, ...] = ()
    """As ``batch.skip_actions`` (``kind`` or ``role:kind``): the seat's valid answers of those kinds stay in its
    conversation with mask 0 (no loss, and verl's GAE passes over them as it does observations); the seat's
    reward is unchanged."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> EpisodeSpec:
        """Build from a dataset row's dict (unknown keys are an error: a typo must not pass silently)."""
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            raise ValueError(f"unknown wolfpack episode keys {sorted(extra)}; known: {sorted(known)}")
        kw: dict[str, Any] = {k: v for k, v in data.items() if v is not None}
        if "bots" in kw:
            kw["bots"] = {int(s): str(b) for s, b in dict(kw["bots"]).items()}
        if "options" in kw:
            kw["options"] = {str(k): str(v) for k, v in dict(kw["options"]).items()}
        if "skip_actions" in kw:
            kw["skip_actions"] = tuple(str(a) for a in kw["skip_actions"])
        for key in ("seed", "seat", "max_turn_tokens"):
            if key in kw:
                kw[key] = int(kw[key])
        spec = cls(**kw)
        if spec.game_id in SCENARIO_GAMES:
            raise ValueError(
                f"{spec.game_id}: the agent loop plays Werewolf only for now; scenario games (scored from the "
                "whole transcript, which the driver builds) are not checked through this loop yet"
            )
        if spec.observation not in ("delta", "full"):
            raise ValueError(f"observation must be 'delta' or 'full', not {spec.observation!r}")
        if spec.max_turn_tokens < 1:
            raise ValueError("max_turn_tokens must be at least 1")
        return spec

    @classmethod
    def from_sample(cls, sample: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> EpisodeSpec:
        """The spec of a verl sample (its dataset row's non-tensor fields): ``extra_info["wolfpack"]`` or a
        top-level ``wolfpack`` column, over ``defaults`` (the agent-loop config's ``episode`` key)."""
        row: Any = sample.get("wolfpack")
        if row is None:
            extra = sample.get("extra_info")
            row = extra.get("wolfpack") if isinstance(extra, Mapping) else None
        if isinstance(row, str):
            row = json.loads(row)
        merged = {**dict(defaults or {}), **dict(row or {})}
        return cls.from_mapping(merged)


def autopilot_action(obs: env_pb.Observation) -> common_pb2.Action:
    """The first legal action, with its first target; used once the response budget is spent."""
    if not obs.legal_actions:
        return common_pb2.Action(kind="pass")
    legal = obs.legal_actions[0]
    action = common_pb2.Action(kind=legal.kind)
    if legal.targets:
        action.target = legal.targets[0]
    if legal.needs_text:
        action.text = "..."
    return action


_CLIENTS: dict[str, tuple[asyncio.AbstractEventLoop, EnvironmentClient]] = {}


def _client(environment: str, settings: Settings) -> EnvironmentClient:
    """One environment client per address, reused by every sample of a worker (verl builds a loop object
    per sample). gRPC channels are bound to the event loop they were made on, so a different running loop
    gets a new one."""
    loop = asyncio.get_running_loop()
    found = _CLIENTS.get(environment)
    if found is None or found[0] is not loop:
        found = (loop, EnvironmentClient(environment, settings))
        _CLIENTS[environment] = found
    return found[1]


async def close_channels() -> None:
    """Close the cached clients made on the running loop (tests, and workers that shut down cleanly)."""
    loop = asyncio.get_running_loop()
    for key, (owner, client) in list(_CLIENTS.items()):
        if owner is loop:
            del _CLIENTS[key]
            await client.close()


class SeatChat:
    """The policy seat's conversation as verl trains on it: one continuous token stream (the prompt, then
    answers and the observations between them) with its response mask and logprobs, kept within the
    response budget (``rollout.response_length``). ``AutopilotEnvironment`` adds each decision's
    observation; ``VerlInference`` adds the answer. Once an observation or an answer fills the budget, or
    ``max_policy_turns`` answers were given, the seat is on autopilot for the rest of the game.
    Tokenisation is verl's continuous-token builder (``ct_*``): the ids trained on are the ids sampled,
    and the chat-template boundaries are verl's."""

    def __init__(
        self, loop: WolfpackAgentLoop, spec: EpisodeSpec, system: list[dict[str, Any]], max_policy_turns: int
    ) -> None:
        self.loop = loop
        self.spec = spec
        self.messages: list[dict[str, Any]] = system
        self.token_ids: list[int] = []  # prompt + response so far (verl's "runtime" token stream)
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.budget = int(loop.rollout_config.response_length)
        self.max_policy_turns = max_policy_turns
        self.answers = 0
        self.autopilot_turns = 0
        self.last_text = ""
        self.exhausted = False
        self.ready = False  # an observation is in and waits for its answer
        self.episode_id = ""
        self.final: env_pb.Observation | None = None  # the seat's last observation of the ended game

    @property
    def remaining(self) -> int:
        return self.budget - len(self.response_mask)

    async def observe(self, obs: env_pb.Observation) -> bool:
        """Add the decision's observation as a user message (only its new part, for ``observation:
        delta``); False when the seat is on autopilot (from now on) and the decision is not the policy's."""
        if self.exhausted or (self.max_policy_turns and self.answers >= self.max_policy_turns):
            return False
        full = obs.text
        first = not self.token_ids
        text = full if self.spec.observation == "full" or first else new_lines(self.last_text, full)
        if first:
            await self.first_prompt(text)
        elif not await self._add_user(text):
            self.exhausted = True
            return False
        self.last_text = full
        if self.remaining < 1:
            self.exhausted = True
            return False
        self.ready = True
        return True

    async def first_prompt(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        self.token_ids = list(await self.loop.ct_build_initial_tokens(self.messages))

    async def _add_user(self, text: str) -> bool:
        """Append a user message; False (nothing changed) when it would not fit the response budget."""
        previous = list(self.messages)
        updated = [*previous, {"role": "user", "content": text}]
        merged, mask, logprobs = await self.loop.ct_merge_context_msg(
            previous, updated, self.token_ids, self.response_mask,
            self.response_logprobs if self.response_logprobs else None,
        )  # fmt: skip
        if len(mask) >= self.budget:
            return False
        self.messages = updated
        self.token_ids = list(merged.token_ids)
        self.response_mask = list(mask)
        if logprobs:
            self.response_logprobs = list(logprobs)
        return True

    async def add_answer(self, generated: list[int], logprobs: list[float] | None) -> str:
        """Append the policy's tokens (mask 1); returns their text, the move sent to the game."""
        merged, mask, all_logprobs = await self.loop.ct_merge_assistant_token(
            self.token_ids, generated, self.response_mask,
            self.response_logprobs if (self.response_logprobs or logprobs) else None,
            assistant_logprobs=logprobs,
        )  # fmt: skip
        self.token_ids = list(merged.token_ids)
        self.response_mask = list(mask)
        if all_logprobs is not None:
            self.response_logprobs = list(all_logprobs)
        tokenizer: Any = self.loop.tokenizer
        reply: str = tokenizer.decode(generated, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": reply})
        self.answers += 1
        self.ready = False
        if self.remaining < 1:
            self.exhausted = True
        return reply

    async def never_acted(self) -> None:
        """The sample of a seat that never got a turn (e.g. killed on the first night): its final
        observation as the prompt and one end-of-sequence token, masked out, so verl still gets a row."""
        if self.final is None:
            raise RuntimeError(
                f"episode {self.episode_id}: the seat never acted and no final observation came"
            )
        await self.first_prompt(self.final.text)
        tokenizer: Any = self.loop.tokenizer
        eos = tokenizer.eos_token_id
        self.token_ids.append(int(eos if eos is not None else 0))
        self.response_mask.append(0)


class AutopilotEnvironment:
    """The driver's ``Environment``: the environment service (``EnvironmentClient``) with the seat's chat
    in front of the policy. Each decision's observation goes into the chat (``SeatChat.observe``); a
    decision the chat declines (budget spent, or ``max_policy_turns`` reached) is answered here with the
    first legal action and never reaches the driver, so it is no policy turn and costs no tokens. The
    seat's final observation is kept for a seat that never got to act."""

    def __init__(self, client: EnvironmentClient, chat: SeatChat) -> None:
        self.client = client
        self.chat = chat

    def play_stream(
        self, *, include_text: bool = True, close_finished: bool = False, rejected_results_only: bool = False
    ) -> _AutopilotStream:
        inner = self.client.play_stream(
            include_text=include_text,
            close_finished=close_finished,
            rejected_results_only=rejected_results_only,
        )
        return _AutopilotStream(inner, self.chat)

    async def get_episode(self, episode_id: str, token: str) -> env_pb.GetEpisodeResponse:
        return await self.client.get_episode(episode_id, token)

    async def close_episode(self, episode_id: str, admin_token: str) -> bool:
        return await self.client.close_episode(episode_id, admin_token)


class _AutopilotStream:
    """One PlaySeats call through ``AutopilotEnvironment`` (see there)."""

    def __init__(self, inner: EpisodeStream, chat: SeatChat) -> None:
        self.inner = inner
        self.chat = chat
        self.tokens: dict[tuple[str, int], str] = {}

    def create(self, req: env_pb.CreateEpisodeRequest) -> None:
        self.inner.create(req)

    def act(self, episode_id: str, token: str, turn_id: int, decision: str | common_pb2.Action) -> None:
        self.inner.act(episode_id, token, turn_id, decision)

    async def close(self) -> None:
        await self.inner.close()

    async def read(self) -> env_pb.PlaySeatsResponse:
        while True:
            message = await self.inner.read()
            for created in message.created:
                episode = created.episode
                self.chat.episode_id = self.chat.episode_id or episode.episode_id
                for t in episode.seat_tokens:
                    self.tokens[(episode.episode_id, t.seat)] = t.token
            kept: list[env_pb.Observation] = []
            for obs in message.decisions:
                if obs.done:
                    self.chat.final = obs
                elif obs.your_turn and obs.turn_id and not await self.chat.observe(obs):
                    self.chat.autopilot_turns += 1
                    token = self.tokens[(obs.episode_id, obs.seat)]
                    self.inner.act(obs.episode_id, token, obs.turn_id, autopilot_action(obs))
                    continue
                kept.append(obs)
            if len(kept) == len(message.decisions):
                return message
            del message.decisions[:]
            message.decisions.extend(kept)
            if message.created or message.results or message.decisions:
                return message


class VerlInference:
    """The driver's ``Inference`` over verl's server handle (``LLMServerClient.generate``: token ids in,
    token ids and logprobs out) for one seat's chat: the prompt is the chat's token stream (the request's
    own rendering of the observation is not used: ``AutopilotEnvironment`` already put the observation in
    the chat), the answer is merged into the chat and returned as a ``GenerateResponse`` whose ids and
    logprobs are the sampled ones. One sticky request id per game: every turn goes to one server."""

    def __init__(self, loop: WolfpackAgentLoop, chat: SeatChat, sampling_params: Mapping[str, Any]) -> None:
        self.server: Any = loop.server_manager
        self.chat = chat
        self.sampling_params = dict(sampling_params)
        self.request_id = uuid.uuid4().hex
        self.extra_fields: dict[str, Any] = {}
        self.generate_s = 0.0

    async def generate_batch(
        self, requests: Sequence[inf_pb.GenerateRequest], *, timeout: float | None = None
    ) -> AsyncIterator[BatchItem]:
        for index, request in enumerate(requests):
            yield BatchItem(index, await self.generate(request))

    async def generate(self, request: inf_pb.GenerateRequest) -> inf_pb.GenerateResponse:
        chat = self.chat
        if not chat.ready:
            raise RuntimeError(
                f"{request.request_id}: no observation waits for an answer (the environment must be this "
                "chat's AutopilotEnvironment)"
            )
        params = dict(self.sampling_params)
        params["max_tokens"] = min(chat.spec.max_turn_tokens, chat.remaining)
        prompt_ids = list(chat.token_ids)
        t0 = time.perf_counter()
        out = await self.server.generate(
            request_id=self.request_id, prompt_ids=prompt_ids, sampling_params=params
        )
        self.generate_s += time.perf_counter() - t0
        extra = dict(out.extra_fields or {})
        self._merge_extra(extra)
        generated = [int(t) for t in out.token_ids]
        logprobs = [float(x) for x in out.log_probs] if out.log_probs else None
        text = await chat.add_answer(generated, logprobs)
        if out.stop_reason == "aborted":
            finish = common_pb2.FINISH_REASON_ABORT
        elif len(generated) >= params["max_tokens"]:
            finish = common_pb2.FINISH_REASON_LENGTH
        else:
            finish = common_pb2.FINISH_REASON_STOP
        resp = inf_pb.GenerateResponse(prompt_token_ids=prompt_ids)
        resp.completions.add(token_ids=generated, logprobs=logprobs or [], text=text, finish_reason=finish)
        resp.usage.prompt_tokens, resp.usage.completion_tokens = len(prompt_ids), len(generated)
        resp.policy.policy_id = request.policy_id
        steps = extra.get("global_steps")
        if isinstance(steps, int):
            resp.policy.version = steps  # the weights version verl generated with
        return resp

    def _merge_extra(self, extra: Mapping[str, Any]) -> None:
        """Keep the first turn's fields and the last turn's ``max_global_steps`` (the weight versions a
        trajectory was generated with: verl's metrics need both ends)."""
        if not self.extra_fields:
            self.extra_fields.update(extra)
        elif extra.get("max_global_steps") is not None:
            self.extra_fields["max_global_steps"] = extra["max_global_steps"]


class LibraryReward:
    """The driver's ``Reward`` from the reward specs library (the reward service's own code), run off the
    event loop (prediction shaping may take CPU-seconds on a long game). Keeps the last response (the
    seat's reward components, terminal-only ones included) and the time spent, for verl's metrics."""

    def __init__(self) -> None:
        self.last: rew_pb.ScoreResponse | None = None
        self.seconds = 0.0

    async def score(self, request: rew_pb.ScoreRequest) -> rew_pb.ScoreResponse:
        t0 = time.perf_counter()
        try:
            self.last = await asyncio.to_thread(wolfpack_rewards.score, request.trajectory, request.spec)
        finally:
            self.seconds += time.perf_counter() - t0
        return self.last


@dataclass
class EpisodeBackends:
    """What one sample's episode plays against (the driver's three backends) and the seat's chat."""

    chat: SeatChat
    environment: AutopilotEnvironment
    inference: VerlInference
    reward: LibraryReward


def episode_task(spec: EpisodeSpec) -> cur_pb.Task:
    """The driver's task for one row: ``POLICY_ID`` on ``spec.seat``, a scripted bot on every other seat
    (``spec.bots`` by seat, else ``spec.default_bot``)."""
    game = get_game(spec.game_id)
    variant = spec.variant or game.default_variant
    if variant not in game.variants:
        raise ValueError(f"{spec.game_id} has no variant {variant!r}; known: {sorted(game.variants)}")
    seats = game.variants[variant]
    if not 0 <= spec.seat < seats:
        raise ValueError(f"seat {spec.seat} is not a seat of {spec.game_id}/{variant} (0..{seats - 1})")
    task = cur_pb.Task(
        task_id=f"{AGENT_NAME}:{spec.game_id}/{variant}:{spec.seed}", seed=spec.seed, scenario_id=spec.scenario_id,
        options=dict(spec.options), trainee_seats=[spec.seat], group_size=1, split="train",
    )  # fmt: skip
    task.game.game_id, task.game.variant = spec.game_id, variant
    for seat in range(seats):
        binding = task.seats.add(seat=seat)
        if seat == spec.seat:
            binding.controller = common_pb2.SEAT_CONTROLLER_POLICY
            binding.policy.policy_id = POLICY_ID
        else:
            binding.controller = common_pb2.SEAT_CONTROLLER_SCRIPTED
            binding.bot = spec.bots.get(seat, spec.default_bot)
    return task


def episode_config(spec: EpisodeSpec, sampling_params: Mapping[str, Any]) -> RolloutConfig:
    """The driver's settings for one sample: one episode, the row's reward spec, language and turn
    timeout; the sampling the trajectory records is verl's (``max_tokens``: the per-answer cap)."""
    top_k = int(sampling_params.get("top_k", 0) or 0)
    sampling = SamplingConfig(
        max_tokens=spec.max_turn_tokens, temperature=float(sampling_params.get("temperature", 1.0)),
        top_p=float(sampling_params.get("top_p", 1.0)), top_k=max(0, top_k),
    )  # fmt: skip
    return RolloutConfig(
        concurrency=1, sampling=sampling, max_turns=MAX_DECISIONS, reward_spec=spec.reward_spec,
        language=spec.language, turn_timeout_s=spec.turn_timeout_s, worker_id=AGENT_NAME,
    )  # fmt: skip


def agent_output_tokens(
    turns: Sequence[trajectory_pb2.Turn], skip: frozenset[str] = frozenset()
) -> tuple[list[int], list[int], list[int], list[float] | None]:
    """verl's (prompt ids, response ids, response mask, response logprobs) of one seat's policy turns,
    played as one conversation (each turn's prompt is the previous turns' whole token stream plus the new
    observation). The prompt is the first turn's; the response is everything after it up to the end of
    the last answer, mask 1 (with the sampled logprobs) where an answer's tokens stand, 0 elsewhere (and on
    the valid answers whose action kind is in ``skip``: ``EpisodeSpec.skip_actions``); logprobs are None
    when no turn has any."""
    if not turns:
        raise ValueError("no policy turns")
    last = turns[-1]
    full = [*last.prompt_token_ids, *last.response_token_ids]
    start = len(turns[0].prompt_token_ids)
    mask = [0] * (len(full) - start)
    logprobs = [0.0] * len(mask)
    for turn in turns:
        at = len(turn.prompt_token_ids)
        if full[:at] != list(turn.prompt_token_ids):
            raise ValueError(f"turn {turn.index}: its prompt does not continue the previous turns' tokens")
        if turn.valid and turn.action.kind in skip:
            continue
        for k, token in enumerate(turn.response_token_ids):
            if at + k >= len(full) or full[at + k] != token:
                break  # a later merge replaced the answer's tail (a chat template's boundary handling)
            mask[at + k - start] = 1
            if turn.response_logprobs:
                logprobs[at + k - start] = turn.response_logprobs[k]
    has_logprobs = any(turn.response_logprobs for turn in turns)
    return full[:start], full[start:], mask, logprobs if has_logprobs else None


class WolfpackAgentLoop(AgentLoopBase):  # type: ignore[misc,valid-type]
    """Plays one seat of one game per sample through the rollout driver; see the module docstring.

    Extra keyword arguments (from the agent-loop config entry): ``environment`` (host:port), ``episode``
    (defaults for ``EpisodeSpec``), ``max_policy_turns`` (0: no limit besides the budget).
    """

    def __init__(
        self,
        *args: Any,
        environment: str = "",
        episode: Mapping[str, Any] | None = None,
        max_policy_turns: int = 0,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("name", None)  # the config entry's own name key
        kwargs.pop("tools", None)  # verl passes its tool list to every loop; games are not tools
        super().__init__(*args, **kwargs)
        self.settings = load_settings()
        self.environment_addr = environment or self.settings.service_addr("environment")
        self.episode_defaults = dict(episode or {})
        self.max_policy_turns = int(max_policy_turns)

    def backends(
        self, spec: EpisodeSpec, sampling_params: Mapping[str, Any], system: Sequence[Mapping[str, Any]] = ()
    ) -> EpisodeBackends:
        """Fresh backends for one episode of ``spec``: the environment service over gRPC (this worker's
        cached client) behind the seat's chat, verl's server handle, the reward library."""
        chat = SeatChat(self, spec, [dict(m) for m in system], self.max_policy_turns)
        environment = AutopilotEnvironment(_client(self.environment_addr, self.settings), chat)
        return EpisodeBackends(chat, environment, VerlInference(self, chat, sampling_params), LibraryReward())

    async def play(
        self, spec: EpisodeSpec, sampling_params: Mapping[str, Any], system: Sequence[Mapping[str, Any]] = ()
    ) -> tuple[trajectory_pb2.Trajectory | None, EpisodeBackends]:
        """Play ``spec`` through the rollout driver: its scored ``Trajectory`` (None when the seat never
        got a turn) and the backends it played against. Any other failed episode raises, with the
        driver's reason and detail."""
        backends = self.backends(spec, sampling_params, system)
        driver = RolloutDriver(
            episode_config(spec, sampling_params), environment=backends.environment,
            inference=backends.inference, reward=backends.reward,
        )  # fmt: skip
        played = await driver.play([episode_task(spec)])
        if played:
            return played[0], backends
        failure = driver.stats.recent_failures[-1]
        if failure.reason != "no_turns":
            raise RuntimeError(
                f"episode {backends.chat.episode_id or '?'} failed: {failure.reason}: {failure.detail}"
            )
        return None, backends

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """Play the episode of ``kwargs`` (a verl sample) and return its ``AgentLoopOutput``."""
        spec = EpisodeSpec.from_sample(kwargs, self.episode_defaults)
        started = time.perf_counter()
        trajectory, backends = await self.play(spec, sampling_params, kwargs.get("raw_prompt") or [])
        chat = backends.chat
        reward, turn_rewards, components, outcome = 0.0, [], {}, common_pb2.OUTCOME_KIND_UNSPECIFIED
        turns: list[trajectory_pb2.Turn] = []
        if trajectory is not None:
            turns = [t for t in trajectory.turns if t.seat == spec.seat]
            seat_outcome = next(o for o in trajectory.outcomes if o.seat == spec.seat)
            skip = skipped_kinds(spec.skip_actions, seat_outcome.role)
            prompt_ids, response_ids, mask, logprobs = agent_output_tokens(turns, skip)
            reward, outcome = float(seat_outcome.final_reward), seat_outcome.outcome
            turn_rewards = [float(t.reward) for t in turns]
            scored = backends.reward.last
            if scored is not None:
                components = next(
                    (dict(s.components) for s in scored.seat_rewards if s.seat == spec.seat), {}
                )
        else:  # the seat never acted (e.g. killed on the first night): nothing to train on
            log.warning("episode %s: seat %d never acted; reward 0, mask all 0", chat.episode_id, spec.seat)
            await chat.never_acted()
            prompt_ids, response_ids, mask = chat.token_ids[:-1], chat.token_ids[-1:], chat.response_mask
            logprobs = None
        metrics = AgentLoopMetrics(
            generate_sequences=backends.inference.generate_s, compute_score=backends.reward.seconds
        )
        response_length = int(self.rollout_config.response_length)
        extra = dict(backends.inference.extra_fields)
        extra.update(
            turn_scores=turn_rewards,
            tool_rewards=[],
            wolfpack_episode_id=chat.episode_id,
            wolfpack_policy_turns=len(turns),
            wolfpack_autopilot_turns=chat.autopilot_turns,
            wolfpack_invalid_turns=sum(1 for t in turns if not t.valid),
            wolfpack_outcome=int(outcome),
            wolfpack_reward_components=components,
            wolfpack_play_s=time.perf_counter() - started,
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[:response_length],
            response_mask=mask[:response_length],
            response_logprobs=logprobs[:response_length] if logprobs is not None else None,
            reward_score=reward,
            num_turns=2 * len(turns) + 1,
            metrics=metrics,
            extra_fields=extra,
        )


def dataset_rows(
    n: int,
    spec: Mapping[str, Any],
    *,
    seed0: int = 0,
    system_prompt: str = "",
    seats: Sequence[int] = (),
    roles: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """``n`` verl dataset rows (RLHFDataset columns) that play ``spec`` with seeds ``seed0 ..``; ``seats``
    cycles the policy's seat across rows (default: ``spec``'s seat). With ``roles`` (e.g. Werewolf's
    village: villager, seer, witch) each seed instead gives one row per seat dealt one of those roles, in
    seat order, until ``n`` rows: the seats a ``wolfpack train`` policy with ``roles`` trains. The deal is
    the game engine's for that seed (``reset(seed)``, the environment service's and the trainer's
    evaluation's deal); a seed that deals none of the roles gives no row."""
    if seats and roles:
        raise ValueError("give seats or roles, not both")
    base = EpisodeSpec.from_mapping(spec)  # validate once
    picks: list[tuple[int, int]] = []  # (seed, seat) per row
    seed = seed0
    while len(picks) < n:
        if roles:
            picks += [(seed, s) for s in role_seats(base, seed, roles)][: n - len(picks)]
            if not picks and seed - seed0 >= 100:  # a typo ("seeer") must not loop for ever
                raise ValueError(f"no seat of {base.game_id} is dealt any of {list(roles)} in 100 seeds")
        else:
            picks.append((seed, seats[len(picks) % len(seats)] if seats else base.seat))
        seed += 1
    rows = []
    for i, (row_seed, seat) in enumerate(picks):
        row_spec = dict(spec) | {"seed": row_seed, "seat": seat}
        prompt = [{"role": "system", "content": system_prompt}] if system_prompt else []
        rows.append(
            {
                "data_source": f"wolfpack/{base.game_id}",
                "prompt": prompt,
                "ability": "social",
                "reward_model": {"style": "rule", "ground_truth": ""},
                "extra_info": {"index": i, "wolfpack": json.dumps(row_spec)},
                "agent_name": AGENT_NAME,
            }
        )
    return rows


def role_seats(spec: EpisodeSpec, seed: int, roles: Sequence[str]) -> list[int]:
    """The seats of ``spec``'s game dealt one of ``roles`` on ``seed`` (the engine's deal, in seat order)."""
    game = get_game(spec.game_id)
    env = make_game(spec.game_id, spec.variant or game.default_variant, **dict(spec.options))
    env.reset(seed=seed)
    wanted = set(roles)
    return [s for s in sorted(env.possible_agents) if env.role(s) in wanted]


def main(argv: Sequence[str] | None = None) -> None:
    """Write a parquet dataset for verl's ``main_ppo`` that plays Wolfpack games with this loop."""
    ap = argparse.ArgumentParser(
        prog="python -m wolfpack_trainer.learners.verl.agent_loop",
        description="Write a verl dataset (parquet) whose rows play Wolfpack games through the agent loop "
        f"registered in {CONFIG_PATH.name} (agent name {AGENT_NAME!r}).",
    )
    ap.add_argument("out", type=Path, help="parquet file to write")
    ap.add_argument("--rows", type=int, default=64, help="number of rows (episodes per epoch)")
    ap.add_argument("--game", default="werewolf_v1", help="game id (see `wolfpack games`)")
    ap.add_argument("--variant", default="6p")
    ap.add_argument("--seats", default="0", help="comma-separated seats the policy plays, cycled over rows")
    ap.add_argument(
        "--roles", default="", help="comma-separated roles (e.g. villager,seer,witch): each seed gives one row per "
        "seat dealt one of them, instead of --seats",
    )  # fmt: skip
    ap.add_argument(
        "--reward-spec", default="", help="reward spec (e.g. werewolf_role@1; default: the game's)"
    )
    ap.add_argument(
        "--seed0", type=int, default=0, help="seed of the first row (rows use seed0, seed0+1, ...)"
    )
    ap.add_argument("--default-bot", default="heuristic", help="scripted bot for the other seats")
    ap.add_argument("--max-turn-tokens", type=int, default=64)
    ap.add_argument(
        "--skip-actions", default="", help="comma-separated action kinds, or role:kind (villager:speak), whose "
        "valid answers are masked out of training (as batch.skip_actions)",
    )  # fmt: skip
    ap.add_argument("--system-prompt", default="You are playing a social game. Answer with one legal action.")
    args = ap.parse_args(argv)
    import pandas as pd  # type: ignore[import-untyped]

    spec = {"game_id": args.game, "variant": args.variant, "default_bot": args.default_bot,
            "max_turn_tokens": args.max_turn_tokens}  # fmt: skip
    if args.reward_spec:
        spec["reward_spec"] = args.reward_spec
    skip = [a.strip() for a in args.skip_actions.split(",") if a.strip()]
    if skip:
        spec["skip_actions"] = skip
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    seats = [] if roles else [int(s) for s in args.seats.split(",") if s.strip()]
    rows = dataset_rows(
        args.rows, spec, seed0=args.seed0, system_prompt=args.system_prompt, seats=seats, roles=roles
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(args.out)
    who = f"roles {roles}" if roles else f"seats {seats}"
    print(f"wrote {len(rows)} rows ({args.game}/{args.variant}, {who}) to {args.out}")


if __name__ == "__main__":
    main()
