"""The environment service over real gRPC: external agents play, bad requests get the right codes."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack import telemetry
from wolfpack.errors import code_of as code_of_status
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient, episode_request
from wolfpack_environment.server import EnvironmentServicer


def first_legal(obs: pb.Observation) -> common_pb2.Action:
    """A simple external policy: the first legal kind, its first target, a short text when needed."""
    la = obs.legal_actions[0]
    action = common_pb2.Action(kind=la.kind, text=f"seat {obs.seat} says hello" if la.needs_text else "")
    if la.targets:
        action.target = la.targets[0]
    return action


async def code_of(coro: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await coro  # type: ignore[misc]
    return err.value.code()


async def test_list_games_has_werewolf_and_scenarios(env_client: EnvironmentClient) -> None:
    games = {g.game_id: g for g in await env_client.list_games()}
    assert {"werewolf_v1", "bargaining_v1"} <= set(games)
    assert {v.name: v.num_seats for v in games["werewolf_v1"].variants} == {"6p": 6, "9p": 9, "12p": 12}
    assert {"heuristic", "random"} <= set(games["werewolf_v1"].bots)


async def test_two_external_clients_and_scripted_seats_finish_a_9_player_werewolf_game(
    env_client: EnvironmentClient,
) -> None:
    ep = await env_client.create_episode(
        "werewolf_v1", "9p", seed=11, external_seats=(2, 5), default_bot="heuristic"
    )
    assert set(ep.seat_tokens) == {2, 5} and ep.num_seats == 9
    finals = await asyncio.wait_for(
        asyncio.gather(
            *(env_client.seat(ep.episode_id, t).play(first_legal) for t in ep.seat_tokens.values())
        ),
        timeout=60,
    )
    assert all(f.done for f in finals)
    assert all(f.outcome in (common_pb2.OUTCOME_KIND_WIN, common_pb2.OUTCOME_KIND_LOSS) for f in finals)
    state = await env_client.get_episode(ep.episode_id, ep.seat_tokens[2])
    assert state.done and state.winner
    assert all(s.role for s in state.seats), "roles are revealed after the game"
    acts = [e for e in state.events if e.actor in (2, 5) and e.kind not in ("role", "invalid")]
    assert acts, "the external seats' actions are in the log"


async def test_external_bargainer_reaches_a_verified_outcome(env_client: EnvironmentClient) -> None:
    ep = await env_client.create_episode("bargaining_v1", "easy", seed=3, external_seats=(0,))
    seat = env_client.seat(ep.episode_id, ep.seat_tokens[0])

    def accept_or_bid(obs: pb.Observation) -> str:
        return (
            "I accept your offer.\nACCEPT"
            if "FINAL_BID" in obs.text.split("Nobody has spoken")[-1]
            else "FINAL_BID: 600"
        )

    final = await asyncio.wait_for(seat.play(accept_or_bid), timeout=30)
    assert final.done and final.outcome != common_pb2.OUTCOME_KIND_UNSPECIFIED
    state = await env_client.get_episode(ep.episode_id, ep.admin_token)
    assert state.done and any(e.channel.startswith("seat:") for e in state.events)


async def test_bad_requests_get_clear_codes_and_the_game_goes_on(env_client: EnvironmentClient) -> None:
    stub = env_client.stub
    assert await code_of(env_client.create_episode("chess_v9")) == grpc.StatusCode.INVALID_ARGUMENT
    assert await code_of(env_client.create_episode("werewolf_v1", "7p")) == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        await code_of(env_client.create_episode("werewolf_v1", "6p", external_seats=(9,)))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    unknown = pb.GetObservationRequest(episode_id="nope", token="x")
    assert await code_of(stub.GetObservation(unknown)) == grpc.StatusCode.NOT_FOUND

    ep = await env_client.create_episode("werewolf_v1", "6p", seed=5, external_seats=(0, 1, 2, 3, 4, 5))
    wrong = pb.GetObservationRequest(episode_id=ep.episode_id, token="not-a-token")
    assert await code_of(stub.GetObservation(wrong)) == grpc.StatusCode.PERMISSION_DENIED

    seats = {s: env_client.seat(ep.episode_id, t) for s, t in ep.seat_tokens.items()}
    observations = {s: await seat.observation() for s, seat in seats.items()}
    acting = [s for s, o in observations.items() if o.your_turn]
    idle = [s for s, o in observations.items() if not o.your_turn]
    assert acting and idle
    # Out of turn.
    assert await code_of(seats[idle[0]].act(1, "I vote for player 1")) == grpc.StatusCode.FAILED_PRECONDITION
    s = acting[0]
    obs = observations[s]
    # Stale turn id.
    assert await code_of(seats[s].act(obs.turn_id + 100, "pass")) == grpc.StatusCode.FAILED_PRECONDITION
    # A structured action's oversized text is the caller's bug (free text is a move: see below).
    long_say = common_pb2.Action(kind="say", text="x" * 5_000)
    assert await code_of(seats[s].act(obs.turn_id, long_say)) == grpc.StatusCode.INVALID_ARGUMENT
    # An illegal action is not an RPC error: it is rejected with a reason and the seat is re-prompted.
    bad = common_pb2.Action(kind="fly", target=0)
    resp = await seats[s].act(obs.turn_id, bad)
    assert not resp.accepted and resp.reason and resp.observation.your_turn
    assert resp.observation.feedback, "the re-prompt carries the reason"
    # After the allowed re-prompts the default legal action is applied and the game moves on.
    for _ in range(10):
        if resp.defaulted:
            break
        resp = await seats[s].act(obs.turn_id, bad)
    assert resp.defaulted and resp.action.kind
    # A retry of the same (applied) turn is idempotent.
    again = await seats[s].act(obs.turn_id, "anything")
    assert again.duplicate and again.action == resp.action
    # Closing needs the admin token.
    close = pb.CloseEpisodeRequest(episode_id=ep.episode_id, token=ep.seat_tokens[0])
    assert await code_of(stub.CloseEpisode(close)) == grpc.StatusCode.PERMISSION_DENIED
    assert await env_client.close_episode(ep.episode_id, ep.admin_token)


@pytest.mark.parametrize("game", ["werewolf_v1", "ultimatum_v1"])
@pytest.mark.parametrize(
    "answer",
    ["", " \n\t ", "\x00\x01\x7f\ufffd\ufffd", "\udcff\udcfe", "\u200b" * 50, "x" * 50_000, "pass " * 10_000],
    ids=["empty", "blank", "binary", "lone-surrogates", "zero-width", "huge", "huge-repeated-action"],
)
async def test_whatever_a_model_answers_is_a_move_the_game_judges(
    env_client: EnvironmentClient, game: str, answer: str
) -> None:
    """Free text is a model's answer: empty, blank, binary or over ``max_text_chars`` (2,000 here), the
    game judges it by its rules (rejected with a reason and re-prompted, then defaulted, or read up to the
    limit), never an RPC error that would lose the episode."""
    ep = await env_client.create_episode(game, seed=3, external_seats=(0,))
    seat = env_client.seat(ep.episode_id, ep.seat_tokens[0])
    obs = await seat.observation()
    for _ in range(200):
        if obs.done:
            break
        if not obs.your_turn:
            obs = await seat.observation()
            continue
        resp = await seat.act(obs.turn_id, answer)
        assert resp.accepted or resp.reason, "a rejected answer names its reason"
        if not resp.accepted and not resp.defaulted:
            assert resp.observation.your_turn and resp.observation.turn_id == obs.turn_id, "re-prompted"
        obs = resp.observation
    assert obs.done, "the episode reached its end"
    final = await env_client.get_episode(ep.episode_id, ep.admin_token)
    assert final.done and all(s.outcome != common_pb2.OUTCOME_KIND_ABORTED for s in final.seats)


async def test_episode_limit_is_resource_exhausted(
    env_client: EnvironmentClient, servicer: EnvironmentServicer
) -> None:
    servicer.manager.limits = type(servicer.manager.limits)(max_episodes=2)
    await env_client.create_episode("werewolf_v1", "6p", external_seats=(0,))
    await env_client.create_episode("werewolf_v1", "6p", external_seats=(0,))
    assert await code_of(env_client.create_episode("werewolf_v1", "6p")) == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_silent_seat_gets_the_default_action_after_its_timeout(env_client: EnvironmentClient) -> None:
    ep = await env_client.create_episode(
        "bargaining_v1", "easy", seed=3, external_seats=(0, 1), turn_timeout_s=0.05
    )
    seat = env_client.seat(ep.episode_id, ep.seat_tokens[0])
    final = await asyncio.wait_for(_last(seat.observe()), timeout=30)
    assert final.done
    state = await env_client.get_episode(ep.episode_id, ep.admin_token)
    assert state.done


async def _last(stream):  # type: ignore[no-untyped-def]
    last = None
    async for obs in stream:
        last = obs
    return last


@pytest.mark.tracing_sdk
async def test_one_trace_per_episode_with_a_span_per_turn(env_client: EnvironmentClient) -> None:
    exporter = InMemorySpanExporter()
    telemetry.setup_telemetry("tests", exporter=exporter)
    ep = await env_client.create_episode("werewolf_v1", "6p", seed=2, external_seats=(1,))
    await asyncio.wait_for(env_client.seat(ep.episode_id, ep.seat_tokens[1]).play(first_legal), timeout=60)
    spans = exporter.get_finished_spans()
    [episode] = [
        s for s in spans if s.name == "episode" and s.attributes["wolfpack.episode.id"] == ep.episode_id
    ]
    turns = [s for s in spans if s.name == "turn" and s.attributes["wolfpack.episode.id"] == ep.episode_id]
    assert turns
    for t in turns:
        assert t.context.trace_id == episode.context.trace_id
        assert t.parent is not None and t.parent.span_id == episode.context.span_id
        assert t.attributes["wolfpack.seat"] == 1 and t.attributes["wolfpack.action.kind"]
        assert "wolfpack.phase" in t.attributes and "wolfpack.action.valid" in t.attributes
    assert trace.get_current_span().get_span_context().is_valid is False


async def test_episodes_from_the_scenario_store(env_client: EnvironmentClient, scenario_store: str) -> None:
    from wolfpack_games.scenarios import generate_scenario, open_store

    scenario = generate_scenario("bargaining", seed=9, difficulty="hard")
    db = open_store(scenario_store)
    db.insert(scenario)
    db.close()
    req = pb.CreateEpisodeRequest(
        game=common_pb2.GameRef(game_id="bargaining_v1", variant="hard"), scenario_id=scenario.id
    )
    resp = await env_client.stub.CreateEpisode(req)
    state = await env_client.get_episode(resp.episode_id, resp.admin_token)
    assert state.done and scenario.id in state.events[0].text
    req.scenario_id = "bargaining-0000000000000000"
    assert await code_of(env_client.stub.CreateEpisode(req)) == grpc.StatusCode.NOT_FOUND
    req.scenario_id, req.game.game_id = scenario.id, "trust_v1"
    assert await code_of(env_client.stub.CreateEpisode(req)) == grpc.StatusCode.INVALID_ARGUMENT


async def test_play_seats_batches_many_episodes_over_one_stream(env_client: EnvironmentClient) -> None:
    seats = []
    for seed in range(8):
        ep = await env_client.create_episode("werewolf_v1", "6p", seed=seed, external_seats=tuple(range(6)))
        seats += [(ep.episode_id, s, t) for s, t in ep.seat_tokens.items()]
    invalid_once: set[tuple[str, int]] = set()

    def decide(obs: pb.Observation) -> common_pb2.Action:
        key = (obs.episode_id, obs.seat)
        if key not in invalid_once:  # every seat's first answer is illegal: it must be re-prompted
            invalid_once.add(key)
            return common_pb2.Action(kind="fly")
        assert not obs.text, "include_text=False sends structure only"
        return first_legal(obs)

    finals = await asyncio.wait_for(env_client.play_seats(seats, decide, include_text=False), timeout=60)
    assert len(finals) == 48 and all(o.done for o in finals.values())
    assert all(
        o.outcome in (common_pb2.OUTCOME_KIND_WIN, common_pb2.OUTCOME_KIND_LOSS) for o in finals.values()
    )
    episode_ids = {e for e, _s, _t in seats}
    for episode_id in episode_ids:
        token = next(t for e, _s, t in seats if e == episode_id)
        state = await env_client.get_episode(episode_id, token)
        assert state.done and state.winner


async def test_play_episodes_creates_plays_and_releases_games_in_one_stream(
    env_client: EnvironmentClient, servicer: EnvironmentServicer
) -> None:
    """The rollout loop: 12 games, 4 at a time, created inside the stream; a mix of scripted and
    external seats; an async decider that is sometimes wrong (re-prompted); each finished game is
    released from the server (close_finished), so the episode limit (50 here) never fills."""
    rng = random.Random(3)
    wrong_once: set[tuple[str, int, int]] = set()

    async def decide(obs: pb.Observation) -> common_pb2.Action:
        await asyncio.sleep(rng.random() / 1000)  # answers come back out of order
        key = (obs.episode_id, obs.seat, obs.turn_id)
        if key not in wrong_once and rng.random() < 0.2:
            wrong_once.add(key)
            return common_pb2.Action(kind="fly")
        return first_legal(obs)

    requests = (
        episode_request("werewolf_v1", "6p", seed=seed, external_seats=(0, 2, 3, 5)) for seed in range(12)
    )
    finished = [f async for f in env_client.play_episodes(requests, decide, concurrency=4, include_text=True)]
    assert len(finished) == 12 and len({f.episode.episode_id for f in finished}) == 12
    for f in finished:
        assert sorted(f.finals) == [0, 2, 3, 5]
        assert all(o.done and o.outcome in (common_pb2.OUTCOME_KIND_WIN, common_pb2.OUTCOME_KIND_LOSS)
                   for o in f.finals.values())  # fmt: skip
        assert all(o.text for o in f.finals.values())
        assert f.episode.episode_id not in servicer.manager.episodes  # released, not kept for the TTL
    assert wrong_once, "some answers were illegal and re-prompted"


async def test_play_episodes_keeps_episodes_without_close_finished(env_client: EnvironmentClient) -> None:
    requests = [episode_request("werewolf_v1", "9p", seed=s, external_seats=tuple(range(9))) for s in (1, 2)]
    finished = [
        f async for f in env_client.play_episodes(requests, first_legal, concurrency=2, close_finished=False)
    ]
    assert len(finished) == 2
    for f in finished:
        assert not any(o.text for o in f.finals.values())  # include_text defaults to off
        state = await env_client.get_episode(f.episode.episode_id, f.episode.admin_token)
        assert state.done and state.winner and len(state.events) > 20


async def test_play_episodes_reports_a_bad_create_request(env_client: EnvironmentClient) -> None:
    requests = [episode_request("werewolf_v1", "7p", external_seats=(0,))]
    with pytest.raises(ValueError, match=r"INVALID_ARGUMENT.*unknown variant"):
        async for _ in env_client.play_episodes(requests, first_legal):
            pass


async def test_play_episodes_with_only_scripted_seats_ends_at_once(env_client: EnvironmentClient) -> None:
    finished = [
        f async for f in env_client.play_episodes([episode_request("werewolf_v1", "6p")], first_legal)
    ]
    assert len(finished) == 1 and finished[0].finals == {}


async def test_free_text_actions_report_the_action_that_was_applied(env_client: EnvironmentClient) -> None:
    """Regression: the applied action is parsed before the step, not re-parsed in the next phase."""
    ep = await env_client.create_episode("werewolf_v1", "6p", seed=21, external_seats=tuple(range(6)))
    seats = {s: env_client.seat(ep.episode_id, t) for s, t in ep.seat_tokens.items()}
    checked = 0
    for _ in range(200):
        observations = [await seat.observation() for seat in seats.values()]
        due = [o for o in observations if o.your_turn]
        if not due or checked >= 3:
            break
        for obs in due:
            la = obs.legal_actions[0]
            if la.targets:
                resp = await seats[obs.seat].act(obs.turn_id, f"{la.kind} {la.targets[-1] + 1}")
                assert resp.accepted, resp.reason
                assert resp.action.kind == la.kind and resp.action.target == la.targets[-1]
                checked += 1
            else:
                await seats[obs.seat].act(obs.turn_id, first_legal(obs))
    assert checked >= 3


async def test_deadlines_cost_one_heap_entry_per_episode(servicer: EnvironmentServicer) -> None:
    """Answering turns leaves nothing behind in the deadline heap (one entry per episode, not per turn),
    and ``expire`` times out exactly the turns whose deadline passed."""
    import time

    from wolfpack_environment.sessions import SeatPlan
    from wolfpack_games import Action

    manager = servicer.manager
    ep = manager.create(
        "werewolf_v1", "6p", seed=1, seats={s: SeatPlan("external") for s in range(6)}, turn_timeout_s=30
    )
    tokens = {s: t for t, s in ep.tokens.items()}
    answered = 0
    while answered < 12 and not ep.done:
        seat, turn_id = next(iter(ep.open_turns.items()))
        la = ep.env.legal_actions(seat)[0]
        manager.act(
            ep, tokens[seat], turn_id, Action(la.kind, la.targets[0] if la.targets else None, "x"), ""
        )
        answered += 1
    assert answered == 12 and len(manager._deadlines) == 1
    assert manager.expire(time.monotonic()) == 0  # nothing is overdue yet
    pending = dict(ep.open_turns)
    # Every open turn is overdue then, and so are the turns opened by their default actions (their
    # deadlines, 30 s after the real now, are before the pretended one however long this call takes on a
    # loaded machine: with +31 the whole game had to play out within 1 s): the game ends on timeouts.
    expired = manager.expire(time.monotonic() + 3600)
    assert expired >= len(pending) and ep.timeouts == expired and ep.done
    assert all(ep.acted[(seat, turn)].defaulted for seat, turn in pending.items())
    assert len(manager._deadlines) <= 1  # re-scheduled at most once, for the turns opened since
    manager.close_all()


def test_released_episodes_are_freed_without_the_cycle_collector(servicer: EnvironmentServicer) -> None:
    """A finished, released episode leaves no reference cycle behind (the engine's continuations are
    dropped by ``close``), so a server finishing hundreds of games a second does not feed the cyclic
    collector a dead engine per game."""
    import gc

    from wolfpack_environment.sessions import SeatPlan
    from wolfpack_games import Action
    from wolfpack_games.werewolf.engine import WerewolfEnv

    manager = servicer.manager
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for seed in range(3):
            ep = manager.create(
                "werewolf_v1", "6p", seed=seed, seats={s: SeatPlan("external") for s in range(6)}
            )
            tokens = {s: t for t, s in ep.tokens.items()}
            while not ep.done:
                seat, turn_id = next(iter(ep.open_turns.items()))
                la = ep.env.legal_actions(seat)[0]
                action = Action(la.kind, la.targets[0] if la.targets else None, "x" if la.needs_text else "")
                manager.act(ep, tokens[seat], turn_id, action, "")
            manager.release(ep)
            del ep
        gc.collect()
        engines = [o for o in gc.garbage if isinstance(o, WerewolfEnv)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert engines == []


async def test_play_seats_reports_item_errors_as_google_rpc_status(env_client: EnvironmentClient) -> None:
    """A bad create and an act with a foreign token fail only their own items, each with a code and a
    message (google.rpc.Status), while the stream goes on."""
    ep = await env_client.create_episode("werewolf_v1", "6p", seed=1, external_seats=(0,))
    call = env_client.stub.PlaySeats(timeout=30)
    bad = pb.PlaySeatsRequest()
    bad.create.add(request_id="bad", game=common_pb2.GameRef(game_id="werewolf_v1", variant="7p"))
    bad.acts.add(episode_id=ep.episode_id, token="not-a-token", turn_id=1, raw_text="vote 1")
    await call.write(bad)
    reply = await call.read()
    await call.done_writing()
    assert [c.request_id for c in reply.created] == ["bad"] and not reply.created[0].HasField("episode")
    assert code_of_status(reply.created[0].error) == grpc.StatusCode.INVALID_ARGUMENT
    assert "7p" in reply.created[0].error.message
    [result] = reply.results
    assert code_of_status(result.error) == grpc.StatusCode.PERMISSION_DENIED and result.error.message
    assert not result.accepted and not result.reason  # reason is for game rejections only


async def test_play_seats_results_carry_the_applied_action(env_client: EnvironmentClient) -> None:
    """A free-text act's result names the action the environment parsed and applied (what a rollout puts
    into ``Turn.action``); a rejected one carries none. Every seat's first answer is gibberish."""
    ep = await env_client.create_episode("werewolf_v1", "6p", seed=5, external_seats=tuple(range(6)))
    call = env_client.stub.PlaySeats(timeout=60)
    first = pb.PlaySeatsRequest(include_text=False)
    for token in ep.seat_tokens.values():
        first.join.add(episode_id=ep.episode_id, token=token)
    await call.write(first)
    tried: set[int] = set()
    sent: dict[tuple[int, int], common_pb2.Action] = {}  # (seat, turn id) -> the legal action written
    applied = rejected = 0
    while applied < 6:  # bounded: a 6p game has more than 6 decisions, and every act gets a result
        reply = await call.read()
        assert reply is not grpc.aio.EOF
        for result in reply.results:
            assert not result.HasField("error"), result.error.message
            if result.accepted:
                want = sent.get((result.seat, result.turn_id))
                if want is None:  # the gibberish, accepted where any text is a speech
                    assert result.action.kind == "speak" and result.action.text == "???", result.action
                else:
                    assert (result.action.kind, result.action.target) == (want.kind, want.target)
                    assert result.action.text == want.text
                applied += 1
            else:
                assert not result.defaulted and not result.HasField("action")
                rejected += 1
        acts = pb.PlaySeatsRequest()
        for obs in reply.decisions:
            if obs.done or not obs.your_turn:
                continue
            token = ep.seat_tokens[obs.seat]
            if obs.seat not in tried:
                tried.add(obs.seat)
                acts.acts.add(episode_id=ep.episode_id, token=token, turn_id=obs.turn_id, raw_text="???")
                continue
            la = next((a for a in obs.legal_actions if a.targets), None)
            if la is None:  # a speech turn
                sent[(obs.seat, obs.turn_id)] = common_pb2.Action(kind="speak", text="I trust seat 1")
                text = "I trust seat 1"
            else:
                sent[(obs.seat, obs.turn_id)] = common_pb2.Action(kind=la.kind, target=la.targets[-1])
                text = f"{la.kind} {la.targets[-1] + 1}"
            acts.acts.add(episode_id=ep.episode_id, token=token, turn_id=obs.turn_id, raw_text=text)
        if acts.acts:
            await call.write(acts)
    call.cancel()
    assert rejected >= 1 and len(sent) >= 1


async def test_the_requested_language_reaches_the_game(env_client: EnvironmentClient) -> None:
    """The episode's language lives in the engine's config only (``Episode`` keeps no copy): a "zh" game
    renders its observations in Chinese, an "en" one in English."""
    texts = {}
    for language in ("zh", "en"):
        ep = await env_client.create_episode(
            "werewolf_v1", "6p", seed=3, external_seats=(0,), language=language
        )
        obs = await env_client.seat(ep.episode_id, ep.seat_tokens[0]).observation()
        texts[language] = obs.text
    assert any("\u4e00" <= ch <= "\u9fff" for ch in texts["zh"]), texts["zh"][:200]
    assert not any("\u4e00" <= ch <= "\u9fff" for ch in texts["en"]), texts["en"][:200]
