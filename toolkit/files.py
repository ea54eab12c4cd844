"""Writing a file so that a process killed at any instant leaves either the whole new file or the old one, never
a torn one that the next command would read as current (a report `toolkit register` attaches, a job record, a cache).
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write beside the target, flush to disk, then rename over it (a rename within a directory is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with open(staging, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
