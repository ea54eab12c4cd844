"""The config reference in Markdown, generated from the models (docs/config-reference.md embeds it; a test keeps it
current)."""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from toolkit.config.models import Config

BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"


def _type_name(field: FieldInfo) -> str:
    text = str(field.annotation).replace("typing.", "").replace("NoneType", "None")
    return text.replace("<class '", "").replace("'>", "").replace("|", "\\|")


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        made: Any = field.default_factory()  # type: ignore[call-arg]
        return "" if isinstance(made, BaseModel) else f"`{json.dumps(made)}`"
    return f"`{json.dumps(field.default)}`"


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """A field that is a section of its own: a model, or an optional model (`X | None`)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _section(prefix: str, model: type[BaseModel], out: list[str]) -> None:
    nested: list[tuple[str, type[BaseModel]]] = []
    rows = []
    for name, field in model.model_fields.items():
        sub = _section_model(field.annotation)
        if sub is not None:
            nested.append((f"{prefix}{name}", sub))
            continue
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | `{_type_name(field)}` | {_default(field)} | {description} |")
    if rows:
        title = prefix.rstrip(".") or "top level"
        doc = (model.__doc__ or "").strip().splitlines()[0] if model.__doc__ else ""
        out += [f"### `{title}`", "", doc, "", "| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for name, sub in nested:
        _section(f"{name}.", sub, out)


def markdown() -> str:
    out: list[str] = []
    _section("", Config, out)
    return "\n".join(out).rstrip() + "\n"


def update_readme(path: str = "docs/config-reference.md") -> None:
    """Rewrite the reference block of a page in place: `python -m toolkit.config.reference [PATH]`."""
    from pathlib import Path

    readme = Path(path)
    text = readme.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{markdown()}{END}{tail}")


if __name__ == "__main__":
    import sys

    update_readme(*sys.argv[1:])
