"""Print the pip requirements of one Wolfpack image: the project's base dependencies plus the extras its
service needs, with the variant's accelerator stack pinned.

Why a script and not ``pip install ".[extra]"``: the image installs its dependencies in a layer that only
``pyproject.toml`` and this file invalidate (source changes rebuild a few kilobytes, not torch), and the CUDA
variant needs a different, matched torch than the one pyproject pins for CPU machines: vLLM 0.24.0 and verl
0.9.1 (its ``vllm`` extra) pin torch 2.11.0 and transformers 5.9.0, while the CPU extras pin torch 2.13.0.

    python deploy/docker/requirements.py --service trainer --variant cuda > requirements.txt
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

# Extras each service's image installs. The trainer image runs the job's own stack (environment, inference
# and reward in the pod: the GPU recipes' layout), so it carries every extra.
EXTRAS = {
    "environment": ("environment",),
    "inference": ("inference",),
    "reward": (),
    "curriculum": (),
    "rollout": (),
    "trainer": ("environment", "inference", "trainer"),
    # The web view: aiohttp; no torch and no sotopia (it reaches the environment over gRPC). Without
    # tensorboard its training page shows curves and evaluated episodes, not the TensorBoard text samples.
    "web": ("web",),
}
# The accelerator stack of each variant: these replace whatever the extras say about the same packages.
TORCH_INDEX = {
    "cpu": "https://download.pytorch.org/whl/cpu",
    "cuda": "https://download.pytorch.org/whl/cu130",
}
PINS = {
    "cpu": {"torch": "torch==2.13.0+cpu"},
    "cuda": {"torch": "torch==2.11.0+cu130", "transformers": "transformers==5.9.0", "vllm": "vllm==0.24.0"},
}
# Packages that only make sense on a GPU variant: added there to images whose service runs inference.
CUDA_ONLY = ("vllm",)
# The trainer image's Ray, pinned (verl asks only ray[default]>=2.41): a KubeRay cluster's head and workers
# run this image, and the chart's training.ray.kuberay.rayVersion must name the same version.
RAY = "ray[default]==2.60.0"
# Left out where vLLM is installed: vllm 0.24.0 requires openai>=2, while sotopia 0.1.5 (the environment
# extra's sotopia adapter, imported only by `wolfpack play --sotopia`-style commands) caps openai<2; pip
# cannot resolve both (checked with `pip install --dry-run`). The environment service itself needs neither.
CONFLICTS_WITH_VLLM = ("sotopia", "openai")


def package(requirement: str) -> str:
    """``"torch==2.13.0"`` → ``"torch"`` (normalised, extras and markers dropped)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(pyproject: Path, service: str, variant: str) -> list[str]:
    if service not in EXTRAS:
        raise ValueError(f"unknown service {service!r}; one of: {', '.join(EXTRAS)}")
    if variant not in PINS:
        raise ValueError(f"unknown variant {variant!r}; one of: {', '.join(PINS)}")
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted: list[str] = list(project["dependencies"])
    for extra in EXTRAS[service]:
        wanted += project["optional-dependencies"][extra]
    pins = PINS[variant]
    uses_torch = any(package(r) == "torch" for r in wanted)
    out: list[str] = []
    seen: set[str] = set()
    with_vllm = uses_torch and variant == "cuda" and "inference" in EXTRAS[service]
    for req in wanted:
        name = package(req)
        if with_vllm and name in CONFLICTS_WITH_VLLM:
            continue
        line = pins.get(name, req) if uses_torch else req
        if line not in seen:
            seen.add(line)
            out.append(line)
    if with_vllm:
        out += [pins[name] for name in CUDA_ONLY]
    if "trainer" in EXTRAS[service]:
        out.append(RAY)
    header = [f"--extra-index-url {TORCH_INDEX[variant]}"] if uses_torch else []
    return header + out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service", required=True, choices=sorted(EXTRAS))
    parser.add_argument("--variant", default="cpu", choices=sorted(PINS))
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    print("\n".join(requirements(args.pyproject, args.service, args.variant)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
