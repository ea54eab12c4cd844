"""AWS's own contract, offline: a request the toolkit builds is checked against botocore's service model (types,
required members, enums, lengths, ranges and patterns the model carries). The emulator accepts more than AWS;
this catches what AWS would refuse. Cross-field rules the model does not carry are checked where they apply."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import botocore.session
from botocore import xform_name
from botocore.validate import ParamValidator


@cache
def _service_model(service: str) -> Any:
    return botocore.session.get_session().get_service_model(service)


def assert_valid(service: str, operation: str, params: dict) -> None:
    model = _service_model(service).operation_model(operation)
    report = ParamValidator().validate(params, model.input_shape)
    assert not report.has_errors(), f"{service}.{operation}: {report.generate_report()}"
    # botocore's client checks types, required members and minimums; AWS also refuses what breaks a member's
    # pattern, enum or maximum, which the model carries too
    problems = list(_server_side_rules(params, model.input_shape, operation))
    assert not problems, f"{service}.{operation}: " + "; ".join(problems)


def _server_side_rules(value: Any, shape: Any, path: str):
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                yield from _server_side_rules(member, shape.members[name], f"{path}.{name}")
    elif shape.type_name == "list" and isinstance(value, list):
        if "max" in shape.metadata and len(value) > shape.metadata["max"]:
            yield f"{path} has {len(value)} items, at most {shape.metadata['max']}"
        for index, item in enumerate(value):
            yield from _server_side_rules(item, shape.member, f"{path}[{index}]")
    elif shape.type_name == "map" and isinstance(value, dict):
        if "max" in shape.metadata and len(value) > shape.metadata["max"]:
            yield f"{path} has {len(value)} entries, at most {shape.metadata['max']}"
        for key, item in value.items():
            yield from _server_side_rules(key, shape.key, f"{path} key {key!r}")
            yield from _server_side_rules(item, shape.value, f"{path}[{key!r}]")
    elif shape.type_name == "string" and isinstance(value, str):
        if "max" in shape.metadata and len(value) > shape.metadata["max"]:
            yield f"{path} is {len(value)} characters, at most {shape.metadata['max']}"
        if shape.enum and value not in shape.enum:
            yield f"{path} = {value!r} is not one of {shape.enum}"
        pattern = _python_pattern(shape.metadata.get("pattern"))
        if pattern is not None and not pattern.search(value):
            yield f"{path} = {value!r} does not match {shape.metadata['pattern']!r}"


def _python_pattern(java_pattern: str | None) -> re.Pattern | None:
    """AWS's patterns are Java regexes, matched against the whole value; the few Java-only constructs
    (\\p{...} classes) are skipped rather than guessed."""
    if not java_pattern or "\\p{" in java_pattern:
        return None
    anchored = java_pattern if java_pattern.startswith("^") else f"^(?:{java_pattern})"
    anchored = anchored if anchored.endswith("$") else f"{anchored}$"
    try:
        return re.compile(anchored, re.DOTALL)
    except re.error:
        return None


def assert_valid_call(service: str, method: str, params: dict) -> None:
    """The same, for a boto3 method name (`create_endpoint`) as the toolkit's request plans carry them."""
    model = _service_model(service)
    operation = {xform_name(name): name for name in model.operation_names}[method]
    assert_valid(service, operation, params)
