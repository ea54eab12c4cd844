"""The JSON Schema of the YAML files users write (`toolkit config schema`, for editor completion).

A file may build on another with `base:`, so a key that the base supplies is not required in it; values may be
`${ENV_VAR}` placeholders, which the loader substitutes before validating. The resolved config (what `config
show` prints) still validates against the strict `Config.model_json_schema()`.
"""

from __future__ import annotations

import copy
from typing import Any

from toolkit.config.models import Config

PLACEHOLDER = {"type": "string", "pattern": r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}"}
ANNOTATIONS = ("title", "description", "default", "examples")
BASE = {
    "type": "string",
    "description": "A preset name (`toolkit config presets`) or a YAML file this one builds on: it writes only "
    "what differs.",
}


def file_schema() -> dict[str, Any]:
    schema = copy.deepcopy(Config.model_json_schema())
    required = schema.pop("required", [])
    for definition in schema.get("$defs", {}).values():
        _relax(definition)
    for prop in schema["properties"].values():
        _relax(prop)
    schema["properties"] = {"base": BASE, **schema["properties"]}
    schema["anyOf"] = [{"required": ["base"]}, {"required": required}]
    return schema


def _relax(node: Any) -> None:
    """Drop `required` (a base may supply it) and let every constrained scalar also be a ${ENV} placeholder."""
    if isinstance(node, list):
        for item in node:
            _relax(item)
        return
    if not isinstance(node, dict):
        return
    node.pop("required", None)
    for key in ("properties", "$defs", "patternProperties"):
        for child in node.get(key, {}).values():
            _relax(child)
    for key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
        if key in node:
            _relax(node[key])
    if _constrained_scalar(node):
        constraint = {k: v for k, v in node.items() if k not in ANNOTATIONS}
        for key in constraint:
            del node[key]
        node["anyOf"] = [constraint, PLACEHOLDER]


def _constrained_scalar(node: dict) -> bool:
    if "enum" in node or "const" in node:
        return True
    kind = node.get("type")
    if kind in ("integer", "number", "boolean"):
        return True
    return kind == "string" and any(k in node for k in ("pattern", "minLength", "maxLength", "format"))
