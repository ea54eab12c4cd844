"""`toolkit train`, `toolkit plan` and `toolkit jobs` (status, logs, stop, list)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from toolkit.cli.common import (
    ConfigAlias,
    ConfigArg,
    ConfigFirst,
    JsonOpt,
    SetOpt,
    TrainTarget,
    app,
    config_first,
    emit_json,
    emit_rows,
    err,
    fail,
    group,
    load,
    note,
    out,
)


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
    from toolkit import sdk

    (source,) = config_first((source,), config)
    assert source is not None
    emit_rows(sdk.list_jobs(load(source, None), target), ("name", "status", "created"), as_json)
