"""A verl agent loop that plays Wolfpack games through the environment service (the AgentLoop plug-in).

Why: people who run stock verl PPO/GRPO (``python -m verl.trainer.main_ppo``) can train on our games
without the rest of Wolfpack. verl asks the loop for one trajectory per dataset row; this loop

1. creates an episode on the environment service over gRPC (one seat external, the others scripted bots),
2. on each of its seat's turns turns the observation into a chat message, generates with verl's server
   handle (``LLMServerClient.generate``: token ids in, token ids and logprobs out) and sends the decoded
   text back as the action,
3. scores the finished episode with the reward specs of ``wolfpack_rewards`` (in process, off the event
   loop: the same code and numbers as the reward service's ``Score``, without a service to run) and
   returns an ``AgentLoopOutput`` whose response holds the whole conversation after the first prompt:
   the policy's tokens with mask 1 and the observation tokens between them with mask 0.

Whatever the model answers (empty, blank, binary) is sent as its move: the environment's game judges it
(an invalid move is re-prompted, then defaulted, and the reward spec's penalty applies), so no answer
loses the episode.

Tokenisation uses verl's continuous-token helpers (``ct_build_initial_tokens`` / ``ct_merge_*``), so the
ids the policy is trained on are exactly the ids it sampled and the chat-template boundaries are verl's.
Nothing here re-tokenises generated text.

Register it with an agent-loop config file (``agent_loops.yaml`` beside this module)::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=<path>/agent_loops.yaml
    actor_rollout_ref.rollout.agent.default_agent_loop=wolfpack

Each dataset row says which game to play in ``extra_info["wolfpack"]`` (or a top-level ``wolfpack``
column): ``game_id``, ``variant``, ``seed``, ``seat``, ``default_bot``, ``bots``, ``reward_spec``, ...
(``EpisodeSpec``). Rows with the same seed are the same game, so GRPO's n samples of one row compare
answers in one game. ``python -m wolfpack_trainer.learners.verl.agent_loop --help`` writes such a dataset.

The environment service's address comes from the agent-loop config key ``environment`` or from
``WOLFPACK_ENVIRONMENT_ADDR`` (the Ray workers inherit the driver's environment).

When the response budget (``rollout.response_length``) runs out before the game ends, the remaining
turns of the seat are answered with the first legal action ("autopilot"): the game still reaches an
outcome, those turns carry no tokens and are not sent to the reward service as policy turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

import wolfpack_rewards
from wolfpack.settings import Settings, load_settings
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack_environment.client import EnvironmentClient
from wolfpack_games.scenarios import GAME_CLASSES as SCENARIO_GAMES

log = logging.getLogger(__name__)

AGENT_NAME = "wolfpack"
CONFIG_PATH = Path(__file__).with_name("agent_loops.yaml")
"""The agent-loop config file that registers this loop under ``AGENT_NAME``."""


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
        for key in ("seed", "seat", "max_turn_tokens"):
            if key in kw:
                kw[key] = int(kw[key])
        spec = cls(**kw)
        if spec.game_id in SCENARIO_GAMES:
            raise ValueError(
                f"{spec.game_id}: the agent loop plays Werewolf only for now; scenario games are scored from the "
                "whole transcript (scripted seats' messages included), which this loop does not rebuild yet"
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


@dataclass
class PlayedTurn:
    """One decision of the policy's seat, as the reward service and the trajectory need it."""

    turn_id: int
    phase: str
    round: int
    observation_text: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    response_text: str
    finish_reason: int
    generate_ms: float
    attempt: int
    accepted: bool = False
    defaulted: bool = False
    reason: str = ""
    action: common_pb2.Action | None = None


def observation_delta(previous: str, current: str) -> str:
    """The part of ``current`` that is new after ``previous``: everything after their common prefix,
    cut back to a line start (so a line is never split). The whole text when nothing is shared."""
    limit = min(len(previous), len(current))
    i = 0
    while i < limit and previous[i] == current[i]:
        i += 1
    if i == len(current):
        return current  # identical view (a re-prompt without new text): repeat it
    cut = current.rfind("\n", 0, i) + 1 if i else 0
    return current[cut:]


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


class WolfpackAgentLoop(AgentLoopBase):  # type: ignore[misc,valid-type]
    """Plays one seat of one game per sample; see the module docstring.

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

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """Play the episode of ``kwargs`` (a verl sample) and return its ``AgentLoopOutput``."""
        spec = EpisodeSpec.from_sample(kwargs, self.episode_defaults)
        system = [dict(m) for m in (kwargs.get("raw_prompt") or [])]
        env = _client(self.environment_addr, self.settings)
        started = time.perf_counter()
        play = await _Play(self, spec, system, sampling_params, env).run()
        generate_s = play.generate_s
        reward, turn_rewards, components, outcome = 0.0, [], {}, common_pb2.OUTCOME_KIND_UNSPECIFIED
        scored_s = 0.0
        if play.turns:
            t0 = time.perf_counter()
            trajectory = await play.trajectory(spec)
            # off the event loop: prediction shaping may take CPU-seconds on a long game
            resp = await asyncio.to_thread(wolfpack_rewards.score, trajectory, spec.reward_spec)
            scored_s = time.perf_counter() - t0
            seat_reward = next(s for s in resp.seat_rewards if s.seat == spec.seat)
            reward, components = float(seat_reward.reward), dict(seat_reward.components)
            turn_rewards = [float(t.reward) for t in resp.turn_rewards]
            outcome = next((o.outcome for o in resp.trajectory.outcomes if o.seat == spec.seat), outcome)
        else:  # the seat never got a turn (e.g. killed on the first night): nothing to train on
            log.warning("episode %s: seat %d never acted; reward 0, mask all 0", play.episode_id, spec.seat)
        metrics = AgentLoopMetrics(generate_sequences=generate_s, compute_score=scored_s)
        response_length = int(self.rollout_config.response_length)
        extra = dict(play.extra_fields)
        extra.update(
            turn_scores=turn_rewards,
            tool_rewards=[],
            wolfpack_episode_id=play.episode_id,
            wolfpack_policy_turns=len(play.turns),
            wolfpack_autopilot_turns=play.autopilot_turns,
            wolfpack_invalid_turns=sum(1 for t in play.turns if not t.accepted),
            wolfpack_outcome=int(outcome),
            wolfpack_reward_components=components,
            wolfpack_play_s=time.perf_counter() - started,
        )
        return AgentLoopOutput(
            prompt_ids=play.prompt_ids,
            response_ids=play.response_ids[:response_length],
            response_mask=play.response_mask[:response_length],
            response_logprobs=play.response_logprobs[:response_length] if play.response_logprobs else None,
            reward_score=reward,
            num_turns=2 * len(play.turns) + 1,
            metrics=metrics,
            extra_fields=extra,
        )


class _Play:
    """The state of one episode as the loop plays it: the token stream and the turns so far."""

    def __init__(
        self,
        loop: WolfpackAgentLoop,
        spec: EpisodeSpec,
        system: list[dict[str, Any]],
        sampling_params: Mapping[str, Any],
        env: EnvironmentClient,
    ) -> None:
        self.loop = loop
        self.spec = spec
        self.env = env
        self.sampling_params = dict(sampling_params)
        self.messages: list[dict[str, Any]] = system
        self.token_ids: list[int] = []  # prompt + response so far (verl's "runtime" token stream)
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.turns: list[PlayedTurn] = []
        self.autopilot_turns = 0
        self.extra_fields: dict[str, Any] = {}
        self.generate_s = 0.0
        self.episode_id = ""
        self.admin_token = ""
        self.last_text = ""
        self.exhausted = False
        self.request_id = uuid.uuid4().hex  # sticky session: every turn of a game goes to one server
        self.budget = int(loop.rollout_config.response_length)
        self.prompt_len = 0

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.prompt_len]

    @property
    def response_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    async def run(self) -> _Play:
        spec = self.spec
        created = await self.env.create_episode(
            spec.game_id, spec.variant, spec.seed, external_seats=(spec.seat,), bots=spec.bots,
            default_bot=spec.default_bot, language=spec.language, turn_timeout_s=spec.turn_timeout_s,
            options=spec.options,
        )  # fmt: skip
        if spec.seat not in created.seat_tokens:
            raise ValueError(f"episode {created.episode_id} gave no token for seat {spec.seat}")
        self.episode_id, self.admin_token = created.episode_id, created.admin_token
        seat = self.env.seat(created.episode_id, created.seat_tokens[spec.seat])
        final: env_pb.Observation | None = None
        async for obs in seat.observe():
            final = obs
            attempt = 0
            while obs.your_turn and not obs.done:
                decision = await self.decide(obs, attempt)
                try:
                    resp = await seat.act(obs.turn_id, decision)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        break  # the turn moved on (timeout default); the stream brings the next one
                    raise
                if isinstance(decision, str) and self.turns:
                    turn = self.turns[-1]
                    turn.accepted, turn.defaulted, turn.reason = resp.accepted, resp.defaulted, resp.reason
                    if resp.HasField("action"):
                        turn.action = resp.action
                obs = resp.observation
                final = obs
                if resp.accepted or resp.defaulted:
                    break
                attempt += 1
            if final.done:
                break
        if final is None or not final.done:
            final = await seat.observation()
        if not self.turns:  # never acted: a one-token response, masked out, so verl still gets a sample
            await self.first_prompt(final.text)
            tokenizer: Any = self.loop.tokenizer
            eos = tokenizer.eos_token_id
            self.token_ids.append(int(eos if eos is not None else 0))
            self.response_mask.append(0)
            if self.response_logprobs:
                self.response_logprobs.append(0.0)
        return self

    async def first_prompt(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        self.token_ids = list(await self.loop.ct_build_initial_tokens(self.messages))
        self.prompt_len = len(self.token_ids)

    async def add_observation(self, text: str) -> bool:
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

    async def decide(self, obs: env_pb.Observation, attempt: int) -> str | common_pb2.Action:
        """Generate the seat's answer to ``obs`` (text), or the autopilot action once out of budget."""
        limit = self.loop.max_policy_turns
        if self.exhausted or (limit and len(self.turns) >= limit):
            self.autopilot_turns += 1
            return autopilot_action(obs)
        full = obs.text
        text = (
            full
            if self.spec.observation == "full" or not self.turns
            else observation_delta(self.last_text, full)
        )
        if not self.turns:
            await self.first_prompt(text)
        elif not await self.add_observation(text):
            self.exhausted = True
            self.autopilot_turns += 1
            return autopilot_action(obs)
        self.last_text = full
        remaining = self.budget - len(self.response_mask)
        if remaining < 1:
            self.exhausted = True
            self.autopilot_turns += 1
            return autopilot_action(obs)
        params = dict(self.sampling_params)
        params["max_tokens"] = min(self.spec.max_turn_tokens, remaining)
        prompt_ids = list(self.token_ids)
        t0 = time.perf_counter()
        out = await self.loop.server_manager.generate(
            request_id=self.request_id, prompt_ids=prompt_ids, sampling_params=params
        )
        elapsed = time.perf_counter() - t0
        self.generate_s += elapsed
        self._merge_extra(out.extra_fields or {})
        generated = [int(t) for t in out.token_ids]
        logprobs = [float(x) for x in out.log_probs] if out.log_probs else None
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
        if out.stop_reason == "aborted":
            finish = common_pb2.FINISH_REASON_ABORT
        elif len(generated) >= params["max_tokens"]:
            finish = common_pb2.FINISH_REASON_LENGTH
        else:
            finish = common_pb2.FINISH_REASON_STOP
        self.turns.append(
            PlayedTurn(
                turn_id=obs.turn_id, phase=obs.phase, round=obs.round, observation_text=text,
                prompt_ids=prompt_ids, response_ids=generated, logprobs=logprobs or [], response_text=reply,
                finish_reason=finish, generate_ms=elapsed * 1000.0, attempt=attempt,
            )
        )  # fmt: skip
        if len(self.response_mask) >= self.budget:
            self.exhausted = True
        return reply

    def _merge_extra(self, extra: Mapping[str, Any]) -> None:
        """Keep the first turn's fields and the last turn's ``max_global_steps`` (the weight versions a
        trajectory was generated with: verl's metrics need both ends)."""
        if not self.extra_fields:
            self.extra_fields.update(extra)
        elif extra.get("max_global_steps") is not None:
            self.extra_fields["max_global_steps"] = extra["max_global_steps"]

    async def trajectory(self, spec: EpisodeSpec) -> trajectory_pb2.Trajectory:
        """The played episode as a ``Trajectory`` for the reward service: the policy seat's turns, every
        seat's outcome from the environment (admin view of the finished episode)."""
        info = await self.env.get_episode(self.episode_id, self.admin_token)
        traj = trajectory_pb2.Trajectory(
            trajectory_id=uuid.uuid4().hex, episode_id=self.episode_id, game=info.game, seed=info.seed,
            winner=info.winner,
        )  # fmt: skip
        for s in info.seats:
            traj.seats.add(seat=s.seat, controller=s.controller)
            traj.outcomes.add(seat=s.seat, role=s.role, outcome=s.outcome, alive=s.alive)
        for index, t in enumerate(self.turns):
            turn = traj.turns.add(
                index=index, seat=spec.seat, phase=t.phase, round=t.round, observation_text=t.observation_text,
                prompt_token_ids=t.prompt_ids, response_token_ids=t.response_ids, response_logprobs=t.logprobs,
                response_text=t.response_text, valid=t.accepted, invalid_reason="" if t.accepted else t.reason,
                attempt=t.attempt, defaulted=t.defaulted, turn_id=t.turn_id, generate_ms=t.generate_ms,
                finish_reason=t.finish_reason,  # type: ignore[arg-type]
            )  # fmt: skip
            if t.action is not None:
                turn.action.CopyFrom(t.action)
        traj.metadata["source"] = "verl_agent_loop"
        return traj


def dataset_rows(
    n: int,
    spec: Mapping[str, Any],
    *,
    seed0: int = 0,
    system_prompt: str = "",
    seats: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """``n`` verl dataset rows (RLHFDataset columns) that play ``spec`` with seeds ``seed0 ..``; ``seats``
    cycles the policy's seat across rows (default: ``spec``'s seat)."""
    base = EpisodeSpec.from_mapping(spec)  # validate once
    rows = []
    for i in range(n):
        row_spec = dict(spec) | {"seed": seed0 + i}
        if seats:
            row_spec["seat"] = seats[i % len(seats)]
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
        "--seed0", type=int, default=0, help="seed of the first row (rows use seed0, seed0+1, ...)"
    )
    ap.add_argument("--default-bot", default="heuristic", help="scripted bot for the other seats")
    ap.add_argument("--max-turn-tokens", type=int, default=64)
    ap.add_argument("--system-prompt", default="You are playing a social game. Answer with one legal action.")
    args = ap.parse_args(argv)
    import pandas as pd  # type: ignore[import-untyped]

    spec = {"game_id": args.game, "variant": args.variant, "default_bot": args.default_bot,
            "max_turn_tokens": args.max_turn_tokens}  # fmt: skip
    seats = [int(s) for s in args.seats.split(",") if s.strip()]
    rows = dataset_rows(args.rows, spec, seed0=args.seed0, system_prompt=args.system_prompt, seats=seats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(args.out)
    print(f"wrote {len(rows)} rows ({args.game}/{args.variant}, seats {seats}) to {args.out}")


if __name__ == "__main__":
    main()
