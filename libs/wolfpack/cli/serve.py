"""``wolfpack serve SERVICE`` as a small entry point of its own: ``python -m wolfpack.cli.serve SERVICE``.

Why a second way in: ``wolfpack.cli.main`` builds the whole Typer application before it runs a command,
importing every service's CLI module to mount its commands (``play``, ``train``, ``league``…) and, in the
Typer in use, pydantic for coercing the arguments: about 0.15 s of CPU per process that a service never
uses. ``wolfpack up`` starts six or seven such processes at once on a 2-core machine, so it starts them
here instead; ``wolfpack serve`` (what each container runs) calls the same ``serve_service``, so both run
one code path: settings, logging, telemetry, the service's ``main``, the same messages and exit codes.

``--await-ready SERVICE=PATH`` (for ``wolfpack up`` only, hidden from users): import the service's module
first, then wait for each named ready file (``wolfpack serve --ready-file`` of a service this one needs the
address of) and put its address in ``WOLFPACK_<SERVICE>_ADDR`` before the settings are read. With
``--base-port 0`` a service's port is known only once it has bound, so the rollout service, which needs
four addresses when it starts, imports its code while the inference service loads its model instead of
after it.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import gc
import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from wolfpack import SERVICES

if TYPE_CHECKING:
    from wolfpack.settings import Settings

AWAIT_POLL_S = 0.02
"""How often a waiting service looks for the ready files it waits on (a file has no event to await)."""


def _say(markup: str) -> None:
    """A red line on stdout, as ``wolfpack``'s commands print errors (rich only here: ~0.05 s of imports)."""
    from rich.console import Console

    Console().print(f"[red]{markup}[/]", markup=True, highlight=False)


def _say_plain(message: str) -> None:
    """One red line on stderr, the text as is (an OS error can hold brackets)."""
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(message, style="red", markup=False, highlight=False)


def load_settings_or_none(**overrides: object) -> Settings | None:
    """The settings, or None after printing why they are invalid (the caller exits 2)."""
    from wolfpack.settings import SettingsError, load_settings

    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        _say(str(exc))
        return None


def await_ready(waits: dict[str, Path]) -> None:
    """Block until each ready file exists and holds an address; export them as ``WOLFPACK_<S>_ADDR``.
    Unbounded on purpose: ``wolfpack up`` owns this process and ends it (SIGTERM, or the kernel's
    parent-death signal) when a service it waits for fails or the stack stops."""
    for service, path in waits.items():
        while True:
            try:
                address = str(json.loads(path.read_text())["address"])
                break
            except (OSError, ValueError, KeyError):
                time.sleep(AWAIT_POLL_S)
        os.environ[f"WOLFPACK_{service.upper()}_ADDR"] = address


def read_start(stream: TextIO) -> tuple[str, Path, dict[str, str]] | None:
    """``--start-on-stdin``: the address, ready file and environment ``wolfpack up`` sends once it has
    read its settings, one JSON line; None when the launcher closed the pipe without one (it gave up:
    another stack runs in its run dir, invalid settings)."""
    line = stream.readline()
    if not line.strip():
        return None
    start = json.loads(line)
    return str(start["address"]), Path(start["ready_file"]), dict(start["env"])


def serve_service(
    service: str,
    address: str | None,
    ready_file: Path | None,
    waits: dict[str, Path] | None = None,
    *,
    start_on_stdin: bool = False,
) -> int:
    """Run ``service``'s gRPC server in the foreground until SIGTERM/SIGINT; the exit code."""
    if service not in SERVICES:
        _say(f"unknown service {service!r}; services: {', '.join(SERVICES)}")
        return 2
    # No cyclic collector during start-up: imports (torch and transformers for the inference service) and
    # set-up allocate long-lived objects by the hundred thousand, and its passes over them as they pile up
    # cost the inference service ~1 s of its ~6 s start-up on a 2-core machine (bench/startup). The
    # server turns it back on once set up, after one collection (``rpc.tune_gc``).
    gc.disable()
    try:
        if start_on_stdin:
            # Spawned by ``wolfpack up`` before it read its settings: import first (the service's
            # ``prepare``, if any: the inference service's torch and transformers), then learn where to bind.
            module = importlib.import_module(f"wolfpack_{service}.server")
            prepare = getattr(module, "prepare", None)
            if prepare is not None:
                prepare()
            start = read_start(sys.stdin)
            if start is None:
                return 1
            address, ready_file, env = start
            os.environ.update(env)
        return _serve(service, address, ready_file, waits)
    finally:
        gc.enable()  # already on once a server started; this covers every early return


def _serve(service: str, address: str | None, ready_file: Path | None, waits: dict[str, Path] | None) -> int:
    if waits:
        importlib.import_module(f"wolfpack_{service}.server")  # the slow part, while the others bind
        await_ready(waits)
    settings = load_settings_or_none()
    if settings is None:
        return 2
    from wolfpack import telemetry
    from wolfpack.logs import setup_logging

    setup_logging(service, settings.log_level, settings.log_format)
    telemetry.setup_telemetry(service)
    module = importlib.import_module(f"wolfpack_{service}.server")
    from wolfpack import rpc

    rpc.freeze_imports()
    rpc.announce_bound_address(ready_file)
    try:
        asyncio.run(module.main(settings, address))
    except OSError as exc:  # a taken port (rpc.BindError), an unreadable file: one line, no traceback
        message = str(exc) if str(exc).startswith(f"{service}:") else f"{service}: {exc}"
        _say_plain(message)
        return 1
    return 0


def serve_web(
    address: str | None,
    ready_file: Path | None,
    *,
    env: str | None = None,
    spectate: bool = True,
    runs: list[Path] | None = None,
    waits: dict[str, Path] | None = None,
) -> int:
    """``wolfpack web``: serve the web view until SIGTERM/SIGINT; the exit code. ``env`` overrides the
    environment service's address; ``runs`` adds run directories to show."""
    if waits:
        importlib.import_module("wolfpack_web.server")  # aiohttp and the views, while the others bind
        await_ready(waits)
    settings = load_settings_or_none(**({} if env is None else {"environment_addr": env}))
    if settings is None:
        return 2
    # importlib by name, like services: the web view is a client package that the libs layer never imports.
    web_settings = importlib.import_module("wolfpack_web.settings")
    server = importlib.import_module("wolfpack_web.server")
    from wolfpack.settings import SettingsError

    web_overrides: dict[str, object] = {} if address is None else {"addr": address}
    if not spectate:
        web_overrides["spectate"] = False
    try:
        loaded = web_settings.load_web_settings(**web_overrides)
        if runs:
            loaded = loaded.model_copy(update={"runs": [*loaded.runs, *runs]})
    except SettingsError as exc:
        _say(str(exc))
        return 2
    from wolfpack.logs import setup_logging

    setup_logging("web", settings.log_level, settings.log_format)
    try:
        asyncio.run(server.main(settings, loaded, ready_file))
    except OSError as exc:  # a taken port, a refused bind (PermissionError): one line, no traceback
        _say_plain(f"web: {exc}")
        return 1
    return 0


def exit_now(code: int) -> NoReturn:
    """End a server process that has stopped as ``sys.exit(code)`` would, minus the interpreter's teardown.

    Everything an exit does for the program still happens: the ``atexit`` handlers (logging's flush and
    close, the OpenTelemetry provider's last export) and the flush of stdout and stderr. What is skipped is
    freeing every object of the module graph one by one before the OS frees the whole address space
    anyway: with torch and transformers imported that took 0.3 s after the drain (1.6 s without
    ``rpc.tune_gc``'s freeze), on the path of every ``wolfpack up`` stop and pod termination. A
    non-daemon thread still running gets the normal exit, which waits for it."""
    current = threading.current_thread()
    if any(t is not current and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code)


def _wait_arg(value: str) -> tuple[str, Path]:
    service, sep, path = value.partition("=")
    if not sep or service not in SERVICES or not path:
        raise argparse.ArgumentTypeError(f"expected SERVICE=PATH with SERVICE one of {', '.join(SERVICES)}")
    return service, Path(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m wolfpack.cli.serve",
        description="Run one service's gRPC server (see `wolfpack serve`).",
    )
    ap.add_argument("service", help=f"One of: {', '.join(SERVICES)}, or web (the web view).")
    ap.add_argument(
        "--address", default=None, help="host:port to bind (default from settings); port 0 picks one."
    )
    ap.add_argument(
        "--ready-file", type=Path, default=None, help="Once bound, write the address here (JSON)."
    )
    ap.add_argument("--await-ready", type=_wait_arg, action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--start-on-stdin", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    waits = dict(args.await_ready)
    if args.service == "web":
        exit_now(serve_web(args.address, args.ready_file, waits=waits))
    exit_now(
        serve_service(args.service, args.address, args.ready_file, waits, start_on_stdin=args.start_on_stdin)
    )


if __name__ == "__main__":
    main()
