"""`toolkit`: parse arguments, call the SDK, render results. Nothing else lives here.

Heavy libraries (torch, transformers, sagemaker) are imported inside the SDK calls, never at start-up.
Exit codes: 0 success, 1 the job failed, 2 bad input (config, data, arguments), 130 interrupted.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import click
import typer
import typer.core
from rich.console import Console

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

ConfigArg = Annotated[str, typer.Argument(help="A YAML file or a preset name (see `toolkit config presets`).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a field: section.field=value (repeatable).")]
METRICS = re.compile(r"^\[metrics\] step=(\d+)/(\d+) loss=([\d.eE+-]+)")


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (the SDK's result, for pipelines).")]


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


class Commands(typer.core.TyperGroup):
    """Applies toolkit.errors' one map to every command: a known failure is one line and its exit code."""

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
    help="Fine-tune gpt-oss with LoRA on SageMaker and serve it: one config, three verbs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Check, show and describe configs.", no_args_is_help=True)
data_app = typer.Typer(help="Prepare training data.", no_args_is_help=True)
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
    files: Annotated[list[str], typer.Argument(help="Files or preset names.")], set_: SetOpt = None
) -> None:
    """Validate configs; exit 2 on the first problem, naming the file and field."""
    for source in files:
        cfg = load(source, set_)
        out.print(f"[green]ok[/] {source}: {cfg.name} ({cfg.model.id}, target {cfg.target})", highlight=False)
        if cfg.skipped_checks():
            err.print(f"not checked (no GPU on this machine to size them by): {'; '.join(cfg.skipped_checks())}",
                      highlight=False, markup=False)  # fmt: skip


@config_app.command("show")
def config_show(source: ConfigArg, set_: SetOpt = None) -> None:
    """Print the resolved config (base, ${ENV} and --set applied, defaults filled in) as YAML, and what one
    optimizer step averages over on its target (as comments)."""
    import yaml

    cfg = load(source, set_)
    sys.stdout.write(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True))
    sys.stdout.write("".join(f"# {line}\n" for line in cfg.optimizer_step()))  # comments: still valid YAML


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON Schema of config files (with base: and ${ENV}); point your editor's YAML plugin at it."""
    from toolkit.config.schema import file_schema

    sys.stdout.write(json.dumps(file_schema(), indent=2) + "\n")


@config_app.command("reference")
def config_reference() -> None:
    """Print the config reference as Markdown (the README's reference is this output)."""
    from toolkit.config.reference import markdown

    sys.stdout.write(markdown())


@config_app.command("presets")
def config_presets() -> None:
    """List the presets shipped with the toolkit."""
    from toolkit.config import preset_names

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
) -> None:
    """Validate, render and tokenize the data once; print token statistics; save it."""
    from rich.table import Table

    from toolkit.entrypoints.data import DataError
    from toolkit.sdk import prepare_data

    cfg = load(source, set_)
    try:
        with status(f"preparing {cfg.data.source} ..."):  # cloud: an s3:// output
            report = prepare_data(cfg, output)
    except DataError as exc:
        fail(str(exc))
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
    target: Annotated[str | None, typer.Option(help="local | training-job | hyperpod (default: the config's).")] = None,
    set_: SetOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be submitted; create nothing.")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="Discard old checkpoints instead of resuming.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Train with LoRA on a target and wait for the result."""
    from toolkit import sdk
    from toolkit.aws import AwsError
    from toolkit.config import ConfigError
    from toolkit.targets.base import TargetError

    cfg = load(source, set_)
    try:
        if dry_run:
            sys.stdout.write(sdk.render_train(cfg, target) + "\n")
            return
        job = sdk.train(cfg, target, fresh=fresh)
    except (ConfigError, TargetError, AwsError) as exc:
        fail(str(exc))
    state = follow(job)
    if as_json:
        emit_json(state)
        raise typer.Exit(0 if state.status.value == "Completed" else 1)
    if state.status.value == "Completed":
        for kind, where in state.artifacts.items():
            out.print(f"[green]{kind}:[/] {where}", highlight=False)
        return
    fail(f"job {state.name} {state.status.value.lower()}: {state.detail}", code=1)


def follow(job):
    """Wait for a job with a progress bar fed by the entrypoint's [metrics] lines; Ctrl-C stops cleanly."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=err,
    )  # fmt: skip
    task = progress.add_task(f"training {job.name}", total=None, loss="-")

    def on_line(line: str) -> None:
        match = METRICS.match(line)
        if match:
            step, total, loss = match.groups()
            progress.update(task, completed=int(step), total=int(total), loss=loss)
        elif line.startswith("[toolkit]") or "Error" in line:
            progress.console.print(line, highlight=False, markup=False)

    import signal

    def terminate(*_):  # SIGTERM (a CI runner cancelling, `kill`) stops the job like Ctrl-C: checkpoint first
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    with progress:
        try:
            return job.wait(on_line)
        except KeyboardInterrupt:
            if not job.stops_on_interrupt:
                progress.stop()
                err.print(
                    f"detached; {job.name} keeps running. Follow it again with: "
                    f"toolkit jobs logs {job.name} --follow -c CONFIG (or jobs status / jobs stop)"
                )
                raise typer.Exit(130) from None
            # a second interrupt, whenever it comes from here on, stops the job at once (no checkpoint)
            signal.signal(signal.SIGINT, lambda *_: _stop_now(job))
            signal.signal(signal.SIGTERM, lambda *_: _stop_now(job))
            progress.stop()  # plain lines from here: a live display repeated the line below when it ended
            err.print("interrupted: asking the job to checkpoint and stop ... (interrupt again to stop at once)")
            job.stop()
            state = job.wait(on_line)
    err.print(f"{state.status.value}: {state.detail}", highlight=False, markup=False)
    raise typer.Exit(130)


def _stop_now(job) -> None:
    from toolkit.targets.base import TargetError

    with contextlib.suppress(TargetError):  # it may have ended meanwhile
        job.stop(now=True)


jobs_app = typer.Typer(help="Jobs started earlier, on any target, from any machine.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
JobConfig = Annotated[str, typer.Option("--config", "-c", help="The job's config (AWS region, endpoint, paths).")]
TargetOpt = Annotated[str | None, typer.Option(help="Target of the job (default: the config's).")]


def _attach(config: str, name: str, target: str | None):
    from toolkit import sdk

    return sdk.job(load(config, None), name, target)


@jobs_app.command("status")
def jobs_status(name: str, config: JobConfig, target: TargetOpt = None, as_json: JsonOpt = False) -> None:
    """Status, detail (failure reason) and artifacts of a job."""
    from toolkit import sdk

    state = sdk.job_status(load(config, None), name, target)
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
    name: str,
    config: JobConfig,
    target: TargetOpt = None,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the job ends.")] = False,
) -> None:
    """Print a job's log (every host's stream)."""
    try:
        for line in _attach(config, name, target).logs(follow=follow_):
            out.print(line, highlight=False, markup=False)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@jobs_app.command("stop")
def jobs_stop(name: str, config: JobConfig, target: TargetOpt = None) -> None:
    """Stop a job (it checkpoints on SIGTERM first)."""
    _attach(config, name, target).stop()
    out.print(f"stop requested for {name}", highlight=False)


@jobs_app.command("list")
def jobs_list(config: JobConfig, target: TargetOpt = None) -> None:
    """Recent jobs of a target."""
    from rich.table import Table

    from toolkit import sdk

    jobs = sdk.list_jobs(load(config, None), target)
    table = Table("name", "status", "created")
    for job in jobs:
        table.add_row(job["TrainingJobName"], job["TrainingJobStatus"], str(job["CreationTime"]))
    out.print(table)


infra_app = typer.Typer(
    help="The AWS resources (role, bucket, ECR repository, KMS key) as a stack.", no_args_is_help=True
)
app.add_typer(infra_app, name="infra")
StackOpt = Annotated[str, typer.Option("--stack", help="CloudFormation stack name.")]
AwsConfig = Annotated[
    str | None, typer.Option("--config", "-c", help="Config whose aws section (region, endpoint) to use.")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def _aws_settings(config: str | None):
    from toolkit.config.models import AwsSettings

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
    config: AwsConfig = None,
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
) -> None:
    """Create or update the stack: show the parameters and changes, then apply them with progress."""
    from rich.table import Table

    from toolkit import infra, sdk

    settings = _aws_settings(config)
    export = infra.ExportRole(export_eks_cluster, export_namespace, export_service_account)
    parameters = infra.parameters(
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
    for key, value in values.items():
        out.print(f"{key}: {value}", highlight=False)


@infra_app.command("outputs")
def infra_outputs(
    stack: StackOpt = "toolkit",
    config: AwsConfig = None,
    base: Annotated[
        str, typer.Option(help="The config (file or preset) the written file builds on.")
    ] = "gpt-oss-20b-lora",
    write: Annotated[Path | None, typer.Option(help="Write a config file with the AWS fields filled in.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the stack's outputs, or write them into a config file (base + aws section)."""
    from toolkit import infra, sdk

    settings = _aws_settings(config)
    values = sdk.infra_outputs(settings, stack)
    if as_json:
        emit_json(values)
        return
    if write is None:
        for key, value in values.items():
            out.print(f"{key}: {value}", highlight=False)
        return
    write.write_text(infra.config_overlay(base, values, settings.region))
    load(str(write), None)  # what we wrote must validate
    out.print(f"wrote {write}", highlight=False)


@infra_app.command("destroy")
def infra_destroy(
    stack: StackOpt = "toolkit",
    config: AwsConfig = None,
    force: Annotated[bool, typer.Option("--force", help="Also delete the bucket's data.")] = False,
    yes: YesOpt = False,
) -> None:
    """Delete the stack; refuses while the bucket holds data unless --force."""
    from toolkit import sdk

    settings = _aws_settings(config)
    _confirm(f"Delete stack {stack}{' and all data in its bucket' if force else ''}?", yes)
    with status(f"deleting {stack} ...") as update:
        sdk.infra_destroy(settings, stack, force, update)
    out.print(f"deleted {stack}")


DeployTarget = Annotated[str, typer.Option("--target", help="endpoint (SageMaker) | local (vLLM on this machine).")]


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
    target: DeployTarget = "endpoint",
    image_uri: Annotated[str | None, typer.Option(help="Serve this image; skip the build.")] = None,
    model_data: Annotated[str | None, typer.Option(help="S3 URI of model.tar.gz (default: latest job's).")] = None,
    model_dir: Annotated[
        str | None, typer.Option(help="local: the model directory (default: training output).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="local: port (default: serving.local_port).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print every request; create nothing.")] = False,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Serve the trained model: a SageMaker endpoint (created, or updated blue/green) or vLLM on this machine."""
    from toolkit import sdk

    cfg = load(source, set_)
    if target == "local":
        return _deploy_local(cfg, model_dir, port, dry_run)
    if target != "endpoint":
        fail(f"--target must be endpoint or local, not {target!r}")
    sent: list[str] = []  # endpoint requests already made: what Ctrl-C leaves behind
    try:
        if dry_run:
            requests = sdk.render_deploy(cfg, image_uri, model_data)
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
            state = sdk.deploy(cfg, image_uri, model_data, on_status=on_status)
    except KeyboardInterrupt:
        if sent:
            err.print(
                "detached: SageMaker goes on creating/updating the endpoint (a failed update rolls back by itself). "
                f"Check it with: toolkit endpoint describe -c {source}"
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
    out.print(f"[green]serving[/] {server.model} at {server.url} (/ping, /invocations, /v1/chat/completions); "
              f"log: {server.log}. Ctrl-C stops it.", highlight=False)  # fmt: skip
    try:
        code = server.process.wait()
    except KeyboardInterrupt:
        server.stop()
        out.print("stopped")
        return
    server.stop()  # the API server died: end its engine and workers too
    fail(f"the server exited with {code}; its log ends:\n{server.log_tail()}", code=1)


@app.command("invoke")
def invoke(
    source: ConfigArg,
    question: Annotated[str, typer.Argument(help="The user message.")],
    reasoning_language: Annotated[
        str | None, typer.Option(help="System prompt 'reasoning language: X' (the model reasons in X).")
    ] = None,
    system: Annotated[str | None, typer.Option(help="More system instructions.")] = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 512,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.7,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Print tokens as they arrive.")] = True,
    target: DeployTarget = "endpoint",
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
    from toolkit.deploy.client import ChatReply, messages_for, reply_problems, wait_for

    cfg = load(source, set_)
    messages = messages_for(question, reasoning_language, system)
    try:
        client = sdk.chat_client(cfg, target, url)
        if wait and (url or target == "local"):
            with status("waiting for the server ..."):
                wait_for(url or f"http://127.0.0.1:{cfg.serving.local_port}", wait)
        if as_json:  # the whole reply at once: content, reasoning, finish_reason, usage, model
            reply = client.chat(messages, max_tokens, temperature)
            emit_json(reply)
        elif not stream:
            reply = client.chat(messages, max_tokens, temperature)
            if reply.reasoning:  # model text is never read as rich markup
                err.print("[dim]reasoning:[/] ", end="")
                err.print(reply.reasoning, highlight=False, markup=False)
            out.print("[dim]answer:[/] ", end="")
            out.print(reply.content, highlight=False, markup=False)
        else:
            parts = {"reasoning": "", "content": ""}
            for delta in client.stream(messages, max_tokens, temperature):
                if not parts[delta.kind]:
                    label = "reasoning: " if delta.kind == "reasoning" else "\nanswer: "
                    (err if delta.kind == "reasoning" else out).print(f"[dim]{label}[/]", end="")
                parts[delta.kind] += delta.text
                (err if delta.kind == "reasoning" else out).print(delta.text, end="", highlight=False, markup=False)
            out.print()
            reply = ChatReply(parts["content"], parts["reasoning"], "", {})
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    problems = reply_problems(reply) if check else []
    if problems:
        fail("the reply " + "; ".join(problems), code=1)


image_app = typer.Typer(help="The toolkit's container images (built with docker, pushed to ECR).", no_args_is_help=True)
app.add_typer(image_app, name="image")


@image_app.command("build")
def image_build(
    kind: Annotated[str, typer.Argument(help="serving (vLLM endpoint) or training (HyperPod pods, training jobs).")],
    config: JobConfig,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the image URI; build nothing.")] = False,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Build an image and push it to ECR unless the registry already has this content's tag; print its URI."""
    from toolkit import sdk

    if kind not in ("serving", "training"):
        fail(f"image kind must be serving or training, not {kind!r}", code=2)
    cfg = load(config, set_)
    with status(f"building the {kind} image ...") as update:
        uri = sdk.build_image(cfg, lambda line: update(line[-160:]), kind=kind, dry_run=dry_run)  # type: ignore[arg-type]
    if as_json:
        emit_json({"image_uri": uri})
        return
    sys.stdout.write(uri + "\n")


endpoint_app = typer.Typer(help="SageMaker endpoints made by `toolkit deploy`.", no_args_is_help=True)
app.add_typer(endpoint_app, name="endpoint")


@endpoint_app.command("list")
def endpoint_list(config: JobConfig) -> None:
    """Endpoints in the config's account and region."""
    from rich.table import Table

    from toolkit import sdk

    table = Table("name", "status", "modified")
    endpoints = sdk.endpoints(load(config, None)).list_endpoints()
    for item in endpoints:
        table.add_row(item["EndpointName"], item["EndpointStatus"], str(item["LastModifiedTime"]))
    out.print(table)


@endpoint_app.command("describe")
def endpoint_describe(config: JobConfig, as_json: JsonOpt = False) -> None:
    """Status, serving config, instances and failure reason of the config's endpoint."""
    from toolkit import sdk

    endpoints = sdk.endpoints(load(config, None))
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
def endpoint_delete(config: JobConfig, yes: YesOpt = False) -> None:
    """Delete the endpoint with its config and model (the model data in S3 stays). serving.weights: adapter: the
    config's adapter component, and the base and endpoint once no other adapter is on them."""
    from toolkit import sdk

    endpoints = sdk.endpoints(load(config, None))
    adapter = getattr(endpoints, "adapter", None)
    _confirm(f"Delete adapter {adapter} (and endpoint {endpoints.name} if no other adapter is on it)?" if adapter
             else f"Delete endpoint {endpoints.name}?", yes)  # fmt: skip
    deleted = endpoints.delete()
    out.print("deleted " + ", ".join(deleted) if deleted else f"endpoint {endpoints.name} does not exist")


@app.command("register")
def register(
    source: ConfigArg,
    job: Annotated[str | None, typer.Option(help="Training job (default: the latest completed one).")] = None,
    image_uri: Annotated[str | None, typer.Option(help="Serving image (default: built and pushed).")] = None,
    approve: Annotated[bool, typer.Option("--approve", help="Mark the package Approved.")] = False,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Record a trained model in the Model Package Group named after the config."""
    from toolkit import sdk

    cfg = load(source, set_)
    registration = sdk.register(cfg, job, image_uri, approve)
    if as_json:
        emit_json(registration)
        return
    verb = "registered" if registration.created else "already registered"
    out.print(f"{verb}: {registration.arn} ({registration.status}) in {registration.group}", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
