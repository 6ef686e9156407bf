"""The Helm chart, checked with real tools and no cluster: Helm v4's own lint and renderer (PyPI
``helm-python-sdk``, which also applies ``values.schema.json``), every rendered manifest validated against the
Kubernetes 1.30 schemas (``kubernetes-validate``, strict: unknown fields fail), then properties a platform
engineer would check by reading: GPUs only where meant, every pod probed, secrets never in plain text, the
training Job on its volume, only the gateway reachable from outside. The files the chart mounts are parsed by
the project's own config loaders, so a value the services would refuse fails here."""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "wolfpack"
EXAMPLES = ROOT / "deploy" / "helm" / "examples"
K8S_VERSION = "1.30.0"
GRPC_SERVICES = ("environment", "inference", "reward", "curriculum", "rollout")
Doc = dict[str, Any]

# Known values for the secrets, so the tests can look for them where they must never be.
ADMIN = "admin-Secret-0123456789"
REDIS_PW = "redis-Secret-9876543210"
PINNED = {"secrets": {"adminSecret": ADMIN}, "redis": {"auth": {"password": REDIS_PW}}}


def example(name: str) -> dict[str, Any]:
    data = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    assert isinstance(data, dict)
    return data


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


@cache
def _render(values_json: str) -> str:
    manifests = helm_python.Chart.load(str(CHART)).render(
        json.loads(values_json), name="wolfpack", namespace="default"
    )
    return "\n---\n".join(manifests[k] for k in sorted(manifests) if k.endswith(".yaml"))  # not NOTES.txt


@cache
def _validate(doc_json: str) -> None:
    doc = json.loads(doc_json)
    if not doc["apiVersion"].startswith("ray.io/"):  # KubeRay CRDs are not in the Kubernetes schemas
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def render(values: dict[str, Any] | None = None) -> list[Doc]:
    """Render and validate every manifest against the Kubernetes schemas (both cached: many tests render
    the same value sets, and most manifests repeat between them)."""
    text = _render(json.dumps(values or {}, sort_keys=True))
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        _validate(json.dumps(doc, sort_keys=True))
    return docs


def by_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[Doc]) -> Iterator[tuple[str, Doc]]:
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


def container(docs: list[Doc], kind: str, name: str) -> Doc:
    c = by_kind(docs, kind)[name]["spec"]["template"]["spec"]["containers"][0]
    assert isinstance(c, dict)
    return c


def env_of(c: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in c.get("env", [])}


def gpus_of(spec: Doc) -> dict[str, int]:
    out = {}
    for c in spec["containers"]:
        res = c.get("resources", {})
        limit = res.get("limits", {}).get("nvidia.com/gpu")
        assert limit == res.get("requests", {}).get("nvidia.com/gpu"), c["name"]  # extended resources: equal
        if limit:
            out[c["name"]] = limit
    return out


VALUE_SETS = {
    "default": {},
    "cpu-dev": example("cpu-dev"),
    "gpu": example("gpu"),
    "tracing+external-redis": {
        "tracing": {"enabled": True},
        "redis": {"enabled": False, "url": "redis://ext:6379/1"},
    },
}


def test_chart_lints_without_errors_with_every_example() -> None:
    for values in VALUE_SETS.values():
        report = helm_python.lint(str(CHART), values, strict=True, kube_version=K8S_VERSION)
        assert not report["errors"], report
        assert all(m["severity"] < 3 for m in report["messages"]), report["messages"]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_value_set_renders_valid_manifests(name: str) -> None:
    docs = render(VALUE_SETS[name])
    assert by_kind(docs, "Deployment")


def test_gpu_requests_only_where_meant() -> None:
    """CPU dev cluster: no GPU anywhere. Defaults: one per inference replica. GPU example: N inference
    replicas of one GPU each and the multi-GPU training Job; nothing else asks for a GPU."""
    for name, spec in pod_specs(render(example("cpu-dev"))):
        assert not gpus_of(spec), name
    default = {name: gpus_of(spec) for name, spec in pod_specs(render())}
    assert {n: g for n, g in default.items() if g} == {"wolfpack-inference": {"inference": 1}}
    docs = render(example("gpu"))
    gpu = {name: gpus_of(spec) for name, spec in pod_specs(docs)}
    assert {n: g for n, g in gpu.items() if g} == {
        "wolfpack-inference": {"inference": 1},
        "wolfpack-train-gpu-bargaining-smollm2": {"train": 2},
    }
    assert by_kind(docs, "Deployment")["wolfpack-inference"]["spec"]["replicas"] == 4
    # GPU pods get shared memory; they tolerate the GPU taint and land on GPU nodes
    for name in ("wolfpack-inference", "wolfpack-train-gpu-bargaining-smollm2"):
        spec = dict(pod_specs(docs))[name]
        shm = next(v for v in spec["volumes"] if v["name"] == "shm")
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


@pytest.mark.parametrize("name", ["default", "cpu-dev", "gpu"])
def test_every_pod_is_probed_and_model_loads_get_a_startup_probe(name: str) -> None:
    docs = render(merged(VALUE_SETS[name], {"tracing": {"enabled": True}}))
    for pod, spec in pod_specs(docs):
        for c in spec["containers"]:
            assert "livenessProbe" in c and ("readinessProbe" in c or pod.startswith("wolfpack-train")), pod
            if pod.startswith("wolfpack-") and not pod.endswith(("jaeger", "collector")):
                assert "startupProbe" in c, pod
    inference = container(docs, "Deployment", "wolfpack-inference")
    startup = inference["startupProbe"]
    # liveness (3 x 20 s) would kill a model load; the startup probe allows minutes first
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert startup["grpc"] == {"port": 50051}


def test_no_secret_value_in_a_configmap_or_a_plain_variable() -> None:
    values = merged(example("gpu"), PINNED)
    docs = render(values)
    secrets = by_kind(docs, "Secret")["wolfpack-secrets"]
    assert base64.b64decode(secrets["data"]["admin-secret"]).decode() == ADMIN
    assert base64.b64decode(secrets["data"]["redis-password"]).decode() == REDIS_PW
    needles = [ADMIN, REDIS_PW, base64.b64encode(ADMIN.encode()).decode()]
    for cm in by_kind(docs, "ConfigMap").values():
        text = yaml.safe_dump(cm)
        assert not any(n in text for n in needles), cm["metadata"]["name"]
    for pod, spec in pod_specs(docs):
        for c in spec["containers"]:
            text = yaml.safe_dump([c.get("env", []), c.get("args", []), c.get("command", [])])
            assert not any(n in text for n in needles), pod
    # the API key comes from the user's Secret, by reference
    env = env_of(container(docs, "Deployment", "wolfpack-inference"))
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "llm-keys", "key": "openai-api-key"}


def test_secrets_are_stable_across_renders_or_refused() -> None:
    """With values pinned the whole release renders byte for byte the same (nothing random left); with
    nothing pinned and generation off, rendering stops with a message instead of inventing a value; the
    generated Secret survives uninstall and is read back with lookup on upgrades."""
    values = merged(example("gpu"), PINNED)
    key = json.dumps(values, sort_keys=True)
    first = _render(key)
    _render.cache_clear()
    assert _render(key) == first
    with pytest.raises(helm_python.HelmError, match=re.escape("secrets.generate is false")):
        render({"secrets": {"generate": False}})
    assert by_kind(render(), "Secret")["wolfpack-secrets"]["metadata"]["annotations"] == {
        "helm.sh/resource-policy": "keep"
    }
    template = (CHART / "templates" / "secret.yaml").read_text()
    assert 'lookup "v1" "Secret"' in template
    own = render({"secrets": {"existingSecret": "mine"}, "redis": {"auth": {"existingSecret": "rds"}}})
    assert "wolfpack-secrets" not in by_kind(own, "Secret")
    env = env_of(container(own, "Deployment", "wolfpack-reward"))
    assert env["WOLFPACK_ADMIN_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "mine",
        "key": "admin-secret",
    }
    assert env["WOLFPACK_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "rds",
        "key": "redis-password",
    }


def test_training_job_runs_the_configmapped_config_with_checkpoints_on_its_claim() -> None:
    from wolfpack_trainer.config import load_config

    docs = render(example("gpu"))
    [job] = by_kind(docs, "Job").values()
    spec = job["spec"]["template"]["spec"]
    c = spec["containers"][0]
    script = c["args"][0]
    assert "exec wolfpack train -c /etc/wolfpack/train/config.yaml" in script
    assert "--run-dir /var/lib/wolfpack/train/gpu-bargaining-smollm2" in script
    assert "--fresh" not in script  # a retry resumes from LATEST, never starts over
    assert c["args"][1:] == ["wolfpack-train", "train.updates=400"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["run"] == "/var/lib/wolfpack"
    assert volumes["run"]["persistentVolumeClaim"]["claimName"] == "wolfpack-training"
    pvc = by_kind(docs, "PersistentVolumeClaim")["wolfpack-training"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "500Gi"
    assert env_of(c)["WOLFPACK_RUN_DIR"]["value"] == "/var/lib/wolfpack"
    # the mounted config is a valid training config with the job's overrides
    cm = by_kind(docs, "ConfigMap")[volumes["config"]["configMap"]["name"]]
    assert mounts["config"] == "/etc/wolfpack/train"
    path = Path("/tmp") / f"wolfpack-chart-{id(cm)}.yaml"
    path.write_text(cm["data"]["config.yaml"])
    try:
        cfg = load_config(path, c["args"][2:])
    finally:
        path.unlink()
    assert cfg.name == "gpu-bargaining-smollm2" and cfg.train.updates == 400
    # stopping: SIGINT first (checkpoint after the current update); bad configs are not retried
    assert "kill -INT 1" in " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {
        "action": "FailJob",
        "onExitCodes": {"containerName": "train", "operator": "In", "values": [2]},
    } in rules
    assert spec["restartPolicy"] == "Never"
    # its own stack in the pod: no cluster addresses that would override it, probes through its up.json
    assert not any(k.endswith("_ADDR") or k == "WOLFPACK_REDIS_URL" for k in env_of(c))
    assert "train/gpu-bargaining-smollm2/stack" in c["livenessProbe"]["exec"]["command"][2]


def test_training_through_the_cluster_services() -> None:
    values = merged(example("cpu-dev"), {"training": {"stack": "cluster"}})
    values["training"]["config"] = merged(values["training"]["config"], {"rollout": {"mode": "service"}})
    docs = render(values)
    c = container(docs, "Job", "wolfpack-train-demo-ultimatum-local")
    script = c["args"][0]
    assert '> "$WOLFPACK_RUN_DIR/up.json"' in script and "--serve" in script
    env = env_of(c)
    assert env["WOLFPACK_INFERENCE_ADDR"]["value"] == "wolfpack-inference:50051"
    assert env["WOLFPACK_TRAINER_ADDR"]["value"] == "0.0.0.0:50051"
    assert c["readinessProbe"]["grpc"] == {"port": 50051}
    assert (
        by_kind(docs, "Service")["wolfpack-trainer"]["spec"]["selector"]["app.kubernetes.io/name"]
        == "trainer"
    )
    reward = env_of(container(docs, "Deployment", "wolfpack-reward"))
    assert reward["WOLFPACK_TRAINER_ADDR"]["value"] == "wolfpack-trainer:50051"
    with pytest.raises(helm_python.HelmError, match=re.escape("set services.inference.replicas to 1")):
        render(merged(values, {"services": {"inference": {"replicas": 2}}}))
    with pytest.raises(helm_python.HelmError, match="with a name"):
        render({"training": {"enabled": True}})
    with pytest.raises(helm_python.HelmError, match="not YAML"):
        render({"training": {"enabled": True, "configYaml": "name: [unclosed"}})


def test_settings_and_mounted_files_are_what_the_services_accept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each container's WOLFPACK_* variables (secret references filled, $(VAR) expanded as the kubelet
    does) load as Settings; the inference policies file as PolicyConfigs; the rollout YAML as a
    RolloutConfig."""
    from wolfpack.settings import load_settings
    from wolfpack_inference.config import PolicyConfig
    from wolfpack_inference.settings import InferenceSettings
    from wolfpack_rollout.config import RolloutConfig

    for name in ("default", "cpu-dev", "gpu"):
        docs = render(VALUE_SETS[name])
        for pod, spec in pod_specs(docs):
            for c in spec["containers"]:
                env: dict[str, str] = {}
                for e in c.get("env", []):
                    value = e.get("value", "filled-from-a-secret")
                    env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m, env=env: env[m.group(1)], value)  # type: ignore[misc]
                if not any(k.startswith("WOLFPACK_") for k in env):
                    continue
                with monkeypatch.context() as m:
                    for k, v in env.items():
                        m.setenv(k, v)
                    settings = load_settings()
                    assert str(settings.run_dir) == "/var/lib/wolfpack", pod
                    if "WOLFPACK_REDIS_URL" in env:
                        assert settings.redis_url and "$(" not in settings.redis_url
                    if pod.endswith("inference"):
                        assert InferenceSettings().cache_dir == Path("/var/cache/wolfpack/models")
        maps = by_kind(docs, "ConfigMap")
        policies = yaml.safe_load(maps["wolfpack-inference-config"]["data"]["policies.yaml"])
        parsed = [PolicyConfig.model_validate(p) for p in policies]
        assert parsed[0].policy_id == "default"
        rollout = yaml.safe_load(maps["wolfpack-rollout-config"]["data"]["config.yaml"])
        assert rollout.pop("episodes") == 0
        RolloutConfig.from_mapping(rollout)

    def policies_of(values: dict[str, Any]) -> Any:
        maps = by_kind(render(values), "ConfigMap")
        return yaml.safe_load(maps["wolfpack-inference-config"]["data"]["policies.yaml"])

    gpu = policies_of(example("gpu"))
    assert gpu[0]["backend"] == "vllm" and gpu[0]["gpu_memory_utilization"] == 0.9
    assert gpu[1]["api_key_env"] == "OPENAI_API_KEY"
    cpu = policies_of(example("cpu-dev"))
    assert cpu == [{"policy_id": "default", "backend": "transformers", "model": "tiny", "dtype": "auto",
                    "max_batch": 32, "device": "cpu"}]  # fmt: skip
    with pytest.raises(helm_python.HelmError, match=re.escape("needs services.inference.gpus >= 1")):
        render({"services": {"inference": {"gpus": 0}}})


def test_pods_run_as_10001_on_a_read_only_root_with_writable_volumes() -> None:
    docs = render(merged(example("gpu"), {"tracing": {"enabled": True}}))
    for pod, spec in pod_specs(docs):
        sc = spec["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}, pod
        for c in spec["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, pod
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, pod
        if pod.endswith(("redis", "jaeger", "collector")):
            continue
        assert sc["runAsUser"] == 10001 and sc["fsGroup"] == 10001, pod
        c = spec["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, pod
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {"/tmp", "/var/lib/wolfpack", "/var/cache/wolfpack"} <= mounts, pod
    cache = dict(pod_specs(docs))["wolfpack-inference"]["volumes"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "wolfpack-model-cache"}} in cache
    pvc = by_kind(docs, "PersistentVolumeClaim")["wolfpack-model-cache"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_only_the_gateway_is_reachable_from_outside() -> None:
    docs = render(example("gpu"))
    policies = by_kind(docs, "NetworkPolicy")
    internal = policies["wolfpack-internal"]["spec"]
    release = {"app.kubernetes.io/instance": "wolfpack"}
    assert internal["podSelector"] == {"matchLabels": release}
    assert internal["ingress"] == [{"from": [{"podSelector": {"matchLabels": release}}]}]
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == "wolfpack", d["metadata"][
                "name"
            ]  # under "internal"
    others = {n: p["spec"] for n, p in policies.items() if n != "wolfpack-internal"}
    assert set(others) == {"wolfpack-gateway"}
    gw = others["wolfpack-gateway"]
    assert gw["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "gateway"
    assert gw["ingress"][0]["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert gw["ingress"][0]["from"][0]["namespaceSelector"]
    for svc in by_kind(docs, "Service").values():
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
    ingress = by_kind(docs, "Ingress")["wolfpack-gateway"]["spec"]
    assert ingress["tls"] == [{"hosts": ["wolfpack.example.com"], "secretName": "wolfpack-gateway-tls"}]
    backend = ingress["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "wolfpack-gateway", "port": {"name": "http"}}
    gateway = container(docs, "Deployment", "wolfpack-gateway")
    assert gateway["args"] == [
        "gateway",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "--env",
        "wolfpack-environment:50051",
    ]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # the exposed pod holds no service credential (the gateway forwards the caller's, never its own)
    assert "WOLFPACK_ADMIN_SECRET" not in env_of(gateway)


def test_autoscaling_and_disruption_budgets() -> None:
    docs = render(example("gpu"))
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    assert set(hpas) == {"wolfpack-environment", "wolfpack-rollout"}
    deployments = by_kind(docs, "Deployment")
    for name, hpa in hpas.items():
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        assert "replicas" not in deployments[name]["spec"]  # an upgrade must not reset what the HPA chose
    assert deployments["wolfpack-inference"]["spec"]["replicas"] == 4
    pdbs = by_kind(docs, "PodDisruptionBudget")
    assert set(pdbs) == {f"wolfpack-{s}" for s in (*GRPC_SERVICES, "gateway")}
    for name, pdb in pdbs.items():
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"]["maxUnavailable"] == 1


def test_redis_statefulset_with_aof_and_auth() -> None:
    docs = render(PINNED)
    redis = by_kind(docs, "StatefulSet")["wolfpack-redis"]
    spec = redis["spec"]
    args = spec["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes" and args[args.index("--dir") + 1] == "/data"
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    [claim] = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    probe = spec["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    assert "redis-cli ping" in probe[-1] and REDIS_PW not in probe[-1]  # REDISCLI_AUTH, not argv
    # clients: the password variable is defined before the URL that expands it (the kubelet's order rule)
    env = container(docs, "Deployment", "wolfpack-rollout")["env"]
    names = [e["name"] for e in env]
    assert names.index("WOLFPACK_REDIS_PASSWORD") < names.index("WOLFPACK_REDIS_URL")
    url = env[names.index("WOLFPACK_REDIS_URL")]["value"]
    assert url == "redis://:$(WOLFPACK_REDIS_PASSWORD)@wolfpack-redis:6379/0"
    existing = render({"redis": {"persistence": {"existingClaim": "old-redis-data"}}})
    pod = by_kind(existing, "StatefulSet")["wolfpack-redis"]
    assert "volumeClaimTemplates" not in pod["spec"]
    assert pod["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "old-redis-data"
    }
    external = render(VALUE_SETS["tracing+external-redis"])
    assert "wolfpack-redis" not in by_kind(external, "StatefulSet")
    env_ext = env_of(container(external, "Deployment", "wolfpack-rollout"))
    assert env_ext["WOLFPACK_REDIS_URL"]["value"] == "redis://ext:6379/1"
    assert env_ext["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://wolfpack-otel-collector:4317"
    secret_url = render({"redis": {"enabled": False, "urlSecret": {"name": "r", "key": "url"}}})
    ref = env_of(container(secret_url, "Deployment", "wolfpack-reward"))["WOLFPACK_REDIS_URL"]
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "r", "key": "url"}
    with pytest.raises(helm_python.HelmError, match=re.escape("set redis.url or redis.urlSecret")):
        render({"redis": {"enabled": False}})
    with pytest.raises(helm_python.HelmError, match="URL-safe"):
        render({"redis": {"auth": {"password": "a@b"}}})


def test_the_schema_refuses_typos_and_bad_values() -> None:
    bad: dict[str, Any]
    for bad in (
        {"servcies": {}},
        {"services": {"inference": {"backend": "tensorrt"}}},
        {"services": {"inference": {"gpuMemoryUtilization": 1.5}}},
        {"services": {"environment": {"replica": 3}}},
        {"training": {"stack": "ray"}},
        {"training": {"overrides": ["--fresh"]}},
        {"redis": {"url": "http://redis:6379"}},
        {"modelCache": {"accessModes": ["ReadWriteAll"]}},
    ):
        with pytest.raises(helm_python.HelmError, match="schema"):
            render(bad)


def test_readme_documents_every_value() -> None:
    """Every leaf key of values.yaml is in the README's table (resources-like maps as one key; keys that
    every service has as one services.*.<key> row)."""
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def leaves(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, dict) and node and prefix not in {"env", "podSecurityContext", "securityContext"}:
            for key, value in node.items():
                if key in ("resources", "config", "autoscaling", "startupProbe") and prefix:
                    yield f"{prefix}.{key}"
                else:
                    yield from leaves(value, f"{prefix}.{key}" if prefix else key)
        else:
            yield prefix

    common = {
        "enabled",
        "replicas",
        "resources",
        "autoscaling",
        "startupProbe",
        "env",
        "tolerations",
        "config",
    }

    def documented_as(key: str) -> str:  # keys every service has are one row: services.*.<key>
        parts = key.split(".")
        return f"services.*.{parts[2]}" if parts[0] == "services" and parts[2] in common else key

    missing = [k for k in leaves(values, "") if f"`{documented_as(k)}`" not in readme]
    assert not missing, f"add to deploy/helm/wolfpack/README.md: {missing}"


def test_kuberay_rayjob_runs_the_same_training_on_ray_workers() -> None:
    """The RayJob is a CRD (not in the Kubernetes schemas): its head and worker pod templates are validated
    as Pods instead, and its Ray version is the one the trainer image pins."""
    import sys

    sys.path.insert(0, str(ROOT / "deploy" / "docker"))
    import requirements as image_requirements

    values = merged(
        example("gpu"), {"training": {"ray": {"kuberay": {"enabled": True, "workerReplicas": 2}}}}
    )
    docs = render(values)
    assert not by_kind(docs, "Job")  # one or the other
    [job] = by_kind(docs, "RayJob").values()
    spec = job["spec"]
    assert spec["entrypoint"].startswith("wolfpack train -c /etc/wolfpack/train/config.yaml --run-dir ")
    assert spec["entrypoint"].endswith('"train.updates=400"')
    cluster = spec["rayClusterSpec"]
    assert f"ray[default]=={cluster['rayVersion']}" == image_requirements.RAY
    head = cluster["headGroupSpec"]["template"]
    [workers] = cluster["workerGroupSpecs"]
    assert workers["replicas"] == 2
    for template in (head, workers["template"]):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "x", **template["metadata"]},
            "spec": template["spec"],
        }
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        c = template["spec"]["containers"][0]
        assert c["image"] == "registry.example.com/wolfpack-trainer:0.1.0-cuda"
        assert "livenessProbe" in c and "readinessProbe" in c
    assert gpus_of(workers["template"]["spec"]) == {"ray-worker": 1} and not gpus_of(head["spec"])
    volumes = {v["name"]: v for v in head["spec"]["volumes"]}
    assert volumes["run"]["persistentVolumeClaim"]["claimName"] == "wolfpack-training"
    assert "wolfpack-training" in by_kind(docs, "PersistentVolumeClaim")
    assert "wolfpack-trainer" not in by_kind(docs, "Service")


def test_a_config_change_rolls_only_its_own_service() -> None:
    def checksums(values: dict[str, Any]) -> dict[str, str]:
        return {
            name: d["spec"]["template"]["metadata"].get("annotations", {}).get("checksum/config", "")
            for name, d in by_kind(render(values), "Deployment").items()
        }

    base = checksums(example("cpu-dev"))
    changed = checksums(merged(example("cpu-dev"), {"services": {"rollout": {"config": {"concurrency": 4}}}}))
    assert {n for n in base if base[n] != changed[n]} == {"wolfpack-rollout"}
    scaled = checksums(merged(example("cpu-dev"), {"services": {"inference": {"replicas": 3}}}))
    assert scaled == base
    model = checksums(merged(example("cpu-dev"), {"services": {"inference": {"model": "smollm2"}}}))
    assert {n for n in base if base[n] != model[n]} == {"wolfpack-inference"}


def _web_settings(c: Doc, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The web container's WOLFPACK_WEB_* variables as the web view loads them (and its bind check)."""
    from wolfpack_web.server import check_bind
    from wolfpack_web.settings import load_web_settings

    with monkeypatch.context() as m:
        for e in c["env"]:
            if e["name"].startswith("WOLFPACK_WEB_"):
                m.setenv(e["name"], e["value"])
        settings = load_web_settings()
    check_bind(settings)  # what `wolfpack web` does before listening: raises where it would refuse
    return settings


def test_web_view_is_reached_through_a_port_forward_unless_exposed_to_named_peers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On by default, listening on its pod's loopback only: no Service, no NetworkPolicy opening it, probes
    that exec inside the pod; the service credential from the Secret only while it spectates. Exposure to
    the cluster needs peers named (an authenticating proxy) and then trusts them explicitly."""
    docs = render(example("gpu"))
    web = container(docs, "Deployment", "wolfpack-web")
    env = env_of(web)
    assert web["args"] == ["web"] and web["image"].split(":")[0].endswith("-web") and "ports" not in web
    settings = _web_settings(web, monkeypatch)
    assert settings.addr == "127.0.0.1:8470" and settings.spectate and not settings.trust_network
    assert env["WOLFPACK_ADMIN_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "wolfpack-secrets",
        "key": "admin-secret",
    }
    assert env["WOLFPACK_ENVIRONMENT_ADDR"]["value"] == "wolfpack-environment:50051"
    assert "$(WOLFPACK_REDIS_PASSWORD)" in env["WOLFPACK_REDIS_URL"]["value"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = web[probe]["exec"]["command"]
        assert command[:2] == ["python", "-c"] and "http://127.0.0.1:8470/healthz" in command[2], probe
    assert "wolfpack-web" not in by_kind(docs, "Service") and "wolfpack-web" not in by_kind(
        docs, "NetworkPolicy"
    )
    assert by_kind(docs, "Deployment")["wolfpack-web"]["spec"]["replicas"] == 1

    blind = env_of(container(render({"web": {"spectate": False}}), "Deployment", "wolfpack-web"))
    assert blind["WOLFPACK_WEB_SPECTATE"]["value"] == "false" and "WOLFPACK_ADMIN_SECRET" not in blind
    assert "wolfpack-web" not in by_kind(render({"web": {"enabled": False}}), "Deployment")

    with pytest.raises(helm_python.HelmError, match=re.escape("web.exposure=cluster needs web.from")):
        render({"web": {"exposure": "cluster"}})
    proxy = [{"podSelector": {"matchLabels": {"app": "oauth2-proxy"}}}]
    exposed = render({"web": {"exposure": "cluster", "from": proxy}})
    web = container(exposed, "Deployment", "wolfpack-web")
    settings = _web_settings(web, monkeypatch)
    assert settings.addr == "0.0.0.0:8470" and settings.trust_network
    assert web["ports"] == [{"name": "http", "containerPort": 8470}]
    svc = by_kind(exposed, "Service")["wolfpack-web"]["spec"]
    assert svc["type"] == "ClusterIP" and svc["ports"][0]["port"] == 8470
    policy = by_kind(exposed, "NetworkPolicy")["wolfpack-web"]["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "web"
    assert policy["ingress"] == [{"ports": [{"port": 8470, "protocol": "TCP"}], "from": proxy}]

    with pytest.raises(helm_python.HelmError, match=re.escape("web.trainingRuns mounts the training claim")):
        render({"web": {"trainingRuns": True}})
    runs = render(merged(example("gpu"), {"web": {"trainingRuns": True}, "training": {"enabled": True}}))
    spec = dict(pod_specs(runs))["wolfpack-web"]
    assert {
        "name": "training",
        "persistentVolumeClaim": {"claimName": "wolfpack-training", "readOnly": True},
    } in spec["volumes"]
    web = spec["containers"][0]
    assert {"name": "training", "mountPath": "/var/lib/wolfpack-training", "readOnly": True} in web[
        "volumeMounts"
    ]
    assert [str(p) for p in _web_settings(web, monkeypatch).runs] == ["/var/lib/wolfpack-training/train"]
