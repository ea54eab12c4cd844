"""Strict structural checks of Kubernetes manifests against OpenAPI-generated client models.

The Kubeflow training SDK's models (`kubeflow.training.models`) are generated from the training operator's
OpenAPI spec, the Kubernetes client's (`kubernetes.client.models`) from the API server's: each class lists its
fields (`attribute_map`) and their types (`openapi_types`). Walking a manifest with them rejects unknown keys,
wrong types and missing required fields (constructor arguments without defaults are not tracked, so required
fields are checked by the API server only).
"""

from __future__ import annotations

import re
from typing import Any

PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
    "object": (object,),  # IntOrString, quantities, free-form
}


def _model(name: str) -> Any:
    import kubeflow.training.models as kubeflow
    import kubernetes.client.models as core

    for module in (kubeflow, core):
        if hasattr(module, name):
            return getattr(module, name)
    raise KeyError(f"no OpenAPI model named {name}")


def errors(value: Any, type_name: str, path: str = "") -> list[str]:
    """Every problem in `value` as `path: message`, checked against the OpenAPI type `type_name`."""
    if match := re.fullmatch(r"list\[(.+)\]", type_name):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [e for i, item in enumerate(value) for e in errors(item, match.group(1), f"{path}[{i}]")]
    if match := re.fullmatch(r"dict\(str, (.+)\)", type_name):
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        return [e for key, item in value.items() for e in errors(item, match.group(1), f"{path}.{key}")]
    if type_name in PRIMITIVES:
        if type_name in ("int", "float") and isinstance(value, bool):
            return [f"{path}: expected {type_name}, got bool"]
        return [] if isinstance(value, PRIMITIVES[type_name]) else [f"{path}: expected {type_name}, got {value!r}"]
    model = _model(type_name)
    if not isinstance(value, dict):
        return [f"{path}: expected an object ({type_name}), got {type(value).__name__}"]
    by_json_name = {json_name: attr for attr, json_name in model.attribute_map.items()}
    problems = []
    for key, item in value.items():
        if key not in by_json_name:
            problems.append(f"{path}.{key}: unknown field of {type_name}")
        else:
            problems += errors(item, model.openapi_types[by_json_name[key]], f"{path}.{key}")
    return problems
