"""The /opt/ml-style job directory that local and HyperPod jobs share with the entrypoint."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.config import Config
from toolkit.entrypoints.settings import to_hyperparameters
from toolkit.errors import BadInput


def resume_hint(root: Path) -> str:
    """What the same command does next for this run: which checkpoint it resumes from."""
    from toolkit.entrypoints.checkpoints import newest_complete

    checkpoint, _ = newest_complete(root / "checkpoints")
    if checkpoint is None:
        return "the next run of the same command starts from the beginning (no complete checkpoint)"
    return f"the next run of the same command resumes from {checkpoint.name}"


def settings_file(root: Path) -> Path:
    return root / "input" / "config" / "hyperparameters.json"


def write_settings(config: Config, root: Path) -> None:
    """The entrypoint's settings, and a clean slate for this run's failure file."""
    path = settings_file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_hyperparameters(config.train_settings()), indent=2))
    (root / "output").mkdir(exist_ok=True)
    (root / "output" / "failure").unlink(missing_ok=True)


def place_train_channel(source: str, root: Path, copy: bool, name: str = "train") -> None:
    """Local data becomes the 'train' channel (data.eval.source: 'eval'), a directory as in SageMaker (linked, or
    copied where every node must see it); builtin and hub data are loaded by name, so they get none. Callers refuse
    remote sources."""
    channel = root / "input" / "data" / name
    if channel.is_symlink() or channel.is_file():
        channel.unlink()
    elif channel.exists():
        shutil.rmtree(channel)
    path = Path(source)
    if source.startswith("builtin:") or not path.exists():
        return
    channel.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.copytree(path, channel) if copy else channel.symlink_to(path.resolve())
    else:
        channel.mkdir()
        shutil.copy(path, channel / path.name) if copy else (channel / path.name).symlink_to(path.resolve())


# One writer per run directory. The lock is an flock on <root>/run.lock, taken before anything in the run is
# written and held by the launched process tree (its file descriptor is inherited), so it ends with the last
# process of the run however that ends (kill -9 included): no stale lock to clean up, and "is this run alive?"
# is answered by the kernel, not by a pid file that outlives its process. The file also records who holds it.
RUN_LOCK = "run.lock"


@dataclass
class RunLock:
    """The held lock: pass `fd` to the process that must hold it (subprocess pass_fds)."""

    path: Path
    fd: int
    previous: dict | None  # the record of an earlier holder that is gone (said so to the user)

    def record(self, **owner) -> None:
        data = json.dumps({"host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"), **owner})
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data.encode(), 0)

    def release(self) -> None:
        """The launcher's own copy: the run's processes keep theirs until they end."""
        os.close(self.fd)


class RunBusy(BadInput):
    """Another process trains this run (exit 2 if it reaches the CLI; the targets say who and what to do)."""

    def __init__(self, owner: dict) -> None:
        super().__init__(owner)
        self.owner = owner


def _read_record(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None


def take_run_lock(root: Path) -> RunLock:
    """The run's lock, or RunBusy naming the live holder."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / RUN_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunBusy(_read_record(path) or {}) from None
    return RunLock(path, fd, _read_record(path))


def run_holder(root: Path) -> dict | None:
    """Who holds the run's lock now (its record), or None when no process of the run is alive."""
    path = root / RUN_LOCK
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_record(path) or {}
    finally:
        os.close(fd)  # closing drops a lock taken here
    return None
