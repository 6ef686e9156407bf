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

A learner shared by several policy ids (``train.share_policy``) is published once per version
(``publish_learner``): its directory written once (the other ids' directories hard-link its files), its
weights exported once for ``PushWeights``; every id still gets the version, each served by its own engine.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from wolfpack.auth import is_loopback
from wolfpack.settings import Settings
from wolfpack.v1 import common_pb2
from wolfpack_trainer.learners.base import ExportedWeights, Learner
from wolfpack_trainer.offload import off_loop

if TYPE_CHECKING:
    from wolfpack.v1 import inference_service_pb2 as inf_pb

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
    def service_settings(self) -> Settings:
        """What the trainer's calls to the other services use: the job's settings, else the environment's
        (read when asked, as every caller did before this property held the rule)."""
        from wolfpack.settings import load_settings

        return self.settings or load_settings()

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
        (done,) = await self.publish_learner(learner, [(policy_id, version)], freeze=freeze)
        return done

    async def publish_learner(
        self, learner: Learner, versions: Sequence[tuple[str, int]], *, freeze: bool = False
    ) -> list[Published]:
        """A new version of each policy id ``learner`` trains (``versions``: (id, version) pairs; several
        under ``train.share_policy``). The weights leave the learner once: one ``save_pretrained`` (the other
        ids' directories hard-link its files) and at most one ``export_weights``; then every id's inference
        gets its version, by path or push, and a league snapshot when ``freeze``. One ``Published`` per id
        (the first id's ``save_s``/``push_s`` carry the learner's save and export)."""
        weights = _Weights(learner, shared=len(versions) > 1)
        written: Path | None = None
        out: list[Published] = []
        for policy_id, version in versions:
            path = ""
            t0 = time.monotonic()
            if self.save_dirs:
                target = self.root / policy_id / f"v{version:06d}"
                if written is None:  # in a thread: the loop serves on, another learner's save beside it
                    path = str(written := await off_loop(learner.save_pretrained, target))
                else:
                    path = str(_link_tree(written, target))
            t1 = time.monotonic()
            pushed, sync = False, ""
            if self.inference_addr:
                sync = self.sync_mode
                if sync == "path":
                    sync = await self._load_path(policy_id, version, Path(path), weights)
                else:
                    await self._push(policy_id, version, weights)
                pushed = True
            t2 = time.monotonic()
            frozen = False
            if freeze and self.curriculum_addr:
                await self._freeze(policy_id, version)
                frozen = True
            out.append(
                Published(policy_id, version, path, pushed, frozen, save_s=t1 - t0, push_s=t2 - t1, sync=sync)
            )
        return out

    async def _load_path(self, policy_id: str, version: int, directory: Path, weights: _Weights) -> str:
        """``LoadPolicy`` of the version's directory; under ``auto`` a directory inference cannot load
        (INVALID_ARGUMENT: it does not see this host's files) falls back to ``push`` for good. Returns the
        way the version went."""
        import grpc

        from wolfpack import rpc
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
            async with rpc.channel(self.inference_addr, self.service_settings) as ch:
                resp = await inf_grpc.InferenceServiceStub(ch).LoadPolicy(req)
        except grpc.aio.AioRpcError as exc:
            if self.weight_sync != "auto" or exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            self.fallback = f"inference at {self.inference_addr} cannot load {directory}: {exc.details()}"
            log.warning("weight sync: %s; pushing the weights over gRPC from now on", self.fallback)
            await self._push(policy_id, version, weights)
            return "push"
        if resp.policy.policy.version != version:
            raise RuntimeError(f"inference serves {policy_id}@{resp.policy.policy.version}, loaded {version}")
        return "path"

    async def _push(self, policy_id: str, version: int, weights: _Weights) -> None:
        from wolfpack import rpc
        from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc

        assert self.inference_addr is not None
        chunks = weights.chunks(policy_id, version)
        async with rpc.channel(self.inference_addr, self.service_settings) as ch:
            resp = await inf_grpc.InferenceServiceStub(ch).PushWeights(chunks)
        if resp.policy.policy.version != version:
            raise RuntimeError(f"inference serves {policy_id}@{resp.policy.policy.version}, pushed {version}")

    async def _freeze(self, policy_id: str, version: int) -> None:
        from wolfpack.v1 import curriculum_service_pb2 as cur_pb
        from wolfpack_curriculum.client import CurriculumClient

        assert self.curriculum_addr is not None
        opponent = cur_pb.Opponent(
            opponent_id=f"checkpoint:{policy_id}@{version}",
            kind=cur_pb.OPPONENT_KIND_CHECKPOINT,
            policy=common_pb2.PolicyRef(policy_id=policy_id, version=version),
        )
        async with CurriculumClient(self.curriculum_addr, self.service_settings) as client:
            await client.register_opponent(opponent)


class _Weights:
    """One learner's weights for ``PushWeights``, exported at most once however many policy ids it serves
    (none when every id loads its directory by path). With several ids the export is moved to host memory
    once, and each id's stream chunks those tensors under its own id and version."""

    def __init__(self, learner: Learner, *, shared: bool) -> None:
        self.learner = learner
        self.shared = shared
        self._exported: ExportedWeights | None = None

    def chunks(self, policy_id: str, version: int) -> Iterator[inf_pb.PushWeightsRequest]:
        from wolfpack_inference.client import tensor_chunks

        if self._exported is None:
            exported = self.learner.export_weights()
            if self.shared:  # device -> host once, not once per id's stream
                tensors = {k: v.detach().to("cpu") for k, v in exported.tensors.items()}
                exported = ExportedWeights(tensors, exported.is_adapter, exported.adapter_config_json)
            self._exported = exported
        e = self._exported
        return tensor_chunks(
            policy_id, version, e.tensors, is_adapter=e.is_adapter, adapter_config_json=e.adapter_config_json
        )


def _link_tree(source: Path, target: Path) -> Path:
    """``target`` as a copy of the version directory ``source`` made of hard links to its files (a copy
    where the filesystem has none): another id's directory of the same weights, no second write."""
    if target.exists():  # a version re-published after a crash
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link)
    return target
