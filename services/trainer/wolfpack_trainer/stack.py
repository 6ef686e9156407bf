"""Service mode's stack: use the running one, or start one for the job (``wolfpack up`` as a child).

Why a child ``wolfpack up`` rather than a second launcher: one launcher owns process groups, pid files,
orphan reaping and draining; the job only needs its addresses (``up.json``) and to stop it at the end.
The child's inference serves every policy of the config from the same base model the learners load,
so the pushed versions apply to the weights that sampled the trajectories. With a warm start, a LoRA
policy's base is the warm-started clone, built before the stack starts (``cli.serve_base``): its adapters
mean nothing on the un-cloned model. A full-weight policy may start from the configured model, since its
first push (before any rollout) replaces every weight. A run that evaluates its base models (``eval.base``)
has them served as well, each as one more policy (``evaluate.base_policy_ids``) from the model as
configured, never the clone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
import yaml

from wolfpack import SERVICES, rpc
from wolfpack.settings import Settings
from wolfpack_trainer.config import OpponentPolicy, TrainConfig


def _healthy(addresses: dict[str, str]) -> bool:
    async def check() -> bool:
        names = ("environment", "inference", "reward")
        states = await asyncio.gather(*(rpc.check_health(addresses[n]) for n in names if n in addresses))
        return len(states) == len(names) and all(s == "SERVING" for s in states)

    try:
        return asyncio.run(check())
    except Exception:  # any failure to reach a service means "not running"
        return False


def _unservable(addresses: dict[str, str]) -> str | None:
    """Why the stack's inference will never serve, if it says so: a configured model that cannot be
    prepared (e.g. CUDA out of memory while vLLM starts) leaves the inference process up with health
    NOT_SERVING and every call answering UNAVAILABLE with the reason. Waiting out the start-up timeout then
    only hides it, so the job stops at once with that reason. ``None`` while it is starting or serving."""
    target = addresses.get("inference")
    if not target:
        return None
    from wolfpack.v1 import inference_service_pb2 as pb
    from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc

    async def ask() -> str | None:
        if await rpc.check_health(target) != "NOT_SERVING":
            return None
        settings = Settings()  # the job's environment: the stack's auth and size limits
        async with rpc.channel(target, settings) as channel:
            try:
                await pb_grpc.InferenceServiceStub(channel).ListPolicies(pb.ListPoliciesRequest(), timeout=5)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE and exc.details():
                    return str(exc.details())
        return None

    try:
        return asyncio.run(ask())
    except Exception:  # not reachable yet: still starting
        return None


def running_stack(settings: Settings) -> dict[str, str] | None:
    """Addresses of a healthy stack started by ``wolfpack up`` on ``settings.run_dir``, if any."""
    path = settings.run_dir / "up.json"
    if not path.exists():
        return None
    services = json.loads(path.read_text()).get("services", {})
    return services if isinstance(services, dict) and _healthy(services) else None


def inference_backend(choice: str) -> str:
    """``auto`` → ``vllm`` where CUDA and vLLM are both present (the GPU host), else ``transformers``."""
    if choice != "auto":
        return choice
    import importlib.util

    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        cuda = False
    return "vllm" if cuda and importlib.util.find_spec("vllm") is not None else "transformers"


def inference_options(cfg: TrainConfig, lora_rank: int = 0, engines: int = 1) -> dict[str, object]:
    """The ``PolicyConfig`` keys (inference's policies file) the job's ``inference`` section sets; a LoRA
    policy gets vLLM's adapter support (its versions arrive as adapters). ``engines``: how many vLLM engines
    the job's stack starts, which share ``gpu_memory_utilization`` evenly (see ``stack_policies``)."""
    inf = cfg.inference
    backend = inference_backend(inf.backend)
    out: dict[str, object] = {"backend": backend, "dtype": "auto"}
    if backend == "vllm":
        # bf16 on the card (the converted SmolLM2 checkpoint is float32) and room for a whole update's
        # episodes in one engine batch.
        out.update(
            gpu_memory_utilization=round(inf.gpu_memory_utilization / max(1, engines), 4),
            enforce_eager=inf.enforce_eager,
            dtype="bfloat16", max_batch=256,
        )  # fmt: skip
        if lora_rank > 0:
            out.update(enable_lora=True, max_lora_rank=1 << (max(lora_rank, 8) - 1).bit_length(), max_loras=2)
    else:
        out["device"] = inf.device
    return out


def opponent_entry(
    cfg: TrainConfig, opponent: OpponentPolicy, engines: int = 1, model: str | None = None
) -> dict[str, object]:
    """Inference's policies-file entry for a served opponent: the stack's backend options for a checkpoint
    or HF id (``model``: the job's resolved checkpoint for ``opponent.model`` where it has one), or the
    OpenAI-compatible backend pointed at ``base_url``."""
    if opponent.backend == "openai":
        return {"policy_id": opponent.id, "backend": "openai", "base_url": opponent.base_url,
                "remote_model": opponent.remote_model, "model": opponent.model or opponent.remote_model}  # fmt: skip
    out: dict[str, object] = {
        "policy_id": opponent.id, "model": model or opponent.model, **inference_options(cfg, engines=engines)
    }  # fmt: skip
    if opponent.backend != "auto":
        out["backend"] = opponent.backend
    return out


def curriculum_config(cfg: TrainConfig) -> dict[str, object]:
    """The job's curriculum service configuration (its ``CurriculumConfig`` keys): one bucket of this run's
    game, variant, options and bot, the first policy as the trainee, the rollout's group size, the run's
    seed, and the ``curriculum`` section's knobs (AIW, league, replays). Seats are bound by the trainer."""
    from wolfpack_games import get_game
    from wolfpack_trainer.config import CurriculumSection, game_options

    section = cfg.curriculum or CurriculumSection()
    seats = sorted({s for p in cfg.policies for s in p.seats})
    by_role = any(p.roles for p in cfg.policies)
    bucket = {
        "game_id": cfg.game.id,
        "variant": cfg.game.variant or get_game(cfg.game.id).default_variant,
        "options": {k: json.dumps(v) for k, v in game_options(cfg).items()},
        "seats": {"trainee_seats": 1 if by_role or not seats else seats, "mix": {"scripted": 1.0},
                  "bot": cfg.game.bot},
    }  # fmt: skip
    return {
        "policy_id": cfg.policies[0].id,
        "group_size": cfg.rollout.group_size,
        "seed": cfg.seed,
        "replay_ratio": section.replay_ratio,
        "recent_window": section.recent_window,
        "eval_seed_offset": cfg.eval.seed_offset,
        "buckets": [bucket],
        "aiw": dict(section.aiw),
        "league": dict(section.league),
    }


class StackError(Exception):
    """The running stack cannot serve this run as it is; the message is the one line to print."""


def serve_on_running(cfg: TrainConfig, settings: Settings, models: dict[str, str], target: str) -> list[str]:
    """``register_policies`` on the running stack's inference at ``target``, from synchronous code."""
    return asyncio.run(register_policies(cfg, settings, models, target))


async def register_policies(
    cfg: TrainConfig, settings: Settings, models: dict[str, str], target: str
) -> list[str]:
    """Make a running stack's inference (at ``target``) serve every policy the run needs, before any work:
    the trained policies (``models``: id → checkpoint the learners load) and the served opponents. A
    missing one is registered with ``LoadPolicy`` (a new policy from that checkpoint at version 0, so the
    run's first push is version 1). ``StackError`` for what cannot work: a policy served from another base,
    an OpenAI-backed opponent the stack lacks (``LoadPolicy`` builds local backends only), a ``curriculum``
    section (the running curriculum keeps its own configuration), an unreachable or refusing inference.
    Returns what was registered, one line each."""
    if cfg.curriculum is not None:
        raise StackError(
            f"curriculum: the running stack of {settings.run_dir} keeps its own curriculum configuration; "
            "stop it so that the job starts a stack configured for this run, or remove the section"
        )
    cache = str(settings.run_dir / "models")
    done: list[str] = []
    async with rpc.channel(target, settings) as channel:
        inference = _Inference(channel)
        try:
            served = await inference.served()
        except grpc.aio.AioRpcError as exc:
            raise StackError(f"the running stack's inference at {target}: {exc.details()}") from None
        wanted = [(pid, path, "") for pid, path in models.items()]
        wanted += [(o.id, o.model, o.backend) for o in cfg.opponent_policies]
        missing = []
        for pid, path, backend in wanted:  # every refusal before the first load: nothing half-registered
            base = served.get(pid)
            if base is not None:
                if backend or _same_checkpoint(base, path, cache):
                    continue
                raise StackError(
                    f"the running stack serves policy {pid!r} from {base}, this run trains it from {path}: "
                    "stop the stack (the job then starts its own) or rename the policy"
                )
            if backend == "openai":
                raise StackError(
                    f"the running stack does not serve opponent policy {pid!r} (backend openai), which it "
                    "cannot load on demand: list it in WOLFPACK_INFERENCE_POLICIES_FILE for `wolfpack up`, "
                    "or stop the stack so that the job starts its own"
                )
            missing.append((pid, path))
        for pid, path in missing:
            if (error := await inference.load(pid, path)) is not None:
                raise StackError(f"the running stack could not load policy {pid!r} from {path}: {error}")
            done.append(f"registered policy {pid} ({path}) on the running inference at {target}")
    return done


async def serve_missing(settings: Settings, target: str, models: dict[str, str]) -> list[str]:
    """Have inference at ``target`` serve ``models`` (policy id -> checkpoint): ``LoadPolicy`` at version 0
    for each one it does not serve yet (built like its first policy); one it serves from another checkpoint
    is a ``StackError`` (a measurement of other weights under the same name). The trainer's guarantee for the
    base models' evaluation where no job set up the stack (a stack built by hand, a test's servers); a job's
    own or running stack already serves them. Returns the ids loaded."""
    cache = str(settings.run_dir / "models")
    loaded = []
    async with rpc.channel(target, settings) as channel:
        inference = _Inference(channel)
        served = await inference.served()
        for pid, path in models.items():
            base = served.get(pid)
            if base is not None:
                if not _same_checkpoint(base, path, cache):
                    raise StackError(f"inference at {target} serves policy {pid!r} from {base}, not {path}")
                continue
            if (error := await inference.load(pid, path)) is not None:
                raise StackError(f"inference at {target} could not load policy {pid!r} from {path}: {error}")
            loaded.append(pid)
    return loaded


def _same_checkpoint(base: str, path: str, cache: str) -> bool:
    """Whether inference's ``base`` (a spec such as ``smollm2`` or a directory) is the checkpoint ``path``."""
    from wolfpack_trainer.learners.cpu import resolve_model_path

    return base == path or resolve_model_path(base, cache) == path


class _Inference:
    """The two calls ``register_policies`` and ``serve_missing`` make on a running inference service."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc

        self._stub = pb_grpc.InferenceServiceStub(channel)

    async def served(self) -> dict[str, str]:
        """Policy id -> the base model it is served from."""
        from wolfpack.v1 import inference_service_pb2 as pb

        listed = await self._stub.ListPolicies(pb.ListPoliciesRequest())
        return {p.policy.policy_id: p.base_model for p in listed.policies}

    async def load(self, policy_id: str, path: str) -> str | None:
        """``LoadPolicy`` of ``path`` as ``policy_id`` at version 0; the refusal's details, else None."""
        from wolfpack.v1 import inference_service_pb2 as pb

        try:
            await self._stub.LoadPolicy(pb.LoadPolicyRequest(policy_id=policy_id, version=0, model_path=path))
        except grpc.aio.AioRpcError as exc:
            return str(exc.details())
        return None


def stack_policies(
    cfg: TrainConfig, models: dict[str, str], opponent_models: Mapping[str, str] | None = None
) -> list[dict[str, object]]:
    """Inference's policies file for the job's own stack: every trained policy (id -> checkpoint) and every
    served opponent (``opponent_models``: id -> the checkpoint the job resolved for its ``model``; see
    ``cli._ensure_stack``) (and, with ``eval.base``, the base models: ``cli._ensure_stack`` adds them to
    ``models``, where they count like the others). Each gets its own engine, so on vLLM they split
    ``inference.gpu_memory_utilization`` evenly: the setting stays the job's whole vLLM share of the card, whatever the number of policies (as
    the config documents: the learner gets the rest). Seen on an H100: IPPO's two engines at 0.35 each
    would have left its learners 24 of 80 GB."""
    ranks = {p.id: p.lora_rank for p in cfg.policies}
    engines = len(models) + sum(1 for o in cfg.opponent_policies if o.backend in ("auto", "vllm"))
    policies = [
        {"policy_id": pid, "model": path, **inference_options(cfg, ranks.get(pid, 0), engines)}
        for pid, path in models.items()
    ]
    resolved = opponent_models or {}
    return policies + [opponent_entry(cfg, o, engines, resolved.get(o.id)) for o in cfg.opponent_policies]


def _log_tail(run_dir: Path, lines: int = 15) -> str:
    """The end of the stack's ``up.log``, for the error that stops the job: on a lent machine the run
    directory is often gone before anyone reads it (seen: a GPU evaluation whose stack exited with only
    "see up.log" to go on)."""
    with contextlib.suppress(OSError):
        tail = (run_dir / "up.log").read_text(errors="replace").rstrip().splitlines()[-lines:]
        if tail:
            return "; its last lines:\n" + "\n".join(tail)
    return ""


@contextlib.contextmanager
def child_stack(
    cfg: TrainConfig,
    run_dir: Path,
    models: dict[str, str],
    timeout_s: float = 600.0,
    opponent_models: Mapping[str, str] | None = None,
) -> Iterator[Path]:
    """Start ``wolfpack up`` in ``run_dir`` serving ``models`` (policy id → checkpoint) and the opponents
    (``opponent_models`` as in ``stack_policies``) and yield its run directory once ``up.json`` lists every
    service healthy; SIGTERM (drain) on exit."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "policies.yaml").write_text(yaml.safe_dump(stack_policies(cfg, models, opponent_models)))
    (run_dir / "curriculum.yaml").write_text(yaml.safe_dump(curriculum_config(cfg)))
    # The job's own stack binds free ports: a WOLFPACK_<SERVICE>_ADDR inherited from the caller's shell would
    # make its service bind that address instead, which whatever the caller pointed it at already holds (seen
    # on a GPU host: the agent-loop script's environment server, exported for main_ppo; the evaluation's
    # stack then exited). The job reads its stack's addresses from the stack's up.json.
    addresses = {f"WOLFPACK_{s.upper()}_ADDR" for s in SERVICES}
    inherited = {k: v for k, v in os.environ.items() if k not in addresses}
    env = {
        **inherited,
        "WOLFPACK_RUN_DIR": str(run_dir),
        "WOLFPACK_BASE_PORT": "0",
        "WOLFPACK_INFERENCE_POLICIES_FILE": str(run_dir / "policies.yaml"),
        "WOLFPACK_CURRICULUM_CONFIG": str(run_dir / "curriculum.yaml"),
    }
    log = (run_dir / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "wolfpack.cli.main", "up", "--base-port", "0", "--timeout", str(timeout_s)],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's Ctrl-C reaches only the job, which finishes its update first
    )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        up = run_dir / "up.json"
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"wolfpack up exited ({proc.returncode}); see {run_dir / 'up.log'}{_log_tail(run_dir)}"
                )
            if up.exists():
                services = json.loads(up.read_text()).get("services", {})
                if set(services) >= set(SERVICES) and _healthy(services):
                    break
                reason = _unservable(services)
                if reason:
                    raise RuntimeError(
                        f"the stack's inference cannot serve: {reason}; see {run_dir / 'up.log'}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the stack did not become healthy in {timeout_s:.0f}s; see {run_dir / 'up.log'}"
                    f"{_log_tail(run_dir)}"
                )
            time.sleep(0.5)
        yield run_dir
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
