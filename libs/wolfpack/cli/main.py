"""``wolfpack``: start the stack, serve one service, and (added by later issues) play, train, eval, bench.

Every command reads ``WOLFPACK_*`` settings (``wolfpack config`` lists them) and fails with a readable
message, not a traceback, when they are wrong.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from wolfpack import SERVICES

if TYPE_CHECKING:  # settings (pydantic-settings) load in the commands that use them: local commands such
    from wolfpack.settings import Settings  # as ``wolfpack play`` start sooner without them

app = typer.Typer(
    name="wolfpack",
    help="Wolfpack: train LLM agents with RL in multi-agent social games.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()


def settings_or_exit(**overrides: object) -> Settings:
    from wolfpack.settings import SettingsError, load_settings

    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        console.print(f"[red]{exc}[/]", markup=True, highlight=False)
        raise typer.Exit(2) from None


@app.command()
def up(
    check: Annotated[
        bool, typer.Option("--check", help="Start, print the table, stop; exit 0 only if all are healthy.")
    ] = False,
    base_port: Annotated[
        int | None, typer.Option(help="First service port (0 = free ports). Default: WOLFPACK_BASE_PORT.")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for every service to report SERVING.")
    ] = 90.0,
) -> None:
    """Start Redis (embedded unless WOLFPACK_REDIS_URL is set) and every service as local processes."""
    import asyncio  # here: local commands (``play``) never need an event loop

    from wolfpack.cli.launcher import kill_early, run_up, spawn_early

    overrides: dict[str, object] = {} if base_port is None else {"base_port": base_port}

    async def up_stack() -> int:
        # The inference service first, before the settings are read (~0.2 s): its start-up is the stack's.
        early = await spawn_early()
        try:
            settings = settings_or_exit(**overrides)
        except typer.Exit:
            await kill_early(early)
            raise
        return await run_up(settings, check=check, timeout_s=timeout, console=console, early=early)

    code = asyncio.run(up_stack())
    global _stack_stopped
    _stack_stopped = True  # every process of the stack is gone: ``main`` ends without the teardown
    raise typer.Exit(code)


@app.command()
def status() -> None:
    """Show the health of Redis and every service of a running stack."""
    import asyncio

    from wolfpack.cli.launcher import run_status

    raise typer.Exit(asyncio.run(run_status(settings_or_exit(), console)))


@app.command()
def serve(
    service: Annotated[str, typer.Argument(help=f"One of: {', '.join(SERVICES)}.")],
    address: Annotated[
        str | None, typer.Option(help="host:port to bind (default from settings); port 0 picks a free one.")
    ] = None,
    ready_file: Annotated[
        Path | None,
        typer.Option(help='Once bound, write {"service", "address", "pid"} as JSON here (the port 0 gave).'),
    ] = None,
) -> None:
    """Run one service's gRPC server in the foreground (what each container runs)."""
    from wolfpack.cli.serve import serve_service  # ``wolfpack up`` starts services through it directly

    code = serve_service(service, address, ready_file)
    if code:
        raise typer.Exit(code)


@app.command()
def web(
    address: Annotated[
        str | None, typer.Option(help="host:port to listen on (default WOLFPACK_WEB_ADDR, 127.0.0.1:8470).")
    ] = None,
    env: Annotated[
        str | None, typer.Option("--env", help="Environment service host:port (default: the stack's).")
    ] = None,
    spectate: Annotated[
        bool, typer.Option(help="Live spectating (default WOLFPACK_WEB_SPECTATE, on).")
    ] = True,
    runs: Annotated[
        list[Path] | None, typer.Option(help="Run directory (or folder of them) to show; repeatable.")
    ] = None,
    ready_file: Annotated[Path | None, typer.Option(hidden=True)] = None,
) -> None:
    """Serve the web view and print its URL: watch games live, replay trajectories, follow training runs."""
    from wolfpack.cli.serve import serve_web  # ``wolfpack up`` starts the web view through it directly

    code = serve_web(address, ready_file, env=env, spectate=spectate, runs=runs)
    if code:
        raise typer.Exit(code)


@app.command()
def config() -> None:
    """List every WOLFPACK_* setting with its default and meaning."""
    from wolfpack.settings import describe_settings

    table = Table(title="Wolfpack settings (environment variables)")
    for col in ("variable", "default", "meaning"):
        table.add_column(col)
    for row in describe_settings():
        table.add_row(*row)
    console.print(table)


def _mount_service_commands() -> None:
    """Services contribute their own commands (``play``, ``scenarios``, later ``train``, ``eval``, ``bench``)
    through a ``mount(app)`` function in ``wolfpack_<service>.cli``; a service not installed adds none."""
    for service in SERVICES:
        try:
            module = importlib.import_module(f"wolfpack_{service}.cli")
        except ModuleNotFoundError as exc:
            if exc.name != f"wolfpack_{service}.cli":
                raise
            continue
        module.mount(app)


_mount_service_commands()


_stack_stopped = False
"""Set by ``up`` once its stack has stopped: ``main`` then exits through ``serve.exit_now`` (the ``atexit``
handlers and a flush, not the interpreter's teardown of every module: ~0.25 s of ``up --check``)."""


def main() -> None:
    try:
        app()
    except SystemExit as done:
        if _stack_stopped and isinstance(done.code, int):
            from wolfpack.cli.serve import exit_now

            exit_now(done.code)
        raise


if __name__ == "__main__":
    main()
