"""Where settings apply: one table (toolkit.config.applicability), one check, through the CLI."""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import re
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from pydantic import BaseModel
from toolkit_train.settings import (
    SAMPLE_DATASET,
    TINY_GPT_OSS,
    TINY_GPT_OSS_MXFP4,
    TINY_GPT_OSS_TOOLS,
    TOOL_SAMPLE_DATASET,
)

from toolkit.config.applicability import SCOPES, rows, value_at
from toolkit.config.models import Config
from toolkit.errors import BadInput
from toolkit.targets.base import get_target

# Which fields must have a row. (a) Every field of a target section: a `Config` field whose model is a target's
# (LocalSettings, TrainingJobSettings, HyperPodSettings), nested sections included; so a new target field fails here
# until its author says where it applies. (b) Outside them, a field whose description already says where it applies,
# in the schema's own words ("EKS:", "Slurm", "spot only", "fsdp:", "local runs only", "for report_to",
# "cosine_with_min_lr", "--target local", "local serving"): the description is the marker, so a described scope
# without a row is caught too.
SCOPE_WORDS = re.compile(
    r"EKS:|Slurm|[Ss]pot only|fsdp:|local runs only|for report_to|cosine_with_min_lr|--target local|local serving"
)
# Where to give a row's field a value other than its default, to show it refused where it cannot apply: a new
# conditional row without an example fails test_every_conditional_row_is_refused_through_the_cli.
EXAMPLES = {
    "data.reasoning_effort": "high",
    "training.fsdp_sharding": "hybrid_shard",
    "training.min_lr_rate": "0.2",
    "training.packing": "false",
    "training.dpo": "{beta: 0.2}",
    "training.grpo": "{num_generations: 8}",
    "data.loss_on": "all",
    "data.overlong": "truncate",
    ("registry.gate.metric", "dpo"): "preference_accuracy",  # a field with two rows on one setting: one per row
    ("registry.gate.metric", "sft"): "chrF",
    "registry.gate.min_format_valid": "0.9",
    "training.mlflow": "{tracking_uri: 'http://127.0.0.1:5000'}",
    "training.mlflow.tracking_uri": "file:/tmp/mlruns",
    "training_job.max_wait_seconds": "172800",
    "hyperpod.fsx.claim": "my-claim",
    "hyperpod.namespace": "team-a",
    "hyperpod.service_account": "model-export",
    "hyperpod.kube_context": "ctx",
    "hyperpod.queue": "q",
    "hyperpod.priority": "high",
    "hyperpod.max_retries": "5",
    "hyperpod.eks_job_kind": "PyTorchJob",
    "hyperpod.python": "/opt/venv/bin/python",
    "hyperpod.exclusive": "false",
    "training.num_epochs": "3",
    "training.tokens_per_micro_batch": "4096",
    "training.warmup_ratio": "0.2",
    "serving.max_loras": "8",
    "serving.hf_token_secret": "hf-token",
    "serving.base_model_data": "s3://toolkit-b/models/base/",
    "serving.component_memory_mb": "1000",
    "training.per_device_batch_size": "4",
    "model.dequantize_mxfp4": "false",
    "model.experts_implementation": "eager",
    "model.revision": "v1",
    "data.split": "test",
    "data.eval.split": "test",
    "hyperpod.cluster": "c",
    "serving.autoscaling": "{min_instances: 1, max_instances: 2}",
}
# Values of an open-ended deciding setting (not a Literal or bool): where a row's field does not apply (ELSEWHERE)
# and, for a row that tests the value (`where`), where it does (APPLIES); by `on`, or by (field, on).
ELSEWHERE = {"training.max_steps": "10", "training.tokens_per_micro_batch": "4096", "model.id": TINY_GPT_OSS,
             ("model.experts_implementation", "model.id"): "mistralai/Mistral-7B-v0.3", "data.source": SAMPLE_DATASET,
             "data.eval.source": SAMPLE_DATASET,
             ("data.reasoning_effort", "model.id"): "builtin:tiny-qwen3"}  # fmt: skip
APPLIES = {("data.reasoning_effort", "model.id"): TINY_GPT_OSS,
           "model.id": "openai/gpt-oss-20b", ("model.experts_implementation", "model.id"): TINY_GPT_OSS,
           "data.source": "HuggingFaceH4/Multilingual-Thinking",
           "data.eval.source": "HuggingFaceH4/Multilingual-Thinking"}  # fmt: skip
# What else a setting needs to validate at all where it is refused (e.g. a tracking uri needs report_to); by field,
# or by (field, on).
NEEDS = {"training.mlflow.tracking_uri": ["training.report_to=[mlflow]"], "training.mlflow": [],
         "training.tokens_per_micro_batch": ["training.per_device_batch_size=1"],  # the preset's 2 rows: not packed
         "training.per_device_batch_size": ["training.packing=true"],
         ("training.tokens_per_micro_batch", "training.method"): ["training.per_device_batch_size=1"],
         ("model.dequantize_mxfp4", "model.experts"): [f"model.id={TINY_GPT_OSS_MXFP4}"],
         ("model.experts_implementation", "model.experts"): [f"model.id={TINY_GPT_OSS_MXFP4}"],
         "model.dequantize_mxfp4": ["serving.instance_type=ml.g6e.12xlarge"],  # the merged 20b fits its endpoint
         "model.revision": ["serving.instance_type=ml.g6e.12xlarge"],
         # a dense model has no experts to adapt; the preset's date is harmony's (ignored by a chat template)
         "data.reasoning_effort": ["lora.target_parameters=[]", "data.conversation_date=null"]}  # fmt: skip


def _value_of(table: dict, path: str, on: str) -> str | None:
    return table.get((path, on), table.get(on))


def _needs(path: str, on: str) -> list[str]:
    return NEEDS.get((path, on), NEEDS.get(path, []))


def _models(annotation: typing.Any) -> list[type[BaseModel]]:
    """The sections a field holds; a list of them (training.grpo.rewards) is one setting, its items no sections."""
    if typing.get_origin(annotation) is list:
        return []
    args = typing.get_args(annotation) or (annotation,)
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def _fields(model: type[BaseModel], prefix: str = "", in_target: bool = False):
    """(dotted path, field, whether it lies in a target section) for every field of the schema."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        inside = in_target or any(m.__name__.endswith("Target") for m in _models(field.annotation))
        yield path, field, inside
        for nested in _models(field.annotation):
            yield from _fields(nested, f"{path}.", inside)


def _covered(path: str) -> bool:
    parts = path.split(".")
    return any(".".join(parts[:n]) in SCOPES for n in range(1, len(parts) + 1))


def test_every_target_specific_field_has_a_row():
    missing = [
        path
        for path, field, in_target in _fields(Config)
        if (in_target and not _models(field.annotation)) or SCOPE_WORDS.search(field.description or "")
        if not _covered(path)
    ]
    assert not missing, f"say where these apply in toolkit.config.applicability.SCOPES: {missing}"


def test_every_row_names_real_settings_and_values():
    paths = {path: field for path, field, _ in _fields(Config)} | {"target": Config.model_fields["target"]}
    for path, scope in rows():
        assert path in paths, f"SCOPES row {path!r}: no such field"
        if scope.on is None:
            continue
        if scope.where is not None:  # an open-ended setting, tested by its value: one phrase says where
            assert scope.on in paths and len(scope.values) == 1, f"SCOPES row {path!r}: say where in one phrase"
            continue
        annotation = paths[scope.on].annotation
        if typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        allowed = set(_choices(scope.on, annotation))
        assert set(scope.values) <= allowed, f"SCOPES row {path!r}: {scope.on} is never {scope.values}"


def _choices(on: str, annotation) -> tuple:
    """A field's closed set: a Literal's values, a registry's names (`target`'s targets, training.method's records:
    the field's schema enum), else a bool's."""
    field = ({"target": Config.model_fields["target"]} | {p: f for p, f, _ in _fields(Config)})[on]
    if isinstance(field.json_schema_extra, dict) and "enum" in field.json_schema_extra:
        return tuple(field.json_schema_extra["enum"])  # type: ignore[arg-type]
    choices = typing.get_args(annotation) or (True, False)
    return (*choices, None) if type(None) in choices else choices  # an optional setting: unset is a value too


def _elsewhere(path: str, on: str, values: tuple) -> str:
    if _value_of(ELSEWHERE, path, on):
        return str(_value_of(ELSEWHERE, path, on))
    annotation = ({"target": Config.model_fields["target"]} | {p: f for p, f, _ in _fields(Config)})[on].annotation
    if typing.get_origin(annotation) is list:
        return "[]"
    choices = _choices(on, annotation)
    other = next(c for c in choices if c not in values)
    return str(other).lower() if isinstance(other, bool) else str(other)


def toolkit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, timeout=120)


CONDITIONAL = [(path, scope) for path, scope in rows() if scope.on is not None]


@pytest.mark.parametrize(("path", "scope"), CONDITIONAL, ids=[f"{p}-{s.on}" for p, s in CONDITIONAL])
def test_every_conditional_row_is_refused_through_the_cli(path, scope):
    """Set where it cannot apply: exit 2, one line with the field, where it applies, and what to do."""
    example = EXAMPLES.get((path, scope.values[0]), EXAMPLES.get(path))
    assert example is not None, f"add an example value for {path} to EXAMPLES"
    needs = _needs(path, scope.on)
    sets = _rows_for_method([f"{path}={example}", f"{scope.on}={_elsewhere(path, scope.on, scope.values)}",
                             *needs])  # fmt: skip
    result = toolkit("config", "validate", "tiny-gpt-oss-local", *[a for s in sets for a in ("--set", s)])
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert re.search(rf"{re.escape(path)}: .* applies only (with|where) {re.escape(scope.on)}", output), output
    assert scope.fix in output, output
    # where it applies, the same value validates
    where = _value_of(APPLIES, path, scope.on) if scope.where else _yaml_list(scope.on, scope.values[0])
    applies = [f"{path}={example}", f"{scope.on}={where}", *needs]
    if scope.on == "training.distributed":
        applies.append("lora.target_parameters=[]")  # fsdp with expert LoRA is its own rule
    allowed = toolkit("config", "validate", "tiny-gpt-oss-local",
                      *[a for s in _rows_for_method(applies) for a in ("--set", s)])  # fmt: skip
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


def _rows_for_method(sets: list[str]) -> list[str]:
    """DPO reads preference rows and GRPO prompts (settings.py: the method and data.format agree): say so."""
    formats = {"training.method=dpo": "data.format=preference", "training.method=grpo": "data.format=prompts"}
    return [*sets, *(formats[s] for s in sets if s in formats)]


def _yaml_list(on: str, value) -> str:
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return f"[{text}]" if on == "training.report_to" else text


# -- "does nothing" found by enumeration, not by someone thinking of it --------------------------------------------
# Every setting of every section that reaches a rendered request or the training settings, changed under every
# combination of the settings that decide others' effect (a section's `deciders`): when the change reaches nothing
# the section renders (`reaches`: the trainer's arguments, the model load, the LoRA config, the rows read, the job
# request, the EKS manifest or sbatch script, the endpoint requests) and the config check still accepts it, the
# setting does nothing there silently and the table lacks a row. `other` gives every setting a value other than the
# base's (a new setting fails until it has one); `read_as_is` names settings read, whatever else is set, by code the
# rendering does not show.
ROLE = ["aws.role=arn:aws:iam::123456789012:role/x", "aws.bucket=toolkit-b"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# openai's gpt-oss checkpoints ship MXFP4 experts, and so does the -mxfp4 builtin (the model load's stand-in asks this)
MXFP4_CHECKPOINTS = {"openai/gpt-oss-20b", "/cache/builtin:tiny-gpt-oss-mxfp4"}


@dataclasses.dataclass(frozen=True)
class Section:
    reaches: Callable[[Config], Any]
    other: dict[str, Any]
    deciders: dict[str, list] = dataclasses.field(default_factory=dict)
    base: list[str] = dataclasses.field(default_factory=list)  # --set overrides on top of the tiny preset
    read_as_is: dict[str, str] = dataclasses.field(default_factory=dict)


def _built_from(config: Config) -> dict:
    """What the trainer is built from: SFTConfig's arguments (captured, not constructed: 80 ms each) and the
    decisions taken beside it."""
    import trl
    from toolkit_train.layout import Paths
    from toolkit_train.run import trainer

    settings = config.train_settings()
    captured: dict = {}
    with mock.patch.object(trl, "SFTConfig", lambda **kwargs: captured.update(kwargs) or captured):
        trainer.trainer_args(settings, Paths(*[Path("/nonexistent")] * 5))
    return {
        "sft": captured,
        "checkpointing": trainer.use_checkpointing(settings),
        "compiled": trainer.use_compiled_layers(settings),
        "rank0_loads": trainer.loads_from_rank0(settings),
        "micro_batch_tokens": settings.micro_batch_tokens() if settings.training.packing else None,
    }


def _loaded(config: Config) -> list:
    """What the model load passes on (toolkit_train.run.model.load_model and load_tokenizer, with transformers and the
    hub stood in for): the path, the loading arguments, the packed path. `auto` dtype and kernel stay as set (their
    choice is the machine's, not another setting's); a builtin resolves to a local directory, and from_pretrained
    reads a local directory as it is (a revision is the hub's)."""
    import transformers
    from toolkit_train.run import model

    calls: list = []

    def from_pretrained(path, **kwargs):
        kwargs = {k: type(v).__name__ if k == "quantization_config" else v for k, v in kwargs.items()}
        if path.startswith("/"):
            kwargs.pop("revision", None)
        calls.append((path, kwargs))
        return SimpleNamespace(config=SimpleNamespace(), pad_token="x")

    stand_ins = {
        "resolve_model_path": lambda s: f"/cache/{s.id}" if s.id.startswith("builtin:") else s.id,
        "is_mxfp4_checkpoint": lambda path, revision=None: path in MXFP4_CHECKPOINTS,
        "load_packed_model": lambda s, path: calls.append(("packed", path, s.dtype, s.attn_implementation)),
        "compute_dtype": lambda s: s.dtype,
        "attention_implementation": lambda s: s.attn_implementation,
    }
    with (
        mock.patch.multiple(model, **stand_ins),
        mock.patch.object(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained),
        mock.patch.object(transformers.AutoTokenizer, "from_pretrained", from_pretrained),
    ):
        model.load_tokenizer(config.model)
        model.load_model(config.model)
    return calls


def _lora(config: Config) -> dict:
    from toolkit_train.run.model import lora_config

    return lora_config(config.lora).to_dict()


@functools.cache
def _rows(source: str, split: str) -> Any:
    """The rows of a source. The multilingual sample's rows carry both shapes (the multilingual fields and a
    messages column), so either data.format reads them alike: here they are read without their messages."""
    from toolkit_train.data import load_rows

    rows = load_rows(source, split)
    return rows.remove_columns(["messages"]) if source == SAMPLE_DATASET else rows


def _rows_read(config: Config) -> list:
    """The rows a job reads (the local sources, read for real), as split into training and held-out rows and made
    conversations; what becomes of their tokens (length, loss mask) is read by toolkit_train.data.prepare."""
    from toolkit_train.data import split_rows, to_conversation

    data = config.data
    read = []
    for part in split_rows(_rows(data.source, data.split), data):
        for row in list(part or [])[:3]:
            try:
                read.append(to_conversation(row, data.format, data.reasoning_effort, data.reasoning))
            except ValueError as exc:
                read.append(str(exc))
        read.append(len(part or []))
    return read


def _request(config: Config) -> str:
    """The CreateTrainingJob request (the dry run's), named alike each time (not by the clock). The SDK checks the
    user's SageMaker defaults file against its schema ten times a rendering (2 s; there is none here): skipped."""
    import jsonschema

    from toolkit.targets.training_job import TrainingJobTarget

    with (
        mock.patch("toolkit.sagemaker_sdk.unique_job_name", lambda base: f"{base}-T"),
        mock.patch.object(jsonschema, "validate", lambda *_, **__: None),
    ):
        return TrainingJobTarget().render(config)


def _cluster(config: Config) -> list:
    """What a HyperPod submission sends: the EKS manifests (and the model export's Job) or the sbatch script, and the
    training image `toolkit image build training` makes for it."""
    from toolkit.deploy.image import image_spec
    from toolkit.targets.hyperpod_eks import export_job, manifests
    from toolkit.targets.hyperpod_slurm import sbatch_script

    if config.hyperpod.orchestrator == "slurm":
        sent: Any = sbatch_script(config, auto_resume=False, gpu_gres=True)
    else:
        sent = [manifests(config), export_job(config, "run", "bucket", "prefix")]
    return [sent, image_spec(config, "training")]


class _Missing:
    """SageMaker and S3 as a deploy finds them: an endpoint serving another config, nothing else there."""

    def __getattr__(self, operation: str):
        from botocore.exceptions import ClientError

        def missing(**_):
            if operation == "describe_endpoint":
                return {"EndpointStatus": "InService", "EndpointConfigName": "another"}
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "not there"}}, operation)

        return missing


def _endpoint_requests(config: Config) -> list:
    """Every request `toolkit deploy` makes for this config (its dry run, offline), and the image it builds."""
    from toolkit.deploy.adapters import AdapterEndpoints
    from toolkit.deploy.endpoint import Endpoints
    from toolkit.deploy.image import ensure_image, image_spec

    adapter = config.serving.weights == "adapter"
    endpoints = AdapterEndpoints(config, _Missing(), s3=_Missing()) if adapter else Endpoints(config, _Missing())
    image = config.serving.image_uri or ensure_image(config, dry_run=True)
    planned = endpoints.requests(image, config.serving.model_data or "s3://toolkit-b/run/model/")
    return [(r.service, r.operation, r.params) for r in [*planned, *endpoints.autoscaling_requests()]] + [
        image_spec(config, "serving")
    ]


def _prefixed(section: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{section}.{name}": value for name, value in values.items()}


TRAINING_OTHER = _prefixed("training", {
    "learning_rate": 1e-3, "num_epochs": 3, "max_steps": 7, "per_device_batch_size": 3,
    "gradient_accumulation_steps": 2, "lr_scheduler": "linear", "min_lr_rate": 0.3, "warmup_ratio": 0.2,
    "weight_decay": 0.01, "adam_beta2": 0.95, "max_grad_norm": 0.5, "gradient_checkpointing": True,
    "compile_layers": True, "seed": 7, "save_steps": 3, "save_total_limit": 5, "logging_steps": 2,
    "report_to": ["tensorboard"], "mlflow": {"tracking_uri": "http://127.0.0.1:5000"}, "distributed": "fsdp",
    "fsdp_sharding": "hybrid_shard", "packing": True, "tokens_per_micro_batch": 2048, "merge_adapter": False,
    "method": "dpo", "dpo.beta": 0.3, "dpo.loss_type": "ipo", "grpo.num_generations": 8,
    "grpo.max_completion_length": 64, "grpo.temperature": 0.7, "grpo.beta": 0.0,
    "grpo.rewards": [{"name": "exact_match", "weight": 2.0}],
})  # fmt: skip
TRAINING_JOB_OTHER = _prefixed("training_job", {
    "instance_type": "ml.p4d.24xlarge", "instance_count": 2, "image_uri": "registry.example/train:1", "spot": True,
    "max_run_seconds": 3600, "max_wait_seconds": 200_000, "volume_size_gb": 100, "subnets": ["subnet-1"],
    "security_group_ids": ["sg-1"], "kms_key_id": "alias/mine", "hf_token_secret": "hf-token", "tags": {"team": "a"},
})  # fmt: skip
HYPERPOD_OTHER = _prefixed("hyperpod", {
    "cluster": "c", "orchestrator": "slurm", "instance_type": "ml.p4d.24xlarge", "nodes": 3, "gpus_per_node": 4,
    "image": "registry.example/other:2", "image_repository": "my-training", "base_image": "registry.example/base:1",
    "fsx.claim": "other-claim", "fsx.mount_path": "/lustre", "job_dir": "{mount_path}/runs/{name}",
    "namespace": "team-a", "service_account": "exporter", "kube_context": "ctx", "queue": "q", "priority": "high",
    "max_retries": 5, "python": "/opt/venv/bin/python", "exclusive": False, "install": False,
    "eks_job_kind": "PyTorchJob",
})  # fmt: skip
SERVING_OTHER = _prefixed("serving", {
    "endpoint_name": "other-endpoint", "image_uri": "registry.example/serve:1", "repository": "my-serving",
    "base_image": "registry.example/vllm:1", "model_data": "s3://toolkit-b/other/model/", "weights": "adapter",
    "base_model_data": "s3://toolkit-b/other/base/",
    "instance_type": "ml.g6e.48xlarge", "instance_count": 2, "volume_size_gb": 100, "startup_timeout_seconds": 600,
    "download_timeout_seconds": 600, "inference_ami_version": "al2-ami-sagemaker-inference-gpu-3-1",
    "routing": "RANDOM", "rollback_alarms": ["alarm"], "autoscaling": {"min_instances": 1, "max_instances": 3},
    "tensor_parallel_size": 2, "max_model_len": 2048, "gpu_memory_utilization": 0.8, "max_num_seqs": 32,
    "vllm_args": {"enable-prefix-caching": False}, "max_loras": 8, "hf_token_secret": "hf-token",
    "component_memory_mb": 32768, "local_port": 9000, "local_python": "/opt/vllm/bin/python",
    "eval_port": 9001,
})  # fmt: skip
LOCAL_SERVING = "toolkit.deploy.local: `toolkit deploy --target local`"
LOCAL_EVAL = "toolkit.evaluate: `toolkit eval --target local`'s servers"
PREPARED = "toolkit_train.data.prepare, on every row (with the model's tokenizer)"

SECTIONS = {
    "training": Section(
        _built_from,
        TRAINING_OTHER,
        deciders={
            "training.lr_scheduler": ["cosine_with_min_lr", "cosine", "linear", "constant", "constant_with_warmup"],
            "training.max_steps": [None, 10],
            "training.packing": [False, True],
            "training.tokens_per_micro_batch": [None, 4096],
            "training.distributed": ["ddp", "fsdp"],
            "training.report_to": [[], ["mlflow"]],
            "training.save_steps": [0, 10],
        },
        read_as_is={
            "training.save_total_limit": "toolkit_train.run.checkpoints.prune, at every complete save (the end too)",
            "training.merge_adapter": "toolkit_train.train.train, after training",
            "training.mlflow": "toolkit_train.run.trainer.report_to_mlflow (scoped to report_to: mlflow by the table)",
        },
    ),
    "model": Section(
        _loaded,
        {
            "model.id": TINY_GPT_OSS_TOOLS,
            "model.dtype": "float32",
            "model.dequantize_mxfp4": False,
            "model.attn_implementation": "eager",
            "model.revision": "v1",
            "model.experts_implementation": "eager",
            "model.experts": "mxfp4",
        },
        deciders={
            "model.id": [TINY_GPT_OSS, TINY_GPT_OSS_MXFP4, "openai/gpt-oss-20b", "mistralai/Mistral-7B-v0.3"],
            "model.experts": ["bf16", "mxfp4"],
        },
        base=["serving.instance_type=ml.g6e.12xlarge"],  # the merged 20b fits its endpoint
    ),
    "lora": Section(
        _lora,
        {
            "lora.r": 16,
            "lora.alpha": 32,
            "lora.dropout": 0.1,
            "lora.target_modules": ["q_proj", "v_proj"],
            "lora.target_parameters": EXPERTS[1:],
            "lora.expert_r": 4,
        },
        deciders={"lora.target_parameters": [[], EXPERTS]},
    ),
    "data": Section(
        _rows_read,
        {
            "data.source": TOOL_SAMPLE_DATASET,
            "data.split": "test",
            "data.format": "messages",
            "data.max_length": 256,
            "data.overlong": "truncate",
            "data.skip_bad_rows": True,
            "data.reasoning_effort": "high",
            "data.reasoning": "drop",
            "data.conversation_date": "2027-01-01",
            "data.loss_on": "all",
            "data.eval": {"fraction": 0.5},
        },
        deciders={"data.eval": [None, {"fraction": 0.25}]},
        read_as_is=dict.fromkeys(
            ["data.max_length", "data.overlong", "data.skip_bad_rows", "data.loss_on", "data.conversation_date"],
            PREPARED,
        ),
    ),
    "local": Section(
        lambda config: get_target("local").render(config),
        {"local.nproc_per_node": 2, "local.output_dir": "runs/other/{name}"},
    ),
    "training_job": Section(
        _request, TRAINING_JOB_OTHER, deciders={"training_job.spot": [False, True]}, base=["target=training-job", *ROLE]
    ),
    "hyperpod": Section(
        _cluster,
        HYPERPOD_OTHER,
        deciders={
            "hyperpod.orchestrator": ["eks", "slurm"],
            "hyperpod.image": [None, "registry.example/train:1"],
            "hyperpod.eks_job_kind": ["HyperPodPyTorchJob", "PyTorchJob"],
        },
        base=["target=hyperpod"],
        read_as_is={
            "hyperpod.kube_context": "toolkit.targets.hyperpod_eks._clients: every call to the cluster",
            "hyperpod.cluster": "toolkit.targets.hyperpod_eks.check_cluster: the context checked against the cluster's "
            "EKS cluster (DescribeCluster) before every call to it, never in what is sent",
            "hyperpod.instance_type": "the GPU memory checks (Config.training_gpu) and `toolkit plan`: the cluster's "
            "type, which Slurm's script names only through its EFA environment",
        },
    ),
    "serving": Section(
        _endpoint_requests,
        SERVING_OTHER,
        deciders={
            "serving.weights": ["merged", "adapter"],
            "serving.autoscaling": [None, {"min_instances": 1, "max_instances": 2}],
        },
        base=["serving.instance_type=ml.g6e.12xlarge", *ROLE],
        read_as_is={
            "serving.local_port": LOCAL_SERVING,
            "serving.local_python": LOCAL_SERVING,
            "serving.eval_port": LOCAL_EVAL,
        },
    ),
}
# Let through by the table, yet read by nothing so far where the decider has this value: each with what would use
# it (asserted silent there, so the entry goes once something reads it).
OWED: dict[str, tuple[tuple[str, Any], str]] = {}


def _leaves(prefix: str) -> set[str]:
    """The settings of a section: its fields, a required sub-section's fields, an optional sub-section whole."""
    found = set()
    for path, config_field, _ in _fields(Config):
        parts = path.split(".")
        parent = ".".join(parts[:-1])
        optional_parent = any(p == parent or parent.startswith(p + ".") for p in _optional_sections())
        leaf = not _models(config_field.annotation) or path in _optional_sections()
        if path.startswith(prefix + ".") and not optional_parent and leaf:
            found.add(path)
    return found


@functools.cache
def _optional_sections() -> frozenset[str]:
    return frozenset(p for p, f, _ in _fields(Config) if _models(f.annotation) and f.default is None)


def _with(raw: dict, settings: dict[str, Any]) -> dict:
    raw = copy.deepcopy(raw)
    for dotted, value in settings.items():
        *sections, name = dotted.split(".")
        node = raw
        for section in sections:
            if node.get(section) is None:  # an unset section: set with this one value
                node[section] = {}
            node = node[section]
        node[name] = value
    return raw


def _reached(section: Section, config: Config) -> Any:
    return [section.reaches(config), [value_at(config, path) for path in section.read_as_is]]


def _silent(section: Section) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Per setting, the deciders' values where changing it reached nothing; and the changes the config check
    accepted but the rendering refused (a refusal that comes only at launch, e.g. at deploy after training)."""
    from toolkit.config import ConfigError, load_config
    from toolkit.config.loader import validate

    base = load_config("tiny-gpt-oss-local", section.base).model_dump()
    silent: dict[str, list[dict]] = {}
    late: dict[str, str] = {}
    for values in itertools.product(*section.deciders.values()):
        context = dict(zip(section.deciders, values, strict=True))
        try:
            before = validate(_with(base, context), "context")
            reached = _reached(section, before)
        except BadInput:
            continue  # a combination the table (or the launch, e.g. EKS without an image) refuses by itself
        for path, other in section.other.items():
            if value_at(before, path) == other:
                continue
            try:
                after = validate(_with(base, {**context, path: other}), "changed")
            except ConfigError:
                continue  # refused: the table (or a validator) says it does not apply here
            try:
                changed = _reached(section, after)
            except BadInput as exc:
                late.setdefault(path, str(exc))
                continue
            if changed == reached:
                silent.setdefault(path, []).append({k: value_at(before, k) for k in section.deciders})
    return silent, late


@pytest.mark.parametrize("name", list(SECTIONS))
def test_a_setting_that_changes_nothing_under_another_settings_value_is_refused(name):
    section = SECTIONS[name]
    assert set(section.other) == _leaves(name), "give each setting of the section a value in `other`"
    silent, late = _silent(section)
    assert not late, f"accepted by the config check, refused only at launch: {late}"
    for path, ((on, value), _) in OWED.items():
        if path.startswith(name + "."):
            assert path in silent, f"{path} is read now: remove it from OWED"
            if all(context[on] == value for context in silent[path]):
                del silent[path]
    assert not silent, "accepted, yet changes nothing it reaches: " + "; ".join(
        f"{path} with {_shown(section, where[0])} (and {len(where) - 1} more)" for path, where in sorted(silent.items())
    )


def _shown(section: Section, context: dict) -> str:
    """The deciders' values that differ from the base's."""
    from toolkit.config import load_config

    base = load_config("tiny-gpt-oss-local", section.base)
    return ", ".join(f"{k}={v}" for k, v in context.items() if v != value_at(base, k)) or "the base's values"
