"""Small file helpers shared by the launcher, the servers and the trainer."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader polling it sees either no file (or the old one) or the
    whole new file, never half of it: written beside it under a name unique to this process, then renamed
    over it (``os.replace`` is atomic within one file system)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
