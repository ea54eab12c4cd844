"""Where each setting lands in an AWS or cluster request, and the receiver's rule for it: one table, one check.

`MEMBERS` maps a config field to the request member it becomes: for AWS, the service, operation and member path in
botocore's service model (`[]` steps into a list's items); for a HyperPod cluster, the Kubernetes object and field
of toolkit.targets.hyperpod_eks's manifests or the sbatch option of toolkit.targets.hyperpod_slurm's script; for an
image build, docker's. `refuse_what_aws_refuses` checks each set value against that member's shape in botocore's own
model (pattern, length, count, range, enum), as the service validates it, plus the documented rules botocore does
not carry (`Member.also`, each citing its source); a cluster's or docker's member has its documented rule alone,
checked where the config's orchestrator sends it. A value equal to the field's default is not checked (defaults are
tested once, in tests/toolkit/test_members.py), so a config that sets nothing AWS-bound loads no service model.

Without botocore (the config checked without the aws extra) the AWS rows check their documented rules (`Member.also`)
alone: botocore's shapes are not there to read, and such a config reaches no AWS request from this machine.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolkit_train.settings import AWS_REGION_ENV, HF_TOKEN_SECRET_ENV

from toolkit.config.applicability import default_at, value_at
from toolkit.config.names import image_reference_problem, k8s_label_value_problem, k8s_name_problem
from toolkit.errors import brief

if TYPE_CHECKING:
    from toolkit.config.models import Config

MAX_RUNTIME_SECONDS = 28 * 24 * 3600  # API_StoppingCondition: "The maximum value is 2,419,200 seconds (28 days)"


# The tag the toolkit puts on every training job beside the user's (its config's name: how `jobs` finds a config's
# jobs); it counts toward AWS's 50 tags per resource, and its prefix is the toolkit's own.
CONFIG_TAG = "toolkit:config"


def _with_config_tag(tags: dict[str, str]) -> list[dict[str, str]]:
    """The Tags member as CreateTrainingJob carries it: the user's tags, then the toolkit's own (not merged as a
    mapping: a user's tag of the toolkit's own key would vanish in it, unchecked; `_no_reserved_prefix` refuses it)."""
    return [*({"Key": k, "Value": v} for k, v in tags.items()), {"Key": CONFIG_TAG, "Value": "config-name"}]


def _no_reserved_prefix(tags: list[dict[str, str]]) -> str | None:
    """Tag keys may not start with aws: (reserved: docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html),
    nor with the toolkit's own prefix (its tag would overwrite the user's)."""
    mine = CONFIG_TAG.split(":")[0] + ":"
    for tag in tags[:-1]:  # the last is the toolkit's own
        if tag["Key"].lower().startswith("aws:"):
            return f"tag key {tag['Key']!r} starts with 'aws:', which AWS reserves for its own tags"
        if tag["Key"].lower().startswith(mine):
            return (
                f"tag key {tag['Key']!r} starts with {mine!r}, which the toolkit reserves for its own ({CONFIG_TAG}: "
                "the config's name, how `toolkit jobs` finds its jobs): rename the tag"
            )
    return None


# S3's safe characters for object keys (docs.aws.amazon.com/AmazonS3/latest/userguide/object-keys.html): a prefix of
# other characters, or with empty path segments, makes keys that tools and the console treat inconsistently
_S3_SAFE_PREFIX = re.compile(r"[0-9A-Za-z!_.*'()-]+(/[0-9A-Za-z!_.*'()-]+)*")


def _clean_key_prefix(uri: str) -> str | None:
    prefix = uri.removeprefix(f"s3://{_BUCKET}/").removesuffix(f"/{_KEY}")
    if not _S3_SAFE_PREFIX.fullmatch(prefix):
        return (f"{prefix!r} is not a clean S3 key prefix: segments of letters, digits and !_.*'()- joined by single "
                "'/', none empty, no leading or trailing '/'")  # fmt: skip
    return None


_BUCKET, _KEY = "bucket", "name/output"  # stand-ins around a prefix, as the requests use it


def _within_28_days(seconds: int) -> str | None:
    if seconds > MAX_RUNTIME_SECONDS:
        return f"{seconds} is above the longest run SageMaker allows, {MAX_RUNTIME_SECONDS} s (28 days)"
    return None


def vllm_flag_environment(vllm_args: dict[str, str | int | float | bool]) -> dict[str, str]:
    """serving.vllm_args as the serving container receives them (containers/serving/serve.py turns SM_VLLM_<NAME>
    back into --<name>): true: --flag, false: --no-flag."""
    return {
        "SM_VLLM_" + flag.removeprefix("--").replace("-", "_").upper(): str(value).lower()
        if isinstance(value, bool)
        else str(value)
        for flag, value in vllm_args.items()
    }


def hf_token_environment(secret: str, region: str = "us-east-1") -> dict[str, str]:
    """Where a container reads the Hugging Face token: the secret's name and its region (the entrypoint's and
    serve.py's variables)."""
    return {HF_TOKEN_SECRET_ENV: secret, AWS_REGION_ENV: region}


def _k8s_name(kind: str) -> Callable[[str], str | None]:
    return lambda name: k8s_name_problem(name, kind)


def _kueue_name(name: str) -> str | None:
    """A Kueue object (LocalQueue, WorkloadPriorityClass) named in a job's label: an object name and a label value."""
    return k8s_name_problem(name) or k8s_label_value_problem(name)


def _sbatch_path(path: str) -> str | None:
    """A path in an #SBATCH option: sbatch splits the line at whitespace, and `--output` reads '%' as its filename
    pattern's replacement symbol and '\\' as the end of them (slurm.schedmd.com/sbatch.html, "filename pattern")."""
    bad = sorted({c for c in path if c.isspace() or c in "%\\"})
    if bad:
        return f"{brief(path)} holds {', '.join(map(repr, bad))}, which sbatch's --output would not keep as written"
    return None


# Where a row's service receives the value, by hyperpod.orchestrator (None: wherever the config goes); every other
# service is botocore's.
RECEIVERS: dict[str, tuple[str, ...] | None] = {"kubernetes": ("eks",), "slurm": ("slurm",), "docker": None}
WHO = {"kubernetes": "Kubernetes", "slurm": "Slurm", "docker": "docker"}


@dataclass(frozen=True)
class Member:
    service: str  # botocore's service name, or a key of RECEIVERS
    operation: str  # the API operation; a cluster's object kind, `sbatch`, `docker build`
    path: str  # the member in the operation's input (dotted, `[]` steps into a list's items), option or field
    to_request: Callable[[Any], Any] | None = None  # the value as the request carries it (default: as it is)
    also: Callable[[Any], str | None] | None = None  # a documented rule botocore's model does not carry
    sent_with: str = ""  # what the toolkit adds to the value in the request (said with a problem)


_TRAIN, _ENDPOINT_CONFIG = ("sagemaker", "CreateTrainingJob"), ("sagemaker", "CreateEndpointConfig")
_VARIANT = "ProductionVariants[]."
_JOB, _POD = ("kubernetes", "HyperPodPyTorchJob"), "spec.replicaSpecs[].template.spec."

MEMBERS: dict[str, Member] = {
    "aws.role": Member(*_TRAIN, "RoleArn"),
    "training_job.instance_count": Member(*_TRAIN, "ResourceConfig.InstanceCount"),
    "hyperpod.cluster": Member("sagemaker", "DescribeCluster", "ClusterName"),  # EKS: the context's cluster is checked
    "training_job.volume_size_gb": Member(*_TRAIN, "ResourceConfig.VolumeSizeInGB"),
    "training_job.max_run_seconds": Member(*_TRAIN, "StoppingCondition.MaxRuntimeInSeconds", also=_within_28_days),
    "training_job.max_wait_seconds": Member(*_TRAIN, "StoppingCondition.MaxWaitTimeInSeconds"),
    "training_job.kms_key_id": Member(*_TRAIN, "OutputDataConfig.KmsKeyId"),
    "training_job.subnets": Member(*_TRAIN, "VpcConfig.Subnets"),
    "training_job.security_group_ids": Member(*_TRAIN, "VpcConfig.SecurityGroupIds"),
    "training_job.image_uri": Member(*_TRAIN, "AlgorithmSpecification.TrainingImage"),
    "training_job.hf_token_secret": Member(*_TRAIN, "Environment", hf_token_environment),
    "training_job.tags": Member(
        *_TRAIN, "Tags", _with_config_tag, also=_no_reserved_prefix, sent_with=f"the toolkit's own tag {CONFIG_TAG}"
    ),
    "serving.endpoint_name": Member("sagemaker", "CreateEndpoint", "EndpointName"),
    "serving.image_uri": Member("sagemaker", "CreateModel", "PrimaryContainer.Image"),
    "serving.model_data": Member("sagemaker", "CreateModel", "PrimaryContainer.ModelDataSource.S3DataSource.S3Uri"),
    "serving.base_model_data": Member(
        "sagemaker", "CreateModel", "PrimaryContainer.ModelDataSource.S3DataSource.S3Uri"
    ),
    "serving.instance_count": Member(*_ENDPOINT_CONFIG, _VARIANT + "InitialInstanceCount"),
    "serving.volume_size_gb": Member(*_ENDPOINT_CONFIG, _VARIANT + "VolumeSizeInGB"),
    "serving.startup_timeout_seconds": Member(
        *_ENDPOINT_CONFIG, _VARIANT + "ContainerStartupHealthCheckTimeoutInSeconds"
    ),
    "serving.download_timeout_seconds": Member(*_ENDPOINT_CONFIG, _VARIANT + "ModelDataDownloadTimeoutInSeconds"),
    "serving.inference_ami_version": Member(*_ENDPOINT_CONFIG, _VARIANT + "InferenceAmiVersion"),
    "serving.routing": Member(*_ENDPOINT_CONFIG, _VARIANT + "RoutingConfig.RoutingStrategy"),
    "serving.rollback_alarms": Member(
        "sagemaker",
        "UpdateEndpoint",
        "DeploymentConfig.AutoRollbackConfiguration.Alarms",
        lambda alarms: [{"AlarmName": alarm} for alarm in alarms],
    ),
    "serving.component_memory_mb": Member(
        "sagemaker", "CreateInferenceComponent", "Specification.ComputeResourceRequirements.MinMemoryRequiredInMb"
    ),
    "aws.prefix": Member(
        *_TRAIN, "OutputDataConfig.S3OutputPath", lambda prefix: f"s3://{_BUCKET}/{prefix}/{_KEY}", _clean_key_prefix
    ),
    "serving.hf_token_secret": Member("sagemaker", "CreateModel", "PrimaryContainer.Environment", hf_token_environment),
    "serving.vllm_args": Member("sagemaker", "CreateModel", "PrimaryContainer.Environment", vllm_flag_environment),
    "serving.repository": Member("ecr", "CreateRepository", "repositoryName"),
    "hyperpod.image_repository": Member("ecr", "CreateRepository", "repositoryName"),
    # -- a HyperPod cluster: the EKS manifests (k8s.io/apimachinery/pkg/util/validation: names, labels) -----------
    "hyperpod.namespace": Member(*_JOB, "metadata.namespace", also=_k8s_name("label")),  # IsDNS1123Label
    "hyperpod.fsx.claim": Member(
        *_JOB, _POD + "volumes[].persistentVolumeClaim.claimName", also=_k8s_name("subdomain")
    ),  # IsDNS1123Subdomain
    "hyperpod.queue": Member(*_JOB, "metadata.labels.kueue.x-k8s.io/queue-name", also=_kueue_name),
    "hyperpod.priority": Member(*_JOB, "metadata.labels.kueue.x-k8s.io/priority-class", also=_kueue_name),
    "hyperpod.image": Member(*_JOB, _POD + "containers[].image", also=image_reference_problem),  # Slurm: pyxis's
    "hyperpod.service_account": Member(
        "kubernetes", "Job", "spec.template.spec.serviceAccountName", also=_k8s_name("subdomain")
    ),  # the model export's pod (toolkit.targets.hyperpod_eks.export_job)
    # -- the Slurm batch script (slurm.schedmd.com/sbatch.html) ----------------------------------------------------
    "hyperpod.job_dir": Member("slurm", "sbatch", "#SBATCH --output", also=_sbatch_path),
    "hyperpod.fsx.mount_path": Member("slurm", "sbatch", "#SBATCH --output", also=_sbatch_path),
    # -- image builds: the base image a Dockerfile's FROM takes (distribution/reference's grammar) -----------------
    "serving.base_image": Member("docker", "docker build", "--build-arg BASE_IMAGE", also=image_reference_problem),
    "hyperpod.base_image": Member("docker", "docker build", "--build-arg BASE_IMAGE", also=image_reference_problem),
}


# The fields of the AWS-bound sections that are no request member of their own, and where they are checked instead
# (tests/toolkit/test_members.py: every field of aws, training_job and serving is in MEMBERS or here).
CHECKED_ELSEWHERE: dict[str, str] = {
    "aws.region": "names.region_problem: botocore's own partition data",
    "aws.bucket": "names.bucket_name_problem: S3's bucket naming rules",
    "aws.data_buckets": "names.bucket_name_problem",
    "aws.endpoint_url": "where requests go, not in one",
    "aws.registry_url": "where images are pushed, not in a request",
    "training_job.instance_type": "the instance table (toolkit.config.instances): SageMaker's training types",
    "training_job.spot": "a boolean (EnableManagedSpotTraining)",
    "serving.instance_type": "the instance table (toolkit.config.instances): SageMaker's hosting types",
    "serving.weights": "the endpoint's layout (a model, or a base and adapter components), no member",
    "serving.autoscaling": "application-autoscaling capacities: integers without limits in its model, ordered here",
    "serving.tensor_parallel_size": "a vLLM flag in the container environment, checked against the instance's GPUs",
    "serving.max_model_len": "a vLLM flag in the container environment, checked against the model's context",
    "serving.gpu_memory_utilization": "a vLLM flag in the container environment (0-1 in the schema)",
    "serving.max_num_seqs": "a vLLM flag in the container environment",
    "serving.max_loras": "a vLLM flag in the container environment",
    "serving.local_port": "this machine only",
    "serving.eval_port": "this machine only (toolkit eval's local servers)",
    "serving.local_python": "this machine only",
    "hyperpod.orchestrator": "one of the two (the schema's Literal)",
    "hyperpod.instance_type": "the instance table (toolkit.config.instances): a node selector's label value",
    "hyperpod.nodes": "an integer >= 1 (replicas, --nodes)",
    "hyperpod.gpus_per_node": "at most the instance type's GPUs (HyperPodSettings._check)",
    "hyperpod.kube_context": "a context of the kubeconfig, not in a request",
    "hyperpod.max_retries": "an integer >= 0 (jobMaxRetryCount, backoffLimit)",
    "hyperpod.python": "a command on every node, shell-quoted in the script",
    "hyperpod.exclusive": "a boolean (--exclusive)",
    "hyperpod.install": "a boolean (the install step)",
    "hyperpod.eks_job_kind": "one of the two (the schema's Literal)",
}


@functools.cache
def _service(name: str) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(name)


def member_shape(member: Member) -> Any:
    """The botocore shape of the member (KeyError naming the step when the path is not in the model)."""
    shape = _service(member.service).operation_model(member.operation).input_shape
    for step in member.path.split("."):
        shape = shape.members[step.removesuffix("[]")]
        if step.endswith("[]"):
            shape = shape.member
    return shape


# botocore writes Java's Unicode classes, which Python's re lacks. Letters become word characters: that adds digits and
# `_`, which every pattern of these members that allows letters allows too (Tag keys and values), so nothing AWS
# accepts is refused; separators become whitespace, numbers digits.
_UNICODE_CLASSES = {r"\p{L}": r"\w", r"\p{Z}": r"\s", r"\p{N}": r"\d"}


@functools.cache
def _pattern(pattern: str) -> re.Pattern[str]:
    for java, python in _UNICODE_CLASSES.items():
        pattern = pattern.replace(java, python)
    return re.compile(pattern)


def shape_problem(shape: Any, value: Any) -> str | None:
    """What the service would refuse in this value of this shape; None when it takes it."""
    meta, kind = shape.metadata, shape.type_name
    if kind == "list":
        if not meta.get("min", 0) <= len(value) <= meta.get("max", len(value)):
            return f"{len(value)} entries, where AWS takes {meta.get('min', 0)} to {meta.get('max')}"
        return next((p for p in (shape_problem(shape.member, item) for item in value) if p), None)
    if kind == "map":
        if len(value) > meta.get("max", len(value)):
            return f"{len(value)} entries, where AWS takes at most {meta['max']}"
        for key, item in value.items():
            problem = shape_problem(shape.key, key) or shape_problem(shape.value, item)
            if problem:
                return problem
        return None
    if kind == "structure":
        return next((p for name, item in value.items() if (p := shape_problem(shape.members[name], item))), None)
    if kind == "string":
        text = str(value)
        if shape.enum and text not in shape.enum:
            return f"{brief(text)} is not one of {', '.join(shape.enum)}"
        if not meta.get("min", 0) <= len(text) <= meta.get("max", len(text)):
            return (
                f"{brief(text)} has {len(text)} characters, where AWS takes {meta.get('min', 0)} to {meta.get('max')}"
            )
        if "pattern" in meta and not _pattern(meta["pattern"]).fullmatch(text):
            return f"{brief(text)} does not match AWS's pattern {meta['pattern']}"
        return None
    if kind in ("integer", "long") and not meta.get("min", value) <= value <= meta.get("max", value):
        return f"{value} is outside AWS's range {meta.get('min', '-')} to {meta.get('max', '-')}"
    return None


def member_problem(path: str, member: Member, value: Any, shapes: bool = True) -> str | None:
    """`shapes`: check botocore's shape too (False where botocore is not installed: the documented rule alone)."""
    sent = member.to_request(value) if member.to_request else value
    shaped = None if member.service in RECEIVERS or not shapes else shape_problem(member_shape(member), sent)
    problem = shaped or (member.also(sent) if member.also else None)
    if problem is None:
        return None
    added = f", with {member.sent_with}" if member.sent_with else ""
    who = WHO.get(member.service, "AWS")
    return f"{path}: {problem} ({member.operation} {member.path}{added}); give a value {who} accepts"


# Every training setting reaches a training job as a hyperparameter (toolkit_train.settings.to_hyperparameters: the
# setting's dotted path -> its value as text), so each must fit this map's key and value rules (2,500 characters).
HYPERPARAMETERS = Member(*_TRAIN, "HyperParameters")


def hyperparameter_problem(config: Config) -> str | None:
    """What CreateTrainingJob would refuse in the hyperparameters a training job of this config carries (None
    where botocore, whose service model says it, is not installed)."""
    from toolkit_train.settings import to_hyperparameters

    if importlib.util.find_spec("botocore") is None:
        return None
    sent = to_hyperparameters(config.train_settings())
    shape = member_shape(HYPERPARAMETERS)
    if len(sent) > shape.metadata.get("max", len(sent)):
        most = shape.metadata["max"]
        return f"the training settings make {len(sent)} hyperparameters, where a training job takes {most}"
    for key, value in sent.items():
        problem = shape_problem(shape.key, key) or shape_problem(shape.value, value)
        if problem:
            return (f"{key}: {problem} (CreateTrainingJob HyperParameters: a training job receives every training "
                    "setting as one); give a shorter value")  # fmt: skip
    return None


def _received(member: Member, config: Config, botocore: bool) -> bool:
    """Whether the config sends this member anywhere: AWS's where botocore is here to check it, a cluster's where
    its orchestrator is the config's."""
    if member.service not in RECEIVERS:
        return botocore
    where = RECEIVERS[member.service]
    return where is None or config.hyperpod.orchestrator in where


def refuse_what_aws_refuses(config: Config) -> None:
    """ValueError naming the first set value its request member refuses."""
    botocore = importlib.util.find_spec("botocore") is not None
    for path, member in MEMBERS.items():
        value = value_at(config, path)
        if value is None or value == default_at(path, type(config)) or value in ([], {}):  # unset, or nothing sent
            continue
        if _received(member, config, botocore):
            problem = member_problem(path, member, value)
        else:  # an AWS member without botocore: its documented rule still holds (a reserved tag key, 28 days)
            problem = member_problem(path, member, value, shapes=False) if member.service not in RECEIVERS else None
        if problem:
            raise ValueError(problem)
