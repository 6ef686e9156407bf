"""The web view's JSON API over a real socket, against a real environment server (credential on) and the
real Redis: spectating rules, bounded inputs, one error shape, no secret in responses or logs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest

from wolfpack_environment.client import EnvironmentClient
from wolfpack_web.server import check_bind
from wolfpack_web.settings import WebSettings

from .conftest import SECRET, Stack, sample_trajectory

pytestmark = pytest.mark.timeout(60)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        return resp.status, await resp.json()


async def _post(session: aiohttp.ClientSession, url: str, body: Any, **kw: Any) -> tuple[int, Any]:
    async with session.post(url, json=body, **kw) as resp:
        return resp.status, await resp.json()


async def test_watch_refuses_seat_tokens_and_shows_the_full_view_to_the_admin_token(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with EnvironmentClient(stack.target, stack.settings) as env:
        ep = await env.create_episode("werewolf_v1", "9p", seed=3, external_seats=tuple(range(9)))
    bodies = []
    async with aiohttp.ClientSession(stack.url) as s:
        for seat_token in ep.seat_tokens.values():  # every seat token: never the spectator view
            status, body = await _post(
                s, "/api/episodes/watch", {"episode_id": ep.episode_id, "admin_token": seat_token}
            )
            assert status == 403 and body["error"]["code"] == "PERMISSION_DENIED", body
            bodies.append(body)
        status, body = await _post(
            s, "/api/episodes/watch", {"episode_id": ep.episode_id, "admin_token": "x" * 40}
        )
        assert status == 403, body
        status, listing = await _get(s, "/api/episodes")
        assert [e["origin"] for e in listing["episodes"]] == ["environment"]  # refusals left nothing behind
        status, body = await _post(
            s, "/api/episodes/watch", {"episode_id": ep.episode_id, "admin_token": ep.admin_token}
        )
        assert status == 201, body
        status, view = await _get(s, f"/api/episodes/{ep.episode_id}?since=0")
        assert status == 200 and not view["done"]
        roles = [seat["role"] for seat in view["seats"]]
        assert len(roles) == 9 and all(roles) and roles.count("werewolf") == 3  # every hidden role shown
        assert view["events_total"] > 0 and view["events"][0]["index"] == 0
        status, later = await _get(s, f"/api/episodes/{ep.episode_id}?since={view['events_total']}")
        assert status == 200 and later["events"] == []
        status, listing = await _get(s, "/api/episodes")
        assert [(e["episode_id"], e["origin"]) for e in listing["episodes"]] == [
            (ep.episode_id, "registered")
        ]
        bodies += [view, listing]
    text = repr(bodies) + caplog.text
    assert SECRET not in text and ep.admin_token not in text
    assert not any(t in text for t in ep.seat_tokens.values())


async def test_without_the_credential_the_web_view_cannot_spectate(stack: Stack) -> None:
    """The credential is what opens a running episode's full view: a web view without it gets 403."""
    from wolfpack_web.server import start_web

    bare = stack.settings.model_copy(update={"admin_secret": type(stack.settings.admin_secret)("")})
    web = await start_web(bare, WebSettings(addr="127.0.0.1:0"), stack.target)
    try:
        async with EnvironmentClient(stack.target, stack.settings) as env:
            ep = await env.create_episode("werewolf_v1", "6p", seed=1, external_seats=tuple(range(6)))
        async with aiohttp.ClientSession(web.url) as s:
            status, body = await _post(
                s, "/api/episodes/watch", {"episode_id": ep.episode_id, "admin_token": ep.admin_token}
            )
            assert status == 403 and "credential" in body["error"]["message"], body
            status, body = await _get(s, f"/api/episodes/{ep.episode_id}")  # nor by id
            assert status == 403 and body["error"]["code"] == "UNAUTHENTICATED", body
            status, body = await _get(s, "/api/episodes")  # the list says why it holds nothing
            assert status == 200 and body["episodes"] == [] and "UNAUTHENTICATED" in body["problem"], body
    finally:
        await web.stop()


async def test_every_episode_of_the_environment_is_listed_and_opens_by_id(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """Episodes created by other clients (here: the environment client, as ``wolfpack rollout`` does) are
    listed a bounded page at a time and open as spectator by id alone; no token reaches a response or log."""
    from wolfpack_web.live import LIST_PAGE

    caplog.set_level(logging.DEBUG)
    async with EnvironmentClient(stack.target, stack.settings) as env:
        running = [
            await env.create_episode("werewolf_v1", "6p", seed=i, external_seats=(0, 1))
            for i in range(LIST_PAGE + 3)
        ]
        over = await env.create_episode("werewolf_v1", "9p", seed=5, default_bot="heuristic")
    async with aiohttp.ClientSession(stack.url) as s:
        status, first = await _get(s, "/api/episodes")
        assert status == 200 and first["problem"] == "" and len(first["episodes"]) == LIST_PAGE
        assert first["episodes"][0]["episode_id"] == over.episode_id and first["episodes"][0]["done"]
        entry = first["episodes"][1]
        assert (
            entry["episode_id"] == running[-1].episode_id
            and not entry["done"]
            and entry["origin"] == "environment"
        )
        assert (entry["game"], entry["variant"], entry["num_seats"], entry["played_seats"]) == (
            "werewolf_v1",
            "6p",
            6,
            2,
        )
        status, rest = await _get(s, f"/api/episodes?page_token={first['next_page_token']}")
        assert [e["episode_id"] for e in rest["episodes"]] == [e.episode_id for e in running[:4][::-1]]
        assert rest["next_page_token"] == ""
        status, done = await _get(s, "/api/episodes?status=finished")
        assert [e["episode_id"] for e in done["episodes"]] == [over.episode_id]
        status, view = await _get(s, f"/api/episodes/{running[0].episode_id}")
        assert status == 200 and not view["done"] and all(seat["role"] for seat in view["seats"])
        assert view["origin"] == "environment"
        status, missing = await _get(s, f"/api/episodes/{'0' * 32}")
        assert status == 404 and missing["error"]["code"] == "NOT_FOUND"
        for bad in ("status=all", "page_token=..", "page_token=" + "1" * 65, "page_token=abc"):
            status, body = await _get(s, f"/api/episodes?{bad}")
            assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", (bad, body)
        text = repr([first, rest, done, view]) + caplog.text
    assert SECRET not in text
    assert not any(
        ep.admin_token in text or any(t in text for t in ep.seat_tokens.values()) for ep in running
    )


@pytest.mark.parametrize("web_settings", [WebSettings(addr="127.0.0.1:0", spectate=False)])
async def test_spectating_switched_off(stack: Stack) -> None:
    async with aiohttp.ClientSession(stack.url) as s:
        status, body = await _get(s, "/api/episodes")
        assert status == 200 and body == {"spectate": False, "episodes": []}
        status, body = await _get(s, "/api/episodes?status=running")
        assert status == 200 and body == {"spectate": False, "episodes": []}
        status, body = await _post(s, "/api/episodes", {"game": "werewolf_v1", "variant": "6p"})
        assert status == 403 and body["error"]["code"] == "SPECTATING_OFF"
        status, body = await _post(s, "/api/episodes/watch", {"episode_id": "e1", "admin_token": "t"})
        assert status == 403 and body["error"]["code"] == "SPECTATING_OFF"
        status, body = await _get(s, "/api/episodes/e1")
        assert status == 403
        status, health = await _get(s, "/healthz")
        assert health["spectate"] is False
    assert not stack.servicer.manager.episodes  # nothing was created


def test_spectating_beyond_loopback_needs_a_trusted_network() -> None:
    with pytest.raises(PermissionError, match="hidden roles"):
        check_bind(WebSettings(addr="0.0.0.0:8470"))
    check_bind(WebSettings(addr="0.0.0.0:8470", spectate=False))
    check_bind(WebSettings(addr="0.0.0.0:8470", trust_network=True))
    check_bind(WebSettings(addr="127.0.0.1:8470"))


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("get", "/api/episodes/bad%20id", {}, 400),
        ("get", "/api/episodes/" + "e" * 200, {}, 400),
        ("get", "/api/episodes/known?since=-1", {}, 400),
        ("get", "/api/episodes/known?since=abc", {}, 400),
        ("get", "/api/episodes/known?since=99999999999", {}, 400),
        ("post", "/api/episodes", {"data": "game=werewolf_v1"}, 415),
        ("post", "/api/episodes", {"json": [1, 2]}, 400),
        (
            "post",
            "/api/episodes",
            {"data": b"{not json", "headers": {"Content-Type": "application/json"}},
            400,
        ),
        ("post", "/api/episodes", {"json": {"game": "chess_v1"}}, 400),
        ("post", "/api/episodes", {"json": {"game": "werewolf_v1", "variant": "99p"}}, 400),
        ("post", "/api/episodes", {"json": {"seed": -5}}, 400),
        ("post", "/api/episodes", {"json": {"seed": 1.5}}, 400),
        ("post", "/api/episodes", {"json": {"pace_ms": 10**9}}, 400),
        ("post", "/api/episodes", {"json": {"game": "g" * 65}}, 400),
        ("post", "/api/episodes", {"json": {"x": "y" * 70_000}}, 413),
        ("post", "/api/episodes", {"json": {}, "headers": {"Origin": "http://evil.example"}}, 403),
        ("post", "/api/episodes/watch", {"json": {"episode_id": "e1"}}, 400),
        ("post", "/api/episodes/watch", {"json": {"episode_id": "e1", "admin_token": "t" * 300}}, 400),
        ("post", "/api/episodes/watch", {"json": {"episode_id": "e1", "admin_token": "tök"}}, 403),
        ("post", "/api/episodes/watch", {"json": {"episode_id": "nope", "admin_token": "t"}}, 404),
        ("get", "/api/stream?count=0", {}, 400),
        ("get", "/api/stream?count=5000", {}, 400),
        ("get", "/api/stream/not-an-id", {}, 400),
        ("get", "/api/stream/1-0", {}, 404),
        (
            "post",
            "/api/trajectory",
            {"data": b"\xff\xfe garbage", "headers": {"Content-Type": "application/octet-stream"}},
            400,
        ),
        (
            "post",
            "/api/trajectory",
            {"data": b'{"turns": "x"}', "headers": {"Content-Type": "application/json"}},
            400,
        ),
        ("post", "/api/trajectory", {"data": b"{}", "headers": {"Content-Type": "application/json"}}, 400),
        ("post", "/api/trajectory", {"data": b"x", "headers": {"Content-Type": "text/plain"}}, 415),
        (
            "post",
            "/api/trajectory",
            {"data": b"\x00" * (17 << 20), "headers": {"Content-Type": "application/octet-stream"}},
            413,
        ),
        ("get", "/api/runs/..%2F..%2Fetc/metrics", {}, 404),
        ("get", "/api/runs/.hidden/metrics", {}, 404),
        ("get", "/api/runs/missing/samples", {}, 404),
        ("get", "/api/runs/missing/episodes", {}, 404),
        ("get", "/static/..%2Fserver.py", {}, 404),
        ("get", "/static/app.py", {}, 404),
        ("get", "/no/such/route", {}, 404),
        ("delete", "/api/episodes", {}, 405),
    ],
)
async def test_bad_input_gets_a_clear_4xx_and_no_traceback(
    stack: Stack, method: str, path: str, kwargs: dict[str, Any], status: int
) -> None:
    async with aiohttp.ClientSession(stack.url) as s, s.request(method, path, **kwargs) as resp:
        body = await resp.json()
        assert resp.status == status, body
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
        assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert not stack.servicer.manager.episodes  # no refused request created anything


async def test_stream_entries_are_listed_and_replayed_without_being_consumed(stack: Stack) -> None:
    traj = sample_trajectory()
    entry_id = (
        await stack.redis.xadd(stack.stream, {b"data": traj.SerializeToString(), b"id": b"x"})
    ).decode()
    await stack.redis.xadd(stack.stream, {b"junk": b"1"})
    async with aiohttp.ClientSession(stack.url) as s:
        status, body = await _get(s, "/api/stream?count=10")
        assert status == 200
        assert [e.get("trajectory_id") for e in body["entries"]] == [None, "traj-web-1"]
        assert body["entries"][0]["error"]
        status, replayed = await _get(s, f"/api/stream/{entry_id}")
        assert status == 200 and replayed["trajectory_id"] == "traj-web-1" and len(replayed["turns"]) == 5
    assert await stack.redis.xlen(stack.stream) == 2  # read, not consumed
    assert await stack.redis.xinfo_groups(stack.stream) == []  # no consumer group created


async def test_a_trajectory_file_replays_as_binary_and_as_json(stack: Stack) -> None:
    from google.protobuf import json_format

    traj = sample_trajectory(turns=3)
    async with aiohttp.ClientSession(stack.url) as s:
        for data, kind in (
            (traj.SerializeToString(), "application/octet-stream"),
            (json_format.MessageToJson(traj).encode(), "application/json"),
        ):
            async with s.post("/api/trajectory", data=data, headers={"Content-Type": kind}) as resp:
                body = await resp.json()
                assert resp.status == 200, body
                assert [t["response"] for t in body["turns"]] == [t.response_text for t in traj.turns]


async def test_the_games_it_plays_are_bounded(stack: Stack) -> None:
    async with aiohttp.ClientSession(stack.url) as s:
        started = []
        for seed in range(4):  # max_games defaults to 4
            status, body = await _post(
                s, "/api/episodes", {"game": "werewolf_v1", "variant": "6p", "seed": seed, "pace_ms": 2000}
            )
            assert status == 201, body
            started.append(body["episode_id"])
        status, body = await _post(
            s, "/api/episodes", {"game": "werewolf_v1", "variant": "6p", "pace_ms": 2000}
        )
        assert status == 429 and body["error"]["code"] == "TOO_MANY_GAMES"
        assert len(stack.servicer.manager.episodes) == 4
    await stack.web.stop()  # stopping the web view closes the games it was playing
    await asyncio.sleep(0.1)
    assert not stack.servicer.manager.episodes


async def test_a_scripted_game_started_here_is_the_game_wolfpack_play_prints(stack: Stack) -> None:
    from wolfpack_environment.cli import play_game

    async with aiohttp.ClientSession(stack.url) as s:
        status, body = await _post(
            s, "/api/episodes", {"game": "werewolf_v1", "variant": "9p", "seed": 7, "bots": "heuristic"}
        )
        assert status == 201, body
        status, view = await _get(s, f"/api/episodes/{body['episode_id']}")
        assert status == 200 and view["done"]
        status, bad = await _post(
            s, "/api/episodes", {"game": "werewolf_v1", "variant": "9p", "bots": "oracle"}
        )
        assert status == 400 and "paced-random" in bad["error"]["message"]
    engine, _ = play_game("werewolf_v1", "9p", 7, "heuristic")
    expected = [(e.kind, e.channel, e.actor, e.target, e.text) for e in engine.events]
    assert [(e["kind"], e["channel"], e["actor"], e["target"], e["text"]) for e in view["events"]] == expected
    assert view["winner"] == engine.winner()
    assert not stack.servicer.manager.episodes  # released there once its view was kept


async def test_requests_for_another_host_name_are_refused(stack: Stack) -> None:
    """DNS rebinding: a page of evil.example resolved to 127.0.0.1 sends ``Host: evil.example``."""
    async with aiohttp.ClientSession(stack.url) as s:
        for host, status in (("evil.example", 403), (f"evil.example:{stack.web.port}", 403), ("localhost", 200),
                             (f"127.0.0.1:{stack.web.port}", 200)):  # fmt: skip
            async with s.get("/api/episodes", headers={"Host": host}) as resp:
                body = await resp.json()
                assert resp.status == status, (host, body)
                if status == 403:
                    assert body["error"]["code"] == "HOST_NOT_ALLOWED"


async def test_a_runs_evaluated_episodes_are_listed_and_replayed(stack: Stack) -> None:
    """Written by the trainer's own ``save_episodes`` (its layout is the contract), listed newest evaluation
    first, each opened as the replay page's trajectory JSON; anything else under the run is refused."""
    from wolfpack_trainer.evaluate import save_episodes

    run = stack.runs / "eval-run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    first = [sample_trajectory(turns=3, trajectory_id=f"eval-0-{i}") for i in range(2)]
    save_episodes(run, 0, first)
    save_episodes(run, 5, [sample_trajectory(turns=4, trajectory_id="eval-5-0")])
    (run / "eval" / "update_000005" / "episode_07.pb").write_bytes(b"\xff\xfe not a trajectory")
    async with aiohttp.ClientSession(stack.url) as s:
        status, body = await _get(s, "/api/runs/eval-run/episodes")
        assert status == 200, body
        rows = body["episodes"]
        assert [(r["step"], r["file"], r.get("trajectory_id")) for r in rows] == [
            (5, "episode_00.pb", "eval-5-0"), (5, "episode_07.pb", None),
            (0, "episode_00.pb", "eval-0-0"), (0, "episode_01.pb", "eval-0-1"),
        ]  # fmt: skip
        assert rows[1]["error"] and rows[0]["turns"] == 4 and rows[0]["trainee_reward"] == 1.0
        status, traj = await _get(s, "/api/runs/eval-run/episodes/5/episode_00.pb")
        assert status == 200 and traj["trajectory_id"] == "eval-5-0"
        assert traj["turns"][0]["tokens"] == [[11, -0.05], [22, -1.2], [33, -3.5]]
        for path, code in (
            ("/api/runs/eval-run/episodes/5/episode_07.pb", 404),  # not a Trajectory
            ("/api/runs/eval-run/episodes/5/episode_03.pb", 404),  # not there
            ("/api/runs/eval-run/episodes/5/metrics.jsonl", 404),  # not an episode file
            ("/api/runs/eval-run/episodes/x/episode_00.pb", 400),
            ("/api/runs/eval-run/episodes/5/..%2F..%2Fmetrics.jsonl", 404),
            ("/api/runs/nope/episodes/0/episode_00.pb", 404),
        ):
            status, err = await _get(s, path)
            assert status == code and set(err) == {"error"}, (path, err)
