"""The typer app of `toolkit`: its global options, the option types the verbs share, the consoles, and the helpers
every verb renders with (`load`, `fail`, `emit_json`, `status`, `confirm`). The verbs live in the modules beside it
(toolkit/cli/__init__.py registers them); like them, this module imports only the SDK, the error map and the config.

Heavy libraries (torch, transformers, sagemaker) are imported inside the SDK calls, never at start-up.
Exit codes: 0 success, 1 the job failed, 2 bad input (config, data, arguments), 130 interrupted.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Annotated, Literal, NoReturn

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
Effort = Literal[
    "low", "medium", "high"
]  # harmony's levels (toolkit_train.families.harmony.EFFORTS; a test ties the two)
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a field: section.field=value (repeatable).")]


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (the SDK's result, for pipelines).")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def dataclasses_dict(value):
    import dataclasses

    return dataclasses.asdict(value)


def emit_json(result) -> None:
    """The SDK's result model as JSON on stdout: dataclasses as objects, enums and datetimes as strings."""
    import dataclasses

    value = dataclasses.asdict(result) if dataclasses.is_dataclass(result) and not isinstance(result, type) else result
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def emit_rows(rows: list, columns: tuple[str, ...], as_json: bool) -> None:
    """A list verb's SDK rows (dataclasses): JSON objects, or a table of these fields in this order."""
    if as_json:
        emit_json([dataclasses_dict(row) for row in rows])
        return
    from rich.table import Table

    table = Table(*columns)
    for row in rows:
        table.add_row(*(getattr(row, column) for column in columns))
    out.print(table)


def non_interactive() -> bool:
    """No prompts and no live displays without a terminal, or under CI (CI=true/1, as CI systems set it)."""
    import os

    return not sys.stdin.isatty() or os.environ.get("CI", "").lower() in ("1", "true", "yes")


def fail(message: str, code: int = 2) -> NoReturn:
    err.print("[bold red]error:[/] ", end="")
    err.print(message, highlight=False, markup=False)  # values from configs and clouds are text, never markup
    raise typer.Exit(code)


def note(line: str) -> None:
    err.print(line, highlight=False, markup=False)


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


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if non_interactive():
        fail(f"{question} Pass --yes to confirm in a non-interactive run.")
    if not typer.confirm(question):
        raise typer.Exit(1)


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
        except (typer.Exit, typer.Abort, typer.TyperException):  # typer's own (its click is vendored)
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


def load(source: str, overrides: list[str] | None):
    from toolkit.config import ConfigError, load_config

    try:
        return load_config(source, overrides or [])
    except ConfigError as exc:
        fail(str(exc))


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
