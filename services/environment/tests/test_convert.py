"""What the environment service puts into its protos (``convert.py``), checked against independent
oracles: outcomes against the winning team (a werewolf seat wins exactly when its team is the winner),
``alive`` of a game without deaths against "still in the game", ``your_turn`` against the existence of a
turn id to answer, and each PlaySeats create's trace context against the episode it started.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment import sessions
from wolfpack_environment.client import EnvironmentClient, episode_request
from wolfpack_environment.server import EnvironmentServicer
from wolfpack_environment.sessions import SeatPlan

pytestmark = pytest.mark.timeout(120)


async def test_outcomes_follow_the_winning_team_in_state_and_final_observations(
    env_client: EnvironmentClient, servicer: EnvironmentServicer
) -> None:
    winners = set()
    for seed in range(6):
        ep = await env_client.create_episode("werewolf_v1", "6p", seed=seed, external_seats=(0, 1, 2))
        engine = servicer.manager.get(ep.episode_id).env
        finals = await asyncio.wait_for(
            asyncio.gather(*(env_client.seat(ep.episode_id, t).play(_first_legal) for t in ep.seat_tokens.values())),
            timeout=60,
        )  # fmt: skip
        state = await env_client.get_episode(ep.episode_id, ep.seat_tokens[0])
        assert state.done and state.winner == engine.winner()
        winners.add(state.winner)
        expected = {
            s: common_pb2.OUTCOME_KIND_WIN if engine.team(s) == state.winner else common_pb2.OUTCOME_KIND_LOSS
            for s in range(6)
        }
        assert {s.seat: s.outcome for s in state.seats} == expected
        assert {f.seat: f.outcome for f in finals} == {s: expected[s] for s in (0, 1, 2)}
    assert winners == {"wolves", "village"}, winners  # both sides won at least once: both mappings ran


def _first_legal(obs: pb.Observation) -> common_pb2.Action:
    la = obs.legal_actions[0]
    action = common_pb2.Action(kind=la.kind, text="Nothing to report." if la.needs_text else "")
    if la.targets:
        action.target = la.targets[0]
    return action


async def test_in_a_game_without_deaths_seats_are_alive_until_it_ends(env_client: EnvironmentClient) -> None:
    running = await env_client.create_episode("bargaining_v1", "easy", seed=3, external_seats=(0, 1))
    state = await env_client.get_episode(running.episode_id, running.seat_tokens[0])
    assert not state.done and [s.alive for s in state.seats] == [True, True]
    assert [s.outcome for s in state.seats] == [common_pb2.OUTCOME_KIND_UNSPECIFIED] * 2  # not decided yet
    over = await env_client.create_episode("bargaining_v1", "easy", seed=3)  # scripted: over at once
    state = await env_client.get_episode(over.episode_id, over.admin_token)
    assert state.done and [s.alive for s in state.seats] == [False, False]


async def test_your_turn_is_set_only_with_a_turn_id_to_answer(
    monkeypatch: pytest.MonkeyPatch, servicer: EnvironmentServicer
) -> None:
    """Between two slices of a scripted run the engine may already wait for an external seat whose turn
    is not open yet: its observation must not say "your turn" with turn id 0 (nothing could answer it)."""
    monkeypatch.setattr(sessions, "ADVANCE_SLICE_S", 0.0)  # one scripted move per slice
    manager = servicer.manager
    ep = manager.create("werewolf_v1", "6p", seed=1, seats={0: SeatPlan("external")})
    engine_waiting_without_a_turn = 0
    for _ in range(10_000):  # bounded: the run has a few dozen scripted moves, one per loop turn
        msg = servicer.observations.observation(ep, 0)
        turn = ep.open_turns.get(0, 0)
        assert msg.turn_id == turn
        if turn:
            assert msg.your_turn
            break
        assert not msg.your_turn
        engine_waiting_without_a_turn += ep.env.observe(0).your_turn
        await asyncio.sleep(0)
    assert ep.open_turns.get(0) == 1
    assert engine_waiting_without_a_turn >= 1  # the case under test happened


async def test_a_create_items_trace_context_applies_to_its_own_episode_only(
    env_client: EnvironmentClient, servicer: EnvironmentServicer
) -> None:
    """Creates in one PlaySeats message: the first carries a traceparent, the second none. The first
    episode starts under the given trace; the second must not inherit it (the item's context is detached
    once its create is done)."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traced = episode_request("werewolf_v1", "6p", seed=1, external_seats=(0,), request_id="traced")
    traced.trace.traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"
    plain = episode_request("werewolf_v1", "6p", seed=2, external_seats=(0,), request_id="plain")
    call = env_client.stub.PlaySeats(timeout=30)
    await call.write(pb.PlaySeatsRequest(create=[traced, plain]))
    reply = await asyncio.wait_for(call.read(), 20)
    ids = {c.request_id: c.episode.episode_id for c in reply.created}
    call.cancel()

    def trace_of(episode_id: str) -> str:
        span = servicer.manager.get(episode_id).span
        assert span is not None
        return f"{span.get_span_context().trace_id:032x}"

    assert trace_of(ids["traced"]) == trace_id
    assert trace_of(ids["plain"]) != trace_id


@pytest.mark.parametrize("game_id", ["allocation_v1", "trust_v1", "werewolf_v1"])
async def test_a_stored_scenario_opens_only_its_own_familys_game(
    env_client: EnvironmentClient, scenario_store: str, game_id: str
) -> None:
    """A bargaining scenario asked for with another game is refused by the service, naming both (games
    whose ids sort before and after ``bargaining_v1``), not handed to that game."""
    from wolfpack_games.scenarios import generate_scenario, open_store

    scenario = generate_scenario("bargaining", seed=5, difficulty="easy")
    db = open_store(scenario_store)
    db.insert(scenario)
    db.close()
    req = episode_request(game_id, seed=1)
    req.scenario_id = scenario.id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env_client.stub.CreateEpisode(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"is a bargaining scenario, not {game_id}" in (err.value.details() or "")
    req.game.game_id = "bargaining_v1"
    assert (await env_client.stub.CreateEpisode(req)).episode_id
