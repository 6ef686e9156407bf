"""`make mutate`: mutation testing (cosmic-ray) over Wolfpack's core modules, each against its own fast tests.

Why: a green suite says nothing about whether the tests would notice a broken product. A mutant is the
module with one small change (``<`` for ``<=``, ``and`` for ``or``, a constant, a negated condition); a good
test run fails on it ("killed"). What survives is either a gap in the tests or an equivalent change.

How, within 2 shared cores:
- the tracked tree is copied to a temporary directory and mutated there (cosmic-ray rewrites files in
  place; the shared working tree is never touched), with ``PYTHONPATH`` pointing tests at the copy;
- each module runs only its own fast tests (``-x``, no random order, no cache);
- operators that only produce noise are left out: the eleven-way cross product of binary operators is cut
  to one replacement per operator, and ``|`` is skipped (in this code base it appears in type annotations,
  which ``from __future__ import annotations`` never evaluates: such mutants are equivalent by design);
- ``--sample N`` mutants per module, drawn with ``--seed`` (all of them with ``--sample 0``); the score is
  killed / (killed + survived) over what ran, with a 95 % Wilson interval.

Usage: ``python bench/mutation/run.py [--only NAME ...] [--sample 40] [--seed 1] [--report FILE]``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ["libs"] + [
    f"services/{s}" for s in ("environment", "inference", "reward", "curriculum", "rollout", "trainer")
]
PYTEST = "python -m pytest -x -q -p no:randomly -p no:cacheprovider -p no:hydra_pytest -p no:anyio"


@dataclass(frozen=True)
class Target:
    name: str
    module: str
    tests: tuple[str, ...]


TARGETS = (
    Target(
        "werewolf parser",
        "libs/wolfpack_games/werewolf/parser.py",
        ("libs/tests/games/werewolf/test_parser.py",),
    ),
    Target(
        "werewolf rules",
        "libs/wolfpack_games/werewolf/engine.py",
        ("libs/tests/games/werewolf/test_rules.py", "libs/tests/games/werewolf/test_rules_mutants.py"),
    ),
    Target(
        "scenario verifiers",
        "libs/wolfpack_games/scenarios/verifiers.py",
        (
            "libs/tests/games/scenarios/test_verifier_tables.py",
            "libs/tests/games/scenarios/test_bargaining.py",
        ),
    ),
    Target(
        "reward specs",
        "libs/wolfpack_rewards/specs.py",
        ("libs/tests/rewards/test_specs.py", "libs/tests/rewards/test_scenarios.py"),
    ),
    Target(
        "reward outcome",
        "libs/wolfpack_rewards/outcome.py",
        (
            "libs/tests/rewards/test_outcome.py",
            "libs/tests/rewards/test_specs.py",
            "libs/tests/rewards/test_scenarios.py",
        ),
    ),
    Target(
        "scenario bargaining",
        "libs/wolfpack_games/scenarios/families/bargaining.py",
        (
            "libs/tests/games/scenarios/test_bargaining.py",
            "libs/tests/games/scenarios/test_family_rules_mutants.py",
            "libs/tests/games/scenarios/test_common.py",
            "libs/tests/games/scenarios/test_engine_and_bots.py",
        ),
    ),
    Target(
        "scenario allocation",
        "libs/wolfpack_games/scenarios/families/allocation.py",
        (
            "libs/tests/games/scenarios/test_verifier_tables.py",
            "libs/tests/games/scenarios/test_family_rules_mutants.py",
            "libs/tests/games/scenarios/test_common.py",
            "libs/tests/games/scenarios/test_engine_and_bots.py",
        ),
    ),
    Target(
        "scenario cooperation",
        "libs/wolfpack_games/scenarios/families/cooperation.py",
        (
            "libs/tests/games/scenarios/test_verifier_tables.py",
            "libs/tests/games/scenarios/test_family_rules_mutants.py",
            "libs/tests/games/scenarios/test_common.py",
            "libs/tests/games/scenarios/test_engine_and_bots.py",
        ),
    ),
    Target(
        "reward shaping",
        "libs/wolfpack_rewards/shaping.py",
        (
            "libs/tests/rewards/test_shaping.py",
            "libs/tests/rewards/test_shaping_work.py",
            "libs/tests/rewards/test_specs.py",
        ),
    ),
    Target(
        "reward credit",
        "libs/wolfpack_rewards/credit.py",
        ("libs/tests/rewards/test_credit.py", "libs/tests/rewards/test_specs.py"),
    ),
    Target(
        "rpc",
        "libs/wolfpack/rpc.py",
        (
            "libs/tests/test_rpc.py",
            "libs/tests/test_rpc_access_log.py",
            "libs/tests/test_errors.py",
            "tests/boundary/test_drain.py",
            "tests/boundary/test_retries.py",
            "tests/boundary/test_limits.py",
        ),
    ),
    Target(
        "rollout driver",
        "services/rollout/wolfpack_rollout/driver.py",
        (
            "services/rollout/tests/test_driver_faults.py",
            "services/rollout/tests/test_failures.py",
            "services/rollout/tests/test_driver.py",
            "services/rollout/tests/test_backpressure.py",
        ),
    ),
    Target(
        "rollout trajectory",
        "services/rollout/wolfpack_rollout/trajectory.py",
        ("services/rollout/tests/test_trajectory.py",),
    ),
    Target(
        "rollout prompts",
        "services/rollout/wolfpack_rollout/prompts.py",
        ("services/rollout/tests/test_prompts.py",),
    ),
    Target(
        "rollout summary",
        "services/rollout/wolfpack_rollout/summary.py",
        ("services/rollout/tests/test_summary.py", "services/rollout/tests/test_trajectory.py"),
    ),
    Target(
        "trainer batch",
        "services/trainer/wolfpack_trainer/batch.py",
        ("services/trainer/tests/test_batch.py",),
    ),
    Target(
        "trainer algos",
        "services/trainer/wolfpack_trainer/algos.py",
        ("services/trainer/tests/test_algos.py", "services/trainer/tests/test_gigpo.py"),
    ),
    Target(
        "trainer gigpo",
        "services/trainer/wolfpack_trainer/gigpo.py",
        ("services/trainer/tests/test_gigpo.py",),
    ),
    Target(
        "trainer cpu learner",
        "services/trainer/wolfpack_trainer/learners/cpu.py",
        ("services/trainer/tests/test_learner_cpu.py",),
    ),
    Target(
        "curriculum aiw",
        "services/curriculum/wolfpack_curriculum/aiw.py",
        ("services/curriculum/tests/test_aiw.py",),
    ),
    Target(
        "curriculum league",
        "services/curriculum/wolfpack_curriculum/league.py",
        ("services/curriculum/tests/test_league.py",),
    ),
    Target(
        "curriculum scheduler",
        "services/curriculum/wolfpack_curriculum/scheduler.py",
        ("services/curriculum/tests/test_scheduler.py", "services/curriculum/tests/test_server.py"),
    ),
    Target(
        "curriculum store",
        "services/curriculum/wolfpack_curriculum/store.py",
        ("services/curriculum/tests/test_store.py", "services/curriculum/tests/test_server.py"),
    ),
    Target(
        "curriculum consumer",
        "services/curriculum/wolfpack_curriculum/consumer.py",
        ("services/curriculum/tests/test_consumer.py", "services/curriculum/tests/test_server.py"),
    ),
    Target(
        "environment sessions",
        "services/environment/wolfpack_environment/sessions.py",
        (
            "services/environment/tests/test_sessions.py",
            "services/environment/tests/test_server.py",
            "tests/boundary/test_limits.py",
            "tests/boundary/test_hidden_information.py",
            "tests/security/test_leak.py",
            "tests/security/test_environment.py",
            "--deselect=tests/security/test_environment.py::test_worst_case_legal_episodes_beside_normal_traffic",
        ),
    ),
    Target(
        "environment server",
        "services/environment/wolfpack_environment/server.py",
        (
            "services/environment/tests/test_server.py",
            "tests/boundary/test_hidden_information.py",
            "tests/security/test_leak.py",
            "tests/security/test_environment.py",
            "--deselect=tests/security/test_environment.py::test_worst_case_legal_episodes_beside_normal_traffic",
        ),
    ),
    Target(
        "environment play stream",
        "services/environment/wolfpack_environment/play_stream.py",
        (
            "services/environment/tests/test_play_stream.py",
            "services/environment/tests/test_server.py",
            "tests/security/test_environment.py",
            "--deselect=tests/security/test_environment.py::test_worst_case_legal_episodes_beside_normal_traffic",
        ),
    ),
    Target(
        "environment session proto mapping",
        "libs/wolfpack_games/session_proto.py",
        (
            "services/environment/tests/test_convert.py",
            "services/environment/tests/test_server.py",
            "tests/boundary/test_hidden_information.py",
            "tests/security/test_leak.py",
            "tests/security/test_environment.py",
            "--deselect=tests/security/test_environment.py::test_worst_case_legal_episodes_beside_normal_traffic",
        ),
    ),
    Target(
        "environment gateway",
        "services/environment/wolfpack_environment/gateway.py",
        (
            "services/environment/tests/test_gateway_bounds.py",
            "services/environment/tests/test_gateway.py",
            "tests/boundary/test_hidden_information.py",
            "tests/security/test_leak.py",
            "tests/security/test_environment.py",
            "--deselect=tests/security/test_environment.py::test_worst_case_legal_episodes_beside_normal_traffic",
        ),
    ),
    Target(
        "stream",
        "libs/wolfpack/stream.py",
        (
            "libs/tests/test_stream.py",
            "libs/tests/test_stream_guarantees.py",
            "libs/tests/test_stream_edges.py",
        ),
    ),
    Target(
        "telemetry",
        "libs/wolfpack/telemetry.py",
        (
            "libs/tests/test_telemetry.py",
            "tests/boundary/test_otel_exporter.py",
            "libs/tests/test_rpc.py::test_light_interceptors_carry_trace_context_without_an_sdk",
            "libs/tests/test_rpc.py::test_light_interceptors_carry_trace_context_into_short_server_streams",
        ),
    ),
    Target(
        "auth",
        "libs/wolfpack/auth.py",
        (
            # test_auth.py refuses PushWeights/LoadPolicy over real gRPC as the inference security tests do,
            # without their 10 s tiny-model load per mutant
            "libs/tests/test_auth.py",
            "tests/security/test_environment.py::test_spectating_and_closing_a_running_episode_need_the_credential",
            "tests/security/test_environment.py::test_clients_configured_with_the_secret_attach_it",
            "tests/security/test_environment.py::test_gateway_forwards_only_the_callers_credential",
            "tests/security/test_environment.py::test_non_loopback_bind_without_a_secret_refuses_to_start",
        ),
    ),
    Target(
        "scenario engine",
        "libs/wolfpack_games/scenarios/engine.py",
        (
            "libs/tests/games/scenarios/test_engine_and_bots.py",
            "libs/tests/games/scenarios/test_engine_mutants.py",
        ),
    ),
    Target(
        "scenario ultimatum",
        "libs/wolfpack_games/scenarios/families/ultimatum.py",
        (
            "libs/tests/games/scenarios/test_verifier_tables.py",
            "libs/tests/games/scenarios/test_families_more_mutants.py",
            "libs/tests/games/scenarios/test_common.py",
            "libs/tests/games/scenarios/test_engine_and_bots.py",
        ),
    ),
    Target(
        "scenario trust",
        "libs/wolfpack_games/scenarios/families/trust.py",
        (
            "libs/tests/games/scenarios/test_verifier_tables.py",
            "libs/tests/games/scenarios/test_families_more_mutants.py",
            "libs/tests/games/scenarios/test_common.py",
            "libs/tests/games/scenarios/test_engine_and_bots.py",
        ),
    ),
    Target(
        "scenario prisoners dilemma",
        "libs/wolfpack_games/scenarios/families/prisoners_dilemma.py",
        (
            "libs/tests/games/scenarios/test_verifier_tables.py",
            "libs/tests/games/scenarios/test_families_more_mutants.py",
            "libs/tests/games/scenarios/test_common.py",
            "libs/tests/games/scenarios/test_engine_and_bots.py",
        ),
    ),
    Target(
        "scenario public goods",
        "libs/wolfpack_games/scenarios/families/public_goods.py",
        (
            "libs/tests/games/scenarios/test_verifier_tables.py",
            "libs/tests/games/scenarios/test_families_more_mutants.py",
            "libs/tests/games/scenarios/test_common.py",
            "libs/tests/games/scenarios/test_engine_and_bots.py",
        ),
    ),
    Target(
        "scenario coalition",
        "libs/wolfpack_games/scenarios/families/coalition.py",
        (
            "libs/tests/games/scenarios/test_verifier_tables.py",
            "libs/tests/games/scenarios/test_families_more_mutants.py",
            "libs/tests/games/scenarios/test_common.py",
            "libs/tests/games/scenarios/test_engine_and_bots.py",
        ),
    ),
)

# One replacement per binary operator (the other ten add time, not information); none for ``|`` (annotations).
_BINOP = re.compile(r"core/ReplaceBinaryOperator_(\w+?)_(\w+)$")
_KEEP_BINOP = {
    "Add": "Sub",
    "Sub": "Add",
    "Mul": "Add",
    "Div": "Mul",
    "FloorDiv": "Div",
    "Mod": "FloorDiv",
    "Pow": "Mul",
}


def wanted(operator: str) -> bool:
    match = _BINOP.match(operator)
    if match is None:
        return True
    return _KEEP_BINOP.get(match.group(1)) == match.group(2)


def copy_tree(dest: Path) -> None:
    """Tracked and untracked-but-not-ignored files, as they are in the working tree now."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Outcome:
    target: Target
    total: int
    ran: int
    killed: int
    survived: int
    timeouts: int
    incompetent: int
    seconds: float
    survivors: list[str]
    error: str = ""


def run_target(
    target: Target, tree: Path, env: dict[str, str], sample: int, seed: int, timeout_s: float
) -> Outcome:
    work = tree / ".mutation" / re.sub(r"\W+", "-", target.name)
    work.mkdir(parents=True)
    test_command = f"{PYTEST} {' '.join(target.tests)}"
    config = work / "config.toml"
    config.write_text(
        "[cosmic-ray]\n"
        f'module-path = "{target.module}"\n'
        f"timeout = {timeout_s}\n"
        "excluded-modules = []\n"
        f'test-command = "{test_command}"\n'
        '[cosmic-ray.distributor]\nname = "local"\n'
    )
    started = time.monotonic()
    baseline = subprocess.run(test_command.split(), cwd=tree, env=env, capture_output=True, text=True)
    if baseline.returncode != 0:
        tail = (baseline.stdout + baseline.stderr)[-600:]
        return Outcome(target, 0, 0, 0, 0, 0, 0, 0.0, [], error=f"baseline tests fail: {tail}")
    session = work / "session.sqlite"
    subprocess.run(
        ["cosmic-ray", "init", str(config), str(session)], cwd=tree, env=env, check=True, capture_output=True
    )
    db = sqlite3.connect(session)
    # Ordered by what the mutant is (job ids are random per init), so a seed draws the same sample each run.
    jobs = db.execute(
        "select job_id, operator_name from mutation_specs"
        " order by operator_name, start_pos_row, start_pos_col, occurrence"
    ).fetchall()
    kept = [job for job, op in jobs if wanted(op)]
    if sample:
        kept = sorted(random.Random(seed).sample(kept, min(sample, len(kept))))
    drop = [(job,) for job, _ in jobs if job not in set(kept)]
    db.executemany("delete from mutation_specs where job_id = ?", drop)
    db.executemany("delete from work_items where job_id = ?", drop)
    db.commit()
    subprocess.run(
        ["cosmic-ray", "exec", str(config), str(session)], cwd=tree, env=env, check=True, capture_output=True
    )
    rows = [
        (str(w).lower(), str(t).lower(), str(out or ""), str(d or ""))
        for w, t, out, d in db.execute(
            "select r.worker_outcome, r.test_outcome, r.output, r.diff"
            " from work_results r join mutation_specs s using (job_id)"
        )
    ]
    db.close()
    # A test run that hits the per-mutant bound is reported killed with "timeout" in its output.
    timeouts = sum(1 for w, t, out, _ in rows if t == "killed" and "timeout" in out.lower()[:200])
    killed = sum(1 for w, t, _, _ in rows if w == "normal" and t == "killed")
    survived = [d for w, t, _, d in rows if w == "normal" and t == "survived"]
    incompetent = sum(1 for w, t, _, _ in rows if t == "incompetent" or w != "normal")
    return Outcome(
        target, len(jobs), len(rows), killed, len(survived), timeouts, incompetent,
        time.monotonic() - started, survived,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", default=None, help="target names (default: all)")
    parser.add_argument("--sample", type=int, default=40, help="mutants per module (0: all)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the sample")
    parser.add_argument(
        "--timeout-s", type=float, default=120.0, help="per-mutant test run bound (a hang = killed)"
    )
    parser.add_argument(
        "--report", type=Path, default=None, help="write the survivors' diffs here (markdown)"
    )
    args = parser.parse_args()
    console = Console(width=130)
    targets = [t for t in TARGETS if args.only is None or t.name in args.only]
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="wolfpack-mutate-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["PYTHONPATH"] = os.pathsep.join(str(tree / d) for d in SOURCE_DIRS)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["HYPOTHESIS_PROFILE"] = "ci"
        with console.status("") as status:
            for target in targets:
                status.update(f"mutating {target.name} ({target.module})")
                outcome = run_target(target, tree, env, args.sample, args.seed, args.timeout_s)
                outcomes.append(outcome)
                console.log(f"{target.name}: {outcome.killed}/{outcome.killed + outcome.survived} killed")
    table = Table(
        title=f"Mutation testing (cosmic-ray; sample {args.sample or 'all'} per module, seed {args.seed})"
    )
    for col in (
        "module",
        "mutants",
        "ran",
        "killed",
        "survived",
        "timeouts",
        "other",
        "score",
        "95% CI",
        "time",
    ):
        table.add_column(col)
    for o in outcomes:
        n = o.killed + o.survived
        lo, hi = wilson(o.killed, n)
        score = f"{o.killed / n:.0%}" if n else "-"
        table.add_row(
            o.target.name, str(o.total), str(o.ran), str(o.killed), str(o.survived), str(o.timeouts),
            str(o.incompetent), score if not o.error else "error", f"{lo:.0%}-{hi:.0%}", f"{o.seconds:.0f}s",
        )  # fmt: skip
    console.print(table)
    for o in outcomes:
        if o.error:
            console.print(f"[red]{o.target.name}: {o.error}[/]")
    if args.report is not None:
        lines = ["# Surviving mutants", ""]
        for o in outcomes:
            lines += [f"## {o.target.name} (`{o.target.module}`)", ""]
            lines += [f"```diff\n{d.strip()}\n```\n" for d in o.survivors] or ["none", ""]
        args.report.write_text("\n".join(lines))
        console.print(f"survivors written to {args.report}")


if __name__ == "__main__":
    main()
