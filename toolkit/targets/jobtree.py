"""The run's layout on every target: the /opt/ml-style job directory local and HyperPod jobs share with the
entrypoint, the one code tree every job runs, the one-writer lock."""

from __future__ import annotations

import fcntl
import gzip
import io
import json
import os
import shutil
import socket
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit_train.layout import RunTree
from toolkit_train.settings import EXPLICIT_PATH, failure_elsewhere, to_hyperparameters, trajectory

from toolkit.config import Config
from toolkit.errors import BadInput
from toolkit.files import write_atomically

if TYPE_CHECKING:
    from toolkit.targets.base import Run

IGNORED_CODE = shutil.ignore_patterns("__pycache__", "*.pyc")
TRAJECTORY_FILE = "trajectory.json"
DATA_FILE = "data.json"  # input/config/data.json: the data the run trains on (data_digests)
STOP_RECORD = "stop-requested"  # output/stop-requested: a stop was sent to the run (stop_record)


def foreign_checkpoints(root: Path) -> str:
    """The refusal when a run directory holds checkpoints of other settings (one text for every target)."""
    return (
        f"{root} holds checkpoints of a different config; resuming would mix runs. Pass --fresh to start over, "
        "or give this config another name (or output directory)"
    )


def prepare_run_dir(config: Config, root: Path, fresh: bool) -> None:
    """Before a run starts in `root` on any target that writes it from here (local, Slurm): --fresh clears what
    runs write; otherwise checkpoints of other settings refuse (resuming them would mix two runs). Then the
    settings are written and an earlier attempt's outcome is cleared: this attempt resumes it."""
    from toolkit.targets.base import TargetError

    data = data_digests(config)
    if fresh:
        for stale in RunTree(root).outputs:
            shutil.rmtree(stale, ignore_errors=True)
    elif any(RunTree(root).checkpoints.glob("checkpoint-*")):
        if _settings_changed(config, root):
            raise TargetError(foreign_checkpoints(root))
        changed = _data_changed(data, root)
        if changed:
            raise TargetError(changed)
    for outcome in (RunTree(root).failure, RunTree(root).stopped, stop_record(root)):  # the last attempt's end
        outcome.unlink(missing_ok=True)
    failure_elsewhere(root).unlink(missing_ok=True)
    write_settings(config, root)
    write_atomically(data_file(root), json.dumps(data, indent=2, sort_keys=True))


def data_digests(config: Config) -> dict[str, dict[str, str | None]]:
    """What each data channel's content is, recorded with the run (input/config/data.json) so that a resume over
    its checkpoints trains on the data they were trained on. The digest is the training side's own
    (toolkit_train.run.prepared.source_digest: each file's name and SHA-256): a local file or directory, its bytes; a
    prepared dataset, its seal (which holds every file's SHA-256); a builtin sample, its file shipped with the code.
    A hub dataset id or an s3:// URI is not read from here: its digest is None and nothing is checked."""
    from toolkit_train.run.checkpoints import SEAL, file_sha256
    from toolkit_train.run.prepared import canonical, source_digest

    recorded: dict[str, dict[str, str | None]] = {}
    for name, source in config.data.channels().items():
        seal = Path(source) / SEAL
        if seal.is_file():
            digest: str | None = f"seal:{file_sha256(seal)}"
        else:
            digest = source_digest(source)
        recorded[name] = {"source": canonical(source), "sha256": digest}
    return recorded


def data_file(root: Path) -> Path:
    """The data digests a run's checkpoints were trained on (data_digests), beside its settings."""
    return settings_file(root).with_name(DATA_FILE)


def _data_changed(now: dict[str, dict[str, str | None]], root: Path) -> str | None:
    """The refusal when a channel's content differs from what the run's checkpoints were trained on; None when it
    is the same, or not known (a run recorded before data was, a hub or S3 source)."""
    from toolkit_train.run.checkpoints import newest_complete

    try:
        was = json.loads(data_file(root).read_text())
    except (OSError, ValueError):
        return None
    for name, ours in now.items():
        theirs = was.get(name) or {}
        if not theirs.get("sha256") or not ours["sha256"] or theirs["sha256"] == ours["sha256"]:
            continue
        checkpoints = RunTree(root).checkpoints
        newest = newest_complete(checkpoints)[0] or max(checkpoints.glob("checkpoint-*"))
        field = "data.source" if name == "train" else "data.eval.source"
        return (
            f"{field} {ours['source']} changed since {newest} was written (content "
            f"{_short(theirs['sha256'])} then, {_short(ours['sha256'])} now): resuming would train on other data "
            "than its steps so far and draw the held-out rows again. Pass --fresh to start over on this data, or "
            "restore the data as it was to resume"
        )
    return None


def _short(digest: str) -> str:
    kind, _, value = digest.rpartition(":")
    return f"{kind + ' ' if kind else ''}sha256 {value[:12]}"


def _settings_changed(config: Config, root: Path) -> bool:
    """Another trajectory than the written settings' (a raised max_steps is the same run: it trains on)."""
    written = settings_file(root)
    ours = trajectory(to_hyperparameters(config.train_settings()))
    return written.exists() and trajectory(json.loads(written.read_text())) != ours


def job_requirements(config: Config) -> str:
    """The requirements file a job installs: the locked training stack, plus MLflow's client only when asked."""
    from toolkit.resources import MLFLOW_LOCK, TRAINING_LOCK

    text = TRAINING_LOCK.read_text()
    if "mlflow" in config.train_settings().training.report_to:
        text += MLFLOW_LOCK.read_text()
    return text


def stage_code(into: Path, config: Config) -> Path:
    """The one code tree every target runs, whole (modules, samples, lock files; nothing flattened):
    <into>/toolkit_train/ and <into>/requirements.txt. The job's PYTHONPATH is <into> alone; its entry script
    is <into>/<resources.ENTRY_SCRIPT>. A previous staging is replaced, never merged into."""
    from toolkit.resources import TRAINING_PACKAGE

    package = into / TRAINING_PACKAGE.name
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(TRAINING_PACKAGE, package, ignore=IGNORED_CODE)
    (into / "requirements.txt").write_text(job_requirements(config))
    return into


def code_archive(config: Config) -> bytes:
    """The staged code tree as one gzipped tar, byte-identical for identical code (sorted, no times or owners):
    how it travels where only a blob can (a Kubernetes ConfigMap)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="toolkit-code-") as tmp:
        root = stage_code(Path(tmp), config)
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as packed, tarfile.open(fileobj=packed, mode="w") as tar:
            for path in sorted(root.rglob("*")):
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if path.is_file():
                    with path.open("rb") as handle:
                        tar.addfile(info, handle)
                else:
                    tar.addfile(info)
        return buffer.getvalue()


def completed_run(name: str, root: Path) -> Run | None:
    """A run directory's outcome when its run is complete (run.json, written last, is there), with what it holds."""
    from toolkit.targets.base import Run

    return Run.completed_in(name, root) if RunTree(root).completed() else None


def upload_run_model(config: Config, root: Path, where: str, dry_run: bool) -> str:
    """A completed run directory's model (adapter, merged model, run.json), uploaded once to S3 under a key that
    names the run (run.json's digest), as the S3 prefix an endpoint serves. A dry run names it, uploads nothing."""
    from toolkit import aws, digest
    from toolkit.targets.base import TargetError

    model, run = RunTree(root).model, RunTree(root).run_record
    if not run.exists():
        raise TargetError(
            f"no completed run of {config.name} in {model}{where}, or set serving.model_data to the model's S3 prefix"
        )
    aws.require(config.aws, "bucket")
    kind, key = f"models/{config.name}", digest.of_files(run)
    if dry_run:
        return f"s3://{config.aws.bucket}/{config.aws.prefix}/{kind}/{key}/"
    return aws.upload_once(aws.client(config.aws, "s3"), config.aws, model, kind=kind, key=key)


def resume_hint(root: Path) -> str:
    """What the same command does next for this run: which checkpoint it resumes from."""
    from toolkit_train.run.checkpoints import newest_complete

    checkpoint, _ = newest_complete(RunTree(root).checkpoints)
    if checkpoint is None:
        return "the next run of the same command starts from the beginning (no complete checkpoint)"
    return f"the next run of the same command resumes from {checkpoint.name}"


def stop_record(root: Path) -> Path:
    """Written by whoever sends the run a stop (the CLI's Ctrl-C, `toolkit jobs stop`) before sending it: a run that
    then ends with no other outcome (stopped before its first checkpoint) was stopped, not killed; it says whether
    it was stopped at once. The next attempt clears it."""
    return RunTree(root).output / STOP_RECORD


def settings_file(root: Path) -> Path:
    return RunTree(root).hyperparameters


def trajectory_file(root: Path) -> Path:
    """What the run's checkpoints belong to (settings.trajectory), as text a shell can compare (the EKS guard)."""
    return settings_file(root).with_name(TRAJECTORY_FILE)


def trajectory_text(hyperparameters: dict[str, str]) -> str:
    return json.dumps(trajectory(hyperparameters), sort_keys=True)


def write_settings(config: Config, root: Path) -> None:
    """The entrypoint's settings, and a clean slate for this run's failure file."""
    path = settings_file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    hyperparameters = to_hyperparameters(config.train_settings())
    write_atomically(path, json.dumps(hyperparameters, indent=2))
    write_atomically(trajectory_file(root), trajectory_text(hyperparameters))
    RunTree(root).output.mkdir(exist_ok=True)
    RunTree(root).failure.unlink(missing_ok=True)


def place_train_channel(source: str, root: Path, copy: bool, name: str = "train") -> None:
    """Local data becomes the 'train' channel (data.eval.source: 'eval'), a directory as in SageMaker (linked, or
    copied where every node must see it); builtin and hub data are loaded by name, so they get none. Callers refuse
    remote sources."""
    channel = RunTree(root).channel(name)
    if channel.is_symlink() or channel.is_file():
        channel.unlink()
    elif channel.exists():
        shutil.rmtree(channel)
    path = Path(source)
    if source.startswith(EXPLICIT_PATH) and not path.expanduser().exists():  # a path by its spelling, not a hub id
        from toolkit.targets.base import TargetError

        field = "data.source" if name == "train" else "data.eval.source"
        raise TargetError(f"{field}: {source} does not exist on this machine: give a file or directory that does "
                          "(or a hub dataset id, an s3:// URI)")  # fmt: skip
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
