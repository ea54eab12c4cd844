"""Prepared datasets (`toolkit data prepare`): complete or invisible, and used only for what they were prepared for.

`save` writes the Arrow dataset into a hidden sibling of its destination, seals it with the checkpoints' seal
(every file's size and SHA-256) plus what it was prepared from (the source and its content digest, the settings
that shape the tokens, the token statistics `toolkit plan` reads), and only then renames it into place. A kill
leaves the previous dataset or the new one, never a mix of both; what a killed prepare left beside it is removed by
the next one. Readers take a sealed dataset only: training checks its content and refuses one prepared with other
settings; plan uses its statistics only while the source and settings still match.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from ..data import SAMPLE_PATH, DataError, data_files
from ..settings import SAMPLE_DATASET, SAMPLES, DataSettings, ModelSettings
from .checkpoints import SEAL, about, file_sha256, problem, seal
from .moments import reached

# What shapes the tokenized rows besides the source: a dataset prepared with other values is another dataset.
SHAPING_SETTINGS = ("format", "reasoning_effort", "loss_on", "skip_bad_rows", "max_length", "overlong")
UNSEALED_STATS = "toolkit-stats.json"  # what `data prepare` wrote beside a dataset before the seal existed
DATASET_MARKERS = ("state.json", "dataset_dict.json")  # what datasets' save_to_disk writes
_STAGING, _REPLACED = "partial", "replaced"  # hidden siblings: .<name>.partial-<pid>, .<name>.replaced-<pid>


def identity(data: DataSettings, model: ModelSettings) -> dict[str, Any]:
    """The settings a prepared dataset's tokens depend on, by their config path."""
    shaping = {f"data.{name}": getattr(data, name) for name in SHAPING_SETTINGS}
    return {"model.id": model.id, "model.revision": model.revision, **shaping}


def source_digest(source: str) -> str | None:
    """SHA-256 of the local files a source reads (their names and bytes); None for a hub id or an s3:// URI."""
    if source == SAMPLE_DATASET:
        files, root = [SAMPLE_PATH], SAMPLE_PATH.parent
    elif source in SAMPLES:
        files, root = [SAMPLE_PATH.parent / SAMPLES[source]], SAMPLE_PATH.parent
    else:
        path = Path(source)
        if path.is_file():
            files, root = [path], path.parent
        elif path.is_dir():
            sealed_or_arrow = any((path / marker).exists() for marker in (SEAL, *DATASET_MARKERS))
            files = sorted(p for p in path.rglob("*") if p.is_file()) if sealed_or_arrow else data_files(path)
            root = path
        else:
            return None
    digest = hashlib.sha256()
    for file in files:  # each file's name, then its own SHA-256 (the checkpoints' hashing)
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file_sha256(file).encode())
    return digest.hexdigest()


def canonical(source: str) -> str:
    """A local source by its absolute path (the same file however a config spells it); others as written."""
    try:
        return str(Path(source).resolve()) if Path(source).exists() else source
    except OSError:
        return source


def record(source: str, split: str, data: DataSettings, model: ModelSettings, stats: dict) -> dict[str, Any]:
    """What the seal of a dataset prepared from `source` says about it (data.eval too: the statistics hold its
    held-out share apart)."""
    held_out = data.eval.model_dump(mode="json") if data.eval is not None else None
    return {"source": canonical(source), "split": split, "source_sha256": source_digest(source),
            "settings": identity(data, model), "eval": held_out, "stats": stats}  # fmt: skip


def save(dataset: Any, destination: Path, about_it: dict[str, Any]) -> None:
    """Write, seal, then rename into place (replacing an earlier prepared dataset there, never anything else). A
    symbolic link is written through (its target is replaced); an OSError names the destination, never the hidden
    sibling, and leaves the earlier dataset where it was."""
    destination = Path(destination).resolve()  # `.` and links: the directory they name
    _refuse_foreign(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(destination)
    staging = _sibling(destination, _STAGING, os.getpid())
    replaced = _sibling(destination, _REPLACED, os.getpid())
    moved = False
    try:
        dataset.save_to_disk(str(staging))
        reached("prepare-written")
        seal(staging, about_it)
        if destination.exists():
            destination.rename(replaced)
            moved = True
            reached("prepare-replaced")  # the old one aside, the new one not yet in place: neither is read
        staging.rename(destination)
    except BaseException as exc:
        if moved and not destination.exists():
            replaced.rename(destination)  # the earlier dataset back where it was
        shutil.rmtree(staging, ignore_errors=True)  # a full disk or a Ctrl-C leaves nothing half-written behind
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror, str(destination)) from None
        raise
    shutil.rmtree(replaced, ignore_errors=True)


def sealed(directory: Path, by_content: bool = True) -> dict[str, Any] | None:
    """A prepared dataset's record; None for a directory the toolkit did not prepare (a user's own save_to_disk
    dataset). DataError, naming the directory and the file, for one that is not complete."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    if not (directory / SEAL).is_file():
        if (directory / UNSEALED_STATS).is_file():
            raise DataError(
                f"{directory}: a prepared dataset with no completion record (an interrupted `toolkit data prepare`, "
                "or one from an older toolkit): run `toolkit data prepare` again"
            )
        return None
    reason = problem(directory, by_content)
    if reason is not None:
        raise DataError(f"{directory}: the prepared dataset is not complete: {reason}; run `toolkit data prepare` "
                        "again")  # fmt: skip
    return about(directory) or {}


def differences(prepared: dict[str, Any], data: DataSettings, model: ModelSettings) -> list[str]:
    """Each setting this config gives another value than the dataset was prepared with."""
    was = prepared.get("settings", {})
    return [f"{key} (prepared with {was.get(key)!r}, this config: {value!r})"
            for key, value in identity(data, model).items() if was.get(key) != value]  # fmt: skip


def check(directory: Path, data: DataSettings, model: ModelSettings) -> dict[str, Any] | None:
    """A prepared dataset's record, checked by content and against the config's settings before it is trained on
    or prepared again (its tokens pass through as they are: they must be what the config says); None for a source
    the toolkit did not prepare."""
    directory = Path(directory).resolve()  # a local run's channel links to the user's directory: name that
    prepared = sealed(directory)
    differ = differences(prepared, data, model) if prepared is not None else []
    if differ:
        raise DataError(
            f"data.source {directory} was prepared with other settings: {'; '.join(differ)}. Prepare it again "
            "with this config (`toolkit data prepare`), or set these as it was prepared"
        )
    return prepared


def _refuse_foreign(destination: Path) -> None:
    here = Path.cwd().resolve()
    if destination == here or destination in here.parents:  # replaced, it would leave the shell in a deleted dir
        raise DataError(
            f"{destination}: is the current directory (or holds it), which preparing would replace: name a "
            "directory inside it (--output prepared)"
        )
    if not destination.exists():
        return
    ours = destination.is_dir() and (
        not any(destination.iterdir())
        or (destination / SEAL).is_file()
        or ((destination / UNSEALED_STATS).is_file() and any((destination / m).exists() for m in DATASET_MARKERS))
    )
    if not ours:
        raise DataError(
            f"{destination}: exists and is not a prepared dataset; preparing would replace it: choose a new or "
            "empty directory (--output)"
        )


def _sibling(destination: Path, kind: str, pid: int) -> Path:
    return destination.with_name(f".{destination.name}.{kind}-{pid}")


def _remove_leftovers(destination: Path) -> None:
    """What a killed prepare left beside the destination (its process is gone): removed, never read."""
    for kind in (_STAGING, _REPLACED):
        for path in destination.parent.glob(f".{glob.escape(destination.name)}.{kind}-*"):
            pid = path.name.rpartition("-")[2]
            if pid.isdigit() and not process_alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether a process of this pid exists (another user's counts: it cannot be signalled, it lives)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
