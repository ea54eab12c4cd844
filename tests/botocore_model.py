"""AWS's own contract, offline: a request the toolkit builds is checked against botocore's service model (types,
required members, enums, lengths, ranges and patterns the model carries). The emulator accepts more than AWS;
this catches what AWS would refuse. Cross-field rules the model does not carry are checked where they apply."""

from __future__ import annotations

import botocore.session
from botocore import xform_name
from botocore.validate import ParamValidator


def assert_valid(service: str, operation: str, params: dict) -> None:
    model = botocore.session.get_session().get_service_model(service).operation_model(operation)
    report = ParamValidator().validate(params, model.input_shape)
    assert not report.has_errors(), f"{service}.{operation}: {report.generate_report()}"


def assert_valid_call(service: str, method: str, params: dict) -> None:
    """The same, for a boto3 method name (`create_endpoint`) as the toolkit's request plans carry them."""
    model = botocore.session.get_session().get_service_model(service)
    operation = {xform_name(name): name for name in model.operation_names}[method]
    assert_valid(service, operation, params)
