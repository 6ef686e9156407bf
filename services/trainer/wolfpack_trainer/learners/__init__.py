"""Learners: the contract (``base.py``) and the built-in implementations, registered on import.

``cpu`` (``cpu.py``): torch + peft in one process. GPU learners on verl's FSDP engine register from
``wolfpack_trainer.verl_*`` modules when verl and CUDA are present.
"""

from __future__ import annotations

import contextlib
import importlib

from wolfpack_trainer.learners.base import (
    LEARNERS,
    ExportedWeights,
    Learner,
    LearnerConfig,
    LossConfig,
    TrainBatch,
    get_learner,
    register_learner,
)

__all__ = [
    "LEARNERS",
    "ExportedWeights",
    "Learner",
    "LearnerConfig",
    "LossConfig",
    "TrainBatch",
    "get_learner",
    "register_learner",
]

for _module in ("wolfpack_trainer.learners.cpu", "wolfpack_trainer.verl_learner"):
    # A missing optional module (the GPU learner on a CPU-only install) just registers nothing.
    with contextlib.suppress(ModuleNotFoundError):
        importlib.import_module(_module)
