"""The trainer's local mode: the rollout driver (the one episode player) over in-process backends.

Local mode plays exactly as service mode does — ``wolfpack_rollout``'s ``RolloutDriver`` loop (create →
decisions → generate → act → close → build ``Trajectory`` → score) — only the three things it talks to
live in this process instead of behind gRPC (the seam is ``wolfpack_rollout.backends``):

* ``LocalEnvironment`` — the game engines (``wolfpack_games``) under the environment service's own
  session rules and proto mapping, which are library code both call (``wolfpack_games.session``: seat
  plans, scripted seats, turn ids, parse-then-step, re-prompts and defaults; ``session_proto``:
  observations and ``GetEpisode`` state). What stays here is the PlaySeats batching. No tokens' secrecy,
  deadlines or limits: nobody else plays here.
* ``LocalInference`` — the learner's own weights (``sample``: batched, KV cache, sampler logprobs at the
  sampling temperature); chat prompts through the tokenizer's chat template, token prompts as given.
* ``LocalReward`` — the reward service's specs from the library (``wolfpack_rewards.score``).

Why in process: on a 2-core CPU box the demo and the learning tests cannot afford gRPC hops and a weight
push per update for a model this small; sampling with the learner's current weights is on-policy by
construction. A seed is the same game in both modes, and the trajectories are the same protos (exact
prompt/response ids, sampler logprobs, scored by the same spec), because the player is the same code.
``rollout_config`` is the one place a train config becomes the driver's settings, for both modes.

No gRPC here, nor in what a local run imports (``test_train_local_imports.py``): status numbers come from
``google.rpc.code_pb2``, and gRPC is imported only to fail an episode as the services would (an unknown
policy, a trajectory the reward spec refuses).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
import yaml
from google.rpc import code_pb2
from torch import nn

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import reward_service_pb2 as rew_pb
from wolfpack_games.session import Session, start_session
from wolfpack_games.session_proto import Observations, action_to_pb, episode_state_pb, seat_plans
from wolfpack_rewards import ScoreError, resolve_spec, score
from wolfpack_rollout.client import BatchResult, RolloutConfig, RolloutDriver, SamplingConfig, TokenizerCodec

if TYPE_CHECKING:
    import grpc


@dataclass(frozen=True)
class Generated:
    token_ids: list[int]
    logprobs: list[float]
    finish: int  # common_pb2.FinishReason


@torch.no_grad()
def sample(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    temperature: float,
    eos_ids: Sequence[int],
    pad_id: int,
    generator: torch.Generator | None = None,
) -> list[Generated]:
    """Batched sampling with a KV cache, left padding and explicit position ids (so a sequence's
    positions do not depend on its neighbours' lengths). ``temperature`` 0 is greedy (logprobs at T=1)."""
    n = len(prompts)
    if n == 0:
        return []
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    att = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        att[i, width - len(p) :] = 1
    pos = (att.cumsum(1) - 1).clamp(min=0)
    t = temperature if temperature > 0 else 1.0
    eos = torch.tensor(list(eos_ids), dtype=torch.long)
    out_ids: list[list[int]] = [[] for _ in range(n)]
    out_lp: list[list[float]] = [[] for _ in range(n)]
    finished = torch.zeros(n, dtype=torch.bool)
    past = None
    step_ids, step_pos = ids, pos
    for _ in range(max_tokens):
        res = model(
            input_ids=step_ids,
            attention_mask=att,
            position_ids=step_pos,
            past_key_values=past,
            use_cache=True,
        )
        past = res.past_key_values
        logp = torch.log_softmax(res.logits[:, -1, :].float() / t, dim=-1)
        if temperature > 0:
            nxt = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        else:
            nxt = logp.argmax(-1)
        lp = logp.gather(1, nxt.unsqueeze(1)).squeeze(1)
        for i in range(n):
            if not finished[i]:
                out_ids[i].append(int(nxt[i]))
                out_lp[i].append(float(lp[i]))
        finished |= torch.isin(nxt, eos)
        if bool(finished.all()):
            break
        step_ids = nxt.unsqueeze(1)
        step_pos = step_pos[:, -1:] + 1
        att = torch.cat([att, torch.ones((n, 1), dtype=torch.long)], dim=1)
    return [
        Generated(
            out_ids[i],
            out_lp[i],
            common_pb2.FINISH_REASON_STOP
            if out_ids[i] and out_ids[i][-1] in set(eos_ids)
            else common_pb2.FINISH_REASON_LENGTH,
        )
        for i in range(n)
    ]


def chat_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """The chat template over ``messages`` with the generation prompt, tokenized once."""
    ids = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
    )
    if not isinstance(ids, list):
        ids = list(ids["input_ids"])
    return [int(t) for t in ids]


def render_prompt(tokenizer: Any, observation: str, max_tokens: int = 0) -> list[int]:
    """The prompt of one whole observation as one user message (chat template), cropped to its last
    ``max_tokens`` tokens when > 0. This is what the driver sends only in ``full_history`` mode; the tests
    use it to tell the modes apart (the warm start renders through the driver's own ``render_messages``)."""
    ids = chat_ids(tokenizer, [{"role": "user", "content": observation}])
    return ids[-max_tokens:] if max_tokens > 0 else ids


def prompt_encoder(tokenizer: Any) -> Callable[[Sequence[common_pb2.ChatMessage]], list[int]]:
    """The driver's ``encode_prompt`` for this tokenizer: what ``max_prompt_tokens`` crops, in both modes."""

    def encode(messages: Sequence[common_pb2.ChatMessage]) -> list[int]:
        return chat_ids(tokenizer, [{"role": m.role, "content": m.content} for m in messages])

    return encode


@dataclass(frozen=True)
class Task:
    """One episode to play: game, variant, seed, which seats the trainee policies take."""

    game_id: str
    variant: str
    seed: int
    trainee_seats: Mapping[int, str]
    """seat → policy id; every other seat is played by ``bot``."""
    trainee_roles: Mapping[str, str] = field(default_factory=dict)
    """role → policy id, resolved after ``reset`` (Werewolf deals roles by seed); adds to ``trainee_seats``."""
    bot: str = "heuristic"
    group_id: str = ""
    group_size: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    """Engine ``reset`` options (``game.options``, plus ``language`` when not "en")."""
    opponent_policy: str = ""
    """A served opponent policy for the other seats (service mode only; local play refuses it)."""
    opponent_roles: frozenset[str] = frozenset()
    """With these, only the untrained seats dealt them go to ``opponent_bot`` / ``opponent_policy`` (the
    opponent mix's ``roles``); the other untrained seats keep ``bot``."""
    opponent_bot: str = ""
    """The opponent mix's scripted bot for the seats dealt ``opponent_roles`` (empty: ``bot``)."""


PROMPT_MODES: dict[str, Literal["full", "memory", "conversation"]] = {
    "observation": "memory",
    "full_history": "full",
    "conversation": "conversation",
}
"""``rollout.prompt`` → the driver's ``prompt_mode``."""


def rollout_config(cfg: Any, *, concurrency: int = 64, temperature: float | None = None) -> RolloutConfig:
    """The driver's settings for a train config (``TrainConfig``), the same in local and service mode."""
    r = cfg.rollout
    return RolloutConfig(
        concurrency=max(1, concurrency),
        prompt_mode=PROMPT_MODES[r.prompt],
        sampling=SamplingConfig(
            max_tokens=r.max_tokens, temperature=r.temperature if temperature is None else temperature
        ),
        reward_spec=r.reward_spec,
        language=cfg.game.language,
        max_prompt_tokens=r.max_prompt_tokens,
    )


# --- in-process environment ---------------------------------------------------------------------------

MAX_TEXT_CHARS = 8_000
"""Characters of a free-text answer the game reads (the environment service's ``Limits.max_text_chars``)."""


@dataclass(kw_only=True)
class _Episode(Session):
    """The session (``wolfpack_games.session``: the rules the environment service plays by) with the
    seat tokens the driver answers with and what this stream last sent each seat."""

    tokens: dict[str, int] = field(default_factory=dict)  # token -> played seat
    admin_token: str = ""
    sent: dict[int, int] = field(default_factory=dict)  # seat -> turn id last sent (a re-prompt clears it)


class LocalEnvironment:
    """``wolfpack_rollout.backends.Environment`` over the game engines in this process."""

    def __init__(self) -> None:
        self.episodes: dict[str, _Episode] = {}
        self.observations = Observations()

    def play_stream(
        self, *, include_text: bool = True, close_finished: bool = False, rejected_results_only: bool = False
    ) -> LocalPlayStream:
        return LocalPlayStream(self, include_text=include_text, rejected_results_only=rejected_results_only)

    def create(self, req: env_pb.CreateEpisodeRequest) -> _Episode:
        """Start an episode as ``CreateEpisode`` does; raises ``ValueError`` naming what is wrong."""
        if req.scenario_id:
            raise ValueError("scenario_id needs the environment service's scenario store (service mode)")
        episode_id = uuid.uuid4().hex
        ep = start_session(
            _Episode, episode_id=episode_id, game_id=req.game.game_id, variant=req.game.variant, seed=req.seed,
            seats=seat_plans(req), default_bot=req.default_bot, language=req.language or "en",
            options={k: yaml.safe_load(v) for k, v in req.options.items()},
        )  # fmt: skip
        ep.tokens = {f"{episode_id}:{s}": s for s in ep.played_seats()}
        ep.admin_token = f"{episode_id}:admin"
        ep.advance()
        self.episodes[episode_id] = ep
        return ep

    def act(self, act: env_pb.SeatAct) -> env_pb.SeatActResult:
        """Apply one answer as ``EnvironmentService`` does (``Session.apply``: parse, step, re-prompt or
        default), then play on to the next decisions."""
        ep = self.episodes.get(act.episode_id)
        seat = ep.tokens.get(act.token) if ep is not None else None
        out = env_pb.SeatActResult(episode_id=act.episode_id, seat=seat or 0, turn_id=act.turn_id)
        if ep is None or seat is None or ep.done or ep.open_turns.get(seat) != act.turn_id:
            out.error.code = code_pb2.FAILED_PRECONDITION
            out.error.message = "not this seat's current turn"
            return out
        result = ep.apply(seat, act.raw_text[:MAX_TEXT_CHARS])
        out.accepted, out.reason, out.defaulted = result.accepted, result.reason, result.defaulted
        if result.action is not None:
            out.action.CopyFrom(action_to_pb(result.action))
        if not (result.accepted or result.defaulted):
            ep.sent.pop(seat, None)  # re-prompt: the same turn id is due again, now with feedback
        ep.advance()
        return out

    def observation(self, ep: _Episode, seat: int, include_text: bool, into: Any) -> None:
        self.observations.observation(ep, seat, include_text=include_text, into=into)

    async def get_episode(self, episode_id: str, token: str) -> env_pb.GetEpisodeResponse:
        """``GetEpisode`` with the admin token's full view (every role, the event log)."""
        return episode_state_pb(self.episodes[episode_id], None)

    async def close_episode(self, episode_id: str, admin_token: str) -> bool:
        ep = self.episodes.pop(episode_id, None)
        if ep is not None:
            ep.closed = True
            ep.env.close()
        return ep is not None


class LocalPlayStream:
    """One in-process PlaySeats call: ``create``/``act`` queue, ``read`` applies everything queued and
    answers with one message (the results, the new decisions of every episode it touched, the final
    observations of those that ended), so all due decisions reach inference as one batch."""

    def __init__(self, env: LocalEnvironment, *, include_text: bool, rejected_results_only: bool) -> None:
        self.env = env
        self.include_text = include_text
        self.rejected_results_only = rejected_results_only
        self.creates: list[env_pb.CreateEpisodeRequest] = []
        self.acts: list[env_pb.SeatAct] = []
        self.mail = asyncio.Event()
        self.closed = False

    def create(self, req: env_pb.CreateEpisodeRequest) -> None:
        self.creates.append(req)
        self.mail.set()

    def act(self, episode_id: str, token: str, turn_id: int, decision: str | common_pb2.Action) -> None:
        if not isinstance(decision, str):
            raise TypeError("the in-process environment takes free-text answers")
        self.acts.append(
            env_pb.SeatAct(episode_id=episode_id, token=token, turn_id=turn_id, raw_text=decision)
        )
        self.mail.set()

    async def read(self) -> env_pb.PlaySeatsResponse:
        while True:
            if self.closed:
                raise ConnectionError("the in-process PlaySeats stream was closed")
            await self.mail.wait()
            self.mail.clear()
            await asyncio.sleep(0)  # let the episodes started in this turn of the loop queue theirs too
            creates, self.creates = self.creates, []
            acts, self.acts = self.acts, []
            response = env_pb.PlaySeatsResponse()
            touched: dict[str, _Episode] = {}
            for req in creates:
                created = response.created.add(request_id=req.request_id)
                try:
                    ep = self.env.create(req)
                except Exception as exc:  # a bad request fails its episode alone, as in the service
                    created.error.code = code_pb2.INVALID_ARGUMENT
                    created.error.message = f"{type(exc).__name__}: {exc}"
                    continue
                created.episode.episode_id, created.episode.admin_token = ep.episode_id, ep.admin_token
                created.episode.num_seats = len(ep.env.possible_agents)
                for token, seat in sorted(ep.tokens.items(), key=lambda kv: kv[1]):
                    created.episode.seat_tokens.add(seat=seat, token=token)
                touched[ep.episode_id] = ep
            for act in acts:
                result = self.env.act(act)
                if not (result.accepted and self.rejected_results_only):
                    response.results.append(result)
                ep_or_none = self.env.episodes.get(act.episode_id)
                if ep_or_none is not None:
                    touched[act.episode_id] = ep_or_none
            for ep in touched.values():
                played = sorted(ep.tokens.values())
                if ep.env.done:
                    for seat in played:
                        self.env.observation(ep, seat, self.include_text, response.decisions)
                    continue
                for seat, turn_id in ep.open_turns.items():
                    if ep.sent.get(seat) != turn_id:
                        ep.sent[seat] = turn_id
                        self.env.observation(ep, seat, self.include_text, response.decisions)
            if response.created or response.results or response.decisions:
                return response

    async def close(self) -> None:
        self.closed = True
        self.mail.set()


# --- in-process inference and reward --------------------------------------------------------------------

PolicyFn = Callable[[str, list[list[int]], common_pb2.SamplingParams], list[Generated]]
"""(policy id, prompts, sampling) → generations: how a batch of trainee decisions is answered."""


@dataclass(frozen=True, slots=True)
class Answered:
    """A request of a batch answered in process (a ``BatchResult``, as the inference client's ``BatchItem``
    with a response). Its ``code`` is OK, as gRPC's member, which is read only of failed items: answering
    loads no gRPC."""

    index: int
    response: inf_pb.GenerateResponse
    message: str = ""

    @property
    def code(self) -> grpc.StatusCode:
        import grpc

        return grpc.StatusCode.OK


class LocalInference:
    """``wolfpack_rollout.backends.Inference`` from the learners in this process: each policy's prompts of
    a batch are sampled together by ``policy``; responses carry the policy's current version."""

    def __init__(self, tokenizer: Any, policy: PolicyFn, versions: Callable[[], Mapping[str, int]]) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.versions = versions

    async def generate_batch(
        self, requests: Sequence[inf_pb.GenerateRequest], *, timeout: float | None = None
    ) -> AsyncIterator[BatchResult]:
        by_policy: dict[str, list[tuple[int, list[int]]]] = {}
        for i, req in enumerate(requests):
            if req.HasField("tokens"):
                ids = [int(t) for t in req.tokens.token_ids]
            else:
                ids = chat_ids(
                    self.tokenizer, [{"role": m.role, "content": m.content} for m in req.chat.messages]
                )
            by_policy.setdefault(req.policy_id, []).append((i, ids))
        versions = self.versions()
        for policy_id, items in by_policy.items():
            if policy_id not in versions:
                import grpc

                from wolfpack_rollout.client import BatchItem

                for i, _ in items:
                    yield BatchItem(
                        i, None, grpc.StatusCode.NOT_FOUND, f"policy {policy_id!r} is not in process"
                    )
                continue
            gens = self.policy(policy_id, [ids for _, ids in items], requests[items[0][0]].sampling)
            for (i, ids), gen in zip(items, gens, strict=True):
                resp = inf_pb.GenerateResponse(prompt_token_ids=ids)
                resp.completions.add(
                    token_ids=gen.token_ids, logprobs=gen.logprobs, finish_reason=gen.finish,  # type: ignore[arg-type]
                    text=self.tokenizer.decode(gen.token_ids, skip_special_tokens=True),
                )  # fmt: skip
                resp.usage.prompt_tokens, resp.usage.completion_tokens = len(ids), len(gen.token_ids)
                resp.policy.policy_id, resp.policy.version = policy_id, versions[policy_id]
                yield Answered(i, resp)


class LocalReward:
    """``wolfpack_rollout.backends.Reward`` from the reward library (the reward service's own specs)."""

    async def score(self, request: rew_pb.ScoreRequest) -> rew_pb.ScoreResponse:
        try:
            return score(request.trajectory, request.spec)
        except ScoreError as exc:  # what the service answers: INVALID_ARGUMENT (the episode fails by it)
            import grpc

            raise grpc.aio.AioRpcError(
                grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(), str(exc)
            ) from None


def local_driver(
    config: RolloutConfig, tokenizer: Any, policy: PolicyFn, versions: Callable[[], Mapping[str, int]]
) -> RolloutDriver:
    """The rollout driver over in-process environment, inference and reward."""
    return RolloutDriver(
        dataclasses.replace(config, worker_id=config.worker_id or "local"),
        environment=LocalEnvironment(),
        inference=LocalInference(tokenizer, policy, versions),
        reward=LocalReward(),
        encode_prompt=prompt_encoder(tokenizer),
        chat_codec=TokenizerCodec(tokenizer),
    )


def check_penalty(reward_spec: str, game_id: str, invalid_penalty: float | None) -> None:
    """``rollout.invalid_penalty``, when given, must equal the spec's penalty for an invalid turn: a spec's
    ``name@version`` says how its rewards were made, so a different penalty is a different (registered)
    spec, never a silent override."""
    configured = resolve_spec(reward_spec, game_id).config.penalties.invalid
    if invalid_penalty is not None and invalid_penalty != configured:
        raise ValueError(
            f"invalid_penalty {invalid_penalty} differs from reward spec "
            f"{resolve_spec(reward_spec, game_id).key}'s {configured}; name a spec variant with that "
            "penalty instead (reward specs are registered by name@version)"
        )


def play(
    tasks: Sequence[Any],
    driver: RolloutDriver,
) -> list[trajectory_pb2.Trajectory]:
    """Play curriculum ``Task`` protos through ``driver`` on a fresh event loop of this thread (the trainer
    runs it in a worker thread, so its own loop keeps serving): the scored trajectories in task order,
    failed episodes left out and counted in ``driver.stats``."""
    return asyncio.run(driver.play(list(tasks)))
