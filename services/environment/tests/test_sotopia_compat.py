"""Wolfpack engines behind sotopia 0.1.5: real sotopia types, agents and runner; no mocks of sotopia.

The LLMAgent test talks to a local fake OpenAI-compatible HTTP server (aiohttp) with canned chat
completions: sotopia → litellm → HTTP are all real, only the model is a stand-in.
"""

from __future__ import annotations

import os

# Before sotopia's first import, as sotopia_compat does (sotopia picks its storage backend at import
# time and its default needs a Redis Stack); this file imports sotopia itself, and may do so first.
os.environ.setdefault("SOTOPIA_STORAGE_BACKEND", "local")

import json
import random
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from sotopia.agents import LLMAgent
from sotopia.database import AgentProfile
from sotopia.envs import ParallelSotopiaEnv
from sotopia.messages import AgentAction, Observation
from sotopia.server import arun_one_episode

from wolfpack_environment.sotopia_compat import (
    ScriptedSotopiaAgent,
    WolfpackSotopiaEnv,
    agent_action_for,
    run_episode,
)
from wolfpack_games import get_game, make_game
from wolfpack_games.base import Action, GameEnv
from wolfpack_games.scenarios import verify

WOLF_ROLES = {"werewolf", "wolf_king"}


def scripted(env: WolfpackSotopiaEnv, seed: int, bot: str = "heuristic") -> list[ScriptedSotopiaAgent]:
    names = env.default_agent_names(seed=seed)
    return [ScriptedSotopiaAgent(env, name, bot=bot, seed=seed * 100 + i) for i, name in enumerate(names)]


async def step_until(
    env: WolfpackSotopiaEnv,
    agents: dict[str, ScriptedSotopiaAgent],
    obs: dict[str, Observation],
    stop: Callable[[dict[str, Observation]], bool],
) -> dict[str, Observation]:
    """Play scripted turns until ``stop(observations)``; returns the observations at that point."""
    while not stop(obs):
        assert not env.done, "game ended before the wanted state"
        acting = [n for n in env.agents if obs[n].available_actions != ["none"]]
        obs, *_ = await env.astep({n: await agents[n].aact(obs[n]) for n in acting})
    return obs


@pytest.mark.parametrize(("variant", "seed"), [("6p", 1), ("6p", 7), ("9p", 2), ("9p", 11)])
async def test_werewolf_game_with_sotopia_agents_runs_to_a_winner(variant: str, seed: int) -> None:
    env = WolfpackSotopiaEnv("werewolf_v1", variant)
    result = await run_episode(env, scripted(env, seed), seed=seed)
    assert env.done
    assert result.winner in {"village", "wolves"}
    assert set(result.outcome) == set(env.agents) and len(env.agents) == int(variant[:-1])
    assert set(result.outcome.values()) == {1, -1}
    for seat, name in enumerate(env.agents):
        won = env.game.team(seat) == result.winner
        assert result.outcome[name] == (1 if won else -1)
    assert sum(result.penalties.values()) == 0  # scripted actions all parse back exactly


async def test_same_seed_same_game_and_outcome() -> None:
    runs = []
    for _ in range(2):
        env = WolfpackSotopiaEnv("werewolf_v1", "9p")
        result = await run_episode(env, scripted(env, 5, bot="random"), seed=5)
        runs.append((result, list(env.game.events)))
    assert runs[0] == runs[1]


@pytest.mark.parametrize(("variant", "bot"), [("9p", "heuristic"), ("12p", "random")])
async def test_adapter_is_lossless_against_direct_engine_play(variant: str, bot: str) -> None:
    """The same bots with the same seeds give the same event log through sotopia as on the engine."""
    seed = 3
    env = WolfpackSotopiaEnv("werewolf_v1", variant)
    await run_episode(env, scripted(env, seed, bot=bot), seed=seed)

    direct: GameEnv = make_game("werewolf_v1", variant)
    direct.reset(seed=seed)
    play = get_game("werewolf_v1").bots[bot]
    rngs = [random.Random(seed * 100 + i) for i in direct.possible_agents]
    while not direct.done:
        direct.step({s: play(direct, s, rngs[s]) for s in direct.acting_seats()})
    assert env.game.events == direct.events
    assert env.game.outcome() == direct.outcome()


async def test_observations_are_sotopia_types_with_mapped_action_types() -> None:
    env = WolfpackSotopiaEnv("werewolf_v1", "6p")
    assert isinstance(env, ParallelSotopiaEnv)
    agents = {a.agent_name: a for a in scripted(env, 1)}
    obs = env.reset(seed=1, agents=agents)
    assert list(obs) == [f"Player {i}" for i in range(1, 7)] == env.agents
    assert all(type(o) is Observation for o in obs.values())
    assert all(o.turn_number == 0 and "Your role:" in o.last_turn for o in obs.values())
    acting = env.game.acting_seats()  # night 1 starts with wolf chat: one speaker
    assert [obs[n].available_actions for n in env.agents] == [
        ["speak"] if s in acting else ["none"] for s in range(6)
    ]
    assert env.action_mask == [s in acting for s in range(6)]
    # Advance to the wolves' kill vote: a structured action for every living wolf at once.
    obs = await step_until(
        env, agents, obs, lambda o: any(x.available_actions == ["action"] for x in o.values())
    )
    voters = [n for n in env.agents if obs[n].available_actions == ["action"]]
    assert {env.game.role(env.seat_of(n)) for n in voters} <= WOLF_ROLES
    assert all(obs[n].turn_number == env.turn_number > 0 for n in env.agents)
    # sotopia's action-space form (an index into available_action_types) is accepted too
    target = next(s for s in range(6) if env.game.role(s) not in WOLF_ROLES) + 1
    index = env.available_action_types.index("action")
    _, rewards, terminated, truncated, info = env.step(
        {n: {"action_type": index, "argument": f"kill {target}"} for n in voters}
    )
    assert all(not info[n].get("invalid_reason") for n in voters)
    assert set(rewards.values()) == {0.0} and not any(terminated.values()) and not any(truncated.values())


async def test_malformed_agent_action_is_reprompted_then_defaulted_by_the_engine() -> None:
    env = WolfpackSotopiaEnv("werewolf_v1", "6p")  # preset: max_reprompts = 1
    agents = {a.agent_name: a for a in scripted(env, 2)}
    obs = env.reset(seed=2, agents=agents)
    obs = await step_until(
        env, agents, obs, lambda o: any(x.available_actions == ["action"] for x in o.values())
    )
    name = next(n for n in env.agents if obs[n].available_actions == ["action"])
    seat = env.seat_of(name)
    garbage = AgentAction(action_type="action", argument="~~ purple monkey dishwasher ~~")

    obs, rewards, terminated, _, info = env.step({name: garbage})
    assert info[name]["invalid_reason"] and not info[name].get("defaulted")
    assert seat in env.game.acting_seats() and obs[name].available_actions == ["action"]
    feedback = env.game.observe(seat).feedback
    assert feedback and feedback in obs[name].last_turn  # the re-prompt reaches the seat's observation

    obs, rewards, terminated, _, info = env.step({name: garbage})
    assert info[name]["defaulted"] and info[name]["penalty"]
    assert seat not in env.game.acting_seats() or env.game.events[-1].kind != "invalid"
    # the game goes on and still ends normally
    rest = {n: a for n, a in agents.items()}
    while not env.done:
        acting = [n for n in env.agents if obs[n].available_actions != ["none"]]
        obs, rewards, terminated, *_ = await env.astep({n: await rest[n].aact(obs[n]) for n in acting})
    assert all(terminated.values()) and set(rewards.values()) == {1.0, -1.0}


async def test_none_from_an_acting_seat_is_an_invalid_move_not_a_hang() -> None:
    env = WolfpackSotopiaEnv("werewolf_v1", "6p")
    agents = {a.agent_name: a for a in scripted(env, 4)}
    obs = env.reset(seed=4, agents=agents)
    obs = await step_until(
        env, agents, obs, lambda o: any(x.available_actions == ["action"] for x in o.values())
    )
    name = next(n for n in env.agents if obs[n].available_actions == ["action"])
    _, _, _, _, info = env.step({name: AgentAction(action_type="none", argument="")})
    assert info[name]["invalid_reason"]
    _, _, _, _, info = env.step({name: AgentAction(action_type="leave", argument="")})
    assert info[name]["defaulted"]


async def test_bargaining_scenario_with_sotopia_agents_ends_with_a_verified_outcome() -> None:
    for seed in (1, 2, 3):
        env = WolfpackSotopiaEnv("bargaining_v1", "medium")
        agents = scripted(env, seed)
        names = [a.agent_name for a in agents]
        scenario = env.game.scenario  # type: ignore[attr-defined]  # ScenarioGame attribute
        assert names == [p.name for p in scenario.players]  # seats named as the scenario names them
        result = await run_episode(env, agents, seed=seed)
        assert env.done
        verified = verify(env.game.scenario, env.game.transcript)  # type: ignore[attr-defined]
        assert result.outcome == {names[s]: v for s, v in verified.outcomes.items()}
        assert all(v in (-1, 0, 1) for v in result.outcome.values())


async def test_scenario_speech_maps_to_say_or_final_by_the_engine_parser() -> None:
    env = WolfpackSotopiaEnv("bargaining_v1", "medium")
    obs = env.reset(seed=1)
    first = next(n for n in env.agents if obs[n].available_actions != ["none"])
    assert obs[first].available_actions == ["speak"]
    env.step({first: AgentAction(action_type="speak", argument="Hello! FINAL_BID: 123")})
    assert env.game.transcript == [(env.seat_of(first), "Hello! FINAL_BID: 123")]  # type: ignore[attr-defined]
    assert [e.kind for e in env.game.events if e.actor == env.seat_of(first)][-1] == "final"


async def test_no_seat_sees_another_seats_hidden_role_or_wolf_chat() -> None:
    env = WolfpackSotopiaEnv("werewolf_v1", "9p")
    agents = {a.agent_name: a for a in scripted(env, 8, bot="random")}
    obs = env.reset(seed=8, agents=agents)
    roles = {s: env.game.role(s) for s in range(9)}
    goals = " ".join([*env.profile.agent_goals, *env.background.agent_goals]).lower()
    assert not any(re.search(rf"\b{role}\b", goals) for role in set(roles.values()))
    checked = 0
    while not env.done:
        for seat, name in enumerate(env.agents):
            text = obs[name].last_turn
            for other in range(9):
                if other != seat:
                    assert f"Player {other + 1}, your role is" not in text
            assert re.findall(r"Your role: (\w+)", text) == [re.findall(r"Your role: (\w+)", text)[0]]
            if roles[seat] not in WOLF_ROLES:
                wolf_lines = {e.text for e in env.game.events if e.kind == "wolf_speech"}
                assert not any(line in text for line in wolf_lines), f"wolf chat reached seat {seat}"
                checked += 1
        acting = [n for n in env.agents if obs[n].available_actions != ["none"]]
        obs, *_ = await env.astep({n: await agents[n].aact(obs[n]) for n in acting})
    assert checked > 50


async def test_sotopias_own_runner_drives_a_werewolf_game() -> None:
    env = WolfpackSotopiaEnv("werewolf_v1", "6p")
    agents = [
        ScriptedSotopiaAgent(
            env, agent_profile=AgentProfile(first_name="Player", last_name=str(i + 1)), seed=i
        )
        for i in range(6)
    ]
    messages = await arun_one_episode(env, agents)
    assert env.done and env.game.winner() in {"village", "wolves"}
    assert isinstance(messages, list) and messages


async def test_renamed_agents_are_told_their_seat() -> None:
    env = WolfpackSotopiaEnv("werewolf_v1", "6p")
    names = ["Ada", "Bo", "Cy", "Di", "Ed", "Flo"]
    agents = {n: ScriptedSotopiaAgent(env, n, seed=i) for i, n in enumerate(names)}
    obs = env.reset(seed=1, agents=agents)
    assert obs["Cy"].last_turn.startswith("(You, Cy, are Player 3 in this game.)")
    result = await run_episode(env, agents, seed=1)
    assert list(result.outcome) == names
    with pytest.raises(ValueError, match="6 seats"):
        env.reset(seed=1, agents={n: agents[n] for n in names[:5]})


def test_scripted_actions_round_trip_through_text() -> None:
    env = make_game("werewolf_v1", "12p")
    env.reset(seed=9)
    rng = random.Random(9)
    play = get_game("werewolf_v1").bots["heuristic"]
    while not env.done:
        actions: dict[int, Action] = {s: play(env, s, rng) for s in env.acting_seats()}
        for seat, action in actions.items():
            sent = agent_action_for(env, seat, action)
            if sent.action_type == "action":
                assert env.parse(seat, sent.argument).action == action
        env.step(actions)


# ---------------------------------------------------------------------- LLMAgent over HTTP


@pytest.fixture
async def fake_openai() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A local OpenAI-compatible chat-completions endpoint with canned replies (a test double for a
    remote model). Replies follow the action types sotopia lists in its prompt."""
    requests: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        prompt = body["messages"][-1]["content"]
        found = re.search(r"available action types are\s+([a-z \-]+)\.", prompt)
        types = found.group(1).split() if found else ["speak"]
        if "speak" in types:
            reply = {"action_type": "speak", "argument": "I am a simple villager. Player 2 seems suspicious."}
        else:
            reply = {"action_type": "action", "argument": "I vote for player 2"}
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "fake"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": json.dumps(reply)},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp internals
    try:
        yield f"http://127.0.0.1:{port}/v1", requests
    finally:
        await runner.cleanup()


async def test_llm_agent_takes_a_seat_via_an_openai_compatible_endpoint(
    fake_openai: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    base_url, requests = fake_openai
    monkeypatch.setenv("CUSTOM_API_KEY", "test-key")
    env = WolfpackSotopiaEnv("werewolf_v1", "6p")
    names = env.default_agent_names(seed=1)
    agents: list[Any] = [ScriptedSotopiaAgent(env, n, seed=i) for i, n in enumerate(names)]
    agents[0] = LLMAgent(agent_name=names[0], model_name=f"custom/fake-model@{base_url}")
    result = await run_episode(env, agents, seed=1)
    assert env.done and result.winner in {"village", "wolves"}
    assert requests, "the LLM seat was never asked"
    assert any(
        e.actor == 0 and "Player 2 seems suspicious" in e.text for e in env.game.events
    )  # its speech reached the engine
    assert "Player 1" in requests[0]["messages"][-1]["content"]  # its observation reached the model
