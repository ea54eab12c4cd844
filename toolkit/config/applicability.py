"""Where each setting applies: one table, one check.

A setting that means something only for some targets, orchestrators, distribution modes or schedules is listed in
`SCOPES` with the setting that decides (`on`) and the values where it applies. `refuse_inapplicable` refuses a
setting given a value other than its default where it cannot apply: field path, why not here, what to do. A value
equal to the default is harmless anywhere (and presets or `--target` re-validation carry defaults everywhere).

Every field of a target section (local, training_job, hyperpod) has a row, also those that apply wherever their
target runs (`on=None`): the row is where someone adding a field says where it applies, and
tests/toolkit/test_applicability.py fails for a field without one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


EVERYWHERE = Scope(None)
EKS = Scope("hyperpod.orchestrator", ("eks",), "remove it, or set hyperpod.orchestrator: eks")
SLURM = Scope("hyperpod.orchestrator", ("slurm",), "remove it, or set hyperpod.orchestrator: slurm")

SCOPES: dict[str, Scope] = {
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
    "training.tokens_per_micro_batch": Scope(
        "training.packing",
        (True,),
        "remove it (where a base config sets it: --set training.tokens_per_micro_batch=null), or set "
        "training.packing: true",
        "unpacked micro-batches hold training.per_device_batch_size rows",
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
    # -- serving: the adapter mode's own settings ---------------------------------------------------------------
    "serving.max_loras": Scope("serving.weights", ("adapter",), "remove it, or set serving.weights: adapter"),
    "serving.hf_token_secret": Scope(
        "serving.weights",
        ("adapter",),
        "remove it, or set serving.weights: adapter",
        "a merged model is served from S3, not downloaded from the hub",
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
    "hyperpod.cluster": EVERYWHERE,
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


def refuse_inapplicable(config: Config) -> None:
    """ValueError naming the first setting given where it cannot apply: field, why not here, what to do."""
    for path, scope in SCOPES.items():
        if scope.on is None:
            continue
        value = value_at(config, path)
        scoped = scope.when(value) if scope.when else value != default_at(path, type(config))
        if value is None or not scoped:
            continue
        current = value_at(config, scope.on)
        listed = current if isinstance(current, list) else [current]
        if any(v in scope.values for v in listed):
            continue
        where = " or ".join(f"{scope.on}: {_yaml(v)}" if v is not None else f"{scope.on} unset" for v in scope.values)
        why = f" ({scope.why})" if scope.why else ""
        shown = _yaml(current) if isinstance(current, bool) else brief(current)
        here = f"but {scope.on} is {shown}"
        raise ValueError(f"{path}: {brief(value)} applies only with {where}{why}, {here}: {scope.fix}")


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
