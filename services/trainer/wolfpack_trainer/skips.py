"""Which of a seat's answers give no training signal (``batch.skip_actions``; the agent loop's rows).

A module of its own because two paths read it: the trainer's batch builder (``batch.py``: those turns give no
sample) and the verl agent loop (``learners/verl/agent_loop.py``: those answers' tokens are masked out of a
seat's conversation), and the agent loop may not import the batch builder (which imports the learner
contract: the trainer's modules import each other without cycles, ``.importlinter``).
"""

from __future__ import annotations

from collections.abc import Sequence


def skipped_kinds(entries: Sequence[str], role: str) -> frozenset[str]:
    """The action kinds ``skip_actions`` ``entries`` leave out for a seat dealt ``role``: every ``kind`` entry,
    and ``role:kind`` entries of that role."""
    out = set()
    for entry in entries:
        who, sep, kind = entry.rpartition(":")
        if not sep or who == role:
            out.add(kind)
    return frozenset(out)
