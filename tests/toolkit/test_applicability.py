"""Where settings apply: one table (toolkit.config.applicability), one check, through the CLI."""

from __future__ import annotations

import re
import subprocess
import sys
import typing

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
    "serving.component_memory_mb": "1000",
}
# A value of an open-ended deciding setting (not a Literal or bool) where a row's field does not apply.
ELSEWHERE = {"training.max_steps": "10"}
# What else a setting needs to validate at all where it is refused (e.g. a tracking uri needs report_to).
NEEDS = {"training.mlflow.tracking_uri": ["training.report_to=[mlflow]"], "training.mlflow": []}


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
