"""The toolkit's config: the shared training settings plus one section per target, serving and AWS."""

from __future__ import annotations

import difflib
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator
from toolkit_train.settings import StrictModel, TrainSettings

from toolkit.config.applicability import refuse_inapplicable
from toolkit.config.instances import MICRO_BATCH_LIMITS, MODELS, instance, local_gpus
from toolkit.config.members import refuse_what_aws_refuses
from toolkit.config.metrics import EVAL_METRICS
from toolkit.config.names import bucket_name_problem, bucket_of, in_ecr_repository, region_problem
from toolkit.config.targets import TARGET_SETTINGS, HyperPodSettings, LocalSettings, TargetSettings, TrainingJobSettings
from toolkit.errors import brief

# The tags `toolkit image build` pushes into the stack's immutable repositories: `<prefix>-<content hash>`.
IMAGE_TAG_PREFIXES = {"serving": "serve", "training": "train"}
CONTENT_TAG_DIGITS = 12
# Every image field that may name one of those repositories: (field, the field naming the repository, the image).
IMMUTABLE_IMAGE_FIELDS = [
    ("hyperpod.image", "hyperpod.image_repository", "training"),
    ("training_job.image_uri", "hyperpod.image_repository", "training"),
    ("serving.image_uri", "serving.repository", "serving"),
]


class AutoscalingSettings(StrictModel):
    """Target tracking on invocations per instance (Application Auto Scaling)."""

    min_instances: int = Field(1, ge=1, description="Never fewer instances than this.")
    max_instances: int = Field(2, ge=1, description="Never more instances than this.")
    invocations_per_instance: int = Field(
        20, ge=1, description="Target SageMakerVariantInvocationsPerInstance (requests per minute per instance)."
    )

    @model_validator(mode="after")
    def _check(self) -> AutoscalingSettings:
        if self.max_instances < self.min_instances:
            raise ValueError("serving.autoscaling.max_instances must be >= min_instances")
        return self


# serving.vllm_args keys that the toolkit sets itself, or that would break the hosting contract (a vLLM flag's name as
# containers/serving/serve.py spells it -> where it comes from instead). A key here would replace the toolkit's value
# and skip its check (SM_VLLM_<NAME> of the same name), or make the endpoint unreachable. tests/toolkit/
# test_config_input.py ties it to every SM_VLLM_* setting the deploy code and serve.py set.
TOOLKIT_VLLM_FLAGS = {
    "port": "SageMaker sends every request to port 8080 (the hosting contract; --target local: serving.local_port)",
    "host": "the server listens where the hosting contract says (0.0.0.0 in the container, 127.0.0.1 locally)",
    "uds": "SageMaker reaches the server on port 8080, not on a Unix socket",
    "api-key": "SageMaker's /invocations and the toolkit's own client (eval, chat) send no key: every request "
    "would be refused",
    "ssl-keyfile": "SageMaker's health checks and requests reach the container over plain HTTP",
    "ssl-certfile": "SageMaker's health checks and requests reach the container over plain HTTP",
    "served-model-name": "requests, `toolkit eval` and `toolkit chat` select the model by the config's name: change "
    "`name`",
    "model": "the served model is the training run's output (serving.model_data), or model.id under serving.weights: "
    "adapter",
    "base-model": "set model.id (with serving.weights: adapter)",
    "revision": "set model.revision",
    "adapter-name": "the adapter is served as 'adapter', the name requests select it by",
    "lora-modules": "serving.weights: adapter serves the run's adapter (as 'adapter')",
    "enable-lora": "set serving.weights: adapter",
    "max-lora-rank": "the toolkit derives it from lora.r and lora.expert_r (rounded up to a rank vLLM serves)",
    "max-loras": "set serving.max_loras",
    "max-model-len": "set serving.max_model_len (checked against data.max_length and the model's context)",
    "max-num-seqs": "set serving.max_num_seqs",
    "tensor-parallel-size": "set serving.tensor_parallel_size (checked against the instance's GPUs and the model's "
    "attention heads)",
    "gpu-memory-utilization": "set serving.gpu_memory_utilization",
}
_FLAG_NAME = re.compile(r"(--)?[A-Za-z0-9][A-Za-z0-9_-]*")
# The largest --max-lora-rank the pinned vLLM serves (containers/serving/serve.py's VLLM_LORA_RANKS, read from vLLM
# 0.32's MaxLoRARanks; tests/toolkit/test_config_input.py ties the two): an adapter of a higher rank cannot be served
VLLM_MAX_LORA_RANK = 512


def vllm_flag(key: str) -> str:
    """A serving.vllm_args key as the vLLM flag serve.py passes (`--Max_Model_Len` and `max-model-len` are one)."""
    return key.removeprefix("--").replace("_", "-").lower()


# The parser flags serving.vllm_args may set -> the names the pinned vLLM knows for it (containers/serving/
# vllm-parsers.json, read from vLLM 0.32 by a test) and what `false` does there
PARSER_FLAGS = {"reasoning-parser": "reasoning_parsers", "tool-call-parser": "tool_call_parsers"}


def _parser_names(kind: str) -> list[str]:
    import json

    from toolkit.resources import SERVING_CONTEXT

    known = json.loads((SERVING_CONTEXT / "vllm-parsers.json").read_text())
    return [*known[kind], *known["added_by_the_image"].get(kind, [])]


def _parser_problem(key: str, flag: str, value: object) -> str | None:
    """A parser setting vLLM would refuse at start (after the endpoint's instance started), or that breaks the
    toolkit's own checks: `true`, an unknown name; no tool-call parser at all (the prompt-parity check and the
    clients send tools, which vLLM refuses without one)."""
    if isinstance(value, str) and value.lower() in ("true", "false"):  # serve.py reads them as the booleans
        value = value.lower() == "true"
    if value is False and flag == "reasoning-parser":
        return None  # no reasoning parser: the serving image drops the default
    if value is False:
        return (
            f"serving.vllm_args.{key}: false: deploy's prompt-parity check and the toolkit's clients send tools, "
            "which vLLM refuses without a tool-call parser; name one, e.g. hermes (JSON in <tool_call>) or "
            "qwen3_coder (XML <function=...>)"
        )
    if value is True:
        return f"serving.vllm_args.{key}: true: --{flag} takes a parser's name (e.g. qwen3, hermes), or false"
    names = _parser_names(PARSER_FLAGS[flag])
    if not isinstance(value, str) or value not in names:
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return (
            f"serving.vllm_args.{key}: {brief(value)} is no {flag.replace('-', ' ')} the pinned vLLM knows: "
            f"{hint}one of {', '.join(names)}"
        )
    return None


def _vllm_args_problem(args: object) -> str | None:
    """What is wrong with serving.vllm_args (None: nothing): a key that is no flag name, that names a flag the toolkit
    sets (TOOLKIT_VLLM_FLAGS), or the same flag twice; a value that is not text, a finite number or true/false."""
    import math

    if not isinstance(args, dict):
        return None  # the type check says it
    seen: dict[str, str] = {}
    for key, value in args.items():
        if not isinstance(key, str) or not _FLAG_NAME.fullmatch(key):
            return (
                f"serving.vllm_args: key {brief(key)} is no vLLM flag name (letters, digits and hyphens, e.g. "
                "enable-prefix-caching)"
            )
        flag = vllm_flag(key)
        if flag in TOOLKIT_VLLM_FLAGS:
            return (
                f"serving.vllm_args: {key!r} is a flag the toolkit sets itself: remove it; " + TOOLKIT_VLLM_FLAGS[flag]
            )
        if flag in seen:
            return f"serving.vllm_args: {seen[flag]!r} and {key!r} are the same flag --{flag}; keep one"
        seen[flag] = key
        if flag in PARSER_FLAGS and (problem := _parser_problem(key, flag, value)):
            return problem
        if isinstance(value, float) and not math.isfinite(value):
            return f"serving.vllm_args.{key}: {value} is not a finite number; write a number"
        if not isinstance(value, str | int | float | bool):
            return f"serving.vllm_args.{key}: a flag's value is text, a number or true/false, not {brief(value)}"
    return None


class ServingSettings(StrictModel):
    """The vLLM endpoint (SageMaker) or local server."""

    endpoint_name: str | None = Field(
        None, pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$", max_length=52, description="Default: the config name."
    )
    image_uri: str | None = Field(
        None, description="Serving image; default: containers/serving built and pushed to ECR."
    )
    repository: str = Field(
        "toolkit-serving", description="ECR repository of the built image (`toolkit infra` makes it)."
    )
    base_image: str | None = Field(
        None, description="vLLM image to build on; default: the Dockerfile's pinned release."
    )
    model_data: str | None = Field(
        None, description="S3 URI of model.tar.gz; default: the latest completed training job of this config."
    )
    base_model_data: str | None = Field(
        None,
        description="serving.weights: adapter: an s3:// prefix holding a copy of model.id's checkpoint (config.json, "
        "safetensors, tokenizer) that the endpoint's base component loads instead of downloading model.id from the "
        "hub at every start.",
    )
    weights: Literal["merged", "adapter"] = Field(
        "merged", description="Serve the merged model, or model.id plus the LoRA adapter (--enable-lora)."
    )
    instance_type: str = Field("ml.g6e.2xlarge", description="Endpoint GPU instance type.")
    instance_count: int = Field(1, ge=1, description="Endpoint instances.")
    volume_size_gb: int | None = Field(None, ge=1, description="EBS volume (only instance types without NVMe storage).")
    startup_timeout_seconds: int = Field(
        1800, ge=60, le=3600, description="Container health-check timeout: model load + vLLM start-up."
    )
    download_timeout_seconds: int = Field(1800, ge=60, le=3600, description="Model data download timeout.")
    # The host's GPU driver must run the image's CUDA: vLLM 0.32's image is built on CUDA 12.9+/13.0, which needs a
    # 575+ driver; AWS's gpu-4-1 AMI has driver 580 / CUDA 13.0 (gpu-3-1: 550 / 12.4, gpu-2*: 535 / 12.2 are older).
    inference_ami_version: Literal[
        "al2023-ami-sagemaker-inference-gpu-4-1", "al2-ami-sagemaker-inference-gpu-3-1",
        "al2-ami-sagemaker-inference-gpu-2-1", "al2-ami-sagemaker-inference-gpu-2",
    ] = Field(
        "al2023-ami-sagemaker-inference-gpu-4-1",
        description="Endpoint host image (NVIDIA driver + CUDA); the default's driver 580 runs the serving image.",
    )  # fmt: skip
    routing: Literal["LEAST_OUTSTANDING_REQUESTS", "RANDOM"] = Field(
        "LEAST_OUTSTANDING_REQUESTS", description="How the endpoint routes requests between instances."
    )
    rollback_alarms: list[str] = Field(
        default_factory=list, description="CloudWatch alarms that roll an update back while they fire."
    )
    autoscaling: AutoscalingSettings | None = Field(None, description="Scale the instance count on load.")
    tensor_parallel_size: int | None = Field(None, ge=1, description="Default: the instance's GPUs.")
    max_model_len: int = Field(8192, ge=16, description="vLLM --max-model-len.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM --gpu-memory-utilization.")
    max_num_seqs: int = Field(64, ge=1, description="vLLM --max-num-seqs (concurrent sequences).")
    vllm_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="More vLLM flags, e.g. {enable-prefix-caching: false} (SM_VLLM_* env; false: --no-<flag>).",
    )
    max_loras: int = Field(4, ge=1, description="vLLM --max-loras: adapters in one batch (weights: adapter).")
    hf_token_secret: str | None = Field(
        None,
        description="Secrets Manager secret with the Hugging Face token for a gated base that the serving container "
        "downloads from the hub (weights: adapter); the execution role must read it.",
    )
    component_memory_mb: int = Field(
        16384, ge=128, description="Host memory the base inference component reserves (weights: adapter, SageMaker)."
    )
    local_port: int = Field(8080, ge=1, le=65535, strict=True, description="Port of `toolkit deploy --target local`.")
    eval_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        strict=True,  # a number: `true` or "8081" are no port (YAML's true would be port 1)
        description="Port `toolkit eval --target local` serves each model on in turn (the base, then the fine-tuned "
        "one; never both at once). Default: a free port the OS picks at each start, which a firewall or a CI "
        "runner with fixed open ports cannot allow for.",
    )
    local_python: str | None = Field(
        None,
        description="Python with vLLM for local serving; default: .venv-serve (WITH_SERVE=1 source scripts/env.sh).",
    )

    @field_validator("vllm_args", mode="before")
    @classmethod
    def _flags_of_the_user(cls, value: object) -> object:
        problem = _vllm_args_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _check(self) -> ServingSettings:
        gpus = instance(self.instance_type, "serving.instance_type").gpus
        if self.tensor_parallel_size is None:
            self.tensor_parallel_size = gpus
        elif self.tensor_parallel_size > gpus:
            raise ValueError(
                f"serving.tensor_parallel_size is {self.tensor_parallel_size} but {self.instance_type} has {gpus} GPUs"
            )
        if self.volume_size_gb is not None and instance(self.instance_type, "serving.instance_type").local_nvme:
            raise ValueError(
                f"serving.volume_size_gb: {self.instance_type} serves from its NVMe instance storage and SageMaker "
                "refuses an EBS volume size for it: remove serving.volume_size_gb"
            )
        if self.model_data and not self.model_data.startswith("s3://"):
            raise ValueError(
                f"serving.model_data: {brief(self.model_data)} is not an s3:// URI (a model.tar.gz or a prefix "
                "ending in /)"
            )
        if self.base_model_data and not (
            self.base_model_data.startswith("s3://") and self.base_model_data.endswith("/")
        ):
            raise ValueError(
                f"serving.base_model_data: {brief(self.base_model_data)} is not an s3:// prefix ending in / (the "
                "folder holding the base checkpoint's files, which SageMaker copies into the container)"
            )
        if self.autoscaling and self.autoscaling.min_instances > self.instance_count:
            raise ValueError("serving.autoscaling.min_instances must be <= serving.instance_count")
        return self


class GateSettings(StrictModel):
    """`toolkit register`'s gate over the eval report: passes: Approved, fails: Rejected, no report: pending."""

    metric: str = Field("rougeL", description=f"The eval report's metric to compare: {', '.join(EVAL_METRICS)}.")
    min_margin: float = Field(
        0.0, ge=-1, le=1, description="Fine-tuned minus baseline on `metric` must be at least this (metrics are 0..1)."
    )
    require_ci: bool = Field(
        False,
        description="Also the lower bound of the difference's 95% bootstrap interval must lie above min_margin "
        "(an interval that reaches it does not rule out no gain).",
    )
    min_format_valid: float | None = Field(
        None, ge=0, le=1,
        description="Share of held-out rows the fine-tuned model answers well-formed (failed rows count as not).",
    )  # fmt: skip

    @field_validator("metric")
    @classmethod
    def _scored_metric(cls, value: str) -> str:
        if value not in EVAL_METRICS:
            raise ValueError(
                f"registry.gate.metric: {brief(value)} is not a metric the eval report has; use one of: "
                f"{', '.join(EVAL_METRICS)}"
            )
        return value


class RegistrySettings(StrictModel):
    """`toolkit register`: the Model Package Group named after the config, and how a version gets approved."""

    gate: GateSettings | None = Field(
        None, description="Approve or reject from the eval report; unset: PendingManualApproval (or --approve)."
    )


class AwsSettings(StrictModel):
    """Where the cloud resources live."""

    region: str = Field("us-east-1", description="AWS region.")
    role: str | None = Field(None, description="SageMaker execution role ARN.")
    bucket: str | None = Field(None, description="S3 bucket for code, data and artifacts.")
    prefix: str = Field("toolkit", description="Key prefix inside the bucket.")
    data_buckets: list[str] = Field(
        default_factory=list,
        description="Other buckets the execution role may read data from (`toolkit infra deploy --data-bucket`).",
    )
    endpoint_url: str | None = Field(None, description="Override every AWS endpoint (e.g. a local emulator).")
    registry_url: str | None = Field(
        None, description="Override the ECR registry that images are pushed to (e.g. http://127.0.0.1:5000)."
    )

    @model_validator(mode="after")
    def _check(self) -> AwsSettings:
        if self.endpoint_url is not None and not re.fullmatch(
            r"https?://[^\s/:]+(:\d{1,5})?(/\S*)?", self.endpoint_url
        ):
            raise ValueError(
                f"aws.endpoint_url: {brief(self.endpoint_url)} is not an http(s):// URL (e.g. http://127.0.0.1:5000): "
                "fix it, or remove it to reach AWS"
            )
        if self.role and not re.fullmatch(r"arn:aws[\w-]*:iam::\d{12}:role/.+", self.role):
            raise ValueError("aws.role must be an IAM role ARN like arn:aws:iam::123456789012:role/Name")
        problem = region_problem(self.region)
        if problem:
            raise ValueError(f"aws.region: {problem}")
        buckets = {"aws.bucket": self.bucket} | {f"aws.data_buckets[{i}]": b for i, b in enumerate(self.data_buckets)}
        for field, bucket in buckets.items():
            problem = bucket_name_problem(bucket) if bucket else None
            if problem:
                raise ValueError(f"{field}: {problem}")
        return self


class Config(TrainSettings):
    """One file drives training on every target and the deployment."""

    name: str = Field(
        pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$",
        max_length=48,
        description="Job and endpoint name prefix (letters, digits, hyphens).",
    )
    target: str = Field(
        "local",
        description=f"Default target of `toolkit train`: {' | '.join(TARGET_SETTINGS)}.",
        json_schema_extra={"enum": list(TARGET_SETTINGS)},
    )
    local: LocalSettings = Field(default_factory=LocalSettings)
    training_job: TrainingJobSettings = Field(default_factory=TrainingJobSettings)
    hyperpod: HyperPodSettings = Field(default_factory=HyperPodSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    aws: AwsSettings = Field(default_factory=AwsSettings)

    @field_validator("target")
    @classmethod
    def _known_target(cls, value: str) -> str:
        if value not in TARGET_SETTINGS:
            raise ValueError(f"target: unknown target {brief(value)}; choose one of: {', '.join(TARGET_SETTINGS)}")
        return value

    def target_settings(self) -> TargetSettings:
        """The active target's section (`target` picks it)."""
        return getattr(self, TARGET_SETTINGS[self.target].section)

    def served_parser(self, flag: str) -> str | None:
        """The vLLM parser `flag` (reasoning-parser, tool-call-parser) the model is served with as far as the config
        tells: serving.vllm_args', else the family's default (a Qwen3 variant's template may change the default in
        the image: containers/serving/serve.py); None: none (a record-less causal LM by default, or `false`)."""
        for key, value in self.serving.vllm_args.items():
            if vllm_flag(key) == flag:
                return None if str(value).lower() == "false" else str(value)
        return self.model.family.vllm_defaults.get(f"--{flag}")

    @property
    def writes_reasoning(self) -> bool:
        """The served model's replies carry reasoning apart from the answer: gpt-oss's analysis channel, or a
        template's reasoning block that a reasoning parser takes apart, trained with the rows' reasoning (not
        data.reasoning: drop). What `toolkit invoke --check` and the eval's format score require."""
        if self.model.family.chat_format == "harmony":
            return True
        return self.data.reasoning == "keep" and self.served_parser("reasoning-parser") is not None

    @model_validator(mode="after")
    def _target_needs(self) -> Config:
        missing = self.target_settings().needs(self)
        if missing:
            raise ValueError(missing)
        return self

    @model_validator(mode="after")
    def _built_images_by_their_tag(self) -> Config:
        """The stack's repositories are immutable and hold only content-hash tags: `:latest` (or any other tag)
        would be pulled from nothing (ImagePullBackOff on EKS, a failed job or endpoint)."""
        for field, repository_field, kind in IMMUTABLE_IMAGE_FIELDS:
            image = self._field(field)
            if not image or "@sha256:" in image:
                continue
            path, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
            prefix = IMAGE_TAG_PREFIXES[kind]
            if not in_ecr_repository(image, self._field(repository_field)):
                continue  # another registry or repository: its tags are its own
            if not re.fullmatch(rf"{prefix}-[0-9a-f]{{{CONTENT_TAG_DIGITS}}}", tag):
                raise ValueError(
                    f"{field}: tag {tag or '(none)'!r} of {path}, an immutable repository that holds only the tags "
                    f"`toolkit image build {kind}` pushes ({prefix}-<content hash>): use the tag it prints"
                )
        return self

    def runs_the_built_training_image(self) -> bool:
        """training_job.image_uri is `toolkit image build training`'s image: the locked stack is in it, so the job
        installs nothing at start."""
        return in_ecr_repository(self.training_job.image_uri, self.hyperpod.image_repository)

    def _field(self, dotted: str) -> str | None:
        section, name = dotted.split(".")
        return getattr(getattr(self, section), name)

    @model_validator(mode="after")
    def _data_bucket_is_readable(self) -> Config:
        for field, uri in (
            ("data.source", self.data.source),
            ("serving.model_data", self.serving.model_data),
            ("serving.base_model_data", self.serving.base_model_data),
        ):
            problem = bucket_name_problem(bucket_of(uri)) if uri and uri.startswith("s3://") else None
            if problem:
                raise ValueError(f"{field}: the bucket of {brief(uri)}: {problem}")
        return self

    @model_validator(mode="after")
    def _serving_context_holds_a_training_row(self) -> Config:
        if self.serving.max_model_len < self.data.max_length:
            raise ValueError(
                f"serving.max_model_len ({self.serving.max_model_len}) is below data.max_length "
                f"({self.data.max_length}): a conversation as long as the training rows would be refused; "
                "raise serving.max_model_len"
            )
        shape = MODELS.get(self.model.id)
        if shape and self.serving.max_model_len > shape.context:
            raise ValueError(
                f"serving.max_model_len ({self.serving.max_model_len}) is above {self.model.id}'s context of "
                f"{shape.context} tokens (vLLM refuses to start): lower serving.max_model_len"
            )
        return self

    @model_validator(mode="after")
    def _adapter_is_servable(self) -> Config:
        """An expert-LoRA adapter of a family whose vLLM MoE layer cannot load one is served merged only."""
        family = self.model.family  # (all-linear on such a family is refused or named per module already)
        if self.serving.weights == "adapter" and self.lora.target_parameters and not family.serves_expert_adapters:
            raise ValueError(
                f"serving.weights: adapter: vLLM 0.32 cannot load a {family.name} adapter that adapts the experts "
                "(lora.target_parameters); serve the merged model (serving.weights: merged, "
                "training.merge_adapter: true), or remove lora.target_parameters"
            )
        if self.serving.weights == "adapter" and self.lora.max_rank > VLLM_MAX_LORA_RANK:
            raise ValueError(
                f"serving.weights: adapter: the adapter's rank {self.lora.max_rank} (lora.r, lora.expert_r) is above "
                f"the largest LoRA rank vLLM 0.32 serves ({VLLM_MAX_LORA_RANK}): lower it, or serve the merged model "
                "(serving.weights: merged)"
            )
        return self

    @model_validator(mode="after")
    def _tensor_parallel_divides_the_heads(self) -> Config:
        shape, tp = MODELS.get(self.model.id), self.serving.tensor_parallel_size
        if shape is None or tp is None:
            return self
        if shape.attention_heads % tp or (shape.kv_heads % tp and tp % shape.kv_heads):
            choices = [n for n in (1, 2, 4, 8) if shape.attention_heads % n == 0 and shape.kv_heads % n == 0]
            raise ValueError(
                f"serving.tensor_parallel_size ({tp}) does not divide {self.model.id}'s {shape.attention_heads} "
                f"attention heads / {shape.kv_heads} KV heads (vLLM refuses to start): use one of {choices}"
            )
        return self

    @model_validator(mode="after")
    def _ddp_model_fits_one_gpu(self) -> Config:
        """ddp keeps a whole copy of the frozen model on every GPU (experts bf16 or packed MXFP4); fsdp shards it."""
        shape = MODELS.get(self.model.id)
        gpu = self.training_gpu()
        if shape is None or gpu is None or self.training.distributed != "ddp":
            return self
        gpu_gib, instance_type, larger = gpu
        weights_gib = shape.weights_gib(self.model.experts)
        if weights_gib > 0.9 * gpu_gib:  # the rest: LoRA weights, optimizer state, activations
            held = "experts in MXFP4" if self.model.experts == "mxfp4" else "in bf16"
            packed = "" if self.model.experts == "mxfp4" or not shape.expert_params_b else (
                f", model.experts: mxfp4 (~{shape.packed_gib:.0f} GiB)"
            )  # fmt: skip
            raise ValueError(
                f"training.distributed: ddp puts all of {self.model.id} (~{weights_gib:.0f} GiB, {held}) on each "
                f"{gpu_gib} GiB GPU of {instance_type}: set training.distributed: fsdp (shards it over the GPUs)"
                f"{packed} or {larger}"
            )
        return self

    @model_validator(mode="after")
    def _micro_batch_below_what_ran_out_of_memory(self) -> Config:
        """A packed micro-batch measured to run out of memory on this GPU fails only after the job has loaded."""
        budget, training, gpu = self.micro_batch_tokens(), self.training, self.training_gpu()
        if gpu is None or not training.packing or training.method_record.samples or training.distributed != "ddp":
            return self  # GRPO packs nothing
        gpu_gib, instance_type, larger = gpu
        measured = MICRO_BATCH_LIMITS.get((self.model.id, self.model.experts, gpu_gib))
        if measured and budget >= measured.out_of_memory:
            raise ValueError(
                f"training.tokens_per_micro_batch: {budget} is too many for {self.model.id} (model.experts: "
                f"{self.model.experts}) on the {gpu_gib} GiB GPUs of {instance_type}: {measured.out_of_memory} ran "
                f"out of memory there ({measured.source}); set it to {measured.fits} or less (fits, with "
                f"training.gradient_checkpointing on) or {larger}"
            )
        return self

    @model_validator(mode="after")
    def _merged_model_fits_the_endpoint(self) -> Config:
        shape = MODELS.get(self.model.id)
        serving = self.serving
        if shape is None or serving.weights != "merged" or serving.tensor_parallel_size is None:
            return self
        weights_gib = shape.weights_gib(self.model.experts)  # merged as trained: bf16, or experts still MXFP4
        usable = serving.tensor_parallel_size * instance(serving.instance_type, "serving.instance_type").gpu_memory_gib
        if weights_gib > 0.8 * usable * serving.gpu_memory_utilization:  # the rest: KV cache, activations
            raise ValueError(
                f"serving: the merged {self.model.id} is ~{weights_gib:.0f} GiB of weights but "
                f"{serving.instance_type} gives vLLM ~{usable * serving.gpu_memory_utilization:.0f} GiB on "
                f"{serving.tensor_parallel_size} GPU(s), with too little left for the KV cache: choose a larger "
                "serving.instance_type (e.g. ml.g6e.12xlarge for 20b, ml.p5.48xlarge for 120b)"
            )
        return self

    @model_validator(mode="after")
    def _arns_are_in_the_configs_region(self) -> Config:
        """A setting that may be an ARN is asked for in aws.region (DescribeCluster, GetSecretValue): an ARN of
        another region is not found there, after a job or an endpoint started."""
        for field, value in (
            ("hyperpod.cluster", self.hyperpod.cluster),
            ("training_job.hf_token_secret", self.training_job.hf_token_secret),
            ("serving.hf_token_secret", self.serving.hf_token_secret),
        ):
            parts = value.split(":") if value and value.startswith("arn:") else []
            if len(parts) > 4 and parts[3] and parts[3] != self.aws.region:
                raise ValueError(
                    f"{field}: the ARN is in {parts[3]} but aws.region is {self.aws.region}, where the toolkit asks "
                    f"for it: set aws.region: {parts[3]}, or name the resource in {self.aws.region}"
                )
        return self

    @model_validator(mode="after")
    def _values_aws_takes(self) -> Config:
        refuse_what_aws_refuses(self)  # the one table from setting to request member (toolkit.config.members)
        return self

    @model_validator(mode="after")
    def _settings_apply_here(self) -> Config:
        refuse_inapplicable(self)  # the one table of where settings apply (toolkit.config.applicability); last: the
        # checks above say more about a wrong combination (e.g. a model that does not fit under ddp)
        return self

    def training_gpu(self) -> tuple[int, str, str] | None:
        """(GiB of one training GPU, what has it, how to get a larger one) for the memory checks: the instance type
        on cloud targets, this machine's first GPU on target local; None on a machine without one (those checks
        are skipped: `skipped_checks` names them)."""
        sized_by = self.target_settings().gpu_instance()
        if sized_by is not None:
            instance_type, field = sized_by
            return instance(instance_type, field).gpu_memory_gib, instance_type, f"choose a larger {field}"
        gpus = local_gpus()
        if not gpus:
            return None
        return gpus[0], "this machine", "train where the GPUs are larger (e.g. --target training-job)"

    def skipped_checks(self) -> list[str]:
        """The checks that need a GPU's size and had none to read (target local on a machine without GPUs)."""
        if self.target_settings().gpu_instance() is not None or local_gpus():
            return []
        packed = self.training.packing and not self.training.method_record.samples  # GRPO packs nothing
        return ["the model fits one GPU under ddp"] + ["the packed micro-batch fits the GPU (measured limits)"] * packed

    def gpus(self) -> int:
        """Training processes (one per GPU) the target runs: the world size the job will see."""
        return self.target_settings().gpus()

    def optimizer_step(self) -> list[str]:
        """What one optimizer step averages over on this target, said plainly (packing changes it: the recipes
        count rows, packed micro-batches count tokens)."""
        t, world = self.training, self.gpus()
        accumulation = t.gradient_accumulation_steps
        rows_unpacked = t.per_device_batch_size * accumulation * world
        lines = [f"{world} GPU process(es) x {accumulation} micro-batch(es) per optimizer step"]
        if t.method_record.samples:
            grpo = t.grpo
            lines.append(
                f"GRPO: {rows_unpacked} prompts per optimizer step ({t.per_device_batch_size} per micro-batch), "
                f"{grpo.num_generations} replies sampled for each, up to {grpo.max_completion_length:,} tokens: "
                f"{rows_unpacked * grpo.num_generations} replies scored by {len(grpo.rewards)} reward(s)"
            )
            return lines  # nothing packed, no labelled tokens
        if t.method_record.pairs:
            layout = "one packed row, no padding" if t.packing else "padded rows (training.packing: false)"
            lines.append(
                f"DPO: {rows_unpacked} pairs per optimizer step ({t.per_device_batch_size} per micro-batch, their "
                f"chosen and rejected replies in {layout})"
            )
        elif t.packing:
            budget = self.micro_batch_tokens()
            lines.append(
                f"packed: up to {budget * accumulation * world:,} tokens per optimizer step ({budget:,} per "
                f"micro-batch); rows per step = those tokens / your rows' mean length (the job prints it); "
                f"unpacked (training.packing: false, as the recipes) it would be {rows_unpacked} rows"
            )
        else:
            lines.append(
                f"unpacked: {rows_unpacked} rows per optimizer step, up to "
                f"{rows_unpacked * self.data.max_length:,} tokens"
            )
        lines.append(f"loss on: {self.data.loss_on} tokens")
        return lines

    def train_settings(self) -> TrainSettings:
        """The part the training entrypoint receives."""
        return TrainSettings.model_validate(self.model_dump(include=set(TrainSettings.model_fields)))
