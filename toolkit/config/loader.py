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


class _UnnamedKey(yaml.MarkedYAMLError):
    """A mapping key that is a list or a mapping (`{[a]: 1}`): no setting is named so, and Python cannot hold it."""

    def __init__(self, kind: str, mark: yaml.Mark) -> None:
        super().__init__(problem=f"a mapping key is a {kind}; keys are names (text)", problem_mark=mark)


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader, refusing duplicate keys (a second `training:` section would replace the first) and keys that
    are lists or mappings (with their line and column, not a TypeError)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges; the mapping's own keys win
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, list | dict | set):
                raise _UnnamedKey({list: "list", dict: "mapping", set: "set"}[type(key)], key_node.start_mark)
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
    """Return (label, YAML text) for a file path or a preset name. A file must be UTF-8 text (a UTF-8 byte-order mark
    is allowed); anything else is one ConfigError naming the file and where."""
    path = Path(source)
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read it ({exc.strerror}); check its permissions") from None
        return str(path), decode(str(path), data)
    if str(source) in preset_names():
        return f"preset {source}", (_presets() / f"{source}.yaml").read_text(encoding="utf-8")
    if path.exists():
        raise ConfigError(f"{source}: not a regular file (a directory, pipe or device); name a YAML file")
    if path.suffix in (".yaml", ".yml") or os.sep in str(source):
        raise ConfigError(f"{source}: no such file")
    import difflib

    close = difflib.get_close_matches(str(source), preset_names(), n=1, cutoff=0.8)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(f"{source}: neither a file nor a preset; {hint}presets: {', '.join(preset_names())}")


# Byte-order marks of the encodings a YAML file may be saved in other than UTF-8 (UTF-32's first: it starts like UTF-16)
_OTHER_BOMS = {
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\xfe\xff": "UTF-16",
    b"\xff\xfe": "UTF-16",
}


def decode(label: str, data: bytes) -> str:
    """A config file's text: UTF-8 (its byte-order mark dropped). Another encoding is refused with the place of the
    first byte that is not UTF-8 (line, column), not a UnicodeDecodeError."""
    for bom, encoding in _OTHER_BOMS.items():
        if data.startswith(bom):
            raise ConfigError(
                f"{label}: saved as {encoding} (its byte-order mark starts the file); re-save it as UTF-8"
            )
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        column = len(before.rsplit(b"\n", 1)[-1].decode("utf-8", errors="replace")) + 1
        raise ConfigError(
            f"{label}: not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column {column} (Latin-1 or "
            "another encoding?); re-save the file as UTF-8"
        ) from None


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


def parse_yaml(text: str, label: str) -> Any:
    """YAML text as Python values; every failure is one ConfigError starting with `label` and saying where (line,
    column) and what (a tab, a character YAML refuses, a key written twice, a list as a key, nesting too deep)."""
    try:
        return yaml.load(text, Loader=_YamlLoader)
    except _DuplicateKey as exc:
        raise ConfigError(f"{label}: {exc}; keep one (the second would silently replace the first)") from None
    except _UnnamedKey as exc:
        place = f"line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}: " if exc.problem_mark else ""
        raise ConfigError(f"{label}: {place}{exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "not YAML"
        if mark and _tab_near(text, mark.line, mark.column):
            problem = "a tab character; YAML indents with spaces only: replace the tab with spaces"
        raise ConfigError(f"{label}: YAML syntax error{where}: {problem}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (a NUL of UTF-16, a control character)
        line, column = _place(text, exc.position)
        character = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        raise ConfigError(
            f"{label}: character {character} at line {line}, column {column} is not allowed in YAML (a binary file, "
            "or one saved as UTF-16?); save the file as UTF-8 text"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{label}: not YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    except RecursionError:
        raise ConfigError(
            f"{label}: nested too deeply to be a config (YAML lists or mappings inside each other)"
        ) from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:  # a tag's constructor: `!!timestamp x`
        tagged = next((n for n, line in enumerate(text.splitlines(), 1) if "!!" in line or " !" in line), None)
        where = f" (line {tagged})" if tagged else ""
        raise ConfigError(
            f"{label}: a tagged value{where} that YAML cannot read ({type(exc).__name__}: {brief(str(exc))}); remove "
            "the tag (e.g. !!timestamp, !!int) or write a value of its kind"
        ) from None


def _tab_near(text: str, line: int, column: int) -> bool:
    """Whether the YAML error at (line, column) is a tab's: the character there, or a tab in that line's indentation."""
    lines = text.splitlines()
    if not 0 <= line < len(lines):
        return False
    current = lines[line]
    indentation = current[: len(current) - len(current.lstrip(" \t"))]
    return "\t" in indentation or current[column : column + 1] == "\t"


def _place(text: str, position: int) -> tuple[int, int]:
    before = text[:position]
    return before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1


def _load_raw(source: str | Path, env: dict[str, str], seen: tuple[str, ...]) -> tuple[str, dict]:
    label, text = read_source(source)
    raw = parse_yaml(text, label)
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
        raise ConfigError(f"--set {brief(item)}: write it as section.field=value, e.g. lora.r=16")
    if any(not part.strip() for part in dotted.split(".")):
        raise ConfigError(f"--set {brief(item)}: {brief(dotted)} has an empty name; write section.field=value")
    if dotted.split(".")[0] == "base":
        raise ConfigError(
            f"--set {brief(item)}: base is read when the file is loaded, before --set applies: write base: in the "
            "file, or give the base itself as the CONFIG argument and --set what differs"
        )
    try:
        value = yaml.load(text, Loader=_YamlLoader)
    except _DuplicateKey as exc:
        raise ConfigError(f"--set {brief(item)}: {exc.args[0].split(' (')[0]}; keep one") from None
    except _UnnamedKey as exc:
        column = exc.problem_mark.column + 1 if exc.problem_mark else 0
        raise ConfigError(f"--set {brief(item)}: at column {column} of the value, {exc.problem}") from None
    except RecursionError:
        raise ConfigError(f"--set {brief(item)}: the value is nested too deeply") from None
    except (yaml.YAMLError, ValueError, TypeError, AttributeError, OverflowError):  # not YAML, or a tag (!!int x)
        value = text  # that cannot be read: the text as typed, which the field's check then judges
    written_null = value is None and text.strip() != ""  # null or ~: unset (an optional field), as in a YAML file
    if _is_text_field(dotted.split(".")) and not written_null and not isinstance(value, str | list | dict):
        value = text  # a string field keeps what was typed: 007 stays "007", 2024-01-01 is not a date
    *parents, leaf = dotted.split(".")
    node = raw
    for part in parents:
        child = node.get(part)
        if child is None:  # absent, or written empty (`lora:`)
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {brief(item)}: {part} is not a section (it holds {brief(child)})")
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
    """One line per problem: `label: problem` where there is one, else a count and one indented line each."""
    problems = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        path = _dotted(loc) or "(top level)"
        if error["type"] == "extra_forbidden":
            problems.append(f"{path}: unknown key{_suggest(loc)}")
        elif error["type"] == "missing":
            problems.append(f"{path}: required; add it to the file or pass --set {path}=...")
        elif error["type"] == "finite_number":
            problems.append(f"{path}: {brief(error.get('input'))} is not a finite number; write a number")
        else:
            problems.append(_located(path if loc else "", error))
    if len(problems) == 1:
        return f"{label}: {problems[0]}"
    return "\n".join([f"{label}: {len(problems)} problems:", *(f"  {problem}" for problem in problems)])


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
    close = [key for key in difflib.get_close_matches(loc[-1], keys, n=2, cutoff=0.4) if key != loc[-1]][:1]
    valid = ", ".join(keys)
    return f"; did you mean {close[0]!r}? (valid keys: {valid})" if close else f"; valid keys: {valid}"
