"""``wolfpack up``: Redis plus every service as local processes, supervised from one asyncio loop.

Why processes and not threads: each service is exactly what runs in its container (``wolfpack serve
SERVICE``), so local runs exercise the real gRPC boundaries, ports and shutdown paths. Children get the
Redis URL and every service address through ``WOLFPACK_*`` variables, their output is prefixed and
streamed (and kept under ``<run_dir>/logs``), and on Ctrl-C, SIGTERM or SIGHUP (a closed terminal) —
at any moment, start-up included — each gets SIGTERM first (drain), then SIGKILL after the grace period;
the embedded Redis stops last. An embedded Redis that dies while the stack runs is restarted on its port
from its AOF, with a line saying so; one that keeps dying or cannot come back stops the stack with exit 1
(``EmbeddedRedis.watch``): services are never left SERVING against no Redis.

Nothing is left behind: the services form one process group owned by the launcher, each is told by the
kernel to exit when the launcher dies (``PR_SET_PDEATHSIG``), and ``up.json`` is written as soon as each
process starts, so an ``up`` after a SIGKILLed one reaps whatever survived (and the embedded Redis reaps
its own orphan from its pid file). One stack per run dir: ``up.lock`` is held (``flock``) while a stack
runs, and a second ``up`` on the same run dir refuses with a message instead of touching it.

Ports: with ``--base-port 0`` each service binds ``host:0`` itself and reports the port the kernel gave it
(``serve --ready-file``, under ``<run_dir>/ready``); the launcher never picks a "free" port and hands it
over, which raced every other process for it. A service that needs others' addresses at start
(``DEPENDS_ON``; the web view needs the environment's) learns them from their ready files
(``serve --await-ready``); ``up.json`` lists bound addresses only.

Start-up time: start-up is CPU (imports, the inference model's load), so processes start as many at a
time as there are cores, the slowest (inference) first, each through ``python -m wolfpack.cli.serve``
(not the whole Typer application); one that waits for addresses imports its code while it waits. On a
2-core machine the inference service so gets a core of its own while the six others start one by one on
the other, instead of sharing both with them (``START_ORDER``, ``start_slots``). It uses no Redis and needs
no address, so ``up`` spawns it before anything else, its own settings included (``spawn_early``: it imports
meanwhile and is told where to bind on stdin) and before Redis starts (``WITHOUT_REDIS``); everything else
waits for Redis's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from wolfpack import SERVICES
from wolfpack.files import write_text_atomic

if TYPE_CHECKING:  # pydantic-settings (~0.2 s) is imported once ``up`` has spawned the inference service
    from wolfpack.settings import Settings

COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red")
READY_POLL_S = 0.05
"""How often a ready file is looked for. A period adds half of itself on average to the start-up of the
service that binds last (inference); each poll is a file read plus an event-loop turn, which at 20 ms
cost the launcher ~0.05 s more CPU on a loaded machine (where start-up takes 15 s) to save ~15 ms."""
HEALTH_POLL_S = 0.05
"""The pause between health checks of a bound service that is not SERVING yet (most are SERVING at the
first check: they bind once set up)."""


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
    launcher_pid: int = 0
    pgid: int = 0  # the services' process group
    web_url: str = ""  # the web view's URL once it listens ("": not started, e.g. not installed)

    @staticmethod
    def path(run_dir: Path) -> Path:
        return run_dir / "up.json"


class AlreadyRunning(RuntimeError):
    """Another ``wolfpack up`` holds this run dir."""


def _lock_run_dir(run_dir: Path) -> IO[str]:
    """Hold ``<run_dir>/up.lock`` for as long as this stack runs (the kernel drops it when we die, even
    by SIGKILL), or raise ``AlreadyRunning`` naming the holder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fh = (run_dir / "up.lock").open("a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        holder = ""
        with contextlib.suppress(OSError, ValueError, KeyError):
            holder = f" (launcher pid {json.loads(UpState.path(run_dir).read_text())['launcher_pid']})"
        raise AlreadyRunning(
            f"a wolfpack stack is already running from run dir {run_dir.resolve()}{holder}; stop it first "
            "(Ctrl-C in its terminal, or SIGTERM to the launcher) or set WOLFPACK_RUN_DIR to another "
            "directory. Nothing was started or stopped."
        ) from None
    return fh


def _ours(pid: int) -> bool:
    """Is ``pid`` alive and a Wolfpack service (not an unrelated process that reused the pid)?"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"wolfpack" in cmdline


def reap_leftovers(run_dir: Path) -> list[int]:
    """Kill what a previous launcher of this run dir left behind (it was SIGKILLed: no clean-up ran)."""
    path = UpState.path(run_dir)
    if not path.exists():
        return []
    killed = []
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        state = json.loads(path.read_text())
        pgid = int(state.get("pgid") or 0)
        if pgid > 0 and _ours(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for pid in state.get("pids", {}).values():
            if _ours(int(pid)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
    path.unlink(missing_ok=True)
    return killed


def _child_setup(pgid: int) -> Callable[[], None]:
    """``preexec_fn`` of a service: join the stack's process group and die with the launcher."""

    def setup() -> None:
        os.setpgid(0, pgid)  # pgid 0: a new group led by this child (the first service)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the launcher died before prctl took effect
            os._exit(1)

    return setup


DEPENDS_ON: dict[str, tuple[str, ...]] = {"rollout": ("environment", "inference", "reward", "curriculum")}
"""Services whose process needs other services' addresses when it starts (in its environment). With
``base_port 0`` a service's port is known only once it has bound, so these are started with
``--await-ready`` on those: they import their code, then wait for the ready files before reading settings."""


WITHOUT_REDIS: tuple[str, ...] = ("inference",)
"""Services that never use Redis and need no other's address: ``wolfpack up`` spawns them first, before it
reads its own settings (``spawn_early``: they import their code meanwhile, the inference service its torch
and transformers, and get where to bind on stdin once the settings are read) and before the embedded Redis
is up; they get no ``WOLFPACK_REDIS_URL`` unless one is configured. Reading the settings (pydantic-settings)
and starting Redis (importing redis-py, spawning the server, waiting for its answer) took ~0.4 s of the
launcher's time before its first spawn (bench/startup)."""


async def spawn_early() -> dict[str, asyncio.subprocess.Process]:
    """Spawn the ``WITHOUT_REDIS`` services with ``--start-on-stdin``, before any settings are read: each
    imports its code (and runs its ``prepare``), then waits for one line on stdin saying where to bind
    (``start_early``). The first leads the stack's process group. Whoever gets them must start or kill them
    (``kill_early``); they also die with the launcher (``PR_SET_PDEATHSIG``)."""
    procs: dict[str, asyncio.subprocess.Process] = {}
    pgid = 0
    for name in WITHOUT_REDIS:
        procs[name] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "wolfpack.cli.serve", name, "--start-on-stdin",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_child_setup(pgid),
        )  # fmt: skip
        pgid = pgid or procs[name].pid
    return procs


async def start_early(
    proc: asyncio.subprocess.Process, address: str, ready: Path, env: dict[str, str]
) -> None:
    """Tell a ``spawn_early`` process where to bind and what to add to its environment; close its stdin."""
    assert proc.stdin is not None
    added = {k: v for k, v in env.items() if os.environ.get(k) != v}
    proc.stdin.write(
        (json.dumps({"address": address, "ready_file": str(ready), "env": added}) + "\n").encode()
    )
    with contextlib.suppress(ConnectionError):  # it died meanwhile: its exit is seen as for any process
        await proc.stdin.drain()
    proc.stdin.close()


async def kill_early(procs: dict[str, asyncio.subprocess.Process]) -> None:
    """Stop ``spawn_early`` processes that were never started (the stack was refused or cut short)."""
    for proc in procs.values():
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()
    procs.clear()


START_ORDER: tuple[str, ...] = (
    "inference",
    "environment",
    "reward",
    "curriculum",
    "trainer",
    "web",
    "rollout",
)
"""The order processes get a start slot (``start_slots``): the inference service first (loading torch,
transformers and the model, ~3 s of CPU against ~0.3 s for each other process, its start-up is the
stack's), the rollout service last (with port 0 it waits for the inference's address, holding its slot)."""


def start_slots() -> int:
    """How many processes start at once: the cores this process may run on. Start-up is CPU (imports),
    so more at once only share the cores: on a 2-core machine the inference service then gets one core
    to itself while the others start one by one on the second, instead of getting two sevenths of the
    machine while all seven start (bench/startup, ``up --check``). At least two."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(2, cores)  # one core too: a stuck inference start must not hold every other one back


def plan_addresses(settings: Settings) -> dict[str, str]:
    """Where each service will listen. With ``base_port 0`` (and no ``WOLFPACK_<SERVICE>_ADDR``) that is
    ``host:0``: the service binds a port the kernel picks and reports it back (``ready_file``); picking a
    "free" port here and handing it over would race every other process on the machine for it."""
    if settings.base_port == 0:
        return {s: getattr(settings, f"{s}_addr") or f"{settings.host}:0" for s in SERVICES}
    return {s: settings.service_addr(s) for s in SERVICES}


def _port_unknown(address: str) -> bool:
    return address.rpartition(":")[2] == "0"


def ready_file(run_dir: Path, service: str) -> Path:
    """Where ``wolfpack serve --ready-file`` reports the address ``service`` bound."""
    return run_dir / "ready" / f"{service}.json"


def child_env(settings: Settings, redis_url: str | None, addresses: dict[str, str]) -> dict[str, str]:
    """A service's environment: Redis (``None``: not up yet, for ``WITHOUT_REDIS``), the run dir, and every
    address known so far (no ``host:0``)."""
    env = dict(os.environ)
    if redis_url is not None:
        env["WOLFPACK_REDIS_URL"] = redis_url
    env["WOLFPACK_RUN_DIR"] = str(settings.run_dir.resolve())
    for s, addr in addresses.items():
        if not _port_unknown(addr):
            env[f"WOLFPACK_{s.upper()}_ADDR"] = addr
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def _wait_bound(svc: ServiceProc, path: Path, deadline: float) -> None:
    """Wait for ``svc`` to report its bound address in ``path`` (bounded by ``deadline``; polled, as a
    file has no event to await); set ``svc.address`` from it, or ``svc.status`` to why it never came."""
    assert svc.proc is not None
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError):
            svc.address = str(json.loads(path.read_text())["address"])
            return
        if svc.proc.returncode is not None:
            svc.status = f"EXITED({svc.proc.returncode})"
            return
        if time.monotonic() > deadline:
            svc.status = "TIMEOUT"
            return
        await asyncio.sleep(READY_POLL_S)


async def _wait_bound_after(
    svc: ServiceProc, path: Path, deadline: float, deps: list[tuple[ServiceProc, asyncio.Task[None]]]
) -> None:
    """``_wait_bound`` for a service started with ``--await-ready`` on ``deps``: once they have all bound
    it can bind too; if one of them never does, it never will (it waits for that ready file), so it is
    stopped and reported NOT STARTED."""
    await asyncio.gather(*(task for _, task in deps))
    if any(_port_unknown(dep.address) for dep, _ in deps):
        assert svc.proc is not None
        with contextlib.suppress(ProcessLookupError):
            svc.proc.terminate()
        svc.status = "NOT STARTED"
        return
    await _wait_bound(svc, path, deadline)


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
    from wolfpack import rpc  # gRPC and its health stubs: imported once the services are on their way

    assert svc.proc is not None
    while time.monotonic() < deadline:
        if svc.proc.returncode is not None:
            svc.status = f"EXITED({svc.proc.returncode})"
            return
        status = await rpc.check_health(svc.address, timeout_s=1.0)
        if status == "SERVING":
            svc.status = status
            return
        await asyncio.sleep(HEALTH_POLL_S)
    svc.status = "TIMEOUT"


def status_table(title: str, rows: list[tuple[str, str, str, str]]) -> Table:
    table = Table(title=title)
    for col in ("service", "address", "pid", "status"):
        table.add_column(col)
    for name, addr, pid, status in rows:
        style = "green" if status in ("SERVING", "PONG") else "red"
        table.add_row(name, addr, pid, f"[{style}]{status}[/]")
    return table


async def _terminate(procs: list[ServiceProc], grace_s: float, pgid: int = 0) -> None:
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
    if pgid > 0:  # anything a service started in our group goes too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


async def run_up(
    settings: Settings,
    *,
    check: bool,
    timeout_s: float,
    console: Console,
    early: dict[str, asyncio.subprocess.Process] | None = None,
) -> int:
    """Start everything, wait for SERVING, print the table; with ``check`` stop and return the verdict.
    SIGINT, SIGTERM and SIGHUP stop the stack at any moment, start-up included. ``early``: processes of
    ``spawn_early``, started here (or killed if the stack is refused)."""
    early = {} if early is None else early
    try:
        return await _run_up_locked(settings, check, timeout_s, console, early)
    finally:
        await kill_early(early)  # those never started (empty once ``_run_up`` took them)


async def _run_up_locked(
    settings: Settings,
    check: bool,
    timeout_s: float,
    console: Console,
    early: dict[str, asyncio.subprocess.Process],
) -> int:
    run_dir = settings.run_dir
    try:
        lock = _lock_run_dir(run_dir)
    except AlreadyRunning as exc:
        console.print(f"[red]{exc}[/]")
        return 1
    with lock:
        reaped = reap_leftovers(run_dir)
        if reaped:
            console.print(f"reaped {len(reaped)} process(es) left by a previous launcher of {run_dir}")
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        running = asyncio.Event()  # set once start-up is over: from then on ``_run_up`` handles ``stop``
        main = asyncio.ensure_future(_run_up(settings, check, timeout_s, console, stop, running, early))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([main, stopper], return_when=asyncio.FIRST_COMPLETED)
            if not main.done() and running.is_set():
                return await main  # drains and returns its own verdict
            if not main.done():  # a signal during start-up: unwind it (its finally stops everything)
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await main
                console.print("stopped during start-up.")
                return 130
            return main.result()
        finally:
            stopper.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                with contextlib.suppress(NotImplementedError):
                    loop.remove_signal_handler(sig)


async def _run_up(
    settings: Settings,
    check: bool,
    timeout_s: float,
    console: Console,
    stop: asyncio.Event,
    running: asyncio.Event,
    early: dict[str, asyncio.subprocess.Process],
) -> int:
    run_dir = settings.run_dir
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    procs: list[ServiceProc] = []
    embedded: Any = None
    redis_watch: asyncio.Task[str] | None = None
    webs: list[ServiceProc] = []  # the web view once spawned (none when not installed)
    bound: dict[str, asyncio.Task[None]] = {}  # per process: started and bound (or failed to)
    pgid = 0
    state = UpState(redis_url="", embedded_redis=False, services={}, pids={}, started_at=time.time(),
                    launcher_pid=os.getpid())  # fmt: skip

    def save() -> None:  # written as each process starts: a SIGKILLed launcher's successor reaps them
        # replaced atomically: readers (status, rollout, train) poll it
        write_text_atomic(UpState.path(run_dir), json.dumps(asdict(state), indent=2))

    try:
        addresses = plan_addresses(settings)
        deadline = time.monotonic() + timeout_s
        pumps = []
        # Start-up is CPU: as many processes start at a time as there are cores, the inference service
        # (the slowest) first; each frees its slot once bound (``START_ORDER``). One that needs addresses
        # not known yet (``DEPENDS_ON`` with port 0, the web view) imports its code, then waits for their
        # ready files (``serve --await-ready``). ``up.json`` lists bound addresses only, each as it binds.
        for name in SERVICES:  # none is read before its service wrote it in this run
            ready_file(run_dir, name).unlink(missing_ok=True)
        redis_up = asyncio.get_running_loop().create_future()  # the Redis URL, once Redis answers
        before_redis = {name: asyncio.Event() for name in WITHOUT_REDIS}  # set once spawned (or failed to)
        procs += [
            ServiceProc(name, addresses[name], log_path=run_dir / "logs" / f"{name}.log") for name in SERVICES
        ]
        by_name = {svc.name: svc for svc in procs}
        slots = asyncio.Semaphore(start_slots())
        spawned = asyncio.Event()  # health checks wait for it: a fork while gRPC calls run logs warnings

        async def start(name: str) -> None:
            """Spawn ``name`` once a slot is free and wait until it has bound (or failed to)."""
            nonlocal pgid
            waits = [d for d in DEPENDS_ON.get(name, ()) if _port_unknown(addresses[d])]
            svc = by_name[name]
            ready = ready_file(run_dir, name)
            async with slots:
                try:
                    svc.log_path.write_text("")  # type: ignore[union-attr]
                    redis_url = settings.redis_url if name in WITHOUT_REDIS else await redis_up
                    env = child_env(settings, redis_url, addresses)
                    if name in early:  # spawned before the settings were read: it learns where to bind
                        svc.proc = early.pop(name)
                        await start_early(svc.proc, svc.address, ready, env)
                    else:
                        svc.proc = await asyncio.create_subprocess_exec(
                            sys.executable, "-m", "wolfpack.cli.serve", name,
                            "--address", svc.address, "--ready-file", str(ready),
                            *(f"--await-ready={d}={ready_file(run_dir, d)}" for d in waits),
                            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                            stderr=asyncio.subprocess.STDOUT, env=env, preexec_fn=_child_setup(pgid),
                        )  # fmt: skip
                finally:  # spawned, or failed to: Redis may start
                    if name in before_redis:
                        before_redis[name].set()
                pgid = pgid or svc.proc.pid  # the first process leads the stack's process group
                state.pgid = pgid
                state.pids[name] = svc.proc.pid
                save()
                i = SERVICES.index(name)
                pumps.append(
                    asyncio.create_task(_pump(svc, COLORS[i % len(COLORS)], console, echo=not check))
                )
                if name == START_ORDER[-1]:
                    spawned.set()
                await _wait_bound_after(svc, ready, deadline, [(by_name[d], bound[d]) for d in waits])
            if svc.status == "STARTING":  # bound: its address is known, and listed in up.json
                addresses[svc.name] = state.services[svc.name] = svc.address
                save()

        async def start_web() -> None:
            """The web view (when installed), through the environment service's address."""
            waits = ["environment"] if _port_unknown(addresses["environment"]) else []
            async with slots:
                env = child_env(settings, await redis_up, addresses)
                web = await _spawn_web(settings, env, pgid, waits=waits)
                if web is None:
                    return
                webs.append(web)
                state.pids["web"] = web.proc.pid  # type: ignore[union-attr]
                save()
                pumps.append(asyncio.create_task(_pump(web, "white", console, echo=not check)))
                await _wait_web(
                    web, ready_file(run_dir, "web"), deadline, [(by_name[d], bound[d]) for d in waits]
                )

        # Tasks created in start order: the semaphore hands out its slots in that order.
        for name in START_ORDER:
            bound[name] = asyncio.create_task(start_web() if name == "web" else start(name))
        # Redis starts once the first process is spawned (in a thread: its wait for the server blocks), never
        # while one is: ``preexec_fn`` runs Python in the forked child, which a lock held by another thread
        # at the fork (an import, the dynamic loader) could deadlock. Everything else is spawned after it.
        await asyncio.gather(*(event.wait() for event in before_redis.values()))
        redis_url, embedded = await asyncio.to_thread(_start_redis, settings)
        state.redis_url, state.embedded_redis = redis_url, embedded is not None
        redis_up.set_result(redis_url)

        async def serving(svc: ServiceProc) -> None:
            await bound[svc.name]
            await spawned.wait()
            if svc.status == "STARTING":
                await _wait_healthy(svc, deadline)

        await asyncio.gather(*(serving(svc) for svc in procs), bound["web"])
        web = webs[0] if webs else None
        if web is not None:  # its row shows the URL to open
            if web.status == "SERVING":
                state.web_url = web.address
                save()
            procs.append(web)
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
        if check or not healthy:
            verdict = "all services SERVING" if healthy else "some services are not healthy"
            console.print(f"[{'green' if healthy else 'red'}]{verdict}[/]; shutting down.")
            return 0 if healthy else 1
        console.print("[bold]Ctrl-C to stop.[/] Logs also in " + str(run_dir / "logs"))
        running.set()
        exits = [asyncio.create_task(s.proc.wait()) for s in procs if s.proc]
        stopper = asyncio.create_task(stop.wait())
        if embedded is not None:  # a dead embedded Redis is restarted, or the stack goes down with it
            redis_watch = asyncio.create_task(embedded.watch(lambda m: console.print(f"[yellow]{m}[/]")))
        watched = [redis_watch] if redis_watch is not None else []
        done, _ = await asyncio.wait([stopper, *exits, *watched], return_when=asyncio.FIRST_COMPLETED)
        if redis_watch in done and stopper not in done:
            console.print(f"[red]{redis_watch.result()}; stopping the stack.[/]")
            return 1
        if stopper not in done:
            dead = [s.name for s in procs if s.proc and s.proc.returncode is not None]
            console.print(f"[red]service(s) exited unexpectedly: {', '.join(dead)}; stopping the rest.[/]")
            return 1
        console.print("stopping: draining services…")
        return 0
    finally:
        for task in bound.values():  # a signal during start-up: stop waiting for ready files
            task.cancel()
        await asyncio.gather(*bound.values(), return_exceptions=True)
        procs += [w for w in webs if w not in procs]  # spawned during a start-up cut short: stopped too
        # Shielded: a second signal while draining must not leave children behind.
        await asyncio.shield(_terminate(procs, settings.grpc_grace_s, pgid))
        if redis_watch is not None:  # a restart in progress finishes, so stop() stops what it started
            redis_watch.cancel()
            await asyncio.gather(redis_watch, return_exceptions=True)
        if embedded is not None:
            embedded.stop()
        UpState.path(run_dir).unlink(missing_ok=True)
        console.print("stopped.")


def _start_redis(settings: Settings) -> tuple[str, Any]:
    """``WOLFPACK_REDIS_URL``, or an embedded server started now (redis-py imported here, after the first
    spawn, not before it)."""
    from wolfpack.redis_server import redis_url_or_embedded

    return redis_url_or_embedded(settings)


async def _spawn_web(
    settings: Settings, env: dict[str, str], pgid: int, waits: list[str]
) -> ServiceProc | None:
    """``wolfpack web`` beside the services, when its package is installed: on ``WOLFPACK_WEB_ADDR``
    (with ``--base-port 0``, a port of its own choosing), reporting its URL in a ready file. ``waits``:
    services whose address it learns from their ready files (``serve --await-ready``)."""
    import importlib.util

    if importlib.util.find_spec("wolfpack_web") is None or importlib.util.find_spec("aiohttp") is None:
        return None
    svc = ServiceProc("web", "", log_path=settings.run_dir / "logs" / "web.log")
    svc.log_path.write_text("")  # type: ignore[union-attr]
    ready = ready_file(settings.run_dir, "web")
    ready.unlink(missing_ok=True)
    args = (
        ["--address", f"{settings.host}:0"]
        if settings.base_port == 0 and "WOLFPACK_WEB_ADDR" not in env
        else []
    )
    svc.proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "wolfpack.cli.serve", "web", *args, "--ready-file", str(ready),
        *(f"--await-ready={d}={ready_file(settings.run_dir, d)}" for d in waits),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env, preexec_fn=_child_setup(pgid),
    )  # fmt: skip
    return svc


async def _wait_web(
    svc: ServiceProc, ready: Path, deadline: float, deps: list[tuple[ServiceProc, asyncio.Task[None]]]
) -> None:
    """The web view is SERVING once its ready file exists (it listens before writing it); its address
    becomes the URL to open."""
    await _wait_bound_after(svc, ready, deadline, deps)
    if svc.status == "STARTING":
        with contextlib.suppress(OSError, ValueError, KeyError):
            svc.address, svc.status = str(json.loads(ready.read_text())["url"]), "SERVING"


async def _ping(url: str) -> bool:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        return bool(await client.ping())
    except Exception:
        return False
    finally:
        await client.aclose()


def _web_health(url: str) -> str:
    """The web view's ``/healthz`` (HTTP, not gRPC): SERVING, or why not."""
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/healthz", timeout=2) as resp:
            return str(json.loads(resp.read()).get("status", "UNKNOWN"))
    except (OSError, ValueError):
        return "UNREACHABLE"


async def run_status(settings: Settings, console: Console) -> int:
    """Health of a running stack (from ``up.json`` if ``wolfpack up`` runs, else configured addresses)."""
    path = UpState.path(settings.run_dir)
    if path.exists():
        state = json.loads(path.read_text())
        addresses: dict[str, str] = state["services"]
        pids: dict[str, int] = state["pids"]
        redis_url: str | None = state["redis_url"]
        web_url = str(state.get("web_url") or "")
    else:
        addresses = {s: settings.service_addr(s) for s in SERVICES}
        pids = {}
        redis_url = settings.redis_url
        web_url = ""
    from wolfpack import rpc

    statuses = await asyncio.gather(*(rpc.check_health(a, timeout_s=2.0) for a in addresses.values()))
    rows = []
    if redis_url:
        rows.append(("redis", redis_url, "-", "PONG" if await _ping(redis_url) else "UNREACHABLE"))
    rows += [
        (s, a, str(pids.get(s, "-")), st) for (s, a), st in zip(addresses.items(), statuses, strict=True)
    ]
    if web_url:  # the page to open, with its health
        rows.append(
            ("web", web_url, str(pids.get("web", "-")), await asyncio.to_thread(_web_health, web_url))
        )
    console.print(status_table("wolfpack status", rows))
    return 0 if all(r[3] in ("SERVING", "PONG") for r in rows) else 1
