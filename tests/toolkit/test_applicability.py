"""Where settings apply: one table (toolkit.config.applicability), one check, through the CLI."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from toolkit.config.applicability import SCOPES
from toolkit.config.models import Config

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
    "training.fsdp_sharding": "hybrid_shard",
    "training.min_lr_rate": "0.2",
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
    "serving.component_memory_mb": "1000",
    "training.per_device_batch_size": "4",
}
# A value of an open-ended deciding setting (not a Literal or bool) where a row's field does not apply.
ELSEWHERE = {"training.max_steps": "10", "training.tokens_per_micro_batch": "4096"}
# What else a setting needs to validate at all where it is refused (e.g. a tracking uri needs report_to).
NEEDS = {"training.mlflow.tracking_uri": ["training.report_to=[mlflow]"], "training.mlflow": [],
         "training.tokens_per_micro_batch": ["training.per_device_batch_size=1"],  # the preset's 2 rows: not packed
         "training.per_device_batch_size": ["training.packing=true"]}  # fmt: skip


def _models(annotation: typing.Any) -> list[type[BaseModel]]:
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
    for path, scope in SCOPES.items():
        assert path in paths, f"SCOPES row {path!r}: no such field"
        if scope.on is None:
            continue
        annotation = paths[scope.on].annotation
        if typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        allowed = set(_choices(scope.on, annotation))
        assert set(scope.values) <= allowed, f"SCOPES row {path!r}: {scope.on} is never {scope.values}"


def _choices(on: str, annotation) -> tuple:
    """A field's closed set: a Literal's values, the registered targets for `target`, else a bool's."""
    from toolkit.config.targets import TARGET_SETTINGS

    if on == "target":
        return tuple(TARGET_SETTINGS)
    choices = typing.get_args(annotation) or (True, False)
    return (*choices, None) if type(None) in choices else choices  # an optional setting: unset is a value too


def _elsewhere(on: str, values: tuple) -> str:
    if on in ELSEWHERE:
        return ELSEWHERE[on]
    annotation = ({"target": Config.model_fields["target"]} | {p: f for p, f, _ in _fields(Config)})[on].annotation
    if typing.get_origin(annotation) is list:
        return "[]"
    choices = _choices(on, annotation)
    other = next(c for c in choices if c not in values)
    return str(other).lower() if isinstance(other, bool) else str(other)


def toolkit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", [p for p, s in SCOPES.items() if s.on is not None])
def test_every_conditional_row_is_refused_through_the_cli(path):
    """Set where it cannot apply: exit 2, one line with the field, where it applies, and what to do."""
    scope = SCOPES[path]
    assert path in EXAMPLES, f"add an example value for {path} to EXAMPLES"
    assert scope.on is not None
    sets = [f"{path}={EXAMPLES[path]}", f"{scope.on}={_elsewhere(scope.on, scope.values)}", *NEEDS.get(path, [])]
    if scope.on.startswith("hyperpod.") or scope.on == "target":
        sets.append("hyperpod.cluster=c")
    result = toolkit("config", "validate", "tiny-gpt-oss-local", *[a for s in sets for a in ("--set", s)])
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert f"{path}: " in output and f"applies only with {scope.on}" in output and scope.fix in output, output
    # where it applies, the same value validates
    applies = [f"{path}={EXAMPLES[path]}", f"{scope.on}={_yaml_list(scope.on, scope.values[0])}",
               *NEEDS.get(path, []), "hyperpod.cluster=c"]  # fmt: skip
    if scope.on == "training.distributed":
        applies.append("lora.target_parameters=[]")  # fsdp with expert LoRA is its own rule
    allowed = toolkit("config", "validate", "tiny-gpt-oss-local", *[a for s in applies for a in ("--set", s)])
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr


def _yaml_list(on: str, value) -> str:
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return f"[{text}]" if on == "training.report_to" else text


# -- "does nothing" found by enumeration, not by someone thinking of it --------------------------------------------
# Every training setting, changed under every combination of the settings that decide others' effect: when the
# change reaches nothing the trainer is built from (the SFTConfig arguments, the checkpointing / compile / loading
# decisions, the packed micro-batch budget) and the config check still accepts it, the setting does nothing there
# silently and the table lacks a row. The deciders are the training settings other settings' effect depends on.
DECIDERS = {
    "lr_scheduler": ["cosine_with_min_lr", "cosine", "linear", "constant", "constant_with_warmup"],
    "max_steps": [None, 10],
    "packing": [False, True],
    "tokens_per_micro_batch": [None, 4096],
    "distributed": ["ddp", "fsdp"],
    "report_to": [[], ["mlflow"]],
    "save_steps": [0, 10],
}
# A value other than the tiny preset's for every training setting (a new setting fails until it has one).
OTHER = {
    "learning_rate": 1e-3, "num_epochs": 3, "max_steps": 7, "per_device_batch_size": 3,
    "gradient_accumulation_steps": 2, "lr_scheduler": "linear", "min_lr_rate": 0.3, "warmup_ratio": 0.2,
    "weight_decay": 0.01, "adam_beta2": 0.95, "max_grad_norm": 0.5, "gradient_checkpointing": True,
    "compile_layers": True, "seed": 7, "save_steps": 3, "save_total_limit": 5, "logging_steps": 2,
    "report_to": ["tensorboard"], "mlflow": {"tracking_uri": "http://127.0.0.1:5000"}, "distributed": "fsdp",
    "fsdp_sharding": "hybrid_shard", "packing": True, "tokens_per_micro_batch": 2048, "merge_adapter": False,
}  # fmt: skip
# Read as they are by the code named, whatever else is set (their effect is not in a pure function of the settings).
READ_AS_IS = {
    "save_total_limit": "toolkit_train.checkpoints.prune, at every complete save (the end of a run included)",
    "merge_adapter": "toolkit_train.train.train, after training",
    "mlflow": "toolkit_train.train.report_to_mlflow (scoped to report_to: mlflow by the table)",
}


def _built_from(settings) -> dict:
    """What the trainer is built from: SFTConfig's arguments (captured, not constructed: 80 ms each) and the
    decisions taken beside it."""
    import trl
    from toolkit_train import train

    captured: dict = {}
    original = trl.SFTConfig
    trl.SFTConfig = lambda **kwargs: captured.update(kwargs) or captured  # type: ignore[assignment]
    try:
        train.sft_config(settings, train.Paths(*[Path("/nonexistent")] * 5))
    finally:
        trl.SFTConfig = original
    t = settings.training
    return {
        "sft": captured,
        "checkpointing": train.use_checkpointing(settings),
        "compiled": train.use_compiled_layers(settings),
        "rank0_loads": train.loads_from_rank0(settings),
        "micro_batch_tokens": settings.micro_batch_tokens() if t.packing else None,
        **{name: getattr(t, name) for name in READ_AS_IS},
    }


def test_a_training_setting_that_changes_nothing_under_another_settings_value_is_refused():
    import itertools

    from toolkit.config import load_config
    from toolkit.config.loader import ConfigError, validate

    assert set(OTHER) == set(load_config("tiny-gpt-oss-local").training.model_fields), "give each setting a value"
    base = load_config("tiny-gpt-oss-local").model_dump()
    silent: dict[str, list[str]] = {}
    for values in itertools.product(*DECIDERS.values()):
        context = dict(zip(DECIDERS, values, strict=True))
        try:
            before = validate({**base, "training": {**base["training"], **context}}, "context")
        except ConfigError:
            continue  # a combination the table refuses by itself
        built = _built_from(before.train_settings())
        for name, other in OTHER.items():
            if context.get(name, base["training"][name]) == other:
                continue
            try:
                after = validate({**base, "training": {**base["training"], **context, name: other}}, "changed")
            except ConfigError:
                continue  # refused: the table (or a validator) says it does not apply here
            if _built_from(after.train_settings()) == built:
                shown = ", ".join(f"{k}={v}" for k, v in context.items() if v != base["training"][k])
                silent.setdefault(f"training.{name}", []).append(shown or "the preset's values")
    assert not silent, "accepted, yet changes nothing the trainer is built from: " + "; ".join(
        f"{name} with {where[0]} (and {len(where) - 1} more)" for name, where in sorted(silent.items())
    )
