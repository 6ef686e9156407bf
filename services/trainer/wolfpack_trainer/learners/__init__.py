"""Learners: the contract (``base.py``) and the built-in implementations, registered on import.

``cpu`` (``cpu.py``): torch + peft in one process. GPU learners on verl's FSDP engine register from
``wolfpack_trainer.verl_*`` modules when verl and CUDA are present.
"""

from __future__ import annotations

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
