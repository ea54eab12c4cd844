"""HyperPod target: the same entrypoint on a HyperPod cluster, orchestrated by Slurm or by EKS.

The orchestrator is a config choice (`hyperpod.orchestrator`); each lives in its own module behind the
same Target interface. Both run the entrypoint with the shared filesystem's job directory in place of /opt/ml.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from toolkit import limits
from toolkit.config import Config
from toolkit.config.instances import INSTANCES
from toolkit.targets.base import Job, Run, Size, Target, TargetError
from toolkit.targets.jobtree import place_train_channel, prepare_run_dir, stage_code

ORCHESTRATORS = {"slurm": "toolkit.targets.hyperpod_slurm", "eks": "toolkit.targets.hyperpod_eks"}
PLAN_NODES = (1, 2, 4)  # the node counts plan offers besides the configured one


def job_dir(config: Config) -> Path:
    """The job's root on the shared filesystem: what /opt/ml is in a training job."""
    hp = config.hyperpod
    return Path(hp.job_dir.format(mount_path=hp.fsx.mount_path, name=config.name))


def stage(config: Config, root: Path, fresh: bool) -> None:
    """Write what every node reads: settings, code, and local data copied in as the 'train' channel (after the
    run directory's --fresh / foreign-checkpoint rules, the same as a local run's)."""
    for name, source in config.data.channels().items():
        field = "data.source" if name == "train" else "data.eval.source"
        if source.startswith("s3://"):
            raise TargetError(
                f"{field} {source} is on S3: HyperPod jobs read the shared filesystem. Copy it under "
                f"{config.hyperpod.fsx.mount_path} (or import it into FSx for Lustre) and point {field} there"
            )
    prepare_run_dir(config, root, fresh)
    stage_code(root / "code", config)
    for name, source in config.data.channels().items():
        place_train_channel(source, root, copy=True, name=name)


class HyperPodTarget(Target):
    name = "hyperpod"
    extras = ("aws",)

    def _delegate(self, config: Config) -> Target:
        return importlib.import_module(ORCHESTRATORS[config.hyperpod.orchestrator]).ORCHESTRATOR

    def render(self, config: Config) -> str:
        return self._delegate(config).render(config)

    def submit(self, config: Config, fresh: bool = False) -> Job:
        return self._delegate(config).submit(config, fresh)

    def attach(self, config: Config, job_name: str) -> Job:
        return self._delegate(config).attach(config, job_name)

    def latest(self, config: Config) -> Run | None:
        return self._delegate(config).latest(config)

    def servable_model(self, config: Config, dry_run: bool = False) -> str:
        """Slurm: uploaded from the shared filesystem (mounted where the toolkit runs: the head node); EKS: the
        client cannot mount FSx, so a Job in the cluster exports it."""
        return self._delegate(config).servable_model(config, dry_run)

    # What plan asks: the cluster's instance type (fixed: the cluster has it) at a few node counts, drawing on
    # SageMaker's cluster usage. No preflight: the cluster's instances run already, a job launches none.
    def configured_size(self, config: Config) -> Size:
        return self._size(config, config.hyperpod.nodes)

    def sizes(self, config: Config) -> list[Size]:
        return [self._size(config, nodes) for nodes in sorted({*PLAN_NODES, config.hyperpod.nodes})]

    @staticmethod
    def _size(config: Config, nodes: int) -> Size:
        pod = config.hyperpod
        per_node = pod.gpus_per_node or INSTANCES[pod.instance_type].gpus
        return Size(pod.instance_type, nodes, per_node * nodes, limits.CLUSTER)


TARGET = HyperPodTarget()
