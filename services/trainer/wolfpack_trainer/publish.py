"""New policy versions leave the trainer here: a versioned directory on disk, the weights sent to the
inference service, and every ``freeze_every`` versions a frozen snapshot registered as an opponent in the
curriculum's league.

Two ways to the inference service (``train.weight_sync``):

* ``push``: ``PushWeights``, a LoRA adapter or a full state dict streamed in chunks over gRPC. Portable: it
  needs no shared filesystem (a trainer pod and an inference pod on different nodes).
* ``path``: the same-host fast path. The version's directory is written anyway (``save_versions``), so the
  trainer only names it: ``LoadPolicy(model_path=dir)`` (``adapter_path`` for LoRA), and inference reads the
  safetensors file the learner just wrote. Nothing is serialised into protobuf chunks, copied through two
  gRPC stacks and written to disk a second time on the inference side.

``auto`` (the default) takes ``path`` when the inference service is on this host (a loopback address, as
the job's own stack and ``wolfpack up`` use) and the version directories are written, else ``push``; if
inference cannot load the named directory (another container, another mount namespace), it falls back to
``push`` for the rest of the run and says so once.

Why disk at all: the directory is what a later ``LoadPolicy(model_path=…)`` or a league opponent loads
from, and the record of which weights a version number meant.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from wolfpack.auth import is_loopback
from wolfpack.settings import Settings
from wolfpack.v1 import common_pb2
from wolfpack_trainer.learners.base import Learner

log = logging.getLogger(__name__)

WeightSync = Literal["auto", "push", "path"]


def is_local_address(address: str) -> bool:
    """A loopback TCP address (``127.0.0.1:p``, ``[::1]:p``, ``localhost:p``) or a unix socket: a service
    on this host, which sees this host's files."""
    if address.startswith("unix:"):
        return True
    return is_loopback(address.removeprefix("ipv4:").removeprefix("ipv6:"))


@dataclass(frozen=True)
class Published:
    policy_id: str
    version: int
    path: str
    pushed: bool
    frozen: bool
    save_s: float = 0.0
    """Seconds writing the version's directory."""
    push_s: float = 0.0
    """Seconds from gathering the weights to inference confirming the new version."""
    sync: str = ""
    """How the version reached inference: ``push`` (PushWeights), ``path`` (LoadPolicy of the directory),
    empty when it was not sent."""


class Publisher:
    """``inference_addr``/``curriculum_addr`` None: only the directory is written."""

    def __init__(
        self,
        root: Path,
        settings: Settings | None = None,
        *,
        inference_addr: str | None = None,
        curriculum_addr: str | None = None,
        save_dirs: bool = True,
        weight_sync: WeightSync = "push",
    ) -> None:
        self.root = root
        self.settings = settings
        self.inference_addr = inference_addr
        self.curriculum_addr = curriculum_addr
        self.save_dirs = save_dirs
        if weight_sync == "path" and not save_dirs:
            raise ValueError("weight_sync path loads the version directories: it needs save_dirs")
        self.weight_sync = weight_sync
        self.fallback = ""
        """Why ``auto`` went back to ``push`` (the first directory inference could not load); empty if not."""

    @property
    def sync_mode(self) -> str:
        """``push`` or ``path``: what the next publish uses."""
        if self.weight_sync == "auto":
            local = bool(self.inference_addr) and is_local_address(self.inference_addr or "")
            return "path" if self.save_dirs and local and not self.fallback else "push"
        return self.weight_sync

    async def publish(
        self, policy_id: str, version: int, learner: Learner, *, freeze: bool = False
    ) -> Published:
        path = ""
        t0 = time.monotonic()
        if self.save_dirs:
            path = str(learner.save_pretrained(self.root / policy_id / f"v{version:06d}"))
        t1 = time.monotonic()
        pushed, sync = False, ""
        if self.inference_addr:
            sync = self.sync_mode
            if sync == "path":
                sync = await self._load_path(policy_id, version, Path(path), learner)
            else:
                await self._push(policy_id, version, learner)
            pushed = True
        t2 = time.monotonic()
        frozen = False
        if freeze and self.curriculum_addr:
            await self._freeze(policy_id, version)
            frozen = True
        return Published(policy_id, version, path, pushed, frozen, save_s=t1 - t0, push_s=t2 - t1, sync=sync)

    async def _load_path(self, policy_id: str, version: int, directory: Path, learner: Learner) -> str:
        """``LoadPolicy`` of the version's directory; under ``auto`` a directory inference cannot load
        (INVALID_ARGUMENT: it does not see this host's files) falls back to ``push`` for good. Returns the
        way the version went."""
        import grpc

        from wolfpack import rpc
        from wolfpack.settings import load_settings
        from wolfpack.v1 import inference_service_pb2 as inf_pb
        from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc

        assert self.inference_addr is not None
        directory = directory.resolve()  # inference runs in another working directory
        adapter = (directory / "adapter_config.json").exists()
        req = inf_pb.LoadPolicyRequest(
            policy_id=policy_id,
            version=version,
            model_path="" if adapter else str(directory),
            adapter_path=str(directory) if adapter else "",
        )
        try:
            async with rpc.channel(self.inference_addr, self.settings or load_settings()) as ch:
                resp = await inf_grpc.InferenceServiceStub(ch).LoadPolicy(req)
        except grpc.aio.AioRpcError as exc:
            if self.weight_sync != "auto" or exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            self.fallback = f"inference at {self.inference_addr} cannot load {directory}: {exc.details()}"
            log.warning("weight sync: %s; pushing the weights over gRPC from now on", self.fallback)
            await self._push(policy_id, version, learner)
            return "push"
        if resp.policy.policy.version != version:
            raise RuntimeError(f"inference serves {policy_id}@{resp.policy.policy.version}, loaded {version}")
        return "path"

    async def _push(self, policy_id: str, version: int, learner: Learner) -> None:
        from wolfpack import rpc
        from wolfpack.settings import load_settings
        from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc
        from wolfpack_inference.client import tensor_chunks

        assert self.inference_addr is not None
        exported = learner.export_weights()
        chunks = tensor_chunks(
            policy_id,
            version,
            exported.tensors,
            is_adapter=exported.is_adapter,
            adapter_config_json=exported.adapter_config_json,
        )
        async with rpc.channel(self.inference_addr, self.settings or load_settings()) as ch:
            resp = await inf_grpc.InferenceServiceStub(ch).PushWeights(chunks)
        if resp.policy.policy.version != version:
            raise RuntimeError(f"inference serves {policy_id}@{resp.policy.policy.version}, pushed {version}")

    async def _freeze(self, policy_id: str, version: int) -> None:
        from wolfpack.settings import load_settings
        from wolfpack.v1 import curriculum_service_pb2 as cur_pb
        from wolfpack_curriculum.client import CurriculumClient

        assert self.curriculum_addr is not None
        opponent = cur_pb.Opponent(
            opponent_id=f"checkpoint:{policy_id}@{version}",
            kind=cur_pb.OPPONENT_KIND_CHECKPOINT,
            policy=common_pb2.PolicyRef(policy_id=policy_id, version=version),
        )
        async with CurriculumClient(self.curriculum_addr, self.settings or load_settings()) as client:
            await client.register_opponent(opponent)
