"""``wolfpack play`` and ``wolfpack scenarios`` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wolfpack.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize("players", [6, 9, 12])
def test_play_werewolf_reaches_a_winner_and_is_deterministic(players: int) -> None:
    args = ["play", "werewolf", "--players", str(players), "--seed", "4", "--bots", "heuristic"]
    first = runner.invoke(app, args)
    second = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert first.output == second.output, "same seed must print byte-identical games"
    summary = first.output.strip().splitlines()[-1]
    assert summary.startswith(f"Summary: werewolf_v1/{players}p seed 4")
    assert "winner wolves" in summary or "winner village" in summary
    other = runner.invoke(app, [*args[:-4], "--seed", "5", "--bots", "heuristic"])
    assert other.output != first.output


def test_play_werewolf_in_chinese_and_with_random_bots() -> None:
    result = runner.invoke(
        app, ["play", "werewolf", "--players", "6", "--seed", "1", "--lang", "zh", "--bots", "random"]
    )
    assert result.exit_code == 0, result.output
    assert "狼人" in result.output


def test_play_bargaining_ends_with_a_verified_outcome() -> None:
    result = runner.invoke(app, ["play", "bargaining", "--seed", "3", "--bots", "heuristic"])
    assert result.exit_code == 0, result.output
    assert "Verified outcome:" in result.output


def test_play_rejects_unknown_games_and_bots_readably() -> None:
    bad_game = runner.invoke(app, ["play", "chess"])
    assert bad_game.exit_code != 0 and "unknown game" in bad_game.output
    bad_bots = runner.invoke(app, ["play", "werewolf", "--bots", "genius"])
    assert bad_bots.exit_code != 0 and "unknown bots" in bad_bots.output


def test_scenarios_generate_list_show_verify(tmp_path: Path) -> None:
    store = str(tmp_path / "s.sqlite3")
    gen = runner.invoke(app, ["scenarios", "generate", "--n", "1000", "--seed", "1", "--store", store])
    assert gen.exit_code == 0, gen.output
    assert "1000 distinct ids, 1000 new in the store" in gen.output
    listed = runner.invoke(
        app, ["scenarios", "list", "--family", "bargaining", "--limit", "3", "--store", store]
    )
    assert listed.exit_code == 0 and "bargaining-" in listed.output
    from wolfpack_games.scenarios import open_store

    db = open_store(store)
    sid = db.list(family="bargaining", limit=1)[0].id
    db.close()
    shown = runner.invoke(app, ["scenarios", "show", sid, "--store", store])
    assert json.loads(shown.output)["id"] == sid
    transcript = tmp_path / "t.jsonl"
    first = json.loads(shown.output)["players"][0]["seat"]
    lines = [{"seat": first, "text": "FINAL_BID: 1"}, {"seat": 1 - first, "text": "REJECT"}]
    transcript.write_text("\n".join(json.dumps(x) for x in lines))
    verified = runner.invoke(app, ["scenarios", "verify", sid, str(transcript), "--store", store])
    assert verified.exit_code == 0 and "Verified outcome:" in verified.output


def test_gateway_command_has_help() -> None:
    result = runner.invoke(app, ["gateway", "--help"])
    assert result.exit_code == 0 and "WebSocket" in result.output


def test_play_with_a_config_file() -> None:
    config = Path(__file__).resolve().parents[3] / "configs" / "play" / "werewolf-9p-wolf-king.yaml"
    result = runner.invoke(
        app, ["play", "werewolf", "--players", "9", "--seed", "2", "--config", str(config)]
    )
    assert result.exit_code == 0, result.output
    assert "Wolf King" in result.output or "wolf king" in result.output.lower()
    bad = runner.invoke(app, ["play", "werewolf", "--config", str(config.parent / "README.md")])
    assert bad.exit_code != 0
