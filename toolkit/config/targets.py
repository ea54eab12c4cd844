"""One settings section per target, each registered under its target's name with what it knows about itself:
the GPUs it runs, the instance type sizing its GPUs, what a config needs before it launches there, and the module
of its behaviour (toolkit/targets/). `Config` asks the active section; nothing switches on a target's name.
Adding a target = a section here (a `TargetSettings` subclass and a `Config` field) and its module in targets/;
tests/toolkit/test_config.py fails when a registered section has no `Config` field or no behaviour module.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from toolkit_train.settings import StrictModel

from toolkit.config.instances import instance
from toolkit.config.members import hyperparameter_problem
from toolkit.config.names import bucket_of, k8s_name_problem
from toolkit.errors import brief

if TYPE_CHECKING:
    from toolkit.config.models import Config

# The client-side home of every run, relative to where the toolkit runs: runs/<name>/ holds a local run's job tree
# (local.output_dir's default), prepared data, the local server's log and pid, a training job's record.
RUNS = "runs"


def run_home(name: str) -> Path:
    return Path(RUNS) / name


TARGET_SETTINGS: dict[str, type[TargetSettings]] = {}  # target name -> its section's class, in declaration order


class TargetSettings(StrictModel):
    """A target's config section. Subclasses register with `target=` (the name `--target` takes), `section=` (the
    Config field) and `module=` (where its `TARGET` lives)."""

    target: ClassVar[str]
    section: ClassVar[str]
    module: ClassVar[str]

    def __init_subclass__(cls, target: str = "", section: str = "", module: str = "", **kwargs):
        super().__init_subclass__(**kwargs)
        if target:
            cls.target, cls.section, cls.module = target, section, module
            TARGET_SETTINGS[target] = cls

    def gpus(self) -> int:
        """Training processes (one per GPU) a job of this section runs: the world size it sees."""
        raise NotImplementedError

    def gpu_instance(self) -> tuple[str, str] | None:
        """(instance type, its field) whose GPUs size the memory checks; None: this machine's GPUs."""
        return None

    def needs(self, config: Config) -> str | None:
        """What `config` lacks to launch on this target (one line saying how to fix), or None."""
        return None


def check_placeholders(value: str, field: str, allowed: tuple[str, ...]) -> str:
    """A path template may use only the placeholders it is filled with (else a KeyError at launch)."""
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
    except ValueError as exc:
        raise ValueError(f"{field}: {brief(value)} is not a valid template ({exc}); write {{ as {{{{") from None
    unknown = sorted(used - set(allowed))
    if unknown:
        raise ValueError(
            f"{field}: unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)} in {brief(value)}; "
            f"allowed: {', '.join('{' + a + '}' for a in allowed)}"
        )
    return value


class LocalSettings(TargetSettings, target="local", section="local", module="toolkit.targets.local"):
    """Run the entrypoint on this machine under torchrun, in an /opt/ml-style tree."""

    nproc_per_node: int = Field(1, ge=1, description="Processes (one per GPU; CPU: gloo).")
    output_dir: str = Field(f"{RUNS}/{{name}}", description="Where artifacts land; {name} is the config name.")

    @field_validator("output_dir")
    @classmethod
    def _template(cls, value: str) -> str:
        return check_placeholders(value, "local.output_dir", ("name",))

    def gpus(self) -> int:
        return self.nproc_per_node

    def needs(self, config: Config) -> str | None:
        return config.model.missing_here()


class TrainingJobSettings(
    TargetSettings, target="training-job", section="training_job", module="toolkit.targets.training_job"
):
    """A SageMaker training job."""

    instance_type: str = Field("ml.p5.48xlarge", description="GPU instance type; torchrun starts one process per GPU.")
    instance_count: int = Field(1, ge=1, description="Nodes.")
    image_uri: str | None = Field(None, description="Training image; default: the pinned AWS PyTorch container.")
    spot: bool = Field(False, description="Managed spot training (resumes from checkpoints).")
    max_run_seconds: int = Field(86_400, ge=60, description="Stop the job after this long.")
    max_wait_seconds: int | None = Field(None, description="Spot only: >= max_run_seconds.")
    volume_size_gb: int = Field(500, ge=1, description="EBS volume per node (model, checkpoints).")
    subnets: list[str] = Field(default_factory=list, description="VPC subnets (with security_group_ids).")
    security_group_ids: list[str] = Field(default_factory=list, description="VPC security groups.")
    kms_key_id: str | None = Field(None, description="KMS key for volumes and output.")
    hf_token_secret: str | None = Field(
        None, description="Secrets Manager name holding the Hugging Face token (read at submit)."
    )
    tags: dict[str, str] = Field(default_factory=dict, description="Tags on the job.")

    @model_validator(mode="after")
    def _check(self) -> TrainingJobSettings:
        instance(self.instance_type, "training_job.instance_type")
        if self.spot:
            if self.max_wait_seconds is None:
                self.max_wait_seconds = self.max_run_seconds * 2
            if self.max_wait_seconds < self.max_run_seconds:
                raise ValueError("training_job.max_wait_seconds must be >= max_run_seconds for spot jobs")
        if bool(self.subnets) != bool(self.security_group_ids):
            raise ValueError("training_job.subnets and training_job.security_group_ids go together: set both")
        return self

    def gpus(self) -> int:
        return instance(self.instance_type, "training_job.instance_type").gpus * self.instance_count

    def gpu_instance(self) -> tuple[str, str] | None:
        return self.instance_type, "training_job.instance_type"

    def needs(self, config: Config) -> str | None:
        if config.model.is_path:
            return (
                f"model.id: a training job cannot read the local directory {config.model.id}; it downloads model.id "
                "from the Hugging Face hub: use a hub id (local checkpoints: --target local, or hyperpod with the "
                "directory on the cluster's shared filesystem)"
            )
        if config.data.source.startswith("fsx://") and not self.subnets:
            return (
                "an fsx:// data.source is mounted over the file system's VPC: set training_job.subnets and "
                "training_job.security_group_ids"
            )
        if self.subnets and not config.runs_the_built_training_image():
            return (
                "training_job.subnets: a job in your VPC would pip-install the training stack from PyPI at start, "
                "which fails without a NAT route: set training_job.image_uri to the URI `toolkit image build "
                "training` prints (the stack is in it; the job installs nothing)"
            )
        return self._unreadable_data(config) or hyperparameter_problem(config)

    @staticmethod
    def _unreadable_data(config: Config) -> str | None:
        """An s3:// data.source outside the buckets the execution role reads (aws.bucket, aws.data_buckets)."""
        source = config.data.source
        if not source.startswith("s3://") or not config.aws.bucket:
            return None
        bucket = bucket_of(source)
        if bucket == config.aws.bucket or bucket in config.aws.data_buckets:
            return None
        return (f"data.source is in bucket {brief(bucket)}, which the execution role cannot read: add it to "
                f"aws.data_buckets and grant it with `toolkit infra deploy --data-bucket {bucket}`")  # fmt: skip


class FsxSettings(StrictModel):
    """The shared FSx for Lustre filesystem of a HyperPod cluster."""

    claim: str = Field("fsx-claim", description="EKS: the PersistentVolumeClaim name.")
    mount_path: str = Field("/fsx", description="Where the filesystem is mounted on every node.")

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        """A pod's volume mountPath and pyxis's --container-mounts=<path>:<path> take an absolute path; a ':' would
        split the mount, whitespace the command line, and '..' leaves the filesystem."""
        if not value.startswith("/") or ":" in value or any(c.isspace() for c in value) or ".." in value.split("/"):
            raise ValueError(
                f"hyperpod.fsx.mount_path: {brief(value)} is not an absolute path without ':', spaces or '..': give "
                "where the cluster mounts FSx, e.g. /fsx"
            )
        return value.rstrip("/") or "/"


class HyperPodSettings(TargetSettings, target="hyperpod", section="hyperpod", module="toolkit.targets.hyperpod"):
    """A HyperPod cluster, orchestrated by EKS or Slurm."""

    cluster: str | None = Field(
        None,
        description="EKS: the HyperPod cluster's name (optional). Jobs go to the cluster of your kubeconfig's context "
        "(hyperpod.kube_context); when set, every submit and `toolkit jobs` call first checks that context against "
        "the cluster's EKS cluster (SageMaker DescribeCluster: Orchestrator.Eks.ClusterArn, as `hyp "
        "set-cluster-context` reads it) and stops on another cluster (exit 2); a dry run asks nothing. Slurm submits "
        "on the head node: none.",
    )
    orchestrator: Literal["eks", "slurm"] = Field("eks", description="How the cluster runs jobs.")
    instance_type: str = Field("ml.p5.48xlarge", description="The cluster's GPU instance type.")
    nodes: int = Field(1, ge=1, description="Nodes for this job.")
    gpus_per_node: int | None = Field(None, ge=0, description="Default: the instance type's GPUs.")
    image: str | None = Field(
        None, description="Container image (EKS; Slurm with pyxis): `toolkit image build training` makes one."
    )
    image_repository: str = Field(
        "toolkit-training", description="ECR repository of the built training image (`toolkit infra` makes it)."
    )
    base_image: str | None = Field(
        None, description="Training image's base; default: the region's AWS PyTorch training container (DLC)."
    )
    fsx: FsxSettings = Field(default_factory=FsxSettings)
    job_dir: str = Field("{mount_path}/toolkit/{name}", description="Data, checkpoints and model under this path.")

    @field_validator("job_dir")
    @classmethod
    def _template(cls, value: str) -> str:
        return check_placeholders(value, "hyperpod.job_dir", ("mount_path", "name"))

    namespace: str = Field("default", description="EKS namespace.")
    service_account: str | None = Field(
        None,
        description="EKS: the service account of the pod that exports a run's model from FSx to S3 for `toolkit "
        "deploy` (`toolkit infra deploy --export-eks-cluster` gives one its S3 role through EKS Pod Identity); "
        "default: the namespace's.",
    )
    kube_context: str | None = Field(None, description="EKS: kubeconfig context (default: the current one).")
    queue: str | None = Field(None, description="Kueue local queue.")
    priority: str | None = Field(None, description="Kueue priority class.")
    max_retries: int = Field(3, ge=0, description="Auto-resume attempts after node failure.")
    python: str = Field(
        "python3", description="Slurm without a container image: the Python (with torch) on every node."
    )
    exclusive: bool = Field(True, description="Slurm: take whole nodes (--exclusive).")
    install: bool = Field(
        True,
        description="Install the locked training stack (toolkit_train/requirements.txt) into the job's Python on "
        "every node before launch; false when hyperpod.python or hyperpod.image already holds it.",
    )
    eks_job_kind: Literal["HyperPodPyTorchJob", "PyTorchJob"] = Field(
        "HyperPodPyTorchJob", description="EKS: HyperPod training operator's job, or Kubeflow's PyTorchJob."
    )

    @model_validator(mode="after")
    def _check(self) -> HyperPodSettings:
        gpus = instance(self.instance_type, "hyperpod.instance_type").gpus
        if self.gpus_per_node is None:
            self.gpus_per_node = gpus
        elif self.gpus_per_node > gpus:
            raise ValueError(f"hyperpod.gpus_per_node is {self.gpus_per_node} but {self.instance_type} has {gpus} GPUs")
        default_python = HyperPodSettings.model_fields["python"].default
        if self.orchestrator == "slurm" and self.image and self.python != default_python:  # pyxis: the image's own
            raise ValueError(
                f"hyperpod.python: {brief(self.python)} is the nodes' Python for Slurm without a container image, "
                f"but hyperpod.image runs the job in {brief(self.image)}, with the image's own python: remove "
                "hyperpod.python, or hyperpod.image"
            )
        return self

    def gpus(self) -> int:
        return max(self.gpus_per_node or 1, 1) * self.nodes

    def gpu_instance(self) -> tuple[str, str] | None:
        return self.instance_type, "hyperpod.instance_type"

    def needs(self, config: Config) -> str | None:
        problem = k8s_name_problem(config.name, "label")
        if problem and self.orchestrator == "eks":  # the job, its pods' label and ConfigMap are named so
            return f"name: on EKS the job is a Kubernetes object named after the config: {problem}"
        return None
