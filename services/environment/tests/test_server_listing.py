"""ListEpisodes and SpectateEpisode over real gRPC, on a server started with the service credential:
only the credential opens them (no credential: UNAUTHENTICATED; a wrong one, a seat token or an admin token
in its place: PERMISSION_DENIED), pages are bounded and resume where they stopped, and the full view of a
running episode comes by id alone."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from wolfpack import auth, rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, EpisodeManager, Limits

SECRET = "listing-test-secret"


@dataclass
class Stack:
    servicer: EnvironmentServicer
    admin: EnvironmentClient  # configured with the secret
    bare: EnvironmentClient  # no secret


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    settings = load_settings(rpc_timeout_s=20, admin_secret=SECRET)
    servicer = EnvironmentServicer(EpisodeManager(Limits(max_episodes=300)))
    servicer.credential = auth.from_settings(settings)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    target = f"127.0.0.1:{server.port}"
    async with (
        EnvironmentClient(target, settings) as admin,
        EnvironmentClient(target, load_settings(rpc_timeout_s=20)) as bare,
    ):
        yield Stack(servicer, admin, bare)
    servicer.manager.close_all()
    await server.stop(0)


async def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code()


async def test_only_the_credential_opens_the_list_and_the_spectator_view(stack: Stack) -> None:
    created = await stack.bare.create_episode("werewolf_v1", "6p", seed=1, external_seats=(0, 3))
    stub = stack.bare.stub
    listing = pb.ListEpisodesRequest()
    spectate = pb.SpectateEpisodeRequest(episode_id=created.episode_id)
    assert await code_of(stub.ListEpisodes(listing)) == grpc.StatusCode.UNAUTHENTICATED
    assert await code_of(stub.SpectateEpisode(spectate)) == grpc.StatusCode.UNAUTHENTICATED
    for wrong in ("nope", created.seat_tokens[0], created.admin_token):
        md = [(auth.METADATA_KEY, wrong)]
        assert await code_of(stub.ListEpisodes(listing, metadata=md)) == grpc.StatusCode.PERMISSION_DENIED
        assert await code_of(stub.SpectateEpisode(spectate, metadata=md)) == grpc.StatusCode.PERMISSION_DENIED
    # the handler's own check (a servicer whose credential came after the interceptor was built) agrees
    stack.servicer.credential = auth.Credential("another-secret")
    assert await code_of(stack.admin.list_episodes()) == grpc.StatusCode.PERMISSION_DENIED
    assert await code_of(stack.admin.spectate(created.episode_id)) == grpc.StatusCode.PERMISSION_DENIED
    stack.servicer.credential = auth.Credential(SECRET)
    # a seat still gets its own view only, whatever the new calls allow
    seat_view = await stack.bare.get_episode(created.episode_id, created.seat_tokens[0])
    assert sum(1 for s in seat_view.seats if s.role) == 1
    full = await stack.admin.spectate(created.episode_id)
    assert not full.done and all(s.role for s in full.seats) and full.events
    assert await code_of(stack.admin.spectate("f" * 32)) == grpc.StatusCode.NOT_FOUND


async def test_summaries_hold_public_facts_and_no_token(stack: Stack) -> None:
    before = time.time()
    running = await stack.bare.create_episode("werewolf_v1", "9p", seed=7, external_seats=(2,))
    over = await stack.bare.create_episode("werewolf_v1", "6p", seed=8, default_bot="heuristic")
    resp = await stack.admin.list_episodes()
    assert resp.next_page_token == ""
    by_id = {e.episode_id: e for e in resp.episodes}
    assert [e.episode_id for e in resp.episodes] == [over.episode_id, running.episode_id]  # newest first
    r, o = by_id[running.episode_id], by_id[over.episode_id]
    assert (r.game.game_id, r.game.variant, r.seed, r.num_seats, r.num_played_seats) == (
        "werewolf_v1",
        "9p",
        7,
        9,
        1,
    )
    assert r.status == pb.EPISODE_STATUS_RUNNING and r.phase and r.round >= 1 and not r.winner
    assert o.status == pb.EPISODE_STATUS_FINISHED and o.winner and o.num_played_seats == 0
    assert before - 1 <= r.created_at.ToNanoseconds() / 1e9 <= time.time() + 1
    wire = resp.SerializeToString()
    assert running.admin_token.encode() not in wire and running.seat_tokens[2].encode() not in wire
    running_only = await stack.admin.list_episodes(status=pb.EPISODE_STATUS_RUNNING)
    assert [e.episode_id for e in running_only.episodes] == [running.episode_id]
    finished_only = await stack.admin.list_episodes(status=pb.EPISODE_STATUS_FINISHED)
    assert [e.episode_id for e in finished_only.episodes] == [over.episode_id]
    await stack.admin.close_episode(running.episode_id, running.admin_token)  # released: gone from the list
    assert [e.episode_id for e in (await stack.admin.list_episodes()).episodes] == [over.episode_id]


async def test_pages_are_bounded_and_resume_where_they_stopped(stack: Stack) -> None:
    ids = []
    for seed in range(DEFAULT_PAGE_SIZE + 12):
        created = await stack.bare.create_episode("werewolf_v1", "6p", seed=seed, external_seats=(0,))
        ids.append(created.episode_id)
    first = await stack.admin.list_episodes()  # page_size 0: the default
    assert len(first.episodes) == DEFAULT_PAGE_SIZE and first.next_page_token
    assert [e.episode_id for e in first.episodes] == ids[::-1][:DEFAULT_PAGE_SIZE]
    newer = await stack.bare.create_episode("werewolf_v1", "6p", seed=999, external_seats=(0,))
    rest = await stack.admin.list_episodes(page_token=first.next_page_token)  # a newer one shifts nothing
    assert [e.episode_id for e in rest.episodes] == ids[::-1][DEFAULT_PAGE_SIZE:] and not rest.next_page_token
    walked = await stack.admin.all_episodes()
    assert [e.episode_id for e in walked] == [newer.episode_id, *ids[::-1]]
    pages, token = 0, ""
    while True:
        page = await stack.admin.list_episodes(page_size=7, page_token=token)
        assert len(page.episodes) <= 7
        pages, token = pages + 1, page.next_page_token
        if not token:
            break
    assert pages == -(-len(walked) // 7)
    for size in (-1, MAX_PAGE_SIZE + 1):
        assert await code_of(stack.admin.list_episodes(page_size=size)) == grpc.StatusCode.INVALID_ARGUMENT
    for token in ("abc", "-1", "1" * 21, "\u0661"):
        assert await code_of(stack.admin.list_episodes(page_token=token)) == grpc.StatusCode.INVALID_ARGUMENT
    assert await code_of(stack.admin.list_episodes(status=7)) == grpc.StatusCode.INVALID_ARGUMENT
