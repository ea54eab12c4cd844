"""HyperPod target: the same entrypoint on a HyperPod cluster, orchestrated by Slurm or by EKS.

The orchestrator is a config choice (`hyperpod.orchestrator`); each lives in its own module behind the
same Target interface. Both run the entrypoint with the shared filesystem's job directory in place of /opt/ml.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

from entrypoints.settings import to_hyperparameters
from toolkit.config import Config
from toolkit.targets.base import TargetError

ENTRYPOINTS = Path(__file__).resolve().parents[2] / "entrypoints"
ORCHESTRATORS = {"slurm": "toolkit.targets.hyperpod_slurm", "eks": "toolkit.targets.hyperpod_eks"}


def job_dir(config: Config) -> Path:
    """The job's root on the shared filesystem: what /opt/ml is in a training job."""
    hp = config.hyperpod
    return Path(hp.job_dir.format(mount_path=hp.fsx.mount_path, name=config.name))


def stage(config: Config, root: Path) -> None:
    """Write what every node reads: settings, code, and local data as the 'train' channel."""
    config_file = root / "input" / "config" / "hyperparameters.json"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(json.dumps(to_hyperparameters(config.train_settings()), indent=2))
    code = root / "code" / "entrypoints"
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(ENTRYPOINTS, code, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "output").mkdir(exist_ok=True)
    (root / "output" / "failure").unlink(missing_ok=True)
    source = config.data.source
    if source.startswith("s3://"):
        raise TargetError(
            f"data.source {source} is on S3: HyperPod jobs read the shared filesystem. Copy it under "
            f"{config.hyperpod.fsx.mount_path} (or import it into FSx for Lustre) and point data.source there"
        )
    path = Path(source)
    channel = root / "input" / "data" / "train"
    if channel.is_symlink() or channel.is_file():
        channel.unlink()
    elif channel.exists():
        shutil.rmtree(channel)
    if source.startswith("builtin:") or not path.exists():
        return
    channel.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.copytree(path, channel)
    else:
        channel.mkdir()
        shutil.copy(path, channel / path.name)


class HyperPodTarget:
    name = "hyperpod"

    def _delegate(self, config: Config):
        return importlib.import_module(ORCHESTRATORS[config.hyperpod.orchestrator]).ORCHESTRATOR

    def render(self, config: Config) -> str:
        return self._delegate(config).render(config)

    def submit(self, config: Config, fresh: bool = False):
        return self._delegate(config).submit(config, fresh)

    def attach(self, config: Config, job_name: str):
        return self._delegate(config).attach(config, job_name)


TARGET = HyperPodTarget()
