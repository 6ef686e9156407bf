"""Rollout and curriculum get their YAML config from values through a mounted ConfigMap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate  # type: ignore[import-untyped]
import yaml

from wolfpack_rollout.config import RolloutConfig

CHART = Path(__file__).resolve().parent.parent / "helm" / "wolfpack"


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    manifests = helm_python.Chart.load(str(CHART)).render(values or {}, name="wolfpack", namespace="default")
    docs = [d for text in manifests.values() for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    return docs


def test_rollout_config_is_mounted_and_valid() -> None:
    docs = render({"services": {"rollout": {"replicas": 3}}})
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    data = yaml.safe_load(maps["wolfpack-rollout-config"]["data"]["config.yaml"])
    assert data.pop("episodes") == -1
    RolloutConfig.from_mapping(data)  # the chart's defaults are a valid RolloutConfig
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "wolfpack-rollout")
    assert dep["spec"]["replicas"] == 3
    pod = dep["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["WOLFPACK_ROLLOUT_CONFIG"] == "/etc/wolfpack/config.yaml"
    assert pod["volumes"][0]["configMap"]["name"] == "wolfpack-rollout-config"
    # an empty config (the curriculum's default) mounts nothing
    cur = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "wolfpack-curriculum"
    )
    assert "volumes" not in cur["spec"]["template"]["spec"]
    assert "wolfpack-curriculum-config" not in maps
