"""Sotopia compatibility: any Wolfpack ``GameEnv`` behind sotopia 0.1.5's ``ParallelSotopiaEnv`` surface.

Why: sotopia is the common harness for social-intelligence agents. Wrapping our engines in its
environment class and its own message types (``AgentAction``, ``Observation``) lets any sotopia agent —
its ``LLMAgent`` on an OpenAI-compatible endpoint, a ``HumanAgent``, or our scripted bots wrapped as
``ScriptedSotopiaAgent`` — take a seat in Werewolf or a verifiable scenario, and lets sotopia's own
runner (``sotopia.server.arun_one_episode``) drive our games.

What is ours and what is sotopia's:

* The **engine** decides everything that matters: whose turn it is, what is legal, how free text is
  parsed, invalid actions (re-prompt via observation feedback, then the default action and a penalty),
  termination and the outcome. Sotopia's evaluators are not used (its rewards are always 0 in 0.1.5),
  so ``step``/``astep`` are overridden completely; rewards are the engine outcome (+1/-1/0) on the
  final step and 0 before.
* Sotopia's **message types** carry it: ``Observation.last_turn`` is the seat's full observation text
  (cumulative: rules, role, everything the seat has seen, the legal actions, feedback), and
  ``available_actions`` is ``["speak"]`` for text kinds (Werewolf ``speak``, scenario ``say``/``final``),
  ``["action"]`` for structured kinds (``vote``/``kill``/``inspect``/...) and ``["none"]`` when the seat is
  not acting.
* ``AgentAction`` → engine input: ``speak`` (or non-verbal) on a phase with a single text kind becomes
  ``Action(kind, text=argument)``; everything else passes the argument as free text to the engine's
  parser, so an LLM's loose output ("I vote for player 3", ``{"action": "vote", "target": 3}``) works and
  a wrong ``action_type`` is forgiven. ``none``/``leave`` from an acting seat is an empty message: silence
  in a speech, an invalid action (re-prompt, then default) elsewhere.

Storage: importing sotopia connects to a Redis *Stack* by default (RedisJSON + RediSearch, which plain
Redis lacks). Nothing here stores anything, so ``SOTOPIA_STORAGE_BACKEND`` defaults to ``local`` (a JSON
folder, ``~/.sotopia/data``) before sotopia is imported; set it yourself to keep Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# Must run before the first ``import sotopia``: its database package picks the backend at import time.
os.environ.setdefault("SOTOPIA_STORAGE_BACKEND", "local")

from gymnasium.spaces.dict import Dict as DictSpace
from gymnasium.spaces.discrete import Discrete
from gymnasium.spaces.text import Text
from sotopia.agents import BaseAgent
from sotopia.database import AgentProfile, EnvironmentProfile
from sotopia.envs import ParallelSotopiaEnv
from sotopia.messages import (
    ActionType,
    AgentAction,
    Observation,
    ScriptBackground,
    SimpleMessage,
)

from wolfpack_games.base import Action, GameEnv, get_game, make_game

__all__ = [
    "AVAILABLE_ACTION_TYPES",
    "EpisodeResult",
    "ScriptedSotopiaAgent",
    "SotopiaAgent",
    "WolfpackSotopiaEnv",
    "agent_action_for",
    "run_episode",
]

SotopiaAgent = BaseAgent[Observation, AgentAction]
"""What can take a seat: any sotopia agent over sotopia's own message types."""

AVAILABLE_ACTION_TYPES: tuple[ActionType, ...] = ("none", "speak", "action")
"""The sotopia action types this adapter ever offers (it never offers ``non-verbal communication`` or
``leave``: our games have no such moves, though both are accepted and mapped)."""

StepReturn = tuple[
    dict[str, Observation],
    dict[str, float],
    dict[str, bool],
    dict[str, bool],
    dict[str, dict[Any, Any]],
]


def _natural_names(game: GameEnv) -> list[str]:
    """The names the engine's own text uses: a scenario's player names, else ``Player 1..N``.

    Matching them matters for LLM agents: sotopia prompts "Imagine you are {agent_name}", and the
    observation text addresses the seat by these names.
    """
    scenario = getattr(game, "scenario", None)
    players = getattr(scenario, "players", None)
    if players is not None and len(players) == len(game.possible_agents):
        return [str(p.name) for p in players]
    return [f"Player {seat + 1}" for seat in game.possible_agents]


def _in_memory_profile(scenario: str) -> EnvironmentProfile:
    """An unsaved ``EnvironmentProfile``.

    Under the Redis backend (sotopia imported before this module with ``SOTOPIA_STORAGE_BACKEND``
    unset or ``redis``) the profile is a redis-om model whose constructor probes the server for
    RedisJSON; skipping validation keeps our env usable without one (nothing is ever saved).
    """
    try:
        return EnvironmentProfile(scenario=scenario, agent_goals=[])
    except Exception:  # redis-om's probe: no server, or one without RedisJSON
        return EnvironmentProfile.model_construct(pk="", scenario=scenario, agent_goals=[])


class WolfpackSotopiaEnv(ParallelSotopiaEnv):
    """A Wolfpack engine as a sotopia ``ParallelSotopiaEnv`` (agents keyed by name, seat i = i-th name).

    ``game`` is an engine instance or a registered game id (then ``variant`` and ``game_options`` build
    it with ``make_game``). The engine stays reachable as ``.game`` (for transcripts, scripted bots and
    tests); ``seat_of(name)``/``name_of(seat)`` map between sotopia names and engine seats.
    """

    def __init__(
        self,
        game: GameEnv | str,
        variant: str = "",
        *,
        game_options: Mapping[str, Any] | None = None,
        model_name: str = "wolfpack-engine",
    ) -> None:
        self.game: GameEnv = (
            make_game(game, variant, **dict(game_options or {})) if isinstance(game, str) else game
        )
        description = get_game(self.game.game_id).description
        # A profile is required by ParallelSotopiaEnv and read by sotopia's runner (goals, pk); it is
        # built in memory and never saved. Goals are role-free on purpose: roles are hidden information
        # and reach each seat only through its own observation.
        super().__init__(
            available_action_types=set(AVAILABLE_ACTION_TYPES),
            action_order="simultaneous",
            evaluators=[],
            terminal_evaluators=[],  # unused: step/astep are overridden, the engine decides the end
            model_name=model_name,
            env_profile=_in_memory_profile(description),
        )
        # ParallelSotopiaEnv stores a list built from a set (random order); keep ours stable.
        self.available_action_types = list(AVAILABLE_ACTION_TYPES)
        self._seat_names: list[str] = []
        self._names_to_seat: dict[str, int] = {}
        self.turn_number = 0
        self.last_infos: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ names
    def seat_of(self, name: str) -> int:
        return self._names_to_seat[name]

    def name_of(self, seat: int) -> str:
        return self._seat_names[seat]

    def default_agent_names(
        self, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> list[str]:
        """The natural names for this seed (scenario names depend on the generated scenario).

        Resets the engine to find out (engines are cheap and seeded, so the next ``reset`` with the
        same seed is unaffected). Use these as ``agent_name`` of the agents you seat.
        """
        self.game.reset(seed=seed, options=options)
        return _natural_names(self.game)

    def goal_for(self, seat: int) -> str:
        """The sotopia goal of a seat: what to do, never what its role is (see the class docstring)."""
        name = self._seat_names[seat]
        return (
            f"You are {name} in {self.game.game_id}. Win the game: your role, the rules, what you have "
            "seen and your legal actions are in your observations. Use 'speak' to talk and 'action' "
            "for moves such as votes (e.g. 'vote 3')."
        )

    # ------------------------------------------------------------------ reset / step
    def reset(
        self,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        agents: Mapping[str, SotopiaAgent] | None = None,
        omniscient: bool = False,
        lite: bool = False,
    ) -> dict[str, Observation]:
        """Start a game; returns each name's first ``Observation`` (turn 0).

        ``options`` go to the engine's ``reset`` (e.g. Werewolf config overrides, a scenario). Names come
        from ``agents`` (sotopia's convention: its keys, in order, are seats 0..N-1), else from the
        engine's text. ``omniscient``/``lite`` exist for sotopia's runner and are ignored: what a seat may
        see is the engine's rule, not the harness's.
        """
        del omniscient, lite
        self.reset_inbox()
        self.game.reset(seed=seed, options=options)
        seats = list(self.game.possible_agents)
        names = list(agents.keys()) if agents is not None else _natural_names(self.game)
        if len(names) != len(seats) or len(set(names)) != len(names):
            raise ValueError(
                f"{self.game.game_id} has {len(seats)} seats; got {len(names)} agent names {names!r} "
                "(they must be distinct, one per seat, in seat order)"
            )
        self._seat_names = names
        self._names_to_seat = {name: seat for seat, name in zip(seats, names, strict=True)}
        self.agents = list(names)
        self.possible_agents = list(names)
        self.turn_number = 0
        self.last_infos = {}
        goals = [self.goal_for(seat) for seat in seats]
        self.profile.agent_goals = goals
        self.background = ScriptBackground(
            scenario=self.profile.scenario,
            agent_names=list(names),
            agent_backgrounds=["" for _ in names],
            agent_goals=goals,
        )
        self.action_spaces = {
            name: DictSpace(
                {"action_type": Discrete(len(self.available_action_types)), "argument": Text(4096)}
            )
            for name in names
        }
        self.recv_message("Environment", self.background)
        return self._observations()

    def step(self, actions: Mapping[str, AgentAction] | Mapping[str, Mapping[str, Any]]) -> StepReturn:
        """Apply the acting seats' actions; returns ``(observations, rewards, terminated, truncated, info)``.

        Actions of seats that are not acting are ignored (sotopia masks them to ``none`` too); an acting
        seat without an action stays acting. ``terminated`` is true for every name once the engine is
        done, including a Werewolf day-limit draw (which also sets ``truncated``): sotopia's runner stops
        on ``terminated`` only. ``info[name]`` carries the engine's per-seat info (``invalid_reason``,
        ``defaulted``, ``penalty``, ...), plus ``comments`` and ``complete_rating`` (the outcome) that
        sotopia's runner reads.
        """
        if not self._seat_names:
            raise RuntimeError("call reset() before step()")
        self.turn_number += 1
        compiled = {name: self._compile(action) for name, action in actions.items()}
        self.recv_message("Environment", SimpleMessage(message=f"Turn #{self.turn_number}"))
        engine_actions: dict[int, Action | str] = {}
        acting = set(self.game.acting_seats())
        for name, action in compiled.items():
            seat = self._names_to_seat.get(name)
            if seat is None:
                raise KeyError(f"unknown agent {name!r}; agents: {self._seat_names}")
            if seat not in acting:
                continue
            self.recv_message(name, action)
            engine_actions[seat] = self._to_engine(seat, action)
        result = self.game.step(engine_actions) if engine_actions else None
        self.last_infos = dict(result.infos) if result is not None else {}
        done = self.game.done
        outcome = self.game.outcome() if done else {}
        truncated = bool(result is not None and any(result.truncations.values()))
        comments = f"winner: {self.game.winner() or 'none (draw)'}" if done else ""
        info: dict[str, dict[Any, Any]] = {}
        for seat, name in enumerate(self._seat_names):
            entry: dict[Any, Any] = dict(self.last_infos.get(seat, {}))
            entry.update(seat=seat, comments=comments, complete_rating=float(outcome.get(seat, 0)))
            info[name] = entry
        if done:
            self.recv_message("Environment", SimpleMessage(message=f"Game over. {comments}"))
        return (
            self._observations(),
            {name: float(outcome.get(seat, 0)) for seat, name in enumerate(self._seat_names)},
            {name: done for name in self._seat_names},
            {name: truncated for name in self._seat_names},
            info,
        )

    async def astep(self, actions: Mapping[str, AgentAction] | Mapping[str, Mapping[str, Any]]) -> StepReturn:
        """``step`` for sotopia's async runner: engines are pure and fast, so nothing is awaited."""
        return self.step(actions)

    @property
    def done(self) -> bool:
        return self.game.done

    # ------------------------------------------------------------------ mapping
    def available_actions(self, seat: int) -> list[ActionType]:
        """Sotopia action types for a seat now: ``speak`` for text kinds, ``action`` for the rest."""
        legal = self.game.legal_actions(seat)
        if not legal:
            return ["none"]
        types: list[ActionType] = []
        if any(la.needs_text for la in legal):
            types.append("speak")
        if any(not la.needs_text for la in legal):
            types.append("action")
        return types

    def _observations(self) -> dict[str, Observation]:
        acting = set(self.game.acting_seats())
        self.action_mask = [seat in acting for seat in range(len(self._seat_names))]
        out: dict[str, Observation] = {}
        natural = _natural_names(self.game)
        for seat, name in enumerate(self._seat_names):
            text = self.game.observe(seat).text
            if name != natural[seat]:  # a renamed seat must still know which one it is in the text
                text = f"(You, {name}, are {natural[seat]} in this game.)\n{text}"
            out[name] = Observation(
                last_turn=text,
                turn_number=self.turn_number,
                available_actions=self.available_actions(seat) if seat in acting else ["none"],
            )
        return out

    def _compile(self, action: AgentAction | Mapping[str, Any]) -> AgentAction:
        """Accept sotopia's two action forms: an ``AgentAction`` or an action-space sample (index)."""
        if isinstance(action, AgentAction):
            return action
        data = dict(action)
        kind = data.get("action_type", "none")
        if isinstance(kind, int):
            data["action_type"] = self.available_action_types[kind]
        return AgentAction.model_validate(data)

    def _to_engine(self, seat: int, action: AgentAction) -> Action | str:
        """One sotopia action → engine input (see the module docstring for the rules)."""
        if action.action_type in ("none", "leave"):
            return ""
        legal = self.game.legal_actions(seat)
        if (
            action.action_type in ("speak", "non-verbal communication")
            and len(legal) == 1
            and legal[0].needs_text
        ):
            return Action(legal[0].kind, text=action.argument)
        return action.argument


# ---------------------------------------------------------------------- scripted agents


def agent_action_for(game: GameEnv, seat: int, action: Action) -> AgentAction:
    """Express an engine ``Action`` as the ``AgentAction`` an agent would send for it.

    Text kinds become ``speak``; the rest become ``action`` with "kind <player number>" text, checked to
    parse back to the same action (JSON otherwise), so a scripted game through the adapter is the same
    game as one played directly on the engine.
    """
    legal = {la.kind: la for la in game.legal_actions(seat)}
    spec = legal.get(action.kind)
    if spec is not None and spec.needs_text:
        return AgentAction(action_type="speak", argument=action.text)
    text = action.kind if action.target is None else f"{action.kind} {action.target + 1}"
    if game.parse(seat, text).action != action:
        payload: dict[str, Any] = {"action": action.kind}
        if action.target is not None:
            payload["target"] = action.target + 1
        text = json.dumps(payload)
    return AgentAction(action_type="action", argument=text)


class ScriptedSotopiaAgent(BaseAgent[Observation, AgentAction]):
    """A genuine sotopia agent playing one of the game's registered bots (``heuristic``/``random``).

    Why it holds the env: our bots read the engine through its seat-scoped API (``knowledge(seat)``,
    legal actions), which is richer than the observation text; the agent asks only about its own seat.
    Seeded per agent, so a game's outcome depends only on the env seed and the agents' seeds.
    """

    def __init__(
        self,
        env: WolfpackSotopiaEnv,
        agent_name: str | None = None,
        *,
        bot: str | Callable[[GameEnv, int, random.Random], Action] = "",
        seed: int = 0,
        agent_profile: AgentProfile | None = None,
    ) -> None:
        super().__init__(agent_name=agent_name, agent_profile=agent_profile)
        self.env = env
        bots = get_game(env.game.game_id).bots
        self.bot: Callable[[GameEnv, int, random.Random], Action] = (
            bot if callable(bot) else bots[bot or get_game(env.game.game_id).default_bot]
        )
        self.model_name = f"wolfpack-bot:{getattr(self.bot, '__name__', 'bot')}"
        self.seed = seed
        self.rng = random.Random(seed)

    def reset(self) -> None:
        super().reset()
        self.rng = random.Random(self.seed)

    def act(self, obs: Observation) -> AgentAction:
        self.recv_message("Environment", obs)
        if obs.available_actions == ["none"]:
            return AgentAction(action_type="none", argument="")
        seat = self.env.seat_of(self.agent_name)
        return agent_action_for(self.env.game, seat, self.bot(self.env.game, seat, self.rng))

    async def aact(self, obs: Observation) -> AgentAction:
        return self.act(obs)


# ---------------------------------------------------------------------- runner


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    """A finished game: per-name engine outcome (+1/-1/0), winner, steps, and engine penalties."""

    outcome: dict[str, int]
    winner: str
    turns: int
    truncated: bool
    penalties: dict[str, int] = field(default_factory=dict)


async def run_episode(
    env: WolfpackSotopiaEnv,
    agents: Mapping[str, SotopiaAgent] | Sequence[SotopiaAgent],
    *,
    seed: int | None = None,
    options: Mapping[str, Any] | None = None,
    history: Literal["latest", "all"] = "latest",
    max_steps: int = 10_000,
) -> EpisodeResult:
    """Play one game with sotopia agents (a sequence is keyed by ``agent_name``); returns the outcome.

    Unlike sotopia's ``arun_one_episode`` (which also works with this env, but asks *every* agent every
    turn and needs agent profiles), only the acting seats are asked, concurrently, each step — a
    Werewolf speech phase has one speaker and sotopia's ``LLMAgent`` would otherwise buffer N-1 idle
    observations per step. ``history="latest"`` clears an agent's inbox before each turn: our
    observation text is already cumulative, and re-sending every earlier one would grow an LLM prompt
    quadratically. Goals are set from the env when an agent has none (``LLMAgent`` would otherwise
    spend a model call inventing one).
    """
    seated: dict[str, SotopiaAgent] = (
        dict(agents) if isinstance(agents, Mapping) else {a.agent_name: a for a in agents}
    )
    observations = env.reset(seed=seed, options=options, agents=seated)
    for seat, name in enumerate(env.agents):
        agent = seated[name]
        agent.reset()
        if getattr(agent, "_goal", None) is None:
            agent.goal = env.goal_for(seat)
    penalties = dict.fromkeys(env.agents, 0)
    truncated = False
    while not env.done:
        if env.turn_number >= max_steps:
            raise RuntimeError(f"{env.game.game_id} did not end within {max_steps} steps")
        acting = [name for name in env.agents if observations[name].available_actions != ["none"]]
        if history == "latest":
            for name in acting:
                seated[name].reset_inbox()
        replies = await asyncio.gather(*(seated[name].aact(observations[name]) for name in acting))
        observations, _, _, truncations, info = await env.astep(dict(zip(acting, replies, strict=True)))
        truncated = any(truncations.values())
        for name in acting:
            if info[name].get("penalty"):
                penalties[name] += 1
    outcome = env.game.outcome()
    return EpisodeResult(
        outcome={name: outcome[seat] for seat, name in enumerate(env.agents)},
        winner=env.game.winner(),
        turns=env.turn_number,
        truncated=truncated,
        penalties=penalties,
    )
