"""``wolfpack train``: the main job, mounted on the main CLI.

It brings up what is not running (an embedded Redis when ``WOLFPACK_REDIS_URL`` is unset), runs rollouts
and updates with a progress bar, evaluates on held-out seeds, writes metrics/TensorBoard/plot into the run
directory and ends with a summary whose last line is the ``learning:`` line.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()


def train(
    config: Annotated[Path, typer.Option("--config", "-c", help="Training config (configs/*.yaml).")],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="key=value overrides of the config (train.updates=2 rollout.temperature=0.7 "
            "policies.0.lr=1e-4), validated like the file: an unknown key is an error.",
            show_default=False,
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Where checkpoints, metrics and plots go (default <run_dir>/train/<name>)."),
    ] = None,
    updates: Annotated[int | None, typer.Option(help="Override train.updates.")] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Delete the run directory first (no resume).")
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Build everything but the weights (learner capabilities, seats, roles, bots, opponents, "
            "game options, the first update's and the evaluation's episodes) and exit.",
        ),
    ] = False,
    serve: Annotated[
        bool,
        typer.Option("--serve", help="Serve TrainerService (status, checkpoints) at WOLFPACK_TRAINER_ADDR."),
    ] = False,
) -> None:
    """Train policies with RL on a game; resumes from the run directory's last checkpoint."""
    from wolfpack.cli.main import settings_or_exit
    from wolfpack_trainer.config import ConfigError, load_config

    try:
        cfg = load_config(config, overrides or ())
        if check:
            console.print(check_plan(cfg, config), highlight=False, soft_wrap=True)
            weights = weights_plan(cfg)
            if weights:
                console.print(f"  weights: {weights}", highlight=False, soft_wrap=True)
            base = base_plan(cfg)
            if base:
                console.print(f"  eval base: {base}", highlight=False, soft_wrap=True)
            if cfg.eval.replaces:
                console.print(
                    f"  eval replaces: the held-out games give the seats of {', '.join(cfg.eval.replaces)} to "
                    f"the {cfg.game.bot} bot (eval.replaces): the other policies are scored against it, the "
                    "base model and the references in their seats alike",
                    highlight=False, soft_wrap=True,
                )  # fmt: skip
            if cfg.eval.vs_bot:
                ids = ", ".join(p.id for p in cfg.policies)
                console.print(
                    f"  eval vs bot: every evaluation also plays each of {ids} alone against the "
                    f"{cfg.game.bot} bot in the other policies' seats (eval.vs_bot), with its own references "
                    "and learning vs-bot line",
                    highlight=False, soft_wrap=True,
                )  # fmt: skip
            for mix in cfg.rollout.opponents:
                seats = f"the seats of {', '.join(mix.replaces)}" if mix.replaces else "the untrained seats"
                if mix.roles:
                    seats += f" dealt {', '.join(mix.roles)} (the others keep the {cfg.game.bot} bot)"
                who = f"the {mix.bot} bot" if mix.bot else f"the served policy {mix.policy}"
                console.print(
                    f"  opponents: {mix.fraction:.0%} of the training groups give {seats} to {who} "
                    "(rollout.opponents; held-out games never mix)",
                    highlight=False, soft_wrap=True,
                )  # fmt: skip
            for pid, roles in cfg.eval.roles.items():
                console.print(
                    f"  eval roles: the held-out games seat {pid} on {', '.join(roles)} only (eval.roles; it "
                    f"trains on {', '.join(next(p.roles for p in cfg.policies if p.id == pid))}), every other "
                    f"role plays the {cfg.game.bot} bot, for the base model and the references too",
                    highlight=False, soft_wrap=True,
                )  # fmt: skip
            return
    except ConfigError as exc:
        console.print(f"[red]{exc}[/]", markup=True, highlight=False)
        raise typer.Exit(2) from None
    settings = settings_or_exit()
    out = run_dir or settings.run_dir / "train" / cfg.name
    if fresh:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    from wolfpack_trainer.train import ResumeError, check_resumable

    try:
        check_resumable(out, cfg)  # before any stack or Redis starts: one clear line, nothing started
    except ResumeError as exc:
        console.print(f"[red]{exc}[/]", markup=True, highlight=False)
        raise typer.Exit(2) from None
    with contextlib.ExitStack() as stack:
        redis_url = settings.redis_url
        if not redis_url:
            from wolfpack.redis_server import EmbeddedRedis

            server = stack.enter_context(EmbeddedRedis(out / "redis", binary=settings.redis_server_bin))
            redis_url = server.url
        address = settings.service_addr("trainer") if serve else None
        local = cfg.rollout.mode == "local"
        stack_settings = settings if local else _ensure_stack(stack, cfg, settings, out)
        driver, publisher = (None, None) if local else _service_parts(cfg, stack_settings, out, redis_url)
        _run(cfg, out, redis_url, settings.run_dir / "models", updates, address, driver, publisher)


def check_plan(cfg: Any, path: Path) -> str:
    """``--check`` past the config's own validation: plan the first update's and the evaluation's episodes
    the way the run will (``plan_tasks``; service mode also the curriculum ``Task`` each one becomes, with
    its seats bound by index and role), so what only shows when episodes are built fails here. Returns the
    summary line; raises ``ConfigError``."""
    from wolfpack_trainer.config import ConfigError
    from wolfpack_trainer.train import held_out_plan, plan_tasks, service_task

    r = cfg.rollout
    try:
        groups = r.episodes_per_update // r.group_size
        tasks = plan_tasks(cfg, list(range(groups)), r.group_size, "u0")
        held_out = [cfg.eval.seed_offset + i for i in range(cfg.eval.episodes)]
        tasks += held_out_plan(cfg, held_out)
        bound = 0
        for i, task in enumerate(tasks):
            if r.mode == "service":
                bound = max(bound, len(service_task(task, i).trainee_seats))
    except Exception as exc:  # anything that fails while planning is a recipe that cannot run
        raise ConfigError(f"{path}: planning the episodes failed: {exc}") from None
    learners = ", ".join(sorted({p.learner for p in cfg.policies}))
    seats = f", up to {bound} trained seats an episode" if r.mode == "service" else ""
    trackers = f"; tracking {', '.join(cfg.train.extra_trackers)}" if cfg.train.extra_trackers else ""
    return (
        f"{path}: ok ({cfg.name}: {cfg.game.id}, {cfg.algo_config().estimator}, {len(cfg.policies)} "
        f"policies on {learners}, rollout {r.mode}{seats}; {len(tasks)} episodes planned{trackers})"
    )


def weights_plan(cfg: Any) -> str:
    """``--check``'s account of where the trained weights start and how they reach the sampler: the warm
    start (which bot, how long, when it runs), full weights or LoRA, and what the stack's inference serves.
    In service mode a warm start with LoRA runs before the stack starts, which then serves the clone as the
    base the adapters are pushed onto (``serve_base``); with full weights it runs in the trainer's set-up
    and the clone reaches inference as version 1. Empty for full fine-tuning of the model as it is (then
    ``--check`` prints no ``weights:`` line)."""
    from wolfpack_trainer.warmstart import warmstart_config

    wcfg = warmstart_config(cfg)
    lora = [p for p in cfg.policies if p.lora_rank > 0]
    if wcfg is None and not lora:
        return ""
    service = cfg.rollout.mode == "service"
    models = ", ".join(sorted({p.model for p in cfg.policies}))
    parts = []
    if wcfg is not None:
        when = "before the stack starts" if service and lora else "in the trainer's set-up"
        parts.append(
            f"{models} warm-started on the {wcfg.bot} bot ({wcfg.episodes} episodes, {wcfg.steps} steps) {when}"
        )
    for rank, alpha in sorted({(p.lora_rank, p.lora_alpha) for p in lora}):
        ids = ", ".join(p.id for p in lora if (p.lora_rank, p.lora_alpha) == (rank, alpha))
        if not service:
            parts.append(f"{ids}: LoRA rank {rank} alpha {alpha}, sampled in process")
        elif wcfg is not None:
            parts.append(
                f"{ids}: LoRA rank {rank} alpha {alpha}; inference serves the clone as the base (a resumed run: "
                "its checkpoint's base) and each version's adapter is pushed onto it"
            )
        else:
            parts.append(
                f"{ids}: LoRA rank {rank} alpha {alpha}, each version's adapter pushed onto {models}"
            )
    full = ", ".join(p.id for p in cfg.policies if p.lora_rank == 0)
    if full:
        if not service:
            parts.append(f"{full}: full weights, sampled in process")
        elif wcfg is not None:
            parts.append(
                f"{full}: full weights; the clone reaches inference as version 1, before any rollout"
            )
        else:
            parts.append(f"{full}: full weights")
    return "; ".join(parts)


def base_plan(cfg: Any) -> str:
    """``--check``'s account of the base models' evaluation (``eval.base``): which model stands for which
    policies, on how many held-out seeds, and how it is played (service mode: the extra policy the stack's
    inference serves, one more vLLM engine sharing ``gpu_memory_utilization``). Empty when it is off."""
    if not cfg.eval_base:
        return ""
    from wolfpack_trainer.evaluate import base_policy_ids

    ids = base_policy_ids(cfg)
    groups: dict[str, list[Any]] = {}
    for p in cfg.policies:
        groups.setdefault(ids[p.id], []).append(p)
    if cfg.rollout.mode == "service":
        how = "served by the stack's inference as " + ", ".join(
            f"{bid} ({group[0].model}, for {', '.join(p.id for p in group)})" for bid, group in groups.items()
        )
        if cfg.inference.backend in ("auto", "vllm"):  # as stack_policies counts the engines
            engines = len(cfg.policies) + len(groups)
            engines += sum(1 for o in cfg.opponent_policies if o.backend in ("auto", "vllm"))
            share = cfg.inference.gpu_memory_utilization
            how += f" (on vLLM {engines} engines share gpu_memory_utilization {share}: {share / engines:.3g} each)"
    else:
        how = "loaded in process: " + ", ".join(
            f"{group[0].model} for {', '.join(p.id for p in group)}" for group in groups.values()
        )
    why = "default with a warm start" if cfg.eval.base is None else "eval.base: true"
    when = (
        "beside the update-0 evaluation and the first updates, through a driver of its own (eval.base_overlap)"
        if cfg.base_beside_training
        else "at the start of a fresh run"
    )
    return (
        f"the base models (before the warm start, without LoRA) evaluated once {when} on the "
        f"{cfg.eval.episodes} held-out seeds ({cfg.eval.episodes} more episodes), {how}; the summary's "
        f"reference: base line ({why})"
    )


def _ensure_stack(stack: contextlib.ExitStack, cfg: Any, settings: Any, out: Path) -> Any:
    """The running stack's settings (after registering on its inference the policies the run needs, or one
    line and exit 2 before any work when it cannot serve them), or those of a stack started for this job
    (serving the run's policies and opponents, its curriculum configured from the run; stopped at the end).
    With a warm start, a LoRA policy is served from the run's warm-started base (``serve_base``), so that
    the adapters the trainer pushes apply to the weights they were trained on. (A full-weight policy keeps
    its model: its first push, before any rollout, replaces every weight with the clone's.) A run that will
    evaluate the base models (``train.base_pending``) has them served too, as ``evaluate.base_policy_ids``
    names them, from each policy's configured model (never the clone)."""
    from wolfpack.cli.main import settings_or_exit
    from wolfpack_trainer.evaluate import base_models
    from wolfpack_trainer.learners.cpu import resolve_model_path
    from wolfpack_trainer.stack import StackError, child_stack, running_stack, serve_on_running
    from wolfpack_trainer.train import base_pending

    cache = settings.run_dir / "models"
    models = {p.id: resolve_model_path(p.model, str(cache)) for p in cfg.policies}
    base = serve_base(cfg, out, cache) if any(p.lora_rank > 0 for p in cfg.policies) else None
    if base is not None:  # a LoRA policy's adapters must land on the warm-started weights
        models.update({p.id: base for p in cfg.policies if p.lora_rank > 0})
    if base_pending(cfg, out):  # the models as configured, for the base models' evaluation (eval.base)
        models.update(base_models(cfg, cache))
    running = running_stack(settings)
    if running is not None:
        console.print(f"using the running stack of {settings.run_dir}")
        try:
            target = settings.inference_addr or running["inference"]
            for line in serve_on_running(cfg, settings, models, target):
                console.print(line, highlight=False)
        except StackError as exc:
            console.print(str(exc), style="red", highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(2) from None
        return settings
    console.print(f"starting a stack for this job in {out / 'stack'} (logs: {out / 'stack' / 'up.log'})")
    # Served opponents named like a trained policy's model (``smollm2``, ``tiny``, a .gguf) are resolved here,
    # with the job's cache, as the trained ones are: the stack's inference would otherwise build its own copy
    # in its own cache, and on a host without network (the lent GPUs) fail to fetch the package at all.
    opponents = {o.id: resolve_model_path(o.model, str(cache)) for o in cfg.opponent_policies
                 if o.backend != "openai" and o.model}  # fmt: skip
    stack_dir = stack.enter_context(child_stack(cfg, out / "stack", models, opponent_models=opponents))
    return settings_or_exit(run_dir=stack_dir)


def serve_base(cfg: Any, out: Path, cache: Path) -> str | None:
    """Service mode with a warm start and LoRA: the base the stack must serve, settled *before* it starts
    (``warmstart.run_base``): the clone, warm-started here on a fresh run (printed, with its time) or found
    in ``cache``, or a resumed run's own base from its checkpoint (no second warm start). ``Trainer.setup``
    loads the same directory. None without a warm start (the stack serves each policy's model).
    A resumed run whose base is gone: one line, exit 2, nothing started."""
    from wolfpack_trainer.warmstart import BaseMissingError, WarmStartConfig, run_base

    def building(wcfg: WarmStartConfig) -> None:
        console.print(
            f"warm start: cloning the {wcfg.bot} bot ({wcfg.episodes} episodes, {wcfg.steps} steps) into "
            f"{cfg.policies[0].model} before the stack starts, which then serves the clone",
            highlight=False, soft_wrap=True,
        )  # fmt: skip

    started = time.monotonic()
    try:
        base = run_base(cfg, out, cache, on_build=building)
    except BaseMissingError as exc:
        console.print(str(exc), style="red", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if not base.warm:
        return None
    said = {
        "built": f"built in {time.monotonic() - started:.0f} s",
        "cached": "cached from an earlier run with the same settings",
        "checkpoint": "the base this run's checkpoint was trained on (no second warm start)",
    }[base.how]
    console.print(f"warm start: serving {base.path} ({said})", highlight=False, soft_wrap=True)
    return base.path


def _service_parts(cfg: Any, settings: Any, out: Path, redis_url: str) -> tuple[Any, Any]:
    """Service mode: the rollout driver over the running stack (``wolfpack up``: addresses from settings or
    ``<run_dir>/up.json``) and a publisher that pushes every version to its inference service."""
    from wolfpack_rollout.client import Addresses, connect
    from wolfpack_trainer.local_rollout import rollout_config
    from wolfpack_trainer.publish import Publisher

    a = Addresses.from_settings(settings)
    addresses = Addresses(a.environment, a.inference, a.reward, a.curriculum, redis_url, cfg.stream.name)
    rollout = rollout_config(cfg, concurrency=min(cfg.rollout.episodes_per_update, 64))  # as local mode's
    publisher = Publisher(
        out / "policies", settings, inference_addr=a.inference, curriculum_addr=a.curriculum,
        save_dirs=cfg.train.save_versions, weight_sync=cfg.train.weight_sync,
    )  # fmt: skip
    return (lambda: connect(settings, rollout, addresses, stream=False)), publisher


def _run(
    cfg: object,
    out: Path,
    redis_url: str,
    cache: Path,
    updates: int | None,
    address: str | None,
    driver: Any = None,
    publisher: Any = None,
) -> None:
    from wolfpack_trainer.config import TrainConfig
    from wolfpack_trainer.evaluate import base_policy_lines, reference_lines
    from wolfpack_trainer.metrics import eval_time_line, time_split_line, update_line
    from wolfpack_trainer.train import (
        ResumeError,
        learning_line,
        policy_learning_lines,
        run_training,
        vs_bot_lines,
    )

    assert isinstance(cfg, TrainConfig)  # train() has refused a run of another config before calling this
    total = updates if updates is not None else cfg.train.updates
    start = time.monotonic()
    from transformers.utils import logging as hf_logging

    # Per-save/load tqdm bars would tear the rich bar every update.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=console,
    ) as bar:  # fmt: skip
        task = bar.add_task("updates", total=total)
        phase = bar.add_task("set-up", total=1)

        def progress(name: str, done: int, of: int) -> None:
            if name == "train":
                bar.update(task, completed=done)
            else:
                bar.update(phase, description=name, completed=done, total=max(of, 1))

        def on_update(step: int, of: int, metrics: dict[str, float]) -> None:
            # Through the bar's console: the line goes above the live bar instead of tearing it.
            bar.console.print(update_line(step, of, metrics), highlight=False)

        def notice(text: str) -> None:
            bar.console.print(f"[yellow]{text}[/]", highlight=False)

        try:
            trainer, evals = run_training(
                cfg, out, redis_url, cache, progress, updates, address, driver, publisher, on_update, notice
            )
        except ResumeError as exc:
            bar.stop()
            console.print(f"[red]{exc}[/]", highlight=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:  # the second Ctrl-C (or one during set-up): no new checkpoint
            bar.stop()
            latest = out / "checkpoints" / "LATEST"
            where = f"the checkpoint {latest.read_text().strip()}" if latest.exists() else "the start"
            console.print(f"interrupted — rerun to resume from {where}", highlight=False)
            raise typer.Exit(130) from None
    if trainer.stopped:
        console.print(f"checkpointed at update {trainer.state.step} — rerun to resume", highlight=False)
        raise typer.Exit(128 + int(trainer.stop_signal))
    elapsed = time.monotonic() - start
    rows = trainer.metrics.rows()
    title = f"{cfg.name}: {trainer.state.step} updates, training {elapsed - trainer.setup_s:.0f} s (set-up {trainer.setup_s:.0f} s)"
    table = Table(title=title)
    table.add_column("update", justify="right")
    table.add_column("eval reward (95% CI)")
    table.add_column("eval win rate (95% CI)")
    for e in evals:
        table.add_row(
            str(e.step),
            f"{e.reward.mean:+.2f} ({e.reward.lo:+.2f}..{e.reward.hi:+.2f})",
            f"{e.win_rate.mean:.2f} ({e.win_rate.lo:.2f}..{e.win_rate.hi:.2f})",
        )
    console.print(table)
    last = rows[-1] if rows else {}
    # The clip fraction and the PPO KL only move with several optimiser steps per update (PPO epochs or
    # mini-batches): with one the ratio is exactly 1 and printing them would suggest a clip that is not there.
    multi_step = last.get("actor/optimizer_steps", 1.0) > 1 or any(p.ppo_epochs > 1 for p in cfg.policies)
    for key in (
        "actor/ppo_kl",
        "actor/entropy",
        "actor/pg_clipfrac",
        "actor/grad_norm",
        "adv/zero_fraction",  # samples without gradient: their group's episodes all returned the same
        "mismatch/abs_logprob_diff",
    ):
        if key in last and (multi_step or key not in ("actor/ppo_kl", "actor/pg_clipfrac")):
            console.print(f"  {key}: {last[key]:.4g}")
    if trainer.resumed_from is not None:
        console.print(f"  resumed from the checkpoint of update {trainer.resumed_from}")
    console.print(
        f"  trajectories used: {trainer.state.trajectories_used}, stale dropped: {trainer.state.dropped_stale}"
    )
    if split := time_split_line(rows):
        console.print(f"  {split}", highlight=False)
    if evaluation := eval_time_line(rows):
        console.print(f"  {evaluation}", highlight=False)
    if trainer.warmstart is not None:
        from wolfpack_trainer.warmstart import record_line

        console.print(f"  {record_line(trainer.warmstart)}", highlight=False, markup=False)
    console.print(
        f"  metrics: {out / 'metrics.jsonl'}  plot: {out / 'curves.png'}  tensorboard: {out / 'tb'}"
    )
    metric = cfg.eval.metric
    base = evals[0].base
    measured = (base.reward, base.win_rate) if base is not None else None
    for line in reference_lines(cfg, evals[0].metric(metric), evals[-1].metric(metric), measured):
        console.print(line, highlight=False)
    if base is not None:
        for line in base_policy_lines(metric, base.policies, evals[-1].policies):
            console.print(line, highlight=False, markup=False)  # "[policy]" is no rich style tag
    console.print(learning_line(cfg.eval.metric, evals[0], evals[-1]), highlight=False)
    for line in policy_learning_lines(cfg.eval.metric, evals[0], evals[-1]):
        console.print(line, highlight=False, markup=False)  # "[policy]" is no rich style tag
    for line in vs_bot_lines(cfg, evals[0], evals[-1]):
        console.print(line, highlight=False, markup=False)


def mount(app: typer.Typer) -> None:
    app.command("train")(train)
