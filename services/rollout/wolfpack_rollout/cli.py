"""``wolfpack rollout``: play N episodes against a running stack (``wolfpack up``, or the addresses in
settings) with this process as the rollout worker: tasks from the curriculum, trajectories to the stream,
a progress bar, and a summary (episodes, turns, win rate by role and opponent kind, invalid/defaulted
moves, failures by reason)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from wolfpack_rollout.config import RolloutConfig, SamplingConfig
from wolfpack_rollout.summary import RolloutSummary

console = Console()


def print_summary(s: RolloutSummary, out: Console = console) -> None:
    head = Table(title="Rollout summary")
    head.add_column("metric")
    head.add_column("value", justify="right")
    rows = [
        ("episodes", f"{s.episodes}"), ("failed episodes", f"{s.failed}"), ("turns (all seats)", f"{s.turns}"),
        ("trainee turns", f"{s.trainee_turns}"), ("invalid moves (re-prompted)", f"{s.invalid_moves}"),
        ("defaulted moves", f"{s.defaulted_moves}"), ("truncated episodes", f"{s.truncated_episodes}"),
        ("responses cut at max_tokens", f"{s.truncated_responses}"), ("compressed prompts", f"{s.compressed_prompts}"),
        ("mean trainee reward", f"{s.mean_trainee_reward:+.3f}"), ("generated tokens", f"{s.generated_tokens}"),
        ("episodes / min", f"{s.episodes_per_min:.1f}"), ("generated tokens / s", f"{s.tokens_per_s:.0f}"),
        ("backpressure wait (s)", f"{s.backpressure_wait_s:.1f}"), ("elapsed (s)", f"{s.elapsed_s:.1f}"),
    ]  # fmt: skip
    for row in rows:
        head.add_row(*row)
    out.print(head)
    for title, rates in (
        ("Win rate by role", s.win_rate_by_role),
        ("Win rate by opponent kind", s.win_rate_by_opponent),
    ):
        t = Table(title=title)
        t.add_column("group")
        t.add_column("win rate", justify="right")
        t.add_column("trainee seats", justify="right")
        for name, (rate, n) in rates.items():
            t.add_row(name, f"{rate:.0%}", str(n))
        out.print(t)
    if s.failures:
        t = Table(title="Failures by reason")
        t.add_column("reason")
        t.add_column("episodes", justify="right")
        for reason, n in s.failures.items():
            t.add_row(reason, str(n))
        out.print(t)


async def _rollout(episodes: int, split: str, config: RolloutConfig, stream: bool) -> int:
    from wolfpack.cli.main import settings_or_exit
    from wolfpack_rollout.connect import Addresses, connect
    from wolfpack_rollout.driver import EpisodeFailed

    settings = settings_or_exit()
    addresses = Addresses.from_settings(settings)
    if addresses.curriculum is None:
        console.print("[red]no curriculum address: start the stack with `wolfpack up`[/]")
        return 2
    console.print(
        f"rollout: {episodes} episodes ({split}), concurrency {config.concurrency}, "
        f"stream {addresses.stream if stream and addresses.redis_url else 'off'}"
    )
    with Progress(
        TextColumn("[bold]episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"), console=console,
    ) as progress:  # fmt: skip
        bar = progress.add_task("episodes", total=episodes, status="")
        try:
            async with connect(settings, config, addresses, stream=stream) as driver:

                def tick() -> None:
                    st = driver.stats
                    progress.update(
                        bar, completed=st.episodes_finished, total=max(episodes, st.episodes_started),
                        status=f"in flight {st.in_flight} · turns {st.turns} · failed {st.episodes_failed}",
                    )  # fmt: skip

                summary = await driver.run(episodes, split, on_episode=tick)
                tick()
        except (OSError, ConnectionError, EpisodeFailed) as exc:
            console.print(f"[red]cannot reach the stack: {exc}[/]")
            console.print("is it running? `wolfpack up` (or set WOLFPACK_<SERVICE>_ADDR)")
            return 1
    print_summary(summary)
    return 0 if summary.episodes else 1


def rollout(
    episodes: Annotated[int, typer.Option("--episodes", "-n", help="Episodes to play (whole groups).")] = 20,
    split: Annotated[str, typer.Option(help="Curriculum split: train or eval.")] = "train",
    concurrency: Annotated[int, typer.Option(help="Episodes in flight.")] = 16,
    max_tokens: Annotated[int, typer.Option(help="Max new tokens per turn.")] = 64,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    prompt_mode: Annotated[
        str, typer.Option(help="full or memory (current observation + k-step memory).")
    ] = "full",
    memory_steps: Annotated[int, typer.Option(help="k of the memory prompt mode.")] = 2,
    max_turns: Annotated[int, typer.Option(help="Per-episode cap on policy decisions.")] = 64,
    config: Annotated[
        Path | None, typer.Option(help="YAML of RolloutConfig fields (overrides the flags).")
    ] = None,
    no_stream: Annotated[
        bool, typer.Option("--no-stream", help="Do not append to the trajectory stream.")
    ] = False,
) -> None:
    """Play episodes through the running services and append the trajectories to the stream."""
    if config is not None:
        raw: Any = yaml.safe_load(config.read_text()) or {}
        data: dict[str, Any] = dict(raw.get("rollout", raw))
        data.pop("episodes", None)
        cfg = RolloutConfig.from_mapping(data)
    else:
        try:
            cfg = RolloutConfig(
                concurrency=concurrency, prompt_mode=prompt_mode, memory_steps=memory_steps,  # type: ignore[arg-type]
                max_turns=max_turns, sampling=SamplingConfig(max_tokens=max_tokens, temperature=temperature),
            )  # fmt: skip
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    raise typer.Exit(asyncio.run(_rollout(episodes, split, cfg, not no_stream)))


def mount(app: typer.Typer) -> None:
    """Add the rollout's commands to the main ``wolfpack`` CLI."""
    app.command("rollout")(rollout)
