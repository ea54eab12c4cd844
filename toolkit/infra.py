"""The AWS resources as code: deploy `infra/toolkit.yaml` through a change set, read its outputs, destroy.

Deploy shows what will change before it changes it, is safe to re-run (no changes = nothing done), and on
failure names the resource that failed and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from toolkit import aws
from toolkit.config.models import AwsSettings
from toolkit.config.names import bucket_name_problem
from toolkit.errors import BadInput, Failed
from toolkit.resources import INFRA_TEMPLATE as TEMPLATE

DONE = ("_COMPLETE", "_FAILED")


class InfraError(Failed):
    """The stack could not be deployed or destroyed (exit 1); the message names the resource and the reason."""


class InfraInputError(BadInput, InfraError):
    """Bad input or a missing stack (exit 2; still an InfraError)."""


@dataclass
class Change:
    action: str  # Add | Modify | Remove
    logical_id: str
    resource_type: str
    replacement: str = ""


def _cfn(settings: AwsSettings):
    return aws.client(settings, "cloudformation")


def _stack(cfn, name: str) -> dict | None:
    try:
        return cfn.describe_stacks(StackName=name)["Stacks"][0]
    except cfn.exceptions.ClientError as exc:
        if aws.is_missing(exc):
            return None
        raise


@dataclass
class Plan:
    """What `apply` will do: create the stack, or execute a change set on the existing one."""

    stack: str
    parameters: dict[str, str]
    template: str
    changes: list[Change]
    change_set: str | None = None  # None: a new stack


def plan(settings: AwsSettings, stack: str, parameters: dict[str, str], template: Path = TEMPLATE) -> Plan:
    """Work out the changes; nothing is changed yet. An existing stack gets a change set to review."""
    cfn = _cfn(settings)
    body = template.read_text()
    if _stack(cfn, stack) is None:
        return Plan(stack, parameters, body, _resources_to_add(body, parameters))
    created = cfn.create_change_set(
        StackName=stack,
        ChangeSetName=f"toolkit-{int(time.time())}",
        ChangeSetType="UPDATE",
        TemplateBody=body,
        Parameters=_parameters(parameters),
        Capabilities=["CAPABILITY_NAMED_IAM"],
    )
    described = _wait_change_set(cfn, created["Id"])
    changes = [
        Change(
            c["ResourceChange"]["Action"],
            c["ResourceChange"]["LogicalResourceId"],
            c["ResourceChange"]["ResourceType"],
            c["ResourceChange"].get("Replacement", ""),
        )
        for c in described.get("Changes", [])
    ]
    if not changes:  # nothing to do: leave no empty change set behind
        cfn.delete_change_set(ChangeSetName=created["Id"], StackName=stack)
        return Plan(stack, parameters, body, [], change_set="")
    return Plan(stack, parameters, body, changes, change_set=created["Id"])


@dataclass
class ExportRole:
    """The HyperPod EKS model-export pod's role: created when `cluster` (the EKS cluster) is named."""

    cluster: str = ""
    namespace: str = "default"
    service_account: str = "toolkit-export"


def parameters(
    settings: AwsSettings,
    name_prefix: str,
    kms: bool,
    hf_token_secret: str,
    data_buckets: list[str],
    vpc: bool,
    mlflow_tracking_server: str = "",
    export: ExportRole | None = None,
) -> dict[str, str]:
    """The stack's parameters; each extra data bucket becomes its bucket and objects ARNs (read-only access)."""
    export = export or ExportRole()
    for name in data_buckets:
        problem = bucket_name_problem(name)
        if problem:
            raise InfraInputError(f"--data-bucket: {problem}")
    partition = aws.partition(settings.region)
    arns = [arn for name in data_buckets for arn in (f"arn:{partition}:s3:::{name}", f"arn:{partition}:s3:::{name}/*")]
    return {
        "NamePrefix": name_prefix,
        "KeyPrefix": settings.prefix,
        "CreateKmsKey": str(kms).lower(),
        "HfTokenSecretName": hf_token_secret,
        "DataBucketArns": ",".join(arns),
        "EnableVpc": str(vpc).lower(),
        "MlflowTrackingServerArn": mlflow_tracking_server,
        "ExportEksCluster": export.cluster,
        "ExportNamespace": export.namespace,
        "ExportServiceAccount": export.service_account,
    }


def _parameters(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"ParameterKey": k, "ParameterValue": v} for k, v in values.items()]


def _resources_to_add(body: str, parameters: dict[str, str]) -> list[Change]:
    """A new stack adds every resource whose condition holds (the template's conditions: Equals, Not, Join of
    parameters)."""
    template = yaml.load(body, Loader=_CfnLoader)
    defaults = {k: str(v.get("Default", "")) for k, v in template.get("Parameters", {}).items()}
    values = {**defaults, **parameters}

    def value(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        ((function, argument),) = node.items()
        if function == "Ref":
            return values[argument]
        if function == "Fn::Equals":
            return str(value(argument[0])) == str(value(argument[1]))
        if function == "Fn::Not":
            return not value(argument[0])
        if function == "Fn::Join":
            return argument[0].join(str(value(argument[1])).split(","))
        raise ValueError(f"condition function {function} (extend toolkit.infra._resources_to_add)")

    holds = {name: value(condition) for name, condition in template.get("Conditions", {}).items()}
    return [
        Change("Add", logical_id, resource["Type"])
        for logical_id, resource in template["Resources"].items()
        if holds.get(resource.get("Condition"), True)
    ]


class _CfnLoader(yaml.SafeLoader):
    """Reads CloudFormation's short-form tags (!Ref, !Sub, ...) as their long form."""


def _cfn_tag(loader, suffix, node):
    name = "Ref" if suffix == "Ref" else f"Fn::{suffix}"
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        return {name: value.split(".") if suffix == "GetAtt" else value}
    if isinstance(node, yaml.SequenceNode):
        return {name: loader.construct_sequence(node, deep=True)}
    return {name: loader.construct_mapping(node, deep=True)}


_CfnLoader.add_multi_constructor("!", _cfn_tag)


def _wait_change_set(cfn, change_set: str) -> dict:
    while True:
        described = cfn.describe_change_set(ChangeSetName=change_set)
        status = described.get("Status", "CREATE_COMPLETE")
        if status in ("CREATE_COMPLETE", "FAILED"):
            return described
        time.sleep(2)


def apply(settings: AwsSettings, planned: Plan, on_event: Callable[[str], None] | None = None) -> dict[str, str]:
    """Create the stack or execute its change set, report events as they happen, return the outputs."""
    cfn = _cfn(settings)
    try:
        if planned.change_set is None:
            cfn.create_stack(
                StackName=planned.stack,
                TemplateBody=planned.template,
                Parameters=_parameters(planned.parameters),
                Capabilities=["CAPABILITY_NAMED_IAM"],
                OnFailure="ROLLBACK",
            )
        elif planned.change_set:
            cfn.execute_change_set(ChangeSetName=planned.change_set, StackName=planned.stack)
    except cfn.exceptions.ClientError as exc:
        raise InfraError(f"stack {planned.stack} was not deployed: {exc.response['Error']['Message']}") from None
    seen: set[str] = set()
    while True:
        current = _stack(cfn, planned.stack)
        events = cfn.describe_stack_events(StackName=planned.stack)["StackEvents"]
        for event in reversed(events):
            if event["EventId"] not in seen:
                seen.add(event["EventId"])
                if on_event:
                    on_event(f"{event['LogicalResourceId']}: {event['ResourceStatus']}")
        status = current["StackStatus"] if current else "DELETE_COMPLETE"
        if status.endswith(DONE) and "IN_PROGRESS" not in status:
            break
        time.sleep(2)
    if "ROLLBACK" in status or status.endswith("FAILED"):
        raise InfraError(f"stack {planned.stack} {status}: {_failure(events)}")
    return outputs(settings, planned.stack)


def _failure(events: list[dict]) -> str:
    failed = [e for e in events if e["ResourceStatus"].endswith("FAILED") and e.get("ResourceStatusReason")]
    if not failed:
        return "no resource reported a reason"
    first = failed[-1]  # events are newest first: the earliest failure caused the rest
    return f"{first['LogicalResourceId']} ({first['ResourceType']}) failed: {first['ResourceStatusReason']}"


def outputs(settings: AwsSettings, stack: str) -> dict[str, str]:
    current = _stack(_cfn(settings), stack)
    if current is None:
        raise InfraInputError(f"no stack named {stack}: run `toolkit infra deploy` first")
    return {o["OutputKey"]: o["OutputValue"] for o in current.get("Outputs", [])}


def config_overlay(base: str, values: dict[str, str], region: str) -> str:
    """A config file that takes `base` and fills the AWS fields from the stack outputs."""
    overlay: dict[str, Any] = {
        "base": base,
        "aws": {"region": region, "role": values["RoleArn"], "bucket": values["BucketName"]},
    }
    if "KeyPrefix" in values:
        overlay["aws"]["prefix"] = values["KeyPrefix"]
    if "KmsKeyArn" in values:
        overlay["training_job"] = {"kms_key_id": values["KmsKeyArn"]}
    if "RepositoryUri" in values:  # the repositories' names (a non-default NamePrefix changes them)
        overlay["serving"] = {"repository": values["RepositoryUri"].split("/", 1)[1]}
    if "TrainingRepositoryUri" in values:
        overlay["hyperpod"] = {"image_repository": values["TrainingRepositoryUri"].split("/", 1)[1]}
    if "ExportServiceAccount" in values:  # EKS Pod Identity gives it the stack's export role
        overlay.setdefault("hyperpod", {})["service_account"] = values["ExportServiceAccount"]
    header = "# Written by `toolkit infra outputs` from the stack's outputs.\n"
    return header + yaml.safe_dump(overlay, sort_keys=False)


def destroy(settings: AwsSettings, stack: str, force: bool, on_event: Callable[[str], None] | None = None) -> None:
    """Delete the stack. The bucket is kept while it holds data, unless `force` empties it first."""
    values = outputs(settings, stack)
    bucket = values.get("BucketName")
    s3 = aws.client(settings, "s3")
    if bucket:
        versions = s3.list_object_versions(Bucket=bucket, MaxKeys=1000)
        held = versions.get("Versions", []) + versions.get("DeleteMarkers", [])
        if held and not force:
            raise InfraError(
                f"bucket {bucket} still holds data (checkpoints, models); nothing was deleted. "
                "Copy what you need, then pass --force to delete it with the stack"
            )
        while held:
            s3.delete_objects(
                Bucket=bucket,
                Delete={"Objects": [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in held]},
            )
            versions = s3.list_object_versions(Bucket=bucket, MaxKeys=1000)
            held = versions.get("Versions", []) + versions.get("DeleteMarkers", [])
    cfn = _cfn(settings)
    cfn.delete_stack(StackName=stack)
    while (current := _stack(cfn, stack)) is not None and current["StackStatus"] != "DELETE_COMPLETE":
        if current["StackStatus"] == "DELETE_FAILED":
            events = cfn.describe_stack_events(StackName=stack)["StackEvents"]
            raise InfraError(f"stack {stack} DELETE_FAILED: {_failure(events)}")
        if on_event:
            on_event(f"{stack}: {current['StackStatus']}")
        time.sleep(2)
    if bucket:  # retained by policy (it may hold data); empty now, so remove it too
        try:
            s3.delete_bucket(Bucket=bucket)
        except s3.exceptions.ClientError as exc:
            if not aws.is_missing(exc):  # by its code: already gone is what we want
                raise
