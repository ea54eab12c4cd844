"""The /opt/ml-style job directory that local and HyperPod jobs share with the entrypoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from toolkit.config import Config
from toolkit.entrypoints.settings import to_hyperparameters


def settings_file(root: Path) -> Path:
    return root / "input" / "config" / "hyperparameters.json"


def write_settings(config: Config, root: Path) -> None:
    """The entrypoint's settings, and a clean slate for this run's failure file."""
    path = settings_file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_hyperparameters(config.train_settings()), indent=2))
    (root / "output").mkdir(exist_ok=True)
    (root / "output" / "failure").unlink(missing_ok=True)


def place_train_channel(source: str, root: Path, copy: bool) -> None:
    """Local data becomes the 'train' channel, a directory as in SageMaker (linked, or copied where every node
    must see it); builtin and hub data are loaded by name, so they get none. Callers refuse remote sources."""
    channel = root / "input" / "data" / "train"
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
