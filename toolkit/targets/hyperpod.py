"""HyperPod target: the same entrypoint on a HyperPod cluster, orchestrated by Slurm or by EKS.

The orchestrator is a config choice (`hyperpod.orchestrator`); each lives in its own module behind the
same Target interface. Both run the entrypoint with the shared filesystem's job directory in place of /opt/ml.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

from toolkit.config import Config
from toolkit.resources import ENTRYPOINTS_DIR as ENTRYPOINTS
from toolkit.targets.base import Job, Target, TargetError, job_requirements
from toolkit.targets.jobtree import place_train_channel, write_settings

ORCHESTRATORS = {"slurm": "toolkit.targets.hyperpod_slurm", "eks": "toolkit.targets.hyperpod_eks"}


def job_dir(config: Config) -> Path:
    """The job's root on the shared filesystem: what /opt/ml is in a training job."""
    hp = config.hyperpod
    return Path(hp.job_dir.format(mount_path=hp.fsx.mount_path, name=config.name))


def stage(config: Config, root: Path) -> None:
    """Write what every node reads: settings, code, and local data copied in as the 'train' channel."""
    for name, source in config.data.channels().items():
        field = "data.source" if name == "train" else "data.eval.source"
        if source.startswith("s3://"):
            raise TargetError(
                f"{field} {source} is on S3: HyperPod jobs read the shared filesystem. Copy it under "
                f"{config.hyperpod.fsx.mount_path} (or import it into FSx for Lustre) and point {field} there"
            )
    write_settings(config, root)
    code = root / "code" / "entrypoints"
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(ENTRYPOINTS, code, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "code" / "requirements.txt").write_text(job_requirements(config))
    for name, source in config.data.channels().items():
        place_train_channel(source, root, copy=True, name=name)


class HyperPodTarget(Target):
    name = "hyperpod"

    def _delegate(self, config: Config) -> Target:
        return importlib.import_module(ORCHESTRATORS[config.hyperpod.orchestrator]).ORCHESTRATOR

    def render(self, config: Config) -> str:
        return self._delegate(config).render(config)

    def submit(self, config: Config, fresh: bool = False) -> Job:
        return self._delegate(config).submit(config, fresh)

    def attach(self, config: Config, job_name: str) -> Job:
        return self._delegate(config).attach(config, job_name)


TARGET = HyperPodTarget()


def model_for_serving(config: Config, dry_run: bool = False) -> str:
    """The hand-over from a HyperPod run to `toolkit deploy`: the run's model directory (adapter, merged model,
    run.json) on the shared filesystem, uploaded once to S3 under a key naming the run, as the S3 prefix an
    endpoint serves. Runs where the shared filesystem is mounted (the Slurm head node); on EKS, where the
    client cannot mount FSx, a Job in the cluster uploads it. A dry run names the prefix and uploads nothing."""
    import hashlib

    if config.hyperpod.orchestrator == "eks":
        return importlib.import_module(ORCHESTRATORS["eks"]).export_model(config, dry_run)

    from toolkit import aws
    from toolkit.targets.training_job import upload_once

    model = job_dir(config) / "model"
    run = model / "run.json"
    if not run.exists():
        raise TargetError(
            f"no completed HyperPod run of {config.name} in {model}: run `toolkit deploy` on the cluster's head "
            f"node after `toolkit train {config.name} --target hyperpod` completes, or set serving.model_data to "
            "the model's S3 prefix"
        )
    aws.require(config.aws, "bucket")
    kind, key = f"models/{config.name}", hashlib.sha256(run.read_bytes()).hexdigest()[:16]
    if dry_run:
        return f"s3://{config.aws.bucket}/{config.aws.prefix}/{kind}/{key}/"
    return upload_once(aws.client(config.aws, "s3"), config, model, kind=kind, key=key)
