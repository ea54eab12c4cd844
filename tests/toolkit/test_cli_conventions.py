"""One CLI style, checked on every command's --help: a new command that breaks a convention fails here.

- the config is the first argument (metavar CONFIG) of every command that reads one;
- every argument has help; flags show no value type (`<bool>`);
- closed sets are typed choices whose values --help lists (never a free string checked by hand);
- every command with a result takes --json.
"""

from __future__ import annotations

import re
import subprocess
import sys
import typing

import pytest
import typer.main
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.cli.common import Effort, TrainTarget, config_first

# commands that read no config, and why
NO_CONFIG = {
    "config schema": "prints the schema of every config",
    "config reference": "prints the reference of every field",
    "config presets": "lists the shipped configs",
}
# commands that print no result a pipeline would parse, and why
NO_RESULT = {
    "jobs logs": "a stream of log lines",
    "jobs stop": "a request; the job's state comes from jobs status",
    "config schema": "prints JSON already",
    "config reference": "prints Markdown",
    "infra destroy": "deletes; nothing is left to report",
}
# options whose values are a closed set: each must be a typed choice
CLOSED = {"target", "kind"}


def commands(group=None, prefix=()):
    group = group or typer.main.get_command(app)
    for name, command in group.commands.items():
        path = (*prefix, name)
        if hasattr(command, "commands"):
            yield from commands(command, path)
        else:
            yield " ".join(path), command


ALL = dict(commands())


def test_the_walk_sees_every_command():
    assert {"plan", "train", "jobs list", "jobs status", "endpoint list", "image build", "infra deploy"} <= set(ALL)
    assert set(NO_CONFIG) <= set(ALL) and set(NO_RESULT) <= set(ALL)


@pytest.mark.parametrize("path", sorted(ALL))
def test_every_command_follows_the_conventions(path):
    command = ALL[path]
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = {p.name: p for p in command.params if p.param_type_name == "option"}
    if path not in NO_CONFIG:
        assert arguments and (arguments[0].metavar or "").strip("[]").startswith("CONFIG"), (
            f"{path}: the config must be the first argument (metavar CONFIG); -c may stay as an alias"
        )
    for argument in arguments:
        assert (argument.help or "").strip(), f"{path}: argument {argument.name} has no help"
    for name in CLOSED & {p.name for p in command.params}:
        param = next(p for p in command.params if p.name == name)
        choices = getattr(param.type_descriptor, "choices", None) if hasattr(param, "type_descriptor") else None
        assert choices, f"{path}: --{name} is a closed set: type it as a Literal so --help lists the values"
    if path not in NO_RESULT:
        assert "as_json" in options and "--json" in options["as_json"].opts, f"{path}: a result needs --json"
    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output, f"{path}: a flag shows <bool> in --help"
    for name in CLOSED & {p.name for p in command.params}:
        param = next(p for p in command.params if p.name == name)
        for value in param.type_descriptor.choices:
            assert value in result.output, f"{path}: --help does not list {value!r}"


def test_top_help_names_every_group_and_no_count_of_verbs():
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    for name in typer.main.get_command(app).commands:
        assert re.search(rf"\b{name}\b", result.output), name
    assert "three verbs" not in result.output and "<bool>" not in result.output


def test_the_cli_target_choices_are_the_configs():
    from toolkit.config.targets import TARGET_SETTINGS

    assert list(typing.get_args(TrainTarget)) == list(TARGET_SETTINGS)


def test_the_config_may_come_first_or_as_the_c_alias():
    assert config_first(("cfg.yaml", "job-1"), None) == ("cfg.yaml", "job-1")
    assert config_first(("job-1", None), "cfg.yaml") == ("cfg.yaml", "job-1")  # jobs status job-1 -c cfg.yaml
    for positionals, alias in ((("cfg.yaml", "job-1"), "other.yaml"), ((None, None), None)):
        with pytest.raises(typer.Exit) as raised:
            config_first(positionals, alias)
        assert raised.value.exit_code == 2


def test_verbose_logs_every_aws_call(aws_env):
    result = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "-v", "endpoint", "list", "tiny-gpt-oss-local", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(r"toolkit\.aws sagemaker\.ListEndpoints -> 200, 0 retries, [\d.]+ s", result.stderr), result.stderr
    quiet = subprocess.run([sys.executable, "-m", "toolkit.cli", "endpoint", "list", "tiny-gpt-oss-local"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "toolkit.aws" not in quiet.stderr


def test_the_reasoning_effort_choices_are_harmonys():
    from toolkit_train.families.harmony import EFFORTS

    assert typing.get_args(Effort) == EFFORTS
