"""The pages in a real headless browser: Debian's chromium driven by Playwright, against a real stack
(environment gRPC server with the credential on, real Redis, the web view). Each test saves a screenshot
of its page as an artifact: under ``$WOLFPACK_WEB_SCREENSHOTS`` when set, else the checkout's gitignored
``.artifacts/web/`` (``live.png``, ``live-elsewhere.png``, ``replay.png``, ``training.png``, replaced by each
run). ``docs/images/web-*.png`` are copies of them."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import expect

from .conftest import Stack, metrics_values, sample_trajectory

pytestmark = pytest.mark.timeout(60)
# No string predicates (wait_for_function): the pages' CSP forbids eval, and the tests keep it on.

CHROMIUM = "/usr/bin/chromium"


ARTIFACTS = Path(__file__).resolve().parents[3] / ".artifacts" / "web"
"""Where screenshots go when ``$WOLFPACK_WEB_SCREENSHOTS`` is unset: stable, so a person or CI finds them."""


def screenshot_path(name: str) -> Path:
    folder = Path(os.environ.get("WOLFPACK_WEB_SCREENSHOTS") or ARTIFACTS)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.png"


@pytest.fixture
async def page(stack: Stack) -> AsyncIterator[object]:
    if not Path(CHROMIUM).exists():  # make setup installs it; a missing browser is a failure, not a skip
        pytest.fail(f"{CHROMIUM} is missing: run `make setup` (as root) or `apt-get install chromium`")
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = await browser.new_context(viewport={"width": 1400, "height": 1000})
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        await browser.close()
        assert errors == [], errors  # no JavaScript error on any page


async def test_live_nine_player_game_followed_to_its_end(stack: Stack, page) -> None:  # type: ignore[no-untyped-def]
    await page.goto(stack.url + "#/live")
    await page.wait_for_selector("#start-game option[value=werewolf_v1]", state="attached")
    assert await page.input_value("#start-game") == "werewolf_v1"
    assert await page.input_value("#start-variant") == "9p"
    await page.fill("#start-seed", "7")
    await page.fill("#start-pace", "5")
    await page.click("#start-button")
    await page.wait_for_selector("#live-view:not([hidden])")
    # Mid-game: the spectator sees every hidden role while the game runs.
    await page.locator("#seats .seat").nth(8).wait_for()
    roles = await page.locator("#seats .seat .role").all_inner_texts()
    assert len(roles) == 9 and "?" not in roles and roles.count("werewolf") == 3
    await page.wait_for_selector("#live-view[data-done=true]", timeout=45_000)
    winner = await page.inner_text("#live-winner")
    assert winner.startswith("Winner: ") and winner != "Winner: none (draw)"
    kinds = await page.locator("#events li").evaluate_all("items => items.map(li => li.dataset.kind)")
    assert kinds[0] == "setup" and "game_over" in kinds and kinds[-1] == "reveal", kinds[-3:]
    assert {"speech", "vote", "death", "night", "day"} <= set(kinds)
    assert await page.locator("#seats .seat.dead").count() >= 1
    outcomes = await page.locator("#seats .seat .outcome").all_inner_texts()
    assert sorted(set(outcomes)) == ["loss", "win"]
    # The page's every request carried no token and the page holds none.
    html = await page.content()
    episode_id = (await page.evaluate("location.hash")).split("/")[-1]
    ep = stack.servicer.manager.episodes.get(episode_id)
    assert ep is None or (ep.admin_token not in html and not any(t in html for t in ep.tokens))
    await page.screenshot(path=str(screenshot_path("live")), full_page=True)
    # The finished game is listed for replay and steps through every event.
    await page.goto(stack.url + f"#/replay/episode/{episode_id}")
    await page.wait_for_selector("#replay-view:not([hidden])")
    total = int((await page.inner_text("#replay-counter")).split("/ ")[1])
    assert total == len(kinds)
    await page.click("#replay-last")
    assert await page.locator("#replay-step .events li").count() == total


async def test_an_episode_created_elsewhere_is_listed_and_followed_to_its_end(  # type: ignore[no-untyped-def]
    stack: Stack, page
) -> None:
    """A game the web view did not start (created and played through the environment client, as
    ``wolfpack rollout`` plays): it appears in the live list by polling, opens as spectator, and is followed
    to its end."""
    import asyncio
    import random

    from wolfpack_environment.client import EnvironmentClient
    from wolfpack_web.live import random_legal

    await page.goto(stack.url + "#/live")
    await page.wait_for_selector("#episode-list li.hint")  # "no episodes" yet
    async with EnvironmentClient(stack.target, stack.settings) as env:
        ep = await env.create_episode(
            "werewolf_v1", "6p", seed=21, external_seats=(0, 2, 4), default_bot="heuristic"
        )
        item = page.locator(f"#episode-list li[data-episode='{ep.episode_id}']")
        await item.wait_for(timeout=10_000)  # the list's own polling found it
        label = await item.inner_text()
        assert "werewolf_v1 6p · running" in label and "3 of 6 seats played from outside" in label
        await item.locator("a").click()
        await page.wait_for_selector("#live-view:not([hidden])")
        await page.locator("#seats .seat").nth(5).wait_for()
        roles = await page.locator("#seats .seat .role").all_inner_texts()
        assert len(roles) == 6 and "?" not in roles  # every hidden role, mid-game
        assert await page.get_attribute("#live-view", "data-done") == "false"
        rng = random.Random(21)
        players = [env.seat(ep.episode_id, t).play(random_legal(rng, 0.005)) for t in ep.seat_tokens.values()]
        await asyncio.wait_for(asyncio.gather(*players), timeout=30)
        await page.wait_for_selector("#live-view[data-done=true]", timeout=15_000)
    winner = await page.inner_text("#live-winner")
    assert winner.startswith("Winner: ")
    kinds = await page.locator("#events li").evaluate_all("items => items.map(li => li.dataset.kind)")
    assert kinds[0] == "setup" and "game_over" in kinds, kinds[-3:]
    assert kinds == [e.kind for e in stack.servicer.manager.episodes[ep.episode_id].env.events]
    await expect(page.locator(f"#episode-list li[data-episode='{ep.episode_id}']")).to_have_attribute(
        "data-done", "true"
    )
    html = await page.content()
    assert ep.admin_token not in html and not any(t in html for t in ep.seat_tokens.values())
    await page.screenshot(path=str(screenshot_path("live-elsewhere")), full_page=True)


async def test_replay_steps_through_every_turn(stack: Stack, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    traj = sample_trajectory(turns=6)
    entry_id = (
        await stack.redis.xadd(stack.stream, {b"data": traj.SerializeToString(), b"id": b"t"})
    ).decode()
    await page.goto(stack.url + "#/replay")
    await page.click(f"#stream-list a[href='#/replay/entry/{entry_id}']")
    await page.wait_for_selector("#replay-view:not([hidden])")
    for i, turn in enumerate(traj.turns):
        assert await page.inner_text("#replay-counter") == f"Turn {i + 1} / 6"
        box = page.locator(f"#replay-step .turn[data-turn='{i}']")
        assert await box.locator("pre.prompt").inner_text() == turn.observation_text
        assert await box.locator("pre.response").inner_text() == turn.response_text
        assert await box.locator(".badge").inner_text() == ("valid" if turn.valid else "invalid")
        action = await box.locator(".action").inner_text()
        assert action == (
            f"Parsed action: offer “{turn.action.text}”" if turn.valid else "Parsed action: none"
        )
        cells = await box.locator("table.components td").all_inner_texts()
        assert cells == ["reward", f"{turn.reward:.4f}", "format", f"{turn.reward_components['format']:.4f}",
                         "outcome", f"{turn.reward_components['outcome']:.4f}"]  # fmt: skip
        titles = await box.locator(".tok").evaluate_all("els => els.map(e => e.title)")
        assert titles[1] == "token 22: logprob -1.200 (p 0.301)"
        if i == 2:
            await page.screenshot(path=str(screenshot_path("replay")), full_page=True)
        await page.click("#replay-next")
    assert await page.inner_text("#replay-counter") == "Turn 6 / 6"  # the last turn stays
    assert "seller win" in await page.inner_text("#replay-outcome")
    # The same trajectory from a file.
    path = tmp_path / "traj.binpb"
    path.write_bytes(traj.SerializeToString())
    await page.click("#replay-next")  # away from turn 1, so the file's own first turn is what shows
    await page.set_input_files("#trajectory-file", str(path))
    await expect(page.locator("#replay-counter")).to_have_text("Turn 1 / 6")
    assert await page.inner_text("#replay-title") == "Trajectory traj-web-1"


async def test_training_page_follows_a_growing_run(stack: Stack, page) -> None:  # type: ignore[no-untyped-def]
    """The run is written by the trainer's own ``MetricsWriter`` (metrics.jsonl and TensorBoard text), as
    ``wolfpack train`` writes it, while the page is open."""
    from wolfpack_trainer.evaluate import save_episodes
    from wolfpack_trainer.metrics import MetricsWriter, transcript

    run = stack.runs / "demo-run"
    writer = MetricsWriter(run)
    try:
        writer.log(1, metrics_values(1))
        writer.log(2, metrics_values(2))
        await page.goto(stack.url + "#/training")
        await page.click("#run-list a[href='#/training/demo-run']")
        await page.wait_for_selector("#run-latest[data-updates='2']")
        titles = await page.locator(".chart").evaluate_all("els => els.map(e => e.dataset.title)")
        assert titles == [
            "reward (train, held-out eval, references)", "win rate (train, held-out eval, references)",
            "win rate by policy and role", "KL", "entropy", "loss",
        ]  # fmt: skip
        assert await page.locator(".chart polygon.band").count() == 0  # no evaluation yet: no CI band
        await expect(page.locator("#samples")).to_contain_text("no sample games")  # loaded after the charts
        # The trainer goes on: an evaluated update with its sample game, another update, a half-written line.
        writer.log(3, metrics_values(3, evaluated=True))
        writer.text("transcripts/eval/0", transcript(sample_trajectory(turns=2)), 3)
        save_episodes(run, 3, [sample_trajectory(turns=2, trajectory_id="eval-3-0")])
        writer.log(4, metrics_values(4))
        with writer.jsonl.open("a") as fh:
            fh.write('{"step": 5, "charts/rew')
        await page.wait_for_selector("#run-latest[data-updates='4']", timeout=10_000)
        assert await page.locator(".chart polygon.band").count() == 2  # eval reward and win rate, 95% CI
        assert await page.locator(".chart line.ci").count() == 2
        keys = await page.locator(".chart polyline.series").evaluate_all("els => els.map(e => e.dataset.key)")
        assert {
            "charts/reward_mean",
            "eval/reward_mean",
            "charts/trainee/seller/win_rate",
            "actor/ppo_kl",
        } <= set(keys)
        points = await page.locator("polyline[data-key='charts/reward_mean']").get_attribute("points")
        assert points is not None and len(points.split()) == 4
        assert "4 updates (last 4)" in await page.inner_text("#run-latest")
        sample = page.locator("#samples .sample").first
        await sample.wait_for()
        assert "transcripts/eval/0 · update 3" in await sample.inner_text()
        assert "bargaining_v1/easy" in await sample.locator("pre").inner_text()
        episode = page.locator("#eval-episodes a").first
        await expect(episode).to_contain_text("update 3 · seed 11 · 2 turns · winner seller")
        await page.screenshot(path=str(screenshot_path("training")), full_page=True)
        await episode.click()  # the evaluated episode opens on the replay page, turn by turn
        await expect(page.locator("#replay-counter")).to_have_text("Turn 1 / 2")
        assert await page.inner_text("#replay-title") == "Trajectory eval-3-0"
        assert page.url.endswith("#/replay/run/demo-run/3/episode_00.pb")
    finally:
        writer.close()
