"""New policy versions leave the trainer here: a versioned directory on disk, the weights pushed to the
inference service (``PushWeights``: a LoRA adapter or a full state dict, streamed in chunks), and every
``freeze_every`` versions a frozen snapshot registered as an opponent in the curriculum's league.

Why both disk and push: the push makes the new version serve within one call and no shared filesystem;
the directory is what a later ``LoadPolicy(model_path=…)`` or a league opponent loads from, and the record
of which weights a version number meant.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from wolfpack.settings import Settings
from wolfpack.v1 import common_pb2
from wolfpack_trainer.learners.base import Learner


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
    """Seconds from gathering the weights to inference confirming the new version (PushWeights)."""


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
    ) -> None:
        self.root = root
        self.settings = settings
        self.inference_addr = inference_addr
        self.curriculum_addr = curriculum_addr
        self.save_dirs = save_dirs

    async def publish(
        self, policy_id: str, version: int, learner: Learner, *, freeze: bool = False
    ) -> Published:
        path = ""
        t0 = time.monotonic()
        if self.save_dirs:
            path = str(learner.save_pretrained(self.root / policy_id / f"v{version:06d}"))
        t1 = time.monotonic()
        pushed = False
        if self.inference_addr:
            await self._push(policy_id, version, learner)
            pushed = True
        t2 = time.monotonic()
        frozen = False
        if freeze and self.curriculum_addr:
            await self._freeze(policy_id, version)
            frozen = True
        return Published(policy_id, version, path, pushed, frozen, save_s=t1 - t0, push_s=t2 - t1)

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
