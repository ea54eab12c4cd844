"""`toolkit infra` (deploy, outputs, destroy): the AWS resources as a CloudFormation stack."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toolkit.cli.common import (
    ConfigAlias,
    JsonOpt,
    YesOpt,
    app,
    config_first,
    confirm,
    emit_json,
    group,
    load,
    out,
    status,
)

infra_app = group("The AWS resources (role, bucket, ECR repository, KMS key) as a stack.")
app.add_typer(infra_app, name="infra")
StackOpt = Annotated[str, typer.Option("--stack", help="CloudFormation stack name.")]
AwsConfig = Annotated[
    str | None,
    typer.Argument(
        metavar="[CONFIG]", show_default=False,
        help="Config whose aws section (region, endpoint) to use (default: AWS's own settings).",
    ),
]  # fmt: skip


def _aws_settings(source: str | None, alias: str | None):
    from toolkit.config.models import AwsSettings

    (config,) = config_first((source,), alias, required=False)
    return load(config, None).aws if config else AwsSettings()


@infra_app.command("deploy")
def infra_deploy(
    stack: StackOpt = "toolkit",
    source: AwsConfig = None,
    config: ConfigAlias = None,
    name_prefix: Annotated[str, typer.Option(help="Prefix of every resource name.")] = "toolkit",
    kms: Annotated[bool, typer.Option("--kms", help="Create and use a customer-managed KMS key.")] = False,
    hf_token_secret: Annotated[str, typer.Option(help="Secrets Manager name of the HF token.")] = "hf-token",
    data_bucket: Annotated[
        list[str] | None, typer.Option("--data-bucket", help="Another bucket jobs may read data from (repeatable).")
    ] = None,
    vpc: Annotated[bool, typer.Option("--vpc", help="Let jobs run in your VPC (needed for fsx:// data).")] = False,
    mlflow_tracking_server: Annotated[
        str, typer.Option(help="ARN of a SageMaker managed MLflow tracking server jobs may log to.")
    ] = "",
    export_eks_cluster: Annotated[
        str, typer.Option(help="HyperPod's EKS cluster: a Pod Identity role for the model export pod.")
    ] = "",
    export_namespace: Annotated[str, typer.Option(help="The export pod's namespace.")] = "default",
    export_service_account: Annotated[str, typer.Option(help="The export pod's service account.")] = "toolkit-export",
    yes: YesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Create or update the stack: show the parameters and changes, then apply them with progress."""
    from rich.table import Table

    from toolkit import sdk

    settings = _aws_settings(source, config)
    export = sdk.ExportRole(export_eks_cluster, export_namespace, export_service_account)
    parameters = sdk.infra_parameters(
        settings, name_prefix, kms, hf_token_secret, data_bucket or [], vpc, mlflow_tracking_server, export
    )
    shown = Table("parameter", "value", title=f"stack {stack} parameters")
    for key, value in parameters.items():
        shown.add_row(key, value or "-")
    out.print(shown)
    planned = sdk.infra_plan(settings, stack, parameters)
    if not planned.changes and planned.change_set is not None:
        out.print(f"stack {stack} is up to date; nothing to do")
        values = sdk.infra_outputs(settings, stack)
    else:
        table = Table("action", "resource", "type", "replacement", title=f"changes to stack {stack}")
        for change in planned.changes:
            table.add_row(change.action, change.logical_id, change.resource_type, change.replacement)
        out.print(table)
        confirm(f"Apply these {len(planned.changes)} changes to {stack}?", yes)
        with status(f"deploying {stack} ...") as update:
            values = sdk.infra_apply(settings, planned, lambda line: update(f"deploying {stack}: {line}"))
    if as_json:
        emit_json(values)
        return
    for key, value in values.items():
        out.print(f"{key}: {value}", highlight=False)


@infra_app.command("outputs")
def infra_outputs(
    stack: StackOpt = "toolkit",
    source: AwsConfig = None,
    config: ConfigAlias = None,
    base: Annotated[
        str, typer.Option(help="The config (file or preset) the written file builds on.")
    ] = "gpt-oss-20b-lora",
    write: Annotated[Path | None, typer.Option(help="Write a config file with the AWS fields filled in.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the stack's outputs, or write them into a config file (base + aws section)."""
    from toolkit import sdk

    settings = _aws_settings(source, config)
    values = sdk.infra_outputs(settings, stack)
    if as_json:
        emit_json(values)
        return
    if write is None:
        for key, value in values.items():
            out.print(f"{key}: {value}", highlight=False)
        return
    write.write_text(sdk.infra_config_overlay(base, values, settings.region))
    load(str(write), None)  # what we wrote must validate
    out.print(f"wrote {write}", highlight=False)


@infra_app.command("destroy")
def infra_destroy(
    stack: StackOpt = "toolkit",
    source: AwsConfig = None,
    config: ConfigAlias = None,
    force: Annotated[bool, typer.Option("--force", help="Also delete the bucket's data.")] = False,
    yes: YesOpt = False,
) -> None:
    """Delete the stack; refuses while the bucket holds data unless --force."""
    from toolkit import sdk

    settings = _aws_settings(source, config)
    confirm(f"Delete stack {stack}{' and all data in its bucket' if force else ''}?", yes)
    with status(f"deleting {stack} ...") as update:
        sdk.infra_destroy(settings, stack, force, update)
    out.print(f"deleted {stack}")
