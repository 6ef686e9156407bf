"""The Helm chart lints, renders offline, and every manifest validates against the Kubernetes schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import yaml

CHART = Path(__file__).resolve().parent.parent / "helm" / "wolfpack"
SERVICES = ("environment", "inference", "reward", "curriculum", "rollout", "trainer")
K8S_VERSION = "1.30.0"


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(str(CHART))
    manifests = chart.render(values or {}, name="wolfpack", namespace="default")
    docs = [d for text in manifests.values() for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_chart_lints_without_errors() -> None:
    report = helm_python.lint(str(CHART), strict=False)
    assert not report["errors"], report
    assert all(m["severity"] < 3 for m in report["messages"]), report["messages"]


def test_default_render_has_every_service_with_health_probes_and_gpus() -> None:
    docs = render()
    deployments = by_kind(docs, "Deployment")
    services = by_kind(docs, "Service")
    for name in SERVICES:
        dep = deployments[f"wolfpack-{name}"]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][:2] == ["serve", name]
        assert container["readinessProbe"]["grpc"]["port"] == 50051
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["WOLFPACK_REDIS_URL"] == "redis://wolfpack-redis:6379/0"
        assert env["WOLFPACK_TRAINER_ADDR"] == "wolfpack-trainer:50051"
        gpus = container["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus == (1 if name in ("inference", "trainer") else None), name
        assert f"wolfpack-{name}" in services
    assert "wolfpack-redis" in deployments
    assert "wolfpack-otel-collector" not in deployments


def test_tracing_and_external_redis_options() -> None:
    docs = render({"tracing": {"enabled": True}, "redis": {"enabled": False, "url": "redis://ext:6379/1"}})
    deployments = by_kind(docs, "Deployment")
    assert "wolfpack-otel-collector" in deployments and "wolfpack-jaeger" in deployments
    assert "wolfpack-redis" not in deployments
    env = {
        e["name"]: e.get("value")
        for e in deployments["wolfpack-rollout"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://wolfpack-otel-collector:4317"
    assert env["WOLFPACK_REDIS_URL"] == "redis://ext:6379/1"


def test_redis_keeps_its_append_only_file_on_a_persistent_volume() -> None:
    """The trajectory stream survives a Redis pod restart: AOF on, under /data, on a PVC (or an existing
    claim), and the Deployment recreates rather than rolls (a ReadWriteOnce volume has one owner)."""
    docs = render()
    [pvc] = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == "wolfpack-redis-data"
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"
    redis_dep = by_kind(docs, "Deployment")["wolfpack-redis"]
    pod = redis_dep["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes" and args[args.index("--dir") + 1] == "/data"
    assert pod["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert pod["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "wolfpack-redis-data"}}]
    assert redis_dep["spec"]["strategy"] == {"type": "Recreate"}

    existing = render({"redis": {"persistence": {"existingClaim": "redis-pvc", "storageClass": "fast"}}})
    assert not [d for d in existing if d["kind"] == "PersistentVolumeClaim"]
    pod = by_kind(existing, "Deployment")["wolfpack-redis"]["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "redis-pvc"
    ephemeral = render({"redis": {"persistence": {"enabled": False}}})
    pod = by_kind(ephemeral, "Deployment")["wolfpack-redis"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "data", "emptyDir": {}}]


def test_cpu_only_render_requests_no_gpus() -> None:
    docs = render({"services": {"inference": {"gpus": 0}, "trainer": {"gpus": 0}}})
    for dep in by_kind(docs, "Deployment").values():
        limits = dep["spec"]["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
        assert "nvidia.com/gpu" not in limits


def test_every_service_gets_the_admin_secret_from_a_kubernetes_secret() -> None:
    """Pods listen on 0.0.0.0, where services refuse to start without WOLFPACK_ADMIN_SECRET."""
    docs = render({"secrets": {"adminSecret": "s3cret"}})
    secrets = by_kind(docs, "Secret")
    assert "wolfpack-secrets" in secrets
    for name, dep in by_kind(docs, "Deployment").items():
        if name.endswith("redis"):
            continue
        env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        ref = env["WOLFPACK_ADMIN_SECRET"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "wolfpack-secrets", "key": "admin-secret"}, name
    generated = by_kind(render(), "Secret")["wolfpack-secrets"]["data"]["admin-secret"]
    assert generated  # empty value: a random secret, never an empty one
    own = render({"secrets": {"existingSecret": "mine"}})
    assert "wolfpack-secrets" not in by_kind(own, "Secret")
