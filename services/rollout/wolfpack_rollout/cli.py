"""``wolfpack rollout``: play N episodes against a running stack (``wolfpack up``, or the addresses in
settings) with this process as the rollout worker: tasks from the curriculum, trajectories to the stream,
a progress line, and a summary (episodes, turns, win rate by role and opponent kind, invalid/defaulted
moves, failures by reason with an example of each).

Behaviour a person at a terminal relies on:

* **Every failed episode is printed** as it fails (``bucket seed N: reason detail``) and counted by reason
  in the summary, so a failure can be reproduced, not only counted.
* **Progress moves with the turns**, not only when an episode ends: the line is refreshed every half
  second from the driver's counters (on a CPU an episode takes minutes; turns are what move).
* **Ctrl-C stops at once** and prints the partial summary of what was delivered (episodes in flight are
  abandoned and counted as interrupted; whatever was delivered is already in the stream). A second
  Ctrl-C while stopping quits without the summary.
* **Defaults fit the machine**: on a few cores the flags not given come from ``config.cpu_profile``
  (see ``build_config``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Every ``wolfpack`` command imports this module to mount it: what the commands need loads in them.
if TYPE_CHECKING:
    import asyncio

    from wolfpack_rollout.config import RolloutConfig
    from wolfpack_rollout.driver import RolloutDriver
    from wolfpack_rollout.summary import EpisodeFailure, RolloutSummary

console = Console()
REFRESH_S = 0.5
"""How often the progress line is redrawn and new failures printed."""
PLAIN_PROGRESS_S = 30.0
"""Without a terminal (no live bar) the progress line is printed this often."""
DETAIL_CHARS = 200
"""A failure's detail is cut to this on its progress line (the summary keeps one per reason, cut too)."""


def print_summary(s: RolloutSummary, out: Console | None = None, *, title: str = "Rollout summary") -> None:
    out = out or console
    head = Table(title=title)
    head.add_column("metric")
    head.add_column("value", justify="right")
    rows = [
        ("episodes", f"{s.episodes}"), ("failed episodes", f"{s.failed}"), ("turns (all seats)", f"{s.turns}"),
        ("trainee turns", f"{s.trainee_turns}"), ("invalid moves (re-prompted)", f"{s.invalid_moves}"),
        ("defaulted moves", f"{s.defaulted_moves}"), ("late answers (defaulted: after the turn timeout)", f"{s.late_answers}"),
        ("truncated episodes", f"{s.truncated_episodes}"),
        ("responses cut at max_tokens", f"{s.truncated_responses}"), ("compressed prompts", f"{s.compressed_prompts}"),
        ("mean trainee reward", f"{s.mean_trainee_reward:+.3f}"), ("generated tokens", f"{s.generated_tokens}"),
        ("episodes / min", f"{s.episodes_per_min:.1f}"), ("generated tokens / s", f"{s.tokens_per_s:.0f}"),
        ("backpressure wait (s)", f"{s.backpressure_wait_s:.1f}"), ("elapsed (s)", f"{s.elapsed_s:.1f}"),
    ]  # fmt: skip
    if s.interrupted:
        rows.insert(2, ("interrupted (in flight at Ctrl-C)", f"{s.interrupted}"))
    for row in rows:
        head.add_row(*row)
    out.print(head)
    for name, rates in (
        ("Win rate by role", s.win_rate_by_role),
        ("Win rate by opponent kind", s.win_rate_by_opponent),
    ):
        t = Table(title=name)
        t.add_column("group")
        t.add_column("win rate", justify="right")
        t.add_column("trainee seats", justify="right")
        for group, (rate, n) in rates.items():
            t.add_row(group, f"{rate:.0%}", str(n))
        out.print(t)
    if s.failures:
        t = Table(title="Failures by reason")
        t.add_column("reason")
        t.add_column("episodes", justify="right")
        t.add_column("first one")
        for reason, n in s.failures.items():
            t.add_row(reason, str(n), escape(_clip(s.failure_details.get(reason, ""))))
        out.print(t)


def failure_line(f: EpisodeFailure) -> str:
    """One failed episode for the console: ``episode failed (#3) bargaining_v1/easy seed 7: reason — detail``."""
    where = f" {escape(f.where)}" if f.where else ""
    detail = f" — {escape(_clip(f.detail))}" if f.detail else ""
    return f"[yellow]episode failed[/] (#{f.number}){where}: [bold]{escape(f.reason)}[/]{detail}"


def _clip(text: str, n: int = DETAIL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def status_line(driver: RolloutDriver) -> str:
    st = driver.stats
    return (
        f"done {st.episodes_finished} · failed {st.episodes_failed} · in flight {st.in_flight} · "
        f"turns {st.turns} · tokens {st.generated_tokens}"
    )


def partial_summary(driver: RolloutDriver, started: float) -> RolloutSummary:
    """What the driver delivered so far, as ``run`` would summarise it (the CLI's driver is fresh, so its
    counters are this run's); episodes started but neither delivered nor failed count as interrupted."""
    from wolfpack_rollout.summary import summarize

    st = driver.stats
    s = summarize(
        driver.trajectories, st.failures, time.monotonic() - started, st,
        st.recent_failures,
    )  # fmt: skip
    s.interrupted = max(0, st.episodes_started - st.episodes_finished - st.episodes_failed)
    return s


async def play_with_progress(
    driver: RolloutDriver,
    episodes: int,
    split: str,
    stop: asyncio.Event,
    *,
    on_refresh: Callable[[], None] = lambda: None,
    on_failure: Callable[[EpisodeFailure], None] = lambda f: None,
) -> tuple[RolloutSummary, bool]:
    """Run ``driver.run(episodes, split)``, calling ``on_refresh`` every ``REFRESH_S`` and ``on_failure``
    once per failed episode as it fails. Setting ``stop`` stops at once: the run is cancelled (episodes
    in flight abandoned) and the partial summary is returned. Returns (summary, stopped)."""
    import asyncio

    started = time.monotonic()
    shown = driver.stats.episodes_failed

    def refresh() -> None:
        nonlocal shown
        for f in list(driver.stats.recent_failures):
            if f.number > shown:
                on_failure(f)
                shown = f.number
        on_refresh()

    run = asyncio.create_task(driver.run(episodes, split))
    cancelled = False
    try:
        while not run.done():
            refresh()
            # A cancel that lands while the driver waits for a free slot makes it drain the episodes in
            # flight (minutes on a CPU): cancel again while any is in flight, but not once they are gone,
            # so the driver's own cleanup (closing the PlaySeats stream) is not interrupted.
            if stop.is_set() and (not cancelled or driver.stats.in_flight > 0):
                run.cancel()
                cancelled = True
            waiter = asyncio.create_task(stop.wait())
            await asyncio.wait({run, waiter}, timeout=REFRESH_S, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
    finally:
        if not run.done():  # this coroutine itself was cancelled: take the run down with it
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
    refresh()
    if run.cancelled():
        return partial_summary(driver, started), True
    return run.result(), False


def _on_sigint(stop: asyncio.Event) -> Callable[[], None]:
    """First Ctrl-C: set ``stop`` and hand SIGINT back to Python, so a second one raises
    KeyboardInterrupt (quit without the summary) if stopping hangs."""
    import asyncio

    def handler() -> None:
        stop.set()
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(signal.SIGINT)
        console.print("[yellow]Ctrl-C: stopping; episodes in flight are abandoned (Ctrl-C again to quit)[/]")

    return handler


async def _rollout(episodes: int, split: str, config: RolloutConfig, stream: bool) -> int:
    import asyncio

    from wolfpack.cli.main import settings_or_exit
    from wolfpack_rollout.client import Addresses, connect
    from wolfpack_rollout.driver import EpisodeFailed

    settings = settings_or_exit()
    addresses = Addresses.from_settings(settings)
    if addresses.curriculum is None:
        console.print("[red]no curriculum address: start the stack with `wolfpack up`[/]")
        return 2
    console.print(
        f"rollout: {episodes} episodes ({split}), concurrency {config.concurrency}, "
        f"max_tokens {config.sampling.max_tokens}, prompt {config.prompt_mode}, "
        f"turn timeout {f'{config.turn_timeout_s:g}s' if config.turn_timeout_s else 'the environment default'}, "
        f"stream {addresses.stream if stream and addresses.redis_url else 'off'}"
    )
    # Each failure is printed below with its reason and detail; the driver's own warning would repeat it.
    logging.getLogger("wolfpack_rollout.driver").setLevel(logging.ERROR)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread / Windows
        loop.add_signal_handler(signal.SIGINT, _on_sigint(stop))
    summary: RolloutSummary | None = None
    stopped = False
    code = 0
    with Progress(
        TextColumn("[bold]episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"), console=console,
    ) as progress:  # fmt: skip
        bar = progress.add_task("episodes", total=episodes, status="connecting")
        try:
            async with connect(settings, config, addresses, stream=stream) as driver:
                started = last_line = time.monotonic()

                def tick() -> None:
                    nonlocal last_line
                    st = driver.stats
                    progress.update(
                        bar, completed=st.episodes_finished + st.episodes_failed,
                        total=max(episodes, st.episodes_started), status=status_line(driver),
                    )  # fmt: skip
                    # Not a terminal (a log file, CI): no live bar, so a plain line now and then.
                    if not console.is_terminal and time.monotonic() - last_line >= PLAIN_PROGRESS_S:
                        last_line = time.monotonic()
                        console.print(f"{time.monotonic() - started:.0f}s: {status_line(driver)}")

                def failed(f: EpisodeFailure) -> None:
                    progress.console.print(failure_line(f))

                try:
                    summary, stopped = await play_with_progress(
                        driver, episodes, split, stop, on_refresh=tick, on_failure=failed
                    )
                except EpisodeFailed as exc:  # the curriculum: unreachable, or no task for the split
                    tick()
                    console.print(f"[red]rollout stopped: {escape(str(exc))}[/]")
                    summary, code = partial_summary(driver, started), 1
        except (OSError, ConnectionError) as exc:
            console.print(f"[red]cannot reach the stack: {escape(str(exc))}[/]")
            console.print("is it running? `wolfpack up` (or set WOLFPACK_<SERVICE>_ADDR)")
            return 1
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGINT)
    assert summary is not None
    if stopped:
        print_summary(summary, title="Partial rollout summary (stopped by Ctrl-C)")
        return 130
    print_summary(summary)
    return code or (0 if summary.episodes else 1)


def build_config(
    cpus: int | None = None,
    *,
    concurrency: int | None = None,
    max_tokens: int | None = None,
    prompt_mode: str | None = None,
    turn_timeout_s: float | None = None,
    temperature: float = 1.0,
    memory_steps: int = 2,
    max_turns: int = 64,
) -> RolloutConfig:
    """The flags' ``RolloutConfig``: what is given wins; what is not comes from ``cpu_profile`` on a
    machine of at most ``CPU_PROFILE_MAX_CORES`` cores (the policy is then generated on the same cores as
    the services), else from the dataclass defaults (a GPU policy)."""
    from wolfpack_rollout.config import CPU_PROFILE_MAX_CORES, RolloutConfig, SamplingConfig, cpu_profile

    n = (os.cpu_count() or 1) if cpus is None else cpus
    profile = cpu_profile(n) if n <= CPU_PROFILE_MAX_CORES else {}
    base = RolloutConfig()

    def pick(given: Any, key: str, default: Any) -> Any:
        return given if given is not None else profile.get(key, default)

    return RolloutConfig(
        concurrency=pick(concurrency, "concurrency", base.concurrency),
        prompt_mode=pick(prompt_mode, "prompt_mode", base.prompt_mode),
        memory_steps=memory_steps,
        max_turns=max_turns,
        turn_timeout_s=pick(turn_timeout_s, "turn_timeout_s", base.turn_timeout_s),
        generate_timeout_s=pick(None, "generate_timeout_s", base.generate_timeout_s),
        sampling=SamplingConfig(
            max_tokens=pick(max_tokens, "max_tokens", base.sampling.max_tokens), temperature=temperature
        ),
    )


def rollout(
    episodes: Annotated[int, typer.Option("--episodes", "-n", help="Episodes to play (whole groups).")] = 20,
    split: Annotated[str, typer.Option(help="Curriculum split: train or eval.")] = "train",
    concurrency: Annotated[
        int | None, typer.Option(help="Episodes in flight. Default: 2-4 on <= 8 cores, else 16.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="Max new tokens per turn. Default: 32 on <= 8 cores, else 64.")
    ] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    prompt_mode: Annotated[
        str | None,
        typer.Option(
            help="full or memory (current observation + k-step memory). Default: memory on <= 8 cores, else full. "
            "(conversation, a seat's turns as one growing chat, needs the policy's tokenizer: wolfpack train's "
            "rollout.prompt only.)"
        ),
    ] = None,
    turn_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--turn-timeout",
            help="Seconds the environment waits for a move before defaulting it. Default: 600 on <= 8 cores, "
            "else the environment's (120).",
        ),
    ] = None,
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
    import asyncio

    import yaml

    from wolfpack_rollout.config import RolloutConfig

    if config is not None:
        raw: Any = yaml.safe_load(config.read_text()) or {}
        data: dict[str, Any] = dict(raw.get("rollout", raw))
        data.pop("episodes", None)
        cfg = RolloutConfig.from_mapping(data)
    else:
        try:
            cfg = build_config(
                concurrency=concurrency, max_tokens=max_tokens, prompt_mode=prompt_mode,
                turn_timeout_s=turn_timeout_s, temperature=temperature, memory_steps=memory_steps,
                max_turns=max_turns,
            )  # fmt: skip
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    raise typer.Exit(asyncio.run(_rollout(episodes, split, cfg, not no_stream)))


def mount(app: typer.Typer) -> None:
    """Add the rollout's commands to the main ``wolfpack`` CLI."""
    app.command("rollout")(rollout)
