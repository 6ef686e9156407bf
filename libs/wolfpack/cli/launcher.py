"""``wolfpack up``: Redis plus every service as local processes, supervised from one asyncio loop.

Why processes and not threads: each service is exactly what runs in its container (``wolfpack serve
SERVICE``), so local runs exercise the real gRPC boundaries, ports and shutdown paths. Children get the
Redis URL and every service address through ``WOLFPACK_*`` variables, their output is prefixed and
streamed (and kept under ``<run_dir>/logs``), and on Ctrl-C or SIGTERM each gets SIGTERM first (drain),
then SIGKILL after the grace period; the embedded Redis stops last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from wolfpack import SERVICES, rpc
from wolfpack.redis_server import free_port, redis_url_or_embedded
from wolfpack.settings import Settings

COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red")


@dataclass
class ServiceProc:
    name: str
    address: str
    proc: asyncio.subprocess.Process | None = None
    status: str = "STARTING"
    log_path: Path | None = None
    tail: list[str] = field(default_factory=list)


@dataclass
class UpState:
    """What ``wolfpack status`` reads back: addresses, pids and the Redis URL of a running stack."""

    redis_url: str
    embedded_redis: bool
    services: dict[str, str]
    pids: dict[str, int]
    started_at: float

    @staticmethod
    def path(run_dir: Path) -> Path:
        return run_dir / "up.json"


def plan_addresses(settings: Settings) -> dict[str, str]:
    if settings.base_port == 0:
        return {
            s: getattr(settings, f"{s}_addr") or f"{settings.host}:{free_port(settings.host)}"
            for s in SERVICES
        }
    return {s: settings.service_addr(s) for s in SERVICES}


def child_env(settings: Settings, redis_url: str, addresses: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["WOLFPACK_REDIS_URL"] = redis_url
    env["WOLFPACK_RUN_DIR"] = str(settings.run_dir.resolve())
    for s, addr in addresses.items():
        env[f"WOLFPACK_{s.upper()}_ADDR"] = addr
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def _pump(svc: ServiceProc, color: str, console: Console, echo: bool) -> None:
    assert svc.proc is not None and svc.proc.stdout is not None
    assert svc.log_path is not None
    with svc.log_path.open("a", encoding="utf-8") as fh:
        async for raw in svc.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            fh.write(line + "\n")
            fh.flush()
            svc.tail = [*svc.tail[-19:], line]
            if echo:
                console.print(
                    f"[{color}]{svc.name:>11}[/] | {line}", markup=True, highlight=False, soft_wrap=True
                )


async def _wait_healthy(svc: ServiceProc, deadline: float) -> None:
    assert svc.proc is not None
    while time.monotonic() < deadline:
        if svc.proc.returncode is not None:
            svc.status = f"EXITED({svc.proc.returncode})"
            return
        status = await rpc.check_health(svc.address, timeout_s=1.0)
        if status == "SERVING":
            svc.status = status
            return
        await asyncio.sleep(0.2)
    svc.status = "TIMEOUT"


def status_table(title: str, rows: list[tuple[str, str, str, str]]) -> Table:
    table = Table(title=title)
    for col in ("service", "address", "pid", "status"):
        table.add_column(col)
    for name, addr, pid, status in rows:
        style = "green" if status in ("SERVING", "PONG") else "red"
        table.add_row(name, addr, pid, f"[{style}]{status}[/]")
    return table


async def _terminate(procs: list[ServiceProc], grace_s: float) -> None:
    for svc in procs:
        if svc.proc is not None and svc.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                svc.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s + 2.0
    for svc in procs:
        if svc.proc is None:
            continue
        try:
            await asyncio.wait_for(svc.proc.wait(), timeout=max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                svc.proc.kill()
            await svc.proc.wait()


async def run_up(settings: Settings, *, check: bool, timeout_s: float, console: Console) -> int:
    """Start everything, wait for SERVING, print the table; with ``check`` stop and return the verdict."""
    run_dir = settings.run_dir
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    redis_url, embedded = redis_url_or_embedded(settings)
    procs: list[ServiceProc] = []
    try:
        addresses = plan_addresses(settings)
        env = child_env(settings, redis_url, addresses)
        pumps = []
        for i, name in enumerate(SERVICES):
            svc = ServiceProc(name, addresses[name], log_path=run_dir / "logs" / f"{name}.log")
            svc.log_path.write_text("")  # type: ignore[union-attr]
            svc.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "wolfpack.cli.main",
                "serve",
                name,
                "--address",
                svc.address,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            procs.append(svc)
            pumps.append(asyncio.create_task(_pump(svc, COLORS[i % len(COLORS)], console, echo=not check)))
        deadline = time.monotonic() + timeout_s
        await asyncio.gather(*(_wait_healthy(s, deadline) for s in procs))
        redis_status = "PONG" if await _ping(redis_url) else "UNREACHABLE"
        rows = [
            (
                "redis" + (" (embedded)" if embedded else ""),
                redis_url,
                str(embedded.proc.pid) if embedded and embedded.proc else "-",
                redis_status,
            )
        ]
        rows += [(s.name, s.address, str(s.proc.pid if s.proc else "-"), s.status) for s in procs]
        console.print(status_table("wolfpack up", rows))
        healthy = redis_status == "PONG" and all(s.status == "SERVING" for s in procs)
        for s in procs:
            if s.status != "SERVING":
                console.print(f"[red]{s.name} is {s.status}; last log lines ({s.log_path}):[/]")
                console.print("\n".join(s.tail[-20:]), markup=False, highlight=False)
        state = UpState(
            redis_url=redis_url,
            embedded_redis=embedded is not None,
            services=addresses,
            pids={s.name: s.proc.pid for s in procs if s.proc},
            started_at=time.time(),
        )
        UpState.path(run_dir).write_text(json.dumps(asdict(state), indent=2))
        if check or not healthy:
            verdict = "all services SERVING" if healthy else "some services are not healthy"
            console.print(f"[{'green' if healthy else 'red'}]{verdict}[/]; shutting down.")
            return 0 if healthy else 1
        console.print("[bold]Ctrl-C to stop.[/] Logs also in " + str(run_dir / "logs"))
        stop = rpc.stop_on_signals()
        exits = [asyncio.create_task(s.proc.wait()) for s in procs if s.proc]
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopper, *exits], return_when=asyncio.FIRST_COMPLETED)
        if stopper not in done:
            dead = [s.name for s in procs if s.proc and s.proc.returncode is not None]
            console.print(f"[red]service(s) exited unexpectedly: {', '.join(dead)}; stopping the rest.[/]")
            return 1
        console.print("stopping: draining services…")
        return 0
    finally:
        await _terminate(procs, settings.grpc_grace_s)
        if embedded is not None:
            embedded.stop()
        UpState.path(run_dir).unlink(missing_ok=True)
        console.print("stopped.")


async def _ping(url: str) -> bool:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        return bool(await client.ping())
    except Exception:
        return False
    finally:
        await client.aclose()


async def run_status(settings: Settings, console: Console) -> int:
    """Health of a running stack (from ``up.json`` if ``wolfpack up`` runs, else configured addresses)."""
    path = UpState.path(settings.run_dir)
    if path.exists():
        state = json.loads(path.read_text())
        addresses: dict[str, str] = state["services"]
        pids: dict[str, int] = state["pids"]
        redis_url: str | None = state["redis_url"]
    else:
        addresses = {s: settings.service_addr(s) for s in SERVICES}
        pids = {}
        redis_url = settings.redis_url
    statuses = await asyncio.gather(*(rpc.check_health(a, timeout_s=2.0) for a in addresses.values()))
    rows = []
    if redis_url:
        rows.append(("redis", redis_url, "-", "PONG" if await _ping(redis_url) else "UNREACHABLE"))
    rows += [
        (s, a, str(pids.get(s, "-")), st) for (s, a), st in zip(addresses.items(), statuses, strict=True)
    ]
    console.print(status_table("wolfpack status", rows))
    return 0 if all(r[3] in ("SERVING", "PONG") for r in rows) else 1
