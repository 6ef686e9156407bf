"""The Tiltfile, evaluated by a Starlark interpreter (PyPI starlark-pyo3) with Tilt's builtins recorded: each
stub accepts only the keyword arguments Tilt's API has, so a misspelt option fails here as it would in Tilt.
`local()` really runs (the chart is rendered by tilt/dev.py with Helm's library), and the local mode's
commands are started as Tilt would start them, in resource_deps order, until each readiness probe passes."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import starlark as sl
import yaml

ROOT = Path(__file__).resolve().parents[2]
TILT = ROOT / "tilt"
SERVICES = ("environment", "inference", "reward", "curriculum", "rollout")
IMAGES = (*SERVICES, "web")
"""Images Tilt builds with live update: the gRPC services and the web view."""

# Tilt's builtins as far as the Tiltfile uses them, with their documented keyword arguments.
DOCKER_BUILD = {
    "ref", "context", "build_args", "dockerfile", "dockerfile_contents", "live_update", "match_in_env_vars",
    "ignore", "only", "entrypoint", "target", "ssh", "network", "secret", "extra_tag", "container_args",
    "cache_from", "pull", "platform", "extra_hosts",
}  # fmt: skip
API: dict[str, set[str]] = {
    "docker_build": DOCKER_BUILD,
    "docker_build_with_restart": DOCKER_BUILD | {"base_suffix", "restart_file", "trigger", "exit_policy"},
    "k8s_yaml": {"yaml", "allow_duplicates"},
    "k8s_resource": {
        "workload", "new_name", "port_forwards", "extra_pod_selectors", "trigger_mode", "resource_deps",
        "objects", "auto_init", "pod_readiness", "links", "labels", "discovery_strategy",
    },
    "local_resource": {
        "name", "cmd", "deps", "trigger_mode", "resource_deps", "ignore", "auto_init", "serve_cmd", "cmd_bat",
        "serve_cmd_bat", "allow_parallel", "links", "tags", "env", "serve_env", "readiness_probe", "dir",
        "serve_dir", "labels",
    },
    "probe": {
        "initial_delay_secs", "timeout_secs", "period_secs", "success_threshold", "failure_threshold", "exec",
        "http_get", "tcp_socket",
    },
    "exec_action": {"command"},
    "http_get_action": {"port", "host", "scheme", "path"},
    "port_forward": {"local_port", "container_port", "name", "link_path", "host"},
    "link": {"url", "name"},
    "sync": {"local_path", "remote_path"},
    "fall_back_on": {"files"},
    "local": {"command", "quiet", "command_bat", "echo_off", "env", "dir", "stdin"},
    "watch_file": {"file_name"},
    "encode_json": {"obj"},
}  # fmt: skip
PRELUDE = """
config = struct(define_string = _define, define_bool = _define, parse = _parse)
os = struct(getcwd = _getcwd, path = struct(dirname = _dirname, join = _join))
TRIGGER_MODE_MANUAL = "manual"
TRIGGER_MODE_AUTO = "auto"
"""
Call = tuple[str, dict[str, Any]]


def evaluate(settings: dict[str, Any] | None = None) -> list[Call]:
    """Evaluate tilt/Tiltfile with `tilt up -- <settings>`; returns every builtin call with its arguments
    bound to their names (positional ones mapped in Tilt's parameter order)."""
    calls: list[Call] = []
    defined: set[str] = set()
    positional = {
        "docker_build": ["ref", "context"], "docker_build_with_restart": ["ref", "context"], "k8s_yaml": ["yaml"],
        "k8s_resource": ["workload"], "local_resource": ["name", "cmd"], "exec_action": ["command"],
        "port_forward": ["local_port", "container_port"], "link": ["url", "name"],
        "sync": ["local_path", "remote_path"], "fall_back_on": ["files"], "local": ["command"],
        "watch_file": ["file_name"], "encode_json": ["obj"],
    }  # fmt: skip

    def recorder(name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            names = positional.get(name, [])
            assert len(args) <= len(names), f"{name}: too many positional arguments"
            bound = dict(zip(names, args, strict=False)) | kwargs
            unknown = set(bound) - API[name]
            assert not unknown, f"{name}() has no argument(s) {sorted(unknown)}"
            calls.append((name, bound))
            if name == "encode_json":
                return json.dumps(bound["obj"])
            if name == "local":
                done = subprocess.run(bound["command"], capture_output=True, text=True, cwd=TILT, timeout=60)
                assert done.returncode == 0, done.stderr
                return done.stdout
            return {"builtin": name, **bound}

        return record

    def define(name: str, usage: str = "", args: bool = False) -> None:
        assert usage, f"config setting {name} has no usage text"
        defined.add(name)

    def parse() -> dict[str, Any]:
        unknown = set(settings or {}) - defined
        assert not unknown, f"settings the Tiltfile does not define: {unknown}"
        return dict(settings or {})

    module = sl.Module()
    for name in API:
        if name != "docker_build_with_restart":
            module.add_callable(name, recorder(name))
    module.add_callable("_define", define)
    module.add_callable("_parse", parse)
    module.add_callable("_getcwd", lambda: str(TILT))
    module.add_callable("_dirname", os.path.dirname)
    module.add_callable("_join", os.path.join)

    def load(path: str) -> sl.FrozenModule:
        assert path == "ext://restart_process", path
        ext = sl.Module()
        ext.add_callable("docker_build_with_restart", recorder("docker_build_with_restart"))
        return ext.freeze()

    globals_ = sl.Globals.extended_by([sl.LibraryExtension.StructType, sl.LibraryExtension.Print])
    ast = sl.parse("Tiltfile", PRELUDE + (TILT / "Tiltfile").read_text(), sl.Dialect.extended())
    sl.eval(module, ast, globals_, sl.FileLoader(load))
    return calls


def named(calls: list[Call], builtin: str) -> list[dict[str, Any]]:
    return [kw for name, kw in calls if name == builtin]


def rendered(calls: list[Call]) -> list[dict[str, Any]]:
    [k8s] = named(calls, "k8s_yaml")
    return [d for d in yaml.safe_load_all(k8s["yaml"]) if d]


def dockerfile_env() -> str:
    return re.sub(r"\\\n", " ", (ROOT / "deploy" / "docker" / "Dockerfile").read_text())


def test_root_tiltfile_includes_the_real_one() -> None:
    assert 'include("./tilt/Tiltfile")' in (ROOT / "Tiltfile").read_text()


def test_default_builds_cpu_images_with_a_live_update_that_reloads() -> None:
    calls = evaluate()
    builds = {kw["ref"]: kw for kw in named(calls, "docker_build_with_restart")}
    assert set(builds) == {f"wolfpack-{s}" for s in IMAGES}
    assert not named(calls, "docker_build")  # no trainer image without --train
    pythonpath = re.search(r"PYTHONPATH=(\S+)", dockerfile_env())
    assert pythonpath
    on_path = pythonpath.group(1).split(":")
    entry = re.search(r"COPY --chmod=0755 deploy/docker/entrypoint.sh (\S+)", dockerfile_env())
    assert entry
    for svc in IMAGES:
        b = builds[f"wolfpack-{svc}"]
        assert (TILT / b["dockerfile"]).resolve() == ROOT / "deploy" / "docker" / "Dockerfile"
        assert (TILT / b["context"]).resolve() == ROOT
        assert b["target"] == "dev" and b["build_args"] == {"SERVICE": svc, "VARIANT": "cpu"}
        assert b["entrypoint"] == [entry.group(1)]  # restarts run the image's own entrypoint
        steps = b["live_update"]
        assert steps[0]["builtin"] == "fall_back_on"  # dependency changes rebuild the image
        assert {(TILT / f).resolve() for f in steps[0]["files"]} == {
            ROOT / "pyproject.toml",
            ROOT / "deploy" / "docker",
        }
        syncs = {(TILT / s["local_path"]).resolve(): s["remote_path"] for s in steps[1:]}
        assert syncs == {ROOT / "libs": "/app/libs", ROOT / "services": "/app/services"}
        # what is synced is what runs: the synced directories are the ones on the image's PYTHONPATH
        assert "/app/libs" in on_path and f"/app/services/{svc}" in on_path


def test_default_deploys_the_chart_for_a_cpu_cluster_with_cli_port_forwards() -> None:
    from wolfpack import SERVICES as ALL
    from wolfpack.settings import Settings

    calls = evaluate()
    docs = rendered(calls)
    workloads = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")}
    for d in workloads.values():
        for c in d["spec"]["template"]["spec"]["containers"]:
            assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}), d["metadata"]["name"]
    policies = next(d for d in docs if d["metadata"]["name"] == "wolfpack-inference-config")
    default_policy = yaml.safe_load(policies["data"]["policies.yaml"])[0]
    assert default_policy["backend"] == "transformers" and default_policy["model"] == "tiny"
    resources = {kw["workload"]: kw for kw in named(calls, "k8s_resource")}
    assert set(resources) <= set(workloads)  # every resource names a workload the chart renders
    assert set(resources) >= {f"wolfpack-{s}" for s in SERVICES} | {"wolfpack-redis", "wolfpack-gateway"}
    # the laptop CLI's default addresses (WOLFPACK_BASE_PORT order) are the forwarded ports
    cli = Settings()
    for svc in SERVICES:
        [fwd] = resources[f"wolfpack-{svc}"]["port_forwards"]
        assert f"127.0.0.1:{fwd['local_port']}" == cli.service_addr(svc) and fwd["container_port"] == 50051
        assert ALL.index(svc) == fwd["local_port"] - 50051
    assert resources["wolfpack-gateway"]["port_forwards"][0]["local_port"] == 8080
    # the web view: forwarded to the port `wolfpack web` uses on a laptop, onto the port its pod listens on
    # (its loopback: the forward is the only way in)
    [web_fwd] = resources["wolfpack-web"]["port_forwards"]
    web_env = {
        e["name"]: e.get("value")
        for e in workloads["wolfpack-web"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert (
        web_fwd["local_port"] == 8470
        and web_env["WOLFPACK_WEB_ADDR"] == f"127.0.0.1:{web_fwd['container_port']}"
    )
    assert "wolfpack-environment" in resources["wolfpack-web"]["resource_deps"]
    # every image Tilt builds is used by a rendered workload (Tilt injects its tags there)
    images = {
        c["image"].split(":")[0]
        for d in workloads.values()
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert {kw["ref"] for kw in named(calls, "docker_build_with_restart")} <= images
    # the dev image's /app takes synced files
    env = next(d for n, d in workloads.items() if n == "wolfpack-environment")
    assert (
        env["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    )


def test_resource_deps_start_in_dependency_order() -> None:
    for settings in ({}, {"train": True, "tracing": True}, {"mode": "local", "train": True}):
        calls = evaluate(settings)
        deps = {kw["workload"]: kw.get("resource_deps", []) for kw in named(calls, "k8s_resource")}
        deps |= {kw["name"]: kw.get("resource_deps", []) for kw in named(calls, "local_resource")}
        order = topological(deps)
        rollout = next(n for n in deps if n.endswith("rollout"))
        for other in ("environment", "inference", "reward", "curriculum"):
            assert order.index(next(n for n in deps if n.endswith(other))) < order.index(rollout)
        redis = next(n for n in deps if n.endswith("redis"))
        assert all(order.index(redis) < order.index(n) for n in deps if n.endswith(SERVICES))


def topological(deps: dict[str, list[str]]) -> list[str]:
    order: list[str] = []
    pending = dict(deps)
    while pending:
        ready = [n for n, d in pending.items() if all(x in order for x in d)]
        assert ready, f"unknown or cyclic resource_deps: {pending}"
        order += sorted(ready)
        for n in ready:
            del pending[n]
    return order


def test_gpus_and_training_switch_images_and_the_chart() -> None:
    calls = evaluate({"gpus": "1", "train": True, "tracing": True})
    builds = {kw["ref"]: kw for kw in named(calls, "docker_build_with_restart")}
    assert builds["wolfpack-inference"]["build_args"]["VARIANT"] == "cuda"
    assert builds["wolfpack-reward"]["build_args"]["VARIANT"] == "cpu"
    [trainer] = named(calls, "docker_build")
    assert trainer["ref"] == "wolfpack-trainer" and trainer["build_args"] == {
        "SERVICE": "trainer",
        "VARIANT": "cuda",
    }
    assert "entrypoint" not in trainer  # the Job's own command must stay
    docs = rendered(calls)
    gpus = {
        d["metadata"]["name"]: c["resources"]["limits"]["nvidia.com/gpu"]
        for d in docs
        if d["kind"] in ("Deployment", "Job")
        for c in d["spec"]["template"]["spec"]["containers"]
        if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
    }
    assert gpus == {"wolfpack-inference": 1, "wolfpack-train-demo-ultimatum-local": 1}
    resources = {kw["workload"] for kw in named(calls, "k8s_resource")}
    assert {"wolfpack-train-demo-ultimatum-local", "wolfpack-jaeger"} <= resources
    assert "wolfpack-train-demo-ultimatum-local" in {
        d["metadata"]["name"] for d in docs if d["kind"] == "Job"
    }


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def started(resources: list[dict[str, Any]], log_dir: Path) -> Iterator[list[str]]:
    """Start each local_resource's serve_cmd as Tilt does (serve_dir, serve_env over the environment), in
    resource_deps order, waiting for its readiness probe before the next wave; stop them all at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    ready: list[str] = []
    by_name = {r["name"]: r for r in resources}
    pending = set(by_name)
    t0 = time.monotonic()
    try:
        while pending:  # waves, as Tilt starts every resource whose deps are ready
            wave = sorted(n for n in pending if all(d in ready for d in by_name[n].get("resource_deps", [])))
            assert wave, f"unknown or cyclic resource_deps among {pending}"
            started_now = {}
            for name in wave:
                r = by_name[name]
                log = (log_dir / f"{name}.log").open("wb")
                started_now[name] = subprocess.Popen(
                    r["serve_cmd"], cwd=r["serve_dir"], env={**os.environ, **r.get("serve_env", {})},
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
                procs.append(started_now[name])
            for name in wave:
                wait_ready(name, by_name[name]["readiness_probe"], started_now[name], log_dir)
                print(f"{name} ready at {time.monotonic() - t0:.1f} s")
                ready.append(name)
                pending.discard(name)
        yield ready
    finally:
        t1 = time.monotonic()
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        print(f"stopped in {time.monotonic() - t1:.1f} s")


def wait_ready(name: str, probe: dict[str, Any], proc: subprocess.Popen[bytes], log_dir: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{name} exited: {(log_dir / f'{name}.log').read_text()[-2000:]}"
        if "exec" in probe:
            if subprocess.run(probe["exec"]["command"], capture_output=True, timeout=30).returncode == 0:
                return
        else:
            get = probe["http_get"]
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{get['port']}{get['path']}", timeout=2) as resp,
            ):
                if resp.status == 200:
                    return
        time.sleep(probe.get("period_secs", 1) / 2)
    raise AssertionError(f"{name} never became ready: {(log_dir / f'{name}.log').read_text()[-2000:]}")


@pytest.mark.slow
def test_local_mode_starts_every_service_until_healthy(tmp_path: Path) -> None:
    base = random.randrange(20000, 30000, 20)
    calls = evaluate(
        {
            "mode": "local",
            "base_port": str(base),
            "gateway_port": str(free_port()),
            "web_port": str(free_port()),
        }
    )
    assert not named(calls, "k8s_yaml") and not named(calls, "docker_build_with_restart")
    resources = [kw for kw in named(calls, "local_resource") if "serve_cmd" in kw]
    assert {r["name"] for r in resources} == {"redis", "gateway", "web", *SERVICES}
    for r in resources:
        assert (
            r["serve_cmd"][0] == str(ROOT / ".venv" / "bin" / "python")
            or Path(r["serve_cmd"][0]).is_absolute()
        )
        if r["name"] in SERVICES:
            # source changes restart the process: it runs the checkout's code
            assert {(TILT / d).resolve() for d in r["deps"]} == {ROOT / "libs", ROOT / "services"}
    for r in resources:  # this machine's interpreter, and a run dir of the test's own
        r["serve_cmd"] = [sys.executable if c.endswith("/.venv/bin/python") else c for c in r["serve_cmd"]]
        if "exec" in r["readiness_probe"]:
            cmd = r["readiness_probe"]["exec"]["command"]
            r["readiness_probe"]["exec"]["command"] = [sys.executable, *cmd[1:]]
        if "serve_env" in r:
            r["serve_env"] = {**r["serve_env"], "WOLFPACK_RUN_DIR": str(tmp_path / "run")}
        else:
            r["serve_cmd"] = [
                str(tmp_path / "redis") if c.endswith("/.wolfpack/tilt/redis") else c for c in r["serve_cmd"]
            ]
    with started(resources, tmp_path) as ready:
        assert len(ready) == len(resources)
        # a real call through the gateway to the environment service: the wiring, not only the health
        port = next(r for r in resources if r["name"] == "gateway")["readiness_probe"]["http_get"]["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/games", timeout=10) as resp:
            games = json.loads(resp.read())
        assert "werewolf" in json.dumps(games)
        # and the web view's live list, which asks the environment service for its episodes (ListEpisodes)
        web = next(r for r in resources if r["name"] == "web")["readiness_probe"]["http_get"]["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/episodes", timeout=10) as resp:
            listing = json.loads(resp.read())
        assert listing["spectate"] is True and not listing.get("problem"), listing
    [train] = [
        kw
        for kw in named(evaluate({"mode": "local", "train": True}), "local_resource")
        if kw["name"] == "train"
    ]
    assert train["cmd"][-1].endswith("configs/demo-ultimatum-local.yaml") and Path(train["cmd"][-1]).is_file()
