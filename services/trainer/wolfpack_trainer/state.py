"""``RunState``: what a checkpoint stores besides the learners (``state.json``).

Its own module because two readers need it: the loop (``train.py``) writes and resumes it, and the
TrainerService (``service.py``) reads it from run directories. Kept apart, ``service.py`` does not import
the loop, and the loop can put the service in front of itself without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunState:
    """What a checkpoint stores besides the learners: enough to resume without losing or reusing data."""

    step: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    used_ids: list[str] = field(default_factory=list)
    trajectories_used: int = 0
    dropped_stale: int = 0
    evals: list[dict[str, Any]] = field(default_factory=list)
    model_path: str = ""
    published: list[dict[str, Any]] = field(default_factory=list)
    redelivered_skipped: int = 0
    """Entries delivered again after a crash between checkpoint and ack, skipped as already used."""
    config: dict[str, Any] = field(default_factory=dict)
    """The config this run was trained with (``train.updates`` aside): a resume under another is refused."""
