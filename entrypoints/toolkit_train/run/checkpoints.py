"""Checkpoints that are complete or invisible, wherever they live (a local run, /opt/ml/checkpoints restored from
S3, FSx on HyperPod). The same seal makes prepared datasets complete or invisible (`toolkit_train.run.prepared`).

The Trainer writes `checkpoint-N/` in place, file by file, so a kill during a save leaves a directory that looks
like the newest checkpoint and is not one. Here a checkpoint counts only once it is sealed: every file flushed to
disk, then a record of each file's size and SHA-256 written last (into a temporary name, renamed). Resume takes the
newest checkpoint whose record matches what is on disk, by content (a file corrupted without changing its size is
caught too), and names each one it skipped and why. Retention (the Trainer's
`save_total_limit`) is done here too, counting only complete checkpoints: the Trainer's own rotation runs before
a save is known to be complete and could delete the last good checkpoint for a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

SEAL = "toolkit-complete.json"  # written last; lists every file of the checkpoint with its size and SHA-256
_NAME = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


def step_of(path: Path) -> int | None:
    match = _NAME.match(path.name)
    return int(match.group(1)) if match and path.is_dir() else None


def _files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.rglob("*") if p.is_file() and not p.name.startswith(SEAL))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    """A file's SHA-256, read in 16 MiB chunks (checkpoint shards and datasets are GBs)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def seal(checkpoint: Path, about: dict | None = None) -> None:
    """Flush every file of a finished save to disk, then record it (the record is what makes it a checkpoint).
    `about`: what the directory holds, kept in the record (a prepared dataset's source, settings and statistics)."""
    files = _files(checkpoint)
    for path in files:
        _fsync(path)
    names = [str(p.relative_to(checkpoint)) for p in files]
    record = {"files": {name: p.stat().st_size for name, p in zip(names, files, strict=True)},
              "sha256": {name: file_sha256(p) for name, p in zip(names, files, strict=True)},
              **({"about": about} if about is not None else {})}  # fmt: skip
    temporary = checkpoint / f"{SEAL}.tmp"
    temporary.write_text(json.dumps(record, indent=1))
    _fsync(temporary)
    temporary.replace(checkpoint / SEAL)
    _fsync(checkpoint)


def about(directory: Path) -> dict | None:
    """What a sealed directory's record says it holds (None: no record, or none said)."""
    try:
        found = json.loads((directory / SEAL).read_text()).get("about")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) else None


def problem(checkpoint: Path, by_content: bool = True) -> str | None:
    """None for a complete checkpoint; otherwise what is wrong with it, naming the file. by_content=False: sizes
    only (retention, which runs at every save, need not read every kept checkpoint again)."""
    try:
        record = json.loads((checkpoint / SEAL).read_text())
        sizes, digests = record["files"], record.get("sha256", {}) if by_content else {}
        if not (isinstance(sizes, dict) and sizes and isinstance(digests, dict)):
            raise TypeError("it lists no files")
    except FileNotFoundError:
        return "its save did not finish (no completion record)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"its completion record {SEAL} is unreadable ({exc})"
    for name, size in sizes.items():
        try:
            actual = (checkpoint / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} bytes where {size} were written (truncated or overwritten)"
    for name, expected in digests.items():  # seals written before digests were recorded have none: sizes alone
        try:
            if file_sha256(checkpoint / name) != expected:
                return f"{name} does not hold what was written (its SHA-256 differs: corrupted in place)"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror})"
    return None


def _numbered(folder: Path) -> list[tuple[int, Path]]:
    found = folder.iterdir() if folder.is_dir() else []
    return sorted((step, path) for path in found if (step := step_of(path)) is not None)


def newest_complete(folder: Path) -> tuple[Path | None, list[Skipped]]:
    """The newest complete checkpoint under folder, and the newer ones skipped (with why)."""
    skipped: list[Skipped] = []
    for _, path in reversed(_numbered(folder)):
        reason = problem(path)
        if reason is None:
            return path, skipped
        skipped.append(Skipped(path, reason))
    return None, skipped


def set_aside(skipped: list[Skipped]) -> list[Path]:
    """Move skipped checkpoints out of the Trainer's way (renamed, never deleted: the user decides): a later save
    of the same step must write into an empty directory, not next to a stale record."""
    moved = []
    for item in skipped:
        target, attempt = item.path.with_name(f"{item.path.name}.incomplete"), 1
        while target.exists():
            attempt += 1
            target = item.path.with_name(f"{item.path.name}.incomplete-{attempt}")
        item.path.rename(target)
        moved.append(target)
    return moved


def prune(folder: Path, keep: int) -> list[Path]:
    """Delete complete checkpoints beyond the newest `keep` complete ones; incomplete ones are never counted."""
    complete = [path for _, path in _numbered(folder) if problem(path, by_content=False) is None]
    removed = complete[:-keep] if keep > 0 else []
    for path in removed:
        shutil.rmtree(path)
    return removed


def completed_steps(checkpoint: Path) -> tuple[int, int]:
    """(global_step, max_steps) a checkpoint's trainer state records: equal once training has finished."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return int(state["global_step"]), int(state["max_steps"])
