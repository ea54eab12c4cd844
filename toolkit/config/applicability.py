"""Where each setting applies: one table, one check.

A setting that means something only for some targets, orchestrators, distribution modes, schedules or models is
listed in `SCOPES` with the setting that decides (`on`) and the values where it applies (or, where `on` is
open-ended, like model.id, a test of its value: `where`); a setting that depends on two others has a row for each
(a tuple). `refuse_inapplicable` refuses a setting given a value other than its default where it cannot apply:
field path, why not here, what to do. A value equal to the default is harmless anywhere (and presets or `--target`
re-validation carry defaults everywhere).

Every field of a target section (local, training_job, hyperpod) has a row, also those that apply wherever their
target runs (`on=None`): the row is where someone adding a field says where it applies, and
tests/toolkit/test_applicability.py fails for a field without one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit_train import methods
from toolkit_train.families import known_family
from toolkit_train.settings import BUILTIN_MODELS, EXPLICIT_PATH, TINY_GPT_OSS_MXFP4, source_has_splits

from toolkit.config.metrics import PREFERENCE_ACCURACY
from toolkit.errors import brief

if TYPE_CHECKING:
    from toolkit.config.models import Config


@dataclass(frozen=True)
class Scope:
    on: str | None  # the dotted setting that decides; None: wherever the field's section (its target) is used
    values: tuple[Any, ...] = ()  # values of `on` where the field applies (for a list: any of them listed)
    fix: str = ""  # what to do instead
    why: str = ""  # why it does not apply elsewhere, when that is not obvious
    when: Callable[[Any], bool] | None = None  # only these values of the field are scoped (default: any non-default)
    where: Callable[[Any], bool] | None = None  # for an open-ended `on`: whether the field applies at its value
    # (`values` then holds one phrase saying where)


def _may_be_mxfp4(model_id: str) -> bool:
    """Whether model.id may be an MXFP4 checkpoint, as far as this machine can tell: the builtins' recipes (only the
    -mxfp4 one is quantized), the family record (gpt-oss ships MXFP4), a local checkpoint's own config.json."""
    if model_id in BUILTIN_MODELS:
        return model_id == TINY_GPT_OSS_MXFP4
    local = model_id.startswith(EXPLICIT_PATH)
    family = known_family(model_id, local)
    if family is None:  # a directory only the job's machine has
        return True
    if not (local and family.packed_mxfp4):
        return family.packed_mxfp4
    try:
        quantization = json.loads((Path(model_id).expanduser() / "config.json").read_text())["quantization_config"]
        return str(quantization["quant_method"]).lower() == "mxfp4"
    except (OSError, ValueError, KeyError, TypeError):
        return False  # a gpt-oss checkpoint saved unquantized (e.g. a merged model)


def _fused_experts(model_id: str) -> bool:
    family = known_family(model_id, model_id.startswith(EXPLICIT_PATH))
    return family is None or family.fused_experts


def _renders_harmony(model_id: str) -> bool:
    family = known_family(model_id, model_id.startswith(EXPLICIT_PATH))
    return family is None or family.chat_format == "harmony"


HARMONY_ONLY = ("a model rendered in harmony (gpt-oss)",)


def _hub_id(model_id: str) -> bool:
    return model_id not in BUILTIN_MODELS and not model_id.startswith(EXPLICIT_PATH)


def _split_of(source: str) -> Scope:
    return Scope(source, ("a hub dataset or a save_to_disk directory with splits",), "remove it",
                 "a sample, a file or a directory of files is read whole", where=source_has_splits)  # fmt: skip


EVERYWHERE = Scope(None)
EKS = Scope("hyperpod.orchestrator", ("eks",), "remove it, or set hyperpod.orchestrator: eks")
SLURM = Scope("hyperpod.orchestrator", ("slurm",), "remove it, or set hyperpod.orchestrator: slurm")
UNPACKED = Scope("model.experts", ("bf16",), "remove it, or set model.experts: bf16",
                 "mxfp4 loads the packed experts as they are and runs them on the toolkit's own path")  # fmt: skip

SCOPES: dict[str, Scope | tuple[Scope, ...]] = {
    # -- the model: settings of some checkpoints only --------------------------------------------------------------
    "model.dequantize_mxfp4": (
        UNPACKED,
        Scope(
            "model.id",
            ("an MXFP4 checkpoint (openai/gpt-oss-*, builtin:tiny-gpt-oss-mxfp4)",),
            "remove it",
            "other checkpoints have no MXFP4 experts to dequantize",
            where=_may_be_mxfp4,
        ),
    ),
    "model.experts_implementation": (
        UNPACKED,
        Scope(
            "model.id",
            ("a model with MoE experts the toolkit fuses (gpt-oss)",),
            "remove it",
            "other models load their own layers",
            where=_fused_experts,
        ),
    ),
    "model.revision": Scope(
        "model.id", ("a hub id",), "remove it", "a builtin or local checkpoint is read as it is", where=_hub_id
    ),
    # -- data ----------------------------------------------------------------------------------------------------
    "data.split": _split_of("data.source"),
    "data.eval.split": _split_of("data.eval.source"),
    "data.reasoning_effort": Scope(
        "model.id",
        HARMONY_ONLY,
        "remove it (a row's own reasoning_effort is read only by harmony too)",
        "the family's chat template has no reasoning effort",
        where=_renders_harmony,
    ),
    "data.loss_on": Scope(
        "training.method",
        methods.names(pairs=False, samples=False),
        "remove it",
        "DPO scores whole replies and GRPO the replies it samples; only supervised fine-tuning masks its rows' tokens",
    ),
    "data.overlong": Scope(
        "training.method",
        methods.names(samples=False),
        "remove it: a prompt over data.max_length is dropped",
        "GRPO samples the replies; a prompt is never cut",
    ),
    # -- shared training settings ------------------------------------------------------------------------------
    "training.fsdp_sharding": Scope(
        "training.distributed", ("fsdp",), "remove it, or set training.distributed: fsdp", "ddp does not shard"
    ),
    "training.min_lr_rate": Scope(
        "training.lr_scheduler", ("cosine_with_min_lr",), "remove it, or set training.lr_scheduler: cosine_with_min_lr"
    ),
    "training.mlflow": Scope("training.report_to", ("mlflow",), "add mlflow to training.report_to, or remove it"),
    "training.num_epochs": Scope(
        "training.max_steps", (None,), "remove one of them", "max_steps ends the run whatever the epochs"
    ),
    "training.tokens_per_micro_batch": (
        Scope(
            "training.packing",
            (True,),
            "remove it (where a base config sets it: --set training.tokens_per_micro_batch=null), or set "
            "training.packing: true",
            "unpacked micro-batches hold training.per_device_batch_size rows",
        ),
        Scope(
            "training.method",
            methods.names(pairs=False, samples=False),
            "remove it: DPO batches training.per_device_batch_size pairs, GRPO as many prompts",
            "DPO packs the replies of a micro-batch's pairs, whatever their tokens; GRPO packs nothing",
        ),
    ),
    "training.grpo": Scope(
        "training.method",
        (methods.GRPO.name,),
        "remove it, or set training.method: grpo",
        "only GRPO samples replies and scores them by rewards",
    ),
    "training.dpo": Scope(
        "training.method",
        (methods.DPO.name,),
        "remove it, or set training.method: dpo",
        "supervised fine-tuning has no preference loss",
    ),
    "training.per_device_batch_size": Scope(
        "training.tokens_per_micro_batch",
        (None,),
        "remove it, or unset training.tokens_per_micro_batch (--set training.tokens_per_micro_batch=null)",
        "a packed micro-batch holds training.tokens_per_micro_batch tokens, whatever the rows",
    ),
    "training.warmup_ratio": Scope(
        "training.lr_scheduler",
        ("cosine_with_min_lr", "cosine", "linear", "constant_with_warmup"),
        "remove it, or set training.lr_scheduler: constant_with_warmup",
        "constant has no warmup",
    ),
    # -- the promotion gate: what the method's eval report scores ------------------------------------------------
    "registry.gate.min_format_valid": Scope(
        "training.method",
        methods.names(pairs=False),
        "remove it",
        "a DPO run's report generates nothing whose format to check",
    ),
    "registry.gate.metric": (
        Scope(
            "training.method",
            methods.names(pairs=True),
            "set registry.gate.metric to a generated reply's metric: rougeL, chrF, reasoning_language, format_valid",
            "a supervised fine-tune's report scores generated replies, not pairs",
            when=lambda metric: metric == PREFERENCE_ACCURACY,
        ),
        Scope(
            "training.method",
            methods.names(pairs=False),
            f"set registry.gate.metric: {PREFERENCE_ACCURACY}",
            "a DPO run's report scores its held-out pairs by likelihood; nothing is generated",
            when=lambda metric: metric != PREFERENCE_ACCURACY,
        ),
    ),
    # -- serving: the adapter mode's own settings ---------------------------------------------------------------
    "serving.max_loras": Scope("serving.weights", ("adapter",), "remove it, or set serving.weights: adapter"),
    "serving.hf_token_secret": Scope(
        "serving.weights",
        ("adapter",),
        "remove it, or set serving.weights: adapter",
        "a merged model is served from S3, not downloaded from the hub",
    ),
    "serving.autoscaling": Scope(
        "serving.weights",
        ("merged",),
        "remove it, or set serving.weights: merged",
        "inference components scale their copy count, not the variant's instances",
    ),
    "serving.base_model_data": Scope(
        "serving.weights",
        ("adapter",),
        "remove it, or set serving.weights: adapter",
        "a merged model is served from the training run's output",
    ),
    "serving.component_memory_mb": Scope(
        "serving.weights",
        ("adapter",),
        "remove it, or set serving.weights: adapter",
        "the merged model has no components",
    ),
    "training.mlflow.tracking_uri": Scope(
        "target",
        ("local",),
        "use an http(s):// tracking server or a SageMaker MLflow tracking server's ARN",
        "a job's own file system is gone when the job ends",
        when=lambda uri: str(uri).startswith("file:"),
    ),
    # -- local ---------------------------------------------------------------------------------------------------
    "local.nproc_per_node": EVERYWHERE,
    "local.output_dir": EVERYWHERE,
    # -- training_job ------------------------------------------------------------------------------------------
    "training_job.instance_type": EVERYWHERE,
    "training_job.instance_count": EVERYWHERE,
    "training_job.image_uri": EVERYWHERE,
    "training_job.spot": EVERYWHERE,
    "training_job.max_run_seconds": EVERYWHERE,
    "training_job.max_wait_seconds": Scope(
        "training_job.spot", (True,), "remove it, or set training_job.spot: true", "only spot jobs wait for capacity"
    ),
    "training_job.volume_size_gb": EVERYWHERE,
    "training_job.subnets": EVERYWHERE,
    "training_job.security_group_ids": EVERYWHERE,
    "training_job.kms_key_id": EVERYWHERE,
    "training_job.hf_token_secret": EVERYWHERE,
    "training_job.tags": EVERYWHERE,
    # -- hyperpod: both orchestrators, or one ------------------------------------------------------------------
    "hyperpod.cluster": Scope(  # HyperPod's CLI names the EKS cluster by it (hyp set-cluster-context --cluster-name)
        "hyperpod.orchestrator",
        ("eks",),
        "remove it",
        "Slurm jobs are submitted with sbatch on the head node, which reaches its own cluster",
    ),
    "hyperpod.orchestrator": EVERYWHERE,
    "hyperpod.instance_type": EVERYWHERE,
    "hyperpod.nodes": EVERYWHERE,
    "hyperpod.gpus_per_node": EVERYWHERE,
    "hyperpod.image": EVERYWHERE,  # EKS, and Slurm with pyxis
    "hyperpod.image_repository": EVERYWHERE,
    "hyperpod.base_image": EVERYWHERE,
    "hyperpod.fsx.claim": EKS,
    "hyperpod.fsx.mount_path": EVERYWHERE,
    "hyperpod.job_dir": EVERYWHERE,
    "hyperpod.namespace": EKS,
    "hyperpod.service_account": EKS,
    "hyperpod.kube_context": EKS,
    "hyperpod.queue": EKS,  # a Kueue queue label
    "hyperpod.priority": EKS,  # a Kueue priority class
    "hyperpod.max_retries": EKS,  # the HyperPod operator's restarts; Slurm requeues (--requeue)
    "hyperpod.eks_job_kind": EKS,
    "hyperpod.python": SLURM,  # EKS runs the image's Python
    "hyperpod.exclusive": SLURM,
    "hyperpod.install": EVERYWHERE,
    # -- serving on this machine (`toolkit deploy --target local`), read only there --------------------------
    "serving.local_port": EVERYWHERE,
    "serving.local_python": EVERYWHERE,
    "serving.eval_port": EVERYWHERE,  # `toolkit eval --target local`'s servers, on this machine
}


def value_at(config: Any, path: str) -> Any:
    """The value at a dotted path; None when a section on the way is unset (e.g. training.mlflow)."""
    node = config
    for part in path.split("."):
        if node is None:
            return None
        node = getattr(node, part)
    return node


def default_at(path: str, schema: type) -> Any:
    """The default of the field at a dotted path of `schema` (the Config class: passed in, so that the schema's
    module imports this one and not the other way round)."""
    from pydantic import BaseModel

    model: Any = schema
    field = None
    for part in path.split("."):
        field = model.model_fields[part]
        annotation = field.annotation
        nested = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)]
        model = next((a for a in nested if issubclass(a, BaseModel)), None)
    assert field is not None
    return field.get_default(call_default_factory=True)


def rows() -> Iterator[tuple[str, Scope]]:
    """(field, scope) for every row of SCOPES, a field with two deciding settings twice."""
    for path, scoped in SCOPES.items():
        yield from ((path, scope) for scope in (scoped if isinstance(scoped, tuple) else (scoped,)))


def applies(scope: Scope, current: Any) -> bool:
    """Whether a field of this scope applies where its deciding setting has this value."""
    if scope.where is not None:
        return scope.where(current)
    listed = current if isinstance(current, list) else [current]
    return any(v in scope.values for v in listed)


def refuse_inapplicable(config: Config) -> None:
    """ValueError naming the first setting given where it cannot apply: field, why not here, what to do."""
    for path, scope in rows():
        if scope.on is None:
            continue
        value = value_at(config, path)
        scoped = scope.when(value) if scope.when else value != default_at(path, type(config))
        current = value_at(config, scope.on)
        if value is None or not scoped or applies(scope, current):
            continue
        where = " or ".join(f"{scope.on}: {_yaml(v)}" if v is not None else f"{scope.on} unset" for v in scope.values)
        where = f"where {scope.on} is {scope.values[0]}" if scope.where else f"with {where}"
        why = f" ({scope.why})" if scope.why else ""
        here = f"but {scope.on} is {_shown(current)}"
        raise ValueError(f"{path}: {_shown(value)} applies only {where}{why}, {here}: {scope.fix}")


def _shown(value: Any) -> str:
    return _yaml(value) if isinstance(value, bool) else brief(value)


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
