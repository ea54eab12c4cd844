"""`toolkit eval`, `toolkit image build`, `toolkit endpoint` (list, describe, delete) and `toolkit register`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from toolkit.cli.common import (
    ConfigAlias,
    ConfigArg,
    ConfigFirst,
    EvalTarget,
    ImageKind,
    JsonOpt,
    SetOpt,
    YesOpt,
    app,
    config_first,
    confirm,
    emit_json,
    emit_rows,
    err,
    fail,
    group,
    load,
    out,
    status,
)


@app.command("eval")
def eval_(
    source: ConfigArg,
    target: Annotated[
        EvalTarget,
        typer.Option(
            help="local: serve base and fine-tuned with vLLM here; endpoint: the config's endpoint "
            "(baseline) vs --candidate-endpoint, through SageMaker."
        ),
    ] = "local",
    candidate_endpoint: Annotated[
        str | None, typer.Option(help="endpoint: the endpoint serving the candidate (e.g. a staging one).")
    ] = None,
    model_dir: Annotated[str | None, typer.Option(help="The trained model (default: training output).")] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Score only the first N held-out rows (and task rows).")
    ] = None,
    max_tokens: Annotated[
        int, typer.Option(min=1, help="New tokens per generated reply (a DPO run's pairs generate none).")
    ] = 256,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight per model.")] = 4,
    tasks: Annotated[
        str | None,
        typer.Option(
            help="lm-evaluation-harness tasks too, comma-separated (bundled: toolkit_numbers); --limit applies to each."
        ),
    ] = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Score the fine-tuned model against the base on the held-out rows (data.eval); writes runs/<name>/eval/.
    A DPO run (training.method dpo): its held-out pairs, by which reply each model finds more likely."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from toolkit import sdk

    cfg = load(source, set_)
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), console=err)
    bars: dict = {}
    doing = "scoring pairs" if cfg.training.method_record.pairs else "generating"  # a DPO run: held-out pairs, scored

    def on_row(label: str, generated, total: int) -> None:
        if label not in bars:
            bars[label] = progress.add_task(f"{doing} ({label})", total=total)
        progress.advance(bars[label])

    try:
        with progress:
            report = sdk.evaluate(cfg, target, model_dir, limit, max_tokens, concurrency, on_row,
                                  lambda line: progress.console.print(line, highlight=False, markup=False),
                                  candidate_endpoint=candidate_endpoint, tasks=tasks)  # fmt: skip
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if as_json:
        emit_json(report)
        return
    out.print(sdk.evaluation_table(report), highlight=False, markup=False)
    if report.get("gate"):
        gate = report["gate"]
        out.print(f"registry.gate: {gate['reason']} (toolkit register would mark it {gate['status']})",
                  highlight=False, markup=False)  # fmt: skip
    out.print(f"report: {report['written']['markdown']}", highlight=False)


image_app = group("The toolkit's container images (built with docker, pushed to ECR).")
app.add_typer(image_app, name="image")


@image_app.command("build")
def image_build(
    source: ConfigFirst = None,
    kind: Annotated[
        ImageKind | None,
        typer.Argument(
            metavar="KIND",
            show_default=False,
            help="serving (vLLM endpoint) or training (HyperPod pods, training jobs).",
        ),
    ] = None,
    config: ConfigAlias = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the image URI; build nothing.")] = False,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Build an image and push it to ECR unless the registry already has this content's tag; print its URI."""
    from toolkit import sdk

    source, kind_name = config_first((source, kind), config)  # -c CONFIG KIND: the kind came in first
    if kind_name not in ("serving", "training"):
        fail(f"image kind must be serving or training, not {kind_name!r}", code=2)
    assert source is not None
    kind = kind_name
    cfg = load(source, set_)
    with status(f"building the {kind} image ...") as update:
        uri = sdk.build_image(cfg, lambda line: update(line[-160:]), kind=kind, dry_run=dry_run)
    if as_json:
        emit_json({"image_uri": uri})
        return
    sys.stdout.write(uri + "\n")


endpoint_app = group("SageMaker endpoints made by `toolkit deploy`.")
app.add_typer(endpoint_app, name="endpoint")


def _config(source: str | None, alias: str | None) -> str:
    (chosen,) = config_first((source,), alias)
    assert chosen is not None
    return chosen


@endpoint_app.command("list")
def endpoint_list(source: ConfigFirst = None, config: ConfigAlias = None, as_json: JsonOpt = False) -> None:
    """Endpoints in the config's account and region, newest first."""
    from toolkit import sdk

    emit_rows(sdk.list_endpoints(load(_config(source, config), None)), ("name", "status", "modified"), as_json)


@endpoint_app.command("describe")
def endpoint_describe(source: ConfigFirst = None, config: ConfigAlias = None, as_json: JsonOpt = False) -> None:
    """Status, serving config, instances and failure reason of the config's endpoint."""
    from toolkit import sdk

    endpoints = sdk.endpoints(load(_config(source, config), None))
    description = endpoints.describe()
    if description is None:
        fail("the endpoint does not exist: create it with `toolkit deploy`", code=2)
    components = endpoints.components() if hasattr(endpoints, "components") else []
    if as_json:
        emit_json({**{k: v for k, v in description.items() if k != "ResponseMetadata"},
                   **({"InferenceComponents": components} if components else {})})  # fmt: skip
        return
    out.print(f"{description['EndpointName']}: {description['EndpointStatus']}", highlight=False)
    out.print(f"  config: {description['EndpointConfigName']}", highlight=False)
    for variant in description.get("ProductionVariants", []):
        out.print(
            f"  {variant['VariantName']}: {variant.get('CurrentInstanceCount', '?')} instance(s)", highlight=False
        )
    if description.get("FailureReason"):
        out.print(f"  failure: {description['FailureReason']}", highlight=False)
    for component in components:  # serving.weights: adapter: the base and the adapters on it
        role = f"adapter on {component['base']}: {component['artifact']}" if component["base"] else "base"
        out.print(f"  {component['name']} ({role}): {component['status']}", highlight=False)


@endpoint_app.command("delete")
def endpoint_delete(
    source: ConfigFirst = None, config: ConfigAlias = None, yes: YesOpt = False, as_json: JsonOpt = False
) -> None:
    """Delete the endpoint with its config and model (the model data in S3 stays). serving.weights: adapter: the
    config's adapter component, and the base and endpoint once no other adapter is on them."""
    from toolkit import sdk

    endpoints = sdk.endpoints(load(_config(source, config), None))
    adapter = getattr(endpoints, "adapter", None)
    confirm(f"Delete adapter {adapter} (and endpoint {endpoints.name} if no other adapter is on it)?" if adapter
            else f"Delete endpoint {endpoints.name}?", yes)  # fmt: skip
    deleted = endpoints.delete()
    if as_json:
        emit_json({"name": endpoints.name, "deleted": deleted})
        return
    out.print("deleted " + ", ".join(deleted) if deleted else f"endpoint {endpoints.name} does not exist")


@app.command("register")
def register(
    source: ConfigArg,
    job: Annotated[str | None, typer.Option(help="Training job (default: the latest completed one).")] = None,
    image_uri: Annotated[str | None, typer.Option(help="Serving image (default: built and pushed).")] = None,
    approve: Annotated[
        bool, typer.Option("--approve", help="Mark the package Approved, whatever the gate says (manual override).")
    ] = False,
    report: Annotated[
        str | None, typer.Option(help="The eval report to attach (default: runs/<name>/eval/report.json if any).")
    ] = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Record a trained model in the Model Package Group named after the config, with its eval report attached
    and the approval status from registry.gate (passes: Approved, fails: Rejected, no report: pending)."""
    from toolkit import sdk

    cfg = load(source, set_)
    registration = sdk.register(cfg, job, image_uri, approve, report=report)
    if as_json:
        emit_json(registration)
        return
    verb = "registered" if registration.created else "already registered"
    out.print(f"{verb}: {registration.arn} ({registration.status}) in {registration.group}", highlight=False)
    out.print(registration.verdict, highlight=False, markup=False)
    if registration.left_out:
        err.print(f"metadata left out (past SageMaker's limits): {', '.join(registration.left_out)}", markup=False)
