"""Read a config from YAML (or a preset name), apply `base:`, `${ENV}` and `--set` overrides, validate.

Every failure becomes one `ConfigError` that names the file, the field path and how to fix it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from toolkit.config.models import Config
from toolkit.errors import BadInput, brief

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# Values that look like credentials: they belong in Secrets Manager or the environment, never here.
_SECRET_SHAPES = {
    "a Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "an AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    # 40 characters of base64 with upper case, lower case and a digit (a hex commit hash has no upper case)
    "an AWS secret access key": re.compile(
        r"(?<![A-Za-z0-9/+=])(?=[A-Za-z0-9/+]*[A-Z])(?=[A-Za-z0-9/+]*[a-z])(?=[A-Za-z0-9/+]*[0-9])"
        r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"
    ),
}


class _DuplicateKey(yaml.YAMLError):
    """A mapping that names a key twice: YAML loaders keep the last one silently."""

    def __init__(self, key: object, first: int, second: int) -> None:
        super().__init__(f"key {key!r} is written twice (lines {first} and {second})")
        self.key, self.first, self.second = key, first, second


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader, refusing duplicate keys (a second `training:` section would replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges; the mapping's own keys win
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in lines:
                raise _DuplicateKey(key, lines[key], line)
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


class ConfigError(BadInput):
    """A config that cannot be used; `str()` is the message to show the user."""


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in _presets().iterdir() if p.name.endswith(".yaml"))


def _presets() -> Any:
    return resources.files("toolkit") / "presets"


def read_source(source: str | Path) -> tuple[str, str]:
    """Return (label, YAML text) for a file path or a preset name."""
    path = Path(source)
    if path.is_file():
        return str(path), path.read_text()
    if str(source) in preset_names():
        return f"preset {source}", (_presets() / f"{source}.yaml").read_text()
    if path.suffix in (".yaml", ".yml") or os.sep in str(source):
        raise ConfigError(f"{source}: no such file")
    raise ConfigError(f"{source}: neither a file nor a preset; presets: {', '.join(preset_names())}")


def load_config(source: str | Path, overrides: Sequence[str] = (), env: dict[str, str] | None = None) -> Config:
    """Load, compose and validate a config. `overrides` are `dotted.path=value` strings."""
    label, raw = _load_raw(source, env if env is not None else dict(os.environ), seen=())
    for item in overrides:
        _apply_override(raw, item)
    _refuse_secrets(raw, label)
    return validate(raw, label)


def validate(raw: dict, label: str) -> Config:
    """Validate a raw mapping; errors become one ConfigError naming `label` and each field path."""
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(label, exc)) from None


def _load_raw(source: str | Path, env: dict[str, str], seen: tuple[str, ...]) -> tuple[str, dict]:
    label, text = read_source(source)
    try:
        raw = yaml.load(text, Loader=_YamlLoader)
    except _DuplicateKey as exc:
        raise ConfigError(f"{label}: {exc}; keep one (the second would silently replace the first)") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise ConfigError(f"{label}: YAML syntax error at {where}: {exc.problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{label}: the top level must be a mapping of sections, not {type(raw).__name__}")
    raw = _interpolate(raw, env, label, path="")
    _anchor_data_source(raw, label)
    base = raw.pop("base", None)
    if base is None:
        return label, raw
    if str(base) in seen:
        raise ConfigError(f"{label}: base: {base!r} includes itself")
    if not isinstance(base, str):
        raise ConfigError(f"{label}: base must be a preset name or a file path")
    base_source = Path(label).parent / base if Path(label).is_file() and not Path(base).is_absolute() else base
    if not Path(base_source).is_file():
        base_source = base
    try:
        _, base_raw = _load_raw(base_source, env, (*seen, str(base)))
    except ConfigError as exc:
        if not str(exc).startswith(f"{base_source}: "):  # a problem inside the base file names that file
            raise
        raise ConfigError(f"{label}: base: {exc}") from None
    return label, _deep_merge(base_raw, raw)


def _anchor_data_source(raw: dict, label: str) -> None:
    """A relative data.source is read next to the file that sets it, as base: is, when it is there; otherwise as
    written (a path from the working directory, or a hub id like org/name)."""
    data = raw.get("data")
    source = data.get("source") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(source, str) or not source.strip() or not Path(label).is_file():
        return
    if source.startswith(("builtin:", "s3://", "fsx://", "/", "~")):
        return
    beside = Path(label).parent / source
    if beside.exists():
        data["source"] = str(beside)


def _interpolate(node: Any, env: dict[str, str], label: str, path: str) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, env, label, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, env, label, f"{path}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{label}: {path}: environment variable {name} is not set; export it or write ${{{name}:-default}}"
        )

    return _ENV_REF.sub(substitute, node)


def _deep_merge(base: dict, top: dict) -> dict:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _apply_override(raw: dict, item: str) -> None:
    dotted, sep, text = item.partition("=")
    if not sep or not dotted:
        raise ConfigError(f"--set {item!r}: write it as section.field=value, e.g. lora.r=16")
    try:
        value = yaml.load(text, Loader=_YamlLoader)
    except _DuplicateKey as exc:
        raise ConfigError(f"--set {brief(item)}: {exc.args[0].split(' (')[0]}; keep one") from None
    except yaml.YAMLError:
        value = text
    written_null = value is None and text.strip() != ""  # null or ~: unset (an optional field), as in a YAML file
    if _is_text_field(dotted.split(".")) and not written_null and not isinstance(value, str | list | dict):
        value = text  # a string field keeps what was typed: 007 stays "007", 2024-01-01 is not a date
    *parents, leaf = dotted.split(".")
    node = raw
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {item!r}: {part} is not a section")
        node = child
    node[leaf] = value


def _is_text_field(path: list[str]) -> bool:
    """Whether the config field at `path` holds text only (str or str | None)."""
    import types
    import typing

    model: Any = Config
    annotation: Any = None
    for part in path:
        if typing.get_origin(model) is dict:  # a key of a mapping: its value type
            annotation = model = typing.get_args(model)[1]
            continue
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        annotation = fields[part].annotation
        model = annotation
    if annotation is str:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return set(typing.get_args(annotation)) <= {str, type(None)}
    return False


def _refuse_secrets(node: Any, label: str, path: str = "") -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            _refuse_secrets(value, label, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _refuse_secrets(value, label, f"{path}[{i}]")
    elif isinstance(node, str):
        for what, shape in _SECRET_SHAPES.items():
            if shape.search(node):
                raise ConfigError(
                    f"{label}: {path}: looks like {what}; secrets never go in the config. "
                    "Keep it in the environment (HF_TOKEN, AWS credentials) or name a Secrets "
                    "Manager secret in training_job.hf_token_secret"
                )


def _format_errors(label: str, exc: ValidationError) -> str:
    lines = [f"{label}: {exc.error_count()} problem(s):"]
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        path = _dotted(loc) or "(top level)"
        if error["type"] == "extra_forbidden":
            lines.append(f"  {path}: unknown key{_suggest(loc)}")
        elif error["type"] == "missing":
            lines.append(f"  {path}: required; add it to the file or pass --set {path}=...")
        else:
            lines.append(f"  {_located(path if loc else '', error)}")
    return "\n".join(lines)


def _located(path: str, error: Any) -> str:
    """'path: message (got value)': no second path where the message names its own field, no repr of a section
    (a model check's input), values cut to a readable length (errors.brief)."""
    message = error["msg"].removeprefix("Value error, ")
    if path and not message.startswith((f"{path}.", f"{path}:", f"{path}[", f"{path} ")):
        message = f"{path}: {message}"
    value = error.get("input")
    if not path or isinstance(value, dict | list | BaseModel):
        return message
    return f"{message} (got {brief(value)})"


def _dotted(loc: list[str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def _suggest(loc: list[str]) -> str:
    """'; did you mean r?' for a typo, using the fields of the model that owns the bad key."""
    import typing

    model: type[BaseModel] | None = Config
    for part in loc[:-1]:
        field = model.model_fields.get(part) if model else None
        annotation = field.annotation if field else None
        options = typing.get_args(annotation) or (annotation,)  # `MlflowSettings | None` holds a section too
        model = next((a for a in options if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if model is None:
        return ""
    import difflib

    keys = [*model.model_fields, *(["base"] if model is Config else [])]  # base: is read before validation
    close = difflib.get_close_matches(loc[-1], keys, n=1, cutoff=0.4)
    valid = ", ".join(keys)
    return f"; did you mean {close[0]!r}? (valid keys: {valid})" if close else f"; valid keys: {valid}"
