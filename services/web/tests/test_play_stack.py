"""``wolfpack play`` while a stack runs: the game goes through the stack's environment service (a real gRPC
server with the credential on), the command prints the web view's live URL of the episode, the web view
lists that episode with the same winner, and the transcript is byte for byte the in-process one.

The stack is the web tests' real environment server + web view, announced the way ``wolfpack up`` does
it: an ``up.json`` in the run directory (services, web URL, a live launcher pid: this test's process).
The command runs as a user runs it, in a fresh interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import aiohttp
import pytest

from .conftest import SECRET, Stack


async def wolfpack(run_dir: Path, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "WOLFPACK_RUN_DIR": str(run_dir), "WOLFPACK_ADMIN_SECRET": SECRET}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "wolfpack.cli.main", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, errs = await asyncio.wait_for(proc.communicate(), timeout=180)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), errs.decode()


def announce(run_dir: Path, stack: Stack, launcher_pid: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "up.json").write_text(
        json.dumps(
            {
                "redis_url": "", "embedded_redis": False, "services": {"environment": stack.target},
                "pids": {}, "started_at": 0.0, "launcher_pid": launcher_pid, "pgid": 0, "web_url": stack.url,
            }
        )
    )  # fmt: skip


async def listed(stack: Stack) -> dict[str, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.get(stack.url.rstrip("/") + "/api/episodes") as resp:
        assert resp.status == 200
        return {e["episode_id"]: e for e in (await resp.json())["episodes"]}


async def test_play_goes_through_the_running_stack_and_matches_the_local_game(
    stack: Stack, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    announce(run_dir, stack, os.getpid())
    game = ("play", "werewolf", "--players", "9", "--seed", "7")
    rc, remote, errs = await wolfpack(run_dir, *game, "--pace-ms", "1")
    assert rc == 0, errs
    match = re.search(r"watch: (\S+)/#/live/(\S+)", errs)
    assert match, errs
    assert match.group(1) == stack.url.rstrip("/")
    episode_id = match.group(2)

    rc, local, errs_local = await wolfpack(run_dir, *game, "--local")
    assert rc == 0, errs_local
    assert "watch:" not in errs_local
    assert remote == local  # same seed, same bots: the service played the in-process game
    assert "Summary: werewolf_v1/9p seed 7" in remote

    episodes = await listed(stack)
    assert list(episodes) == [episode_id]  # --local left nothing on the service
    winner = re.search(r"winner (\w+);", remote)
    assert winner, remote
    assert episodes[episode_id]["done"] is True and episodes[episode_id]["winner"] == winner.group(1)


CONFIG = Path(__file__).resolve().parents[3] / "configs" / "play" / "werewolf-9p-wolf-king.yaml"


@pytest.mark.parametrize(
    "game",
    [
        ("bargaining", "--seed", "4"),
        ("werewolf", "--players", "6", "--seed", "1", "--lang", "zh", "--bots", "random"),
        ("werewolf", "--players", "9", "--seed", "2", "--config", str(CONFIG)),
    ],
    ids=["scenario", "zh-random", "options"],
)
async def test_other_games_languages_bots_and_options_match_too(
    stack: Stack, tmp_path: Path, game: tuple[str, ...]
) -> None:
    run_dir = tmp_path / "run"
    announce(run_dir, stack, os.getpid())
    rc, remote, errs = await wolfpack(run_dir, "play", *game)
    assert rc == 0 and "watch: " in errs, errs
    rc, local, errs = await wolfpack(run_dir, "play", *game, "--local")
    assert rc == 0, errs
    assert remote == local and "Summary: " in remote


async def test_a_stale_up_json_plays_in_process(stack: Stack, tmp_path: Path) -> None:
    """A launcher killed by SIGKILL leaves ``up.json`` behind: no stack runs, so the game stays local."""
    run_dir = tmp_path / "run"
    dead = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await dead.wait()
    announce(run_dir, stack, dead.pid)
    rc, out, errs = await wolfpack(run_dir, "play", "werewolf", "--seed", "2")
    assert rc == 0 and "watch:" not in errs and "Summary: werewolf_v1/6p seed 2" in out, errs
    assert await listed(stack) == {}


async def test_an_unreachable_environment_is_one_readable_error(stack: Stack, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    announce(run_dir, stack, os.getpid())
    up = json.loads((run_dir / "up.json").read_text())
    up["services"]["environment"] = "127.0.0.1:1"  # nothing listens there
    (run_dir / "up.json").write_text(json.dumps(up))
    rc, out, errs = await wolfpack(run_dir, "play", "werewolf", "--seed", "2")
    assert rc == 1 and out == "", errs
    assert "environment service at 127.0.0.1:1: UNAVAILABLE" in errs and "--local" in errs
    assert "Traceback" not in errs


async def test_play_through_a_real_wolfpack_up(tmp_path: Path) -> None:
    """The issue's check, as a user does it: ``wolfpack up --base-port 0`` (tiny model, embedded Redis),
    then ``wolfpack play``; the printed URL is the web view's of that stack, and its episode list holds
    the game, finished, with the transcript's winner."""
    import signal

    env = {k: v for k, v in os.environ.items() if not k.startswith("WOLFPACK_")}
    env.update(
        {"WOLFPACK_RUN_DIR": str(tmp_path / "run"), "COLUMNS": "200", "WOLFPACK_INFERENCE_MODEL": "tiny"}
    )
    up = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "wolfpack.cli.main", "up", "--base-port", "0", env=env, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert up.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(180):
            while not any("Ctrl-C to stop" in ln for ln in seen):
                line = (await up.stdout.readline()).decode()
                assert line, "".join(seen)
                seen.append(line)
        web_url = json.loads((tmp_path / "run" / "up.json").read_text())["web_url"]
        play = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "wolfpack.cli.main", "play", "werewolf", "--players", "9", "--seed", "5",
            env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        drain = asyncio.create_task(up.stdout.read())  # keep the launcher's pipe flowing meanwhile
        out, errs = await asyncio.wait_for(play.communicate(), timeout=180)
        assert play.returncode == 0, errs.decode()
        match = re.search(r"watch: (\S+)/#/live/(\S+)", errs.decode())
        assert match and match.group(1) == web_url.rstrip("/"), errs.decode()
        async with aiohttp.ClientSession() as s, s.get(web_url.rstrip("/") + "/api/episodes") as resp:
            episodes = {e["episode_id"]: e for e in (await resp.json())["episodes"]}
        winner = re.search(r"winner (\w+);", out.decode())
        assert winner, out.decode()
        assert episodes[match.group(2)]["done"] is True
        assert episodes[match.group(2)]["winner"] == winner.group(1)
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
            await asyncio.wait_for(up.wait(), timeout=60)
    await drain
    assert up.returncode == 0


async def test_a_service_game_that_differs_from_the_mirror_is_an_error(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the equality checks: when what reaches the service is not what the mirror played
    (here every speech is rewritten on its way out), the command fails instead of printing a transcript
    that the service never played."""
    from wolfpack.v1 import common_pb2
    from wolfpack_environment import stack_play
    from wolfpack_games import session_proto

    real = session_proto.action_to_pb

    def rewritten(action: object) -> common_pb2.Action:
        msg = real(action)  # type: ignore[arg-type]
        if msg.text:
            msg.text = "something else"
        return msg

    monkeypatch.setattr(session_proto, "action_to_pb", rewritten)
    monkeypatch.setenv("WOLFPACK_ADMIN_SECRET", SECRET)
    created: list[str] = []
    with pytest.raises(stack_play.StackPlayError, match="differs from the local engine"):
        await stack_play.play_on_stack(
            stack_play.Stack(stack.target, stack.url), "werewolf_v1", "6p", 3, "heuristic",
            on_created=created.append,
        )  # fmt: skip
    assert len(created) == 1
