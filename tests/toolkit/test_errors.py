"""Bad input and cloud faults: one line naming what is wrong and what to do, the right exit code (toolkit.errors:
2 bad input or a missing resource, 1 a failed operation), never a Python traceback, and nothing created."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from typer.testing import CliRunner

from toolkit.cli import app


def toolkit(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The installed CLI in a process of its own, as a user runs it (a traceback would show in its output)."""
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)  # fmt: skip


def one_line_error(result: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    assert "Traceback" not in output, output
    assert output.strip().startswith("error:") or "\nerror:" in output, output
    for fragment in fragments:
        assert fragment in output, output


def test_markup_in_a_config_value_is_printed_as_text(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("base: tiny-gpt-oss-local\nname: 'x[/bold]y'\n")
    result = CliRunner().invoke(app, ["config", "validate", str(path)])
    assert result.exit_code == 2 and "x[/bold]y" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_closed_port_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    config = tmp_path / "job.yaml"
    config.write_text(
        "base: gpt-oss-20b-lora\n"
        f"aws: {{role: 'arn:aws:iam::123456789012:role/x', bucket: toolkit-b, endpoint_url: 'http://127.0.0.1:{closed}'}}\n"
    )
    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_EC2_METADATA_DISABLED": "true"}
    image = ["--image-uri", "123456789012.dkr.ecr.us-east-1.amazonaws.com/toolkit-serving:1"]
    for verb in (  # every verb that talks to AWS
        ["jobs", "status", "some-job", "-c", str(config), "--target", "training-job"],
        ["jobs", "logs", "some-job", "-c", str(config), "--target", "training-job"],
        ["jobs", "stop", "some-job", "-c", str(config), "--target", "training-job"],
        ["jobs", "list", "-c", str(config), "--target", "training-job"],
        ["train", str(config), "--target", "training-job"],
        ["deploy", str(config), *image],
        ["register", str(config)],
        ["invoke", str(config), "hello"],
        ["endpoint", "list", "-c", str(config)],
        ["endpoint", "describe", "-c", str(config)],
        ["endpoint", "delete", "-c", str(config), "--yes"],
        ["infra", "deploy", "-c", str(config), "--yes"],
        ["infra", "outputs", "-c", str(config)],
        ["infra", "destroy", "-c", str(config), "--yes"],
    ):
        one_line_error(toolkit(*verb, env=env, cwd=tmp_path), 2, "cannot reach")


@pytest.mark.integration
def test_missing_bucket_and_missing_job_on_the_emulator(aws_env, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(f"base: gpt-oss-20b-lora\naws: {{role: '{aws_env['role']}', bucket: no-such-bucket}}\n")
    one_line_error(toolkit("train", str(config), "--target", "training-job", cwd=tmp_path), 2,
                   "bucket 'no-such-bucket' does not exist", "toolkit infra deploy")  # fmt: skip
    assert "no-such-bucket" not in [b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]]  # not made
    for verb in ("status", "logs", "stop"):
        one_line_error(toolkit("jobs", verb, "nope", "-c", str(config), "--target", "training-job", cwd=tmp_path),
                       2, "no such training job 'nope'")  # fmt: skip


def test_a_local_job_that_does_not_exist(tmp_path):
    for verb in ("status", "logs", "stop"):
        result = toolkit("jobs", verb, "nope", "-c", "tiny-gpt-oss-local", "--target", "local", cwd=tmp_path)
        one_line_error(result, 2, "no such local job 'nope'")
