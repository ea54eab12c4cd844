"""`toolkit`: parse arguments, call the SDK, render results. Nothing else lives here.

Heavy libraries (torch, transformers, sagemaker) are imported inside the SDK calls, never at start-up.
Exit codes: 0 success, 1 the job failed, 2 bad input (config, data, arguments), 130 interrupted.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import click
import typer
import typer.core
from rich.console import Console

out = Console(soft_wrap=True, emoji=False)  # values like "a:b:c" are text: rich would print ":b:" as an emoji
err = Console(stderr=True, soft_wrap=True, emoji=False)

CONFIG_HELP = "A YAML file or a preset name (see `toolkit config presets`)."
ConfigArg = Annotated[str, typer.Argument(metavar="CONFIG", help=CONFIG_HELP)]
# The verbs that once took the config only as -c/--config (jobs, endpoint, image, infra) take it first too; -c stays
ConfigFirst = Annotated[str | None, typer.Argument(metavar="CONFIG", show_default=False, help=CONFIG_HELP)]
ConfigAlias = Annotated[
    str | None, typer.Option("--config", "-c", show_default=False, help="The config, as an option (an alias).")
]
# The closed sets of the CLI, as typed choices (their values appear in --help): tests/toolkit/test_cli_conventions.py
# checks TrainTarget against the registered targets (toolkit.config.targets; not imported here: --help stays fast)
TrainTarget = Literal["local", "training-job", "hyperpod"]
ServeTarget = Literal["endpoint", "local"]
ImageKind = Literal["serving", "training"]
EvalTarget = Literal["local", "endpoint"]
Effort = Literal["low", "medium", "high"]  # harmony's levels (toolkit_train.harmony.EFFORTS; a test ties the two)
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a field: section.field=value (repeatable).")]


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (the SDK's result, for pipelines).")]


def dataclasses_dict(value):
    import dataclasses

    return dataclasses.asdict(value)


def emit_json(result) -> None:
    """The SDK's result model as JSON on stdout: dataclasses as objects, enums and datetimes as strings."""
    import dataclasses

    value = dataclasses.asdict(result) if dataclasses.is_dataclass(result) and not isinstance(result, type) else result
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def non_interactive() -> bool:
    """No prompts and no live displays without a terminal, or under CI (CI=true/1, as CI systems set it)."""
    import os

    return not sys.stdin.isatty() or os.environ.get("CI", "").lower() in ("1", "true", "yes")


def fail(message: str, code: int = 2) -> NoReturn:
    err.print("[bold red]error:[/] ", end="")
    err.print(message, highlight=False, markup=False)  # values from configs and clouds are text, never markup
    raise typer.Exit(code)


def config_first(positionals: tuple[str | None, ...], alias: str | None, required: bool = True):
    """The config and the arguments after it: `CMD CONFIG NAME`, or the alias `CMD NAME -c CONFIG` (the
    positionals then shift by one). Returns the tuple with the config first."""
    if alias is not None:
        if positionals[-1] is not None:
            fail("give the config once: as the first argument or as -c/--config, not both")
        positionals = (alias, *positionals[:-1])
    if required and positionals[0] is None:
        fail("missing the config: the first argument (a YAML file or a preset name) or -c CONFIG")
    missing = [i for i, value in enumerate(positionals) if value is None]
    if required and missing:
        fail("missing an argument after the config (see --help)")
    return positionals


def _flags_take_no_value(params: list) -> list:
    """Flags show no value type (`<bool>`) in --help: they take no value."""
    for param in params:
        if getattr(param, "is_flag", False) and not getattr(param, "count", False):
            param.metavar = ""
    return params


class Commands(typer.core.TyperGroup):
    """Applies toolkit.errors' one map to every command: a known failure is one line and its exit code."""

    def get_params(self, ctx):
        return _flags_take_no_value(super().get_params(ctx))

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None and not isinstance(command, Commands):
            plain = command.get_params
            command.get_params = lambda ctx: _flags_take_no_value(plain(ctx))  # type: ignore[method-assign]  # + help option
        return command

    def invoke(self, ctx):
        from toolkit.errors import classify

        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, click.exceptions.ClickException):
            raise
        except (Exception, KeyboardInterrupt) as exc:
            known = classify(exc)
            if known is None:
                raise
            code, message = known
            if code == 130:
                raise typer.Exit(130) from None
            fail(message, code)


app = typer.Typer(
    cls=Commands,
    help="Fine-tune gpt-oss with LoRA (on this machine, SageMaker training jobs or HyperPod) and serve it with vLLM "
    "(a SageMaker endpoint or this machine). One config file drives every command: `toolkit plan CONFIG` sizes and "
    "prices a run, `train`, `deploy` and `invoke` run it; the groups below manage what they made.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def group(help_text: str) -> typer.Typer:
    return typer.Typer(cls=Commands, help=help_text, no_args_is_help=True)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"toolkit {version('toolkit')}")
        except PackageNotFoundError:  # a checkout on sys.path, not installed: nothing records a version
            typer.echo("toolkit (not installed: run `pip install -e .` for a version)")
        raise typer.Exit()


@app.callback()
def main_options(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log what the toolkit does: every AWS call, retries, timings.")
    ] = False,
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the toolkit's version and exit."),
    ] = False,
) -> None:
    if verbose:
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s", "%H:%M:%S"))
        logger = logging.getLogger("toolkit")
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)


config_app = group("Check, show and describe configs.")
data_app = group("Prepare training data.")
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")


def load(source: str, overrides: list[str] | None):
    from toolkit.config import ConfigError, load_config

    try:
        return load_config(source, overrides or [])
    except ConfigError as exc:
        fail(str(exc))


@config_app.command("validate")
def config_validate(
    files: Annotated[list[str], typer.Argument(metavar="CONFIG...", help="Files or preset names.")],
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate configs; exit 2 on the first problem, naming the file and field."""
    results = []
    for source in files:
        cfg = load(source, set_)
        results.append({"source": source, "name": cfg.name, "model": cfg.model.id, "target": cfg.target,
                        "not_checked": cfg.skipped_checks()})  # fmt: skip
        if as_json:
            continue
        out.print(f"[green]ok[/] {source}: {cfg.name} ({cfg.model.id}, target {cfg.target})", highlight=False)
        if cfg.skipped_checks():
            err.print(f"not checked (no GPU on this machine to size them by): {'; '.join(cfg.skipped_checks())}",
                      highlight=False, markup=False)  # fmt: skip
    if as_json:
        emit_json(results)


@config_app.command("show")
def config_show(source: ConfigArg, set_: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Print the resolved config (base, ${ENV} and --set applied, defaults filled in) as YAML, and what one
    optimizer step averages over on its target (as comments)."""
    import yaml

    cfg = load(source, set_)
    if as_json:
        emit_json({"config": cfg.model_dump(mode="json"), "optimizer_step": cfg.optimizer_step()})
        return
    sys.stdout.write(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True))
    sys.stdout.write("".join(f"# {line}\n" for line in cfg.optimizer_step()))  # comments: still valid YAML


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of config files (with base: and ${ENV}); point your editor's YAML plugin at it."""
    from toolkit.config.schema import file_schema

    sys.stdout.write(json.dumps(file_schema(), indent=2) + "\n")


@config_app.command("reference")
def config_reference() -> None:
    """Print the config reference as Markdown (docs/config-reference.md embeds this output)."""
    from toolkit.config.reference import markdown

    sys.stdout.write(markdown())


@config_app.command("presets")
def config_presets(as_json: JsonOpt = False) -> None:
    """List the presets shipped with the toolkit."""
    from toolkit.config import preset_names

    if as_json:
        emit_json(preset_names())
        return
    for name in preset_names():
        out.print(name, highlight=False)


@data_app.command("prepare")
def data_prepare(
    source: ConfigArg,
    output: Annotated[
        str | None,
        typer.Option(help="Directory or s3:// prefix for the Arrow dataset (default: runs/<name>/prepared)."),
    ] = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate, render and tokenize the data once; print token statistics (`toolkit plan` reads them); save it."""
    from rich.table import Table

    from toolkit.sdk import prepare_data

    cfg = load(source, set_)
    with status(f"preparing {cfg.data.source} ..."):  # cloud: an s3:// output
        report = prepare_data(cfg, output)
    if as_json:
        emit_json(report)
        return
    table = Table("statistic", "value", title=f"{cfg.data.source} ({cfg.data.format})")
    for key, value in report.items():
        if key not in ("output", "bad_rows"):
            table.add_row(key, str(value))
    out.print(table)
    for _, reason in report["bad_rows"][:10]:
        err.print(f"[yellow]skipped[/] {reason}", highlight=False)  # the reason names file and line
    out.print(f"saved to {report['output']} (set data.source to it to train on it)", highlight=False)


@app.command("train")
def train(
    source: ConfigArg,
    target: Annotated[TrainTarget | None, typer.Option(help="Where to train (default: the config's target).")] = None,
    set_: SetOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be submitted; create nothing.")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="Discard old checkpoints instead of resuming.")] = False,
    no_preflight: Annotated[
        bool,
        typer.Option("--no-preflight", help="training-job: skip the Service Quota check and the price line."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Train with LoRA on a target and wait for the result (a training job: quota and price checked first)."""
    from toolkit import sdk

    cfg = load(source, set_)
    if dry_run:
        sys.stdout.write(sdk.render_train(cfg, target) + "\n")
        return
    # its errors take the exit code of their kind (toolkit.errors)
    job = sdk.train(cfg, target, fresh=fresh, preflight=not no_preflight, on_note=note)
    state = follow(job)
    if as_json:
        emit_json(state)
        raise typer.Exit(0 if state.status.value == "Completed" else 1)
    if state.status.value == "Completed":
        if state.detail:  # what trained, where the target records it
            out.print(state.detail, highlight=False, markup=False)
        for kind, where in state.artifacts.items():
            out.print(f"[green]{kind}:[/] {where}", highlight=False)
        return
    fail(f"job {state.name} {state.status.value.lower()}: {state.detail}", code=1)


def note(line: str) -> None:
    err.print(line, highlight=False, markup=False)


def follow(job):
    """Render a job's follow (toolkit.targets.base.Job.follow: progress, lines, the interrupt policy)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from toolkit.sdk import JobDetached, JobInterrupted

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]} val {task.fields[eval_loss]}"), TimeElapsedColumn(), console=err,
    )  # fmt: skip
    task = progress.add_task(f"training {job.name}", total=None, loss="-", eval_loss="-")

    def on_progress(metrics) -> None:  # a training line (loss) or a validation line (eval_loss, data.eval)
        progress.update(task, completed=metrics.step, total=metrics.total_steps)
        for name in ("loss", "eval_loss"):
            if name in metrics.values:
                progress.tasks[0].fields[name] = f"{metrics.values[name]:.4f}"

    def on_line(line: str) -> None:
        if line.startswith("[toolkit] interrupted"):
            progress.stop()  # plain lines from here: a live display repeated the line below when it ended
            err.print(line.removeprefix("[toolkit] "), highlight=False, markup=False)
        elif line.startswith("[toolkit]") or "Error" in line:
            progress.console.print(line, highlight=False, markup=False)

    try:
        with progress:
            return job.follow(on_progress, on_line)
    except JobDetached:
        err.print(
            f"detached; {job.name} keeps running. Follow it again with: "
            f"toolkit jobs logs CONFIG {job.name} --follow (or jobs status / jobs stop)"
        )
    except JobInterrupted as stopped:
        err.print(f"{stopped.state.status.value}: {stopped.state.detail}", highlight=False, markup=False)
    raise typer.Exit(130)


def _duration(hours: float) -> str:
    """A plan's time: hours from one up, minutes from one up, else seconds (a short run is not "0 min")."""
    if hours >= 1:
        return f"{hours:.1f} h"
    return f"{hours * 60:.0f} min" if hours * 60 >= 1 else f"{max(hours * 3600, 1):.0f} s"


@app.command("plan")
def plan(
    source: ConfigArg,
    target: Annotated[TrainTarget | None, typer.Option(help="Plan as if the config's target were this.")] = None,
    tokens: Annotated[
        int | None, typer.Option(min=1, help="Tokens in one epoch of the data (default: `data prepare`'s count).")
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option("--price", help="USD per instance-hour, TYPE=USD or USD for all (repeatable); beats AWS's."),
    ] = None,
    offline: Annotated[
        bool, typer.Option("--offline", help="No AWS calls: the shipped price file, no quota check.")
    ] = False,
    all_types: Annotated[bool, typer.Option("--all", help="Also list instance types that do not fit.")] = False,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Before a run: per target and instance type, whether it fits in GPU memory, the expected tokens/s,
    wall-clock and cost (on demand, spot range), and the account's quota for it; every figure says its source."""
    from toolkit import sdk

    cfg = load(source, set_)
    result = sdk.plan(cfg, target, tokens=tokens, prices=sdk.parse_price_overrides(price or []), online=not offline,
                      all_types=all_types)  # fmt: skip
    if as_json:
        emit_json(result)
        return
    _print_plan(result)


def _print_plan(result) -> None:
    from rich.table import Table

    # a pipe or file: keep rows on one line
    wide = out if out.is_terminal else Console(soft_wrap=True, width=160, emoji=False)
    table = Table("", "candidate", "GPUs", "fits", "tokens/s", "time", "on demand", "spot", "quota",
                  title=f"{result.config}: {result.model}, {_count(result.data_tokens)} tokens per epoch")  # fmt: skip
    for c in result.candidates:
        rate = f"{c.tokens_per_s:,.0f} ({c.throughput})" if c.tokens_per_s else "-"
        time = "-" if c.hours is None else _duration(c.hours)
        per_hour = f"${c.usd_per_hour:,.2f}/h" if c.usd_per_hour is not None else "no price"
        cost = f"${c.cost_usd:,.2f} ({per_hour})" if c.cost_usd is not None else per_hour
        spot = f"${c.spot_cost_usd[0]:,.2f}-{c.spot_cost_usd[1]:,.2f}" if c.spot_cost_usd else "-"
        quota = "?" if c.quota is None else f"{c.quota:g}" + (" too low" if c.problem else "")
        table.add_row("*" if c.configured else "", f"{c.target} {c.nodes} x {c.instance_type}", str(c.gpus), c.fits,
                      rate, time, cost, spot, quota)  # fmt: skip
    wide.print(table)
    wide.print(
        f"{'* the target of the config. ' if any(c.configured for c in result.candidates) else ''}tokens per epoch: "
        f"{result.data_tokens_source}. time: the training steps only (not start-up, model download, merge); spot: "
        "AWS's 'up to 90%' savings up to the on-demand cost. quota ?: not read (see below).",
        highlight=False,
        markup=False,
    )
    for c in result.candidates:
        wide.print(f"{c.target} {c.nodes} x {c.instance_type}:", style="bold", highlight=False, markup=False)
        for label, text in (("fits", f"{c.fits}: {c.fits_detail}"), ("tokens/s", f"{c.throughput}: "
                            f"{c.throughput_detail or '-'}"), ("price", c.price_source),
                            ("quota", f"{c.quota_name!r}: {c.quota_detail}")):  # fmt: skip
            wide.print(f"  {label}: {text}", highlight=False, markup=False)
    if result.left_out:
        names = ", ".join(line.split(":", 1)[0] for line in result.left_out)
        err.print(f"left out, they do not fit ({len(result.left_out)}; --all shows them): {names}", highlight=False,
                  markup=False)  # fmt: skip
    for line in result.notes:
        err.print(line, highlight=False, markup=False)
    for c in result.candidates:
        if c.problem:
            err.print(f"warning: {c.target} {c.instance_type}: {c.problem}", highlight=False, markup=False)


def _count(value: int | None) -> str:
    return f"{value:,}" if value is not None else "?"


jobs_app = group("Jobs started earlier, on any target, from any machine.")
app.add_typer(jobs_app, name="jobs")
TargetOpt = Annotated[TrainTarget | None, typer.Option(help="Target of the job (default: the config's).")]
JobName = Annotated[
    str | None,
    typer.Argument(metavar="NAME", show_default=False, help="The job's name (`toolkit jobs list` shows them)."),
]


def _attach(config: str, name: str, target: str | None):
    from toolkit import sdk

    return sdk.job(load(config, None), name, target)


@jobs_app.command("status")
def jobs_status(
    source: ConfigFirst = None, name: JobName = None, config: ConfigAlias = None, target: TargetOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Status, detail (failure reason) and artifacts of a job."""
    from toolkit import sdk

    source, name = config_first((source, name), config)
    assert source is not None and name is not None
    state = sdk.job_status(load(source, None), name, target)
    if as_json:
        emit_json(state)
        raise typer.Exit(1 if state.status.value == "Failed" else 0)
    out.print(f"{state.name}: {state.status.value} {state.detail}", highlight=False)
    for kind, where in state.artifacts.items():
        out.print(f"  {kind}: {where}", highlight=False)
    if state.status.value == "Failed":
        raise typer.Exit(1)


@jobs_app.command("logs")
def jobs_logs(
    source: ConfigFirst = None,
    name: JobName = None,
    config: ConfigAlias = None,
    target: TargetOpt = None,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the job ends.")] = False,
) -> None:
    """Print a job's log (every host's stream)."""
    source, name = config_first((source, name), config)
    assert source is not None and name is not None
    try:
        for line in _attach(source, name, target).logs(follow=follow_):
            out.print(line, highlight=False, markup=False)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@jobs_app.command("stop")
def jobs_stop(
    source: ConfigFirst = None, name: JobName = None, config: ConfigAlias = None, target: TargetOpt = None
) -> None:
    """Stop a job (it checkpoints on SIGTERM first)."""
    source, name = config_first((source, name), config)
    assert source is not None and name is not None
    _attach(source, name, target).stop()
    out.print(f"stop requested for {name}", highlight=False)


@jobs_app.command("list")
def jobs_list(
    source: ConfigFirst = None, config: ConfigAlias = None, target: TargetOpt = None, as_json: JsonOpt = False
) -> None:
    """Recent jobs of a target (training-job keeps a list), newest first."""
    from rich.table import Table

    from toolkit import sdk

    (source,) = config_first((source,), config)
    assert source is not None
    jobs = sdk.list_jobs(load(source, None), target)
    if as_json:
        emit_json([dataclasses_dict(job) for job in jobs])
        return
    table = Table("name", "status", "created")
    for job in jobs:
        table.add_row(job.name, job.status, job.created)
    out.print(table)


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
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def _aws_settings(source: str | None, alias: str | None):
    from toolkit.config.models import AwsSettings

    (config,) = config_first((source,), alias, required=False)
    return load(config, None).aws if config else AwsSettings()


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if non_interactive():
        fail(f"{question} Pass --yes to confirm in a non-interactive run.")
    if not typer.confirm(question):
        raise typer.Exit(1)


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
        _confirm(f"Apply these {len(planned.changes)} changes to {stack}?", yes)
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
    _confirm(f"Delete stack {stack}{' and all data in its bucket' if force else ''}?", yes)
    with status(f"deleting {stack} ...") as update:
        sdk.infra_destroy(settings, stack, force, update)
    out.print(f"deleted {stack}")


DeployTarget = Annotated[
    ServeTarget | None,
    typer.Option(
        "--target",
        help="endpoint: a SageMaker endpoint; local: vLLM on this machine (default: local when the config's target "
        "is local, else endpoint).",
    ),
]


def _live():
    """A spinner on stderr, or a no-op when another process owns the terminal: a server started in the
    background (`toolkit deploy --target local &`) must not draw over the foreground command's display."""
    import os

    if not err.is_terminal or non_interactive():
        return None
    try:
        foreground = os.tcgetpgrp(sys.stderr.fileno()) == os.getpgrp()
    except OSError:
        foreground = False
    return err if foreground else None


@contextlib.contextmanager
def status(message: str):
    """`with status("...") as update: update("...")`; plain, infrequent lines when not in the foreground."""
    console = _live()
    if console is None:
        err.print(message, highlight=False, markup=False)
        yield lambda line: None
        return
    with console.status(message) as spinner:
        yield lambda line: spinner.update(line)


@app.command("deploy")
def deploy(
    source: ConfigArg,
    target: DeployTarget = None,
    image_uri: Annotated[str | None, typer.Option(help="Serve this image; skip the build.")] = None,
    model_data: Annotated[str | None, typer.Option(help="S3 URI of model.tar.gz (default: latest job's).")] = None,
    model_dir: Annotated[
        str | None, typer.Option(help="local: the model directory (default: training output).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="local: port (default: serving.local_port).")] = None,
    model_package: Annotated[
        str | None,
        typer.Option(metavar="ARN|VERSION", help="Serve this registered version (only an Approved one)."),
    ] = None,
    allow_unapproved: Annotated[
        bool, typer.Option("--allow-unapproved", help="Deploy a --model-package version that is not Approved.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print every request; create nothing.")] = False,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Serve the trained model: a SageMaker endpoint (created, or updated blue/green) or vLLM on this machine."""
    from toolkit import sdk

    cfg = load(source, set_)
    endpoint_only = model_package is not None or image_uri is not None or model_data is not None
    target = sdk.serve_target(cfg, target or ("endpoint" if endpoint_only else None))
    if model_package is not None and (target == "local" or image_uri or model_data):
        fail("--model-package: the registered version brings its image and model; it deploys to --target endpoint "
             "without --image-uri or --model-data")  # fmt: skip
    if allow_unapproved and model_package is None:
        fail("--allow-unapproved applies to --model-package only: name the registered version to deploy")
    if target == "local":
        return _deploy_local(cfg, model_dir, port, dry_run)
    sent: list[str] = []  # endpoint requests already made: what Ctrl-C leaves behind
    if model_package is not None:  # refused before anything is shown or made when it is not Approved
        package = sdk.registered_version(cfg, model_package, allow_unapproved)
        if package.note:
            err.print(package.note, highlight=False, markup=False)
    try:
        if dry_run:
            requests = sdk.render_deploy(cfg, image_uri, model_data, model_package=model_package,
                                         allow_unapproved=allow_unapproved)  # fmt: skip
            shown = [{r.operation if r.service == "sagemaker" else f"{r.service}.{r.operation}": r.params}
                     for r in requests]  # fmt: skip
            sys.stdout.write(json.dumps(shown, indent=2, default=str) + "\n")
            if not requests:
                err.print("the endpoint already serves this image and model: nothing to do")
            return

        def on_status(line: str) -> None:
            if line.split(" ", 1)[0] in {f"{verb}_{kind}" for verb in ("create", "update", "delete")
                                         for kind in ("endpoint", "inference_component")}:  # fmt: skip
                sent.append(line)
            update(line[-160:])

        with status(f"deploying {cfg.name} ...") as update:
            state = sdk.deploy(cfg, image_uri, model_data, on_status=on_status, model_package=model_package,
                               allow_unapproved=allow_unapproved)  # fmt: skip
    except KeyboardInterrupt:
        if sent:
            err.print(
                "detached: SageMaker goes on creating/updating the endpoint (a failed update rolls back by itself). "
                f"Check it with: toolkit endpoint describe {source}"
            )
        else:
            err.print("interrupted before the endpoint was touched; re-run the same command to deploy")
        raise typer.Exit(130) from None
    if as_json:
        emit_json(state)
        return
    done = "up to date" if not state.actions else "deployed"
    out.print(f"[green]{done}:[/] endpoint {state.name} serves {state.config_name}", highlight=False)
    out.print(f"try it: toolkit invoke {source} 'Wie viele Planeten hat das Sonnensystem?' --reasoning-language French",
              highlight=False, markup=False)  # fmt: skip


def _deploy_local(cfg, model_dir: str | None, port: int | None, dry_run: bool) -> None:
    import signal

    from toolkit import sdk

    if dry_run:
        plan = sdk.render_serve_local(cfg, model_dir, port)
        sys.stdout.write(json.dumps(plan, indent=2) + "\n")
        return

    def interrupt(*_):
        raise KeyboardInterrupt

    # SIGINT and SIGTERM both stop vLLM: a shell starts background jobs with SIGINT ignored
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    server = None
    try:
        server = sdk.serve_local(cfg, model_dir, port)
        for note in server.notes:
            err.print(note, highlight=False, markup=False)
        with status("starting vLLM ...") as update:
            server.wait_ready(on_status=lambda line: update(f"starting vLLM: {line[-120:]}"))
    except KeyboardInterrupt:
        if server is not None:
            server.stop()
        raise typer.Exit(130) from None
    assert server is not None and server.process is not None  # every failure above has raised
    try:  # the served prompt must be the trained prompt (tools, multi-turn, effort): refuse to serve on drift
        with status("checking that vLLM renders prompts as training did ..."):
            problems = sdk.prompt_drift(cfg, server.url)
    except (KeyboardInterrupt, Exception):
        import time

        deadline = time.monotonic() + 10  # a server killed mid-check is reaped a moment after its socket closes
        while (died := server.process.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        server.stop()
        if died is not None:  # the server went away during the check: say so, as when it dies while serving
            fail(server.ended(died), code=1)
        raise
    if problems:
        server.stop()
        shown = "; ".join(problems[:3])
        fail(f"the served prompt is not the trained prompt: {shown}. Serve with the pinned vLLM (scripts/env.sh, "
             "the serving image) or retrain with this toolkit's rendering", code=1)  # fmt: skip
    out.print(f"[green]serving[/] {server.model} at {server.url} (/ping, /invocations, /v1/chat/completions); "
              f"log: {server.log}. Ctrl-C stops it.", highlight=False)  # fmt: skip
    try:
        code = server.process.wait()
    except KeyboardInterrupt:
        server.stop()
        out.print("stopped")
        return
    server.stop()  # the API server died: end its engine and workers too
    fail(server.ended(code), code=1)


@app.command("invoke")
def invoke(
    source: ConfigArg,
    question: Annotated[str, typer.Argument(help="The user message.")],
    reasoning_language: Annotated[
        str | None, typer.Option(help="System prompt 'reasoning language: X' (the model reasons in X).")
    ] = None,
    system: Annotated[str | None, typer.Option(help="More system instructions.")] = None,
    tools: Annotated[str | None, typer.Option(help="A JSON file: a list of OpenAI function tools.")] = None,
    reasoning_effort: Annotated[
        Effort | None, typer.Option(help="The system message's reasoning level (default: the model's).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 512,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.7,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Print tokens as they arrive.")] = True,
    target: DeployTarget = None,
    url: Annotated[str | None, typer.Option(help="A server's base URL (implies a local/HTTP target).")] = None,
    wait: Annotated[float, typer.Option(help="local/url: wait up to this many seconds for the server.")] = 0,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Exit 1 unless the reply has both a reasoning and an answer part and no special tokens."
        ),
    ] = False,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask the served model: the reasoning (analysis channel) and the final answer are shown apart."""
    from toolkit import sdk
    from toolkit.sdk import (
        ChatReply,
        before_markup,
        cut_off,
        markup_note,
        messages_for,
        read_tools,
        reply_problems,
        show_tool_calls,
        wait_for,
    )

    cfg = load(source, set_)
    target = sdk.serve_target(cfg, target)
    messages = messages_for(question, reasoning_language, system)
    try:
        extra: dict[str, Any] = {"tools": read_tools(tools) if tools else None, "reasoning_effort": reasoning_effort}
        client = sdk.chat_client(cfg, target, url)
        if wait and (url or target == "local"):
            with status("waiting for the server ..."):
                wait_for(url or f"http://127.0.0.1:{cfg.serving.local_port}", wait)
        if as_json:  # the whole reply at once: content, reasoning, tool_calls, finish_reason, usage, model
            reply = client.chat(messages, max_tokens, temperature, **extra)
            emit_json(reply)
        elif not stream:
            reply = client.chat(messages, max_tokens, temperature, **extra)
            if before_markup(reply.reasoning):  # model text is never read as rich markup
                err.print("[dim]reasoning:[/] ", end="")
                err.print(before_markup(reply.reasoning), highlight=False, markup=False)
            for line in show_tool_calls(reply.tool_calls):
                out.print(line, highlight=False, markup=False)
            if before_markup(reply.content) or not reply.tool_calls:
                out.print("[dim]answer:[/] ", end="")
                out.print(before_markup(reply.content), highlight=False, markup=False)
        else:
            parts = {"reasoning": "", "content": ""}
            calls: dict[int, dict] = {}
            finish = ""
            for delta in client.stream(messages, max_tokens, temperature, **extra):
                if delta.kind == "finish":
                    finish = delta.text
                    continue
                if delta.kind == "tool_call":  # shown whole once the reply ends
                    call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    call["name"] += delta.name
                    call["arguments"] += delta.text
                    continue
                shown = len(before_markup(parts[delta.kind]))  # raw harmony tokens and what follows stay unshown
                parts[delta.kind] += delta.text
                text = before_markup(parts[delta.kind])[shown:]
                if text and not shown:
                    label = "reasoning: " if delta.kind == "reasoning" else "\nanswer: "
                    (err if delta.kind == "reasoning" else out).print(f"[dim]{label}[/]", end="")
                (err if delta.kind == "reasoning" else out).print(text, end="", highlight=False, markup=False)
            out.print()
            reply = ChatReply(parts["content"], parts["reasoning"], finish, {}, tool_calls=list(calls.values()))
            for line in show_tool_calls(reply.tool_calls):
                out.print(line, highlight=False, markup=False)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    ended_early = cut_off(reply.finish_reason, max_tokens)
    for note in (markup_note(reply), ended_early) if not as_json else ():  # the JSON carries both itself
        if note:
            err.print(note, style="yellow", highlight=False, markup=False)
    problems = reply_problems(reply) if check else []
    if check and ended_early:
        problems.insert(0, f"was {ended_early}")
    if problems:
        fail("the reply " + "; ".join(problems), code=1)


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
    max_tokens: Annotated[int, typer.Option(min=1, help="New tokens per generated reply.")] = 256,
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
    """Score the fine-tuned model against the base on the held-out rows (data.eval); writes runs/<name>/eval/."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from toolkit import sdk

    cfg = load(source, set_)
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), console=err)
    bars: dict = {}

    def on_row(label: str, generated, total: int) -> None:
        if label not in bars:
            bars[label] = progress.add_task(f"generating ({label})", total=total)
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
    from rich.table import Table

    from toolkit import sdk

    endpoints = sdk.list_endpoints(load(_config(source, config), None))
    if as_json:
        emit_json([dataclasses_dict(item) for item in endpoints])
        return
    table = Table("name", "status", "modified")
    for item in endpoints:
        table.add_row(item.name, item.status, item.modified)
    out.print(table)


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
    _confirm(f"Delete adapter {adapter} (and endpoint {endpoints.name} if no other adapter is on it)?" if adapter
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
