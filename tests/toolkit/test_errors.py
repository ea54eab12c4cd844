"""Bad input and cloud faults: one line naming what is wrong and what to do, the right exit code (toolkit.errors:
2 bad input or a missing resource, 1 a failed operation), never a Python traceback, and nothing created."""

from __future__ import annotations

import json
import os
import re
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


ERROR_PAGE = (
    b"<!DOCTYPE HTML PUBLIC>\n<html><head><title>500 Internal Server Error</title></head>\n<body><h1>"
    b"Internal Server Error</h1><p>The server encountered an internal error.</p></body></html>"
)


def test_an_html_error_page_from_the_aws_endpoint_is_one_line(tmp_path):
    """A proxy, a load balancer or an emulator that crashed answers with an HTML page, which botocore hands on as
    the error's message: printed as it was, it was a page of markup. A real HTTP server on loopback serves it."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.send_response(500)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(ERROR_PAGE)))
            self.end_headers()
            self.wfile.write(ERROR_PAGE)

        do_GET = do_POST = do_PUT = do_HEAD = _answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = tmp_path / "job.yaml"
    config.write_text("base: gpt-oss-20b-lora\naws: {role: 'arn:aws:iam::123456789012:role/x', bucket: toolkit-b, "
                      f"endpoint_url: 'http://127.0.0.1:{server.server_port}'}}\n")  # fmt: skip
    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_MAX_ATTEMPTS": "1"}  # fmt: skip
    try:
        for verb in (["endpoint", "describe", "-c", str(config)], ["jobs", "list", "-c", str(config), "--target",
                                                                   "training-job"]):  # fmt: skip
            result = toolkit(*verb, env=env, cwd=tmp_path)
            one_line_error(result, 1, "an HTML page, not an AWS error: 500 Internal Server Error")
            error = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
            assert "<" not in error and len(result.stderr.strip().splitlines()) == 1, result.stderr
    finally:
        server.shutdown()


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


def readme_exit_codes() -> dict[str, int]:
    """The README's one map, read from the README itself: the test fails when the code and the map part ways."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    found = re.findall(r"(\d+) (the job or operation failed|bad input or a missing resource)", text)
    codes = {cause: int(code) for code, cause in found}
    assert len(codes) == 2, "README.md's exit-code map moved: update this test's pattern"
    return {"failed": codes["the job or operation failed"], "bad input": codes["bad input or a missing resource"]}


@pytest.mark.integration
def test_exit_codes_follow_the_cause(aws_env, tmp_path):
    """Each kind of failure through the CLI, against the moto server (moto has no streaming route: its 404 stands
    in for SageMaker's ValidationException for an endpoint that does not exist; both are codes in errors.MISSING)."""
    import requests

    config = tmp_path / "job.yaml"
    config.write_text(f"base: tiny-gpt-oss-local\naws: {{role: '{aws_env['role']}', bucket: {aws_env['bucket']}}}\n"
                      "serving: {instance_type: ml.g5.xlarge}\n")  # fmt: skip
    image = ["--image-uri", "123456789012.dkr.ecr.us-east-1.amazonaws.com/toolkit-serving:1"]
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    cases = [  # (cause, command, what the line says)
        ("bad input", ["deploy", str(config), *image], "no completed training job"),
        ("bad input", ["deploy", str(config), "--model-data", f"s3://{aws_env['bucket']}/m/"],
         "ECR repository toolkit-serving does not exist"),
        ("bad input", ["deploy", str(config), "--target", "local"], "no trained model in"),
        ("bad input", ["deploy", str(config), "--model-data", "foo", *image], "is not an s3:// URI"),
        ("bad input", ["invoke", str(config), "hi", "--target", "local", "--set", f"serving.local_port={closed}"],
         "cannot reach"),
        ("bad input", ["invoke", str(config), "hi", "--target", "endpoint"], "InvokeEndpointWithResponseStream failed"),
        ("bad input", ["infra", "outputs", "-c", str(config)], "no stack named toolkit"),
        ("bad input", ["endpoint", "describe", "-c", str(config)], "does not exist"),
        ("bad input", ["register", str(config)], "does not exist"),
        ("failed", ["invoke", str(config), "hi", "--target", "endpoint", "--no-stream", "--check"], "has no reasoning"),
    ]  # fmt: skip
    reply = {"choices": [{"message": {"content": "an answer only"}, "finish_reason": "stop"}]}
    scripted = {"results": [{"Body": json.dumps(reply), "ContentType": "application/json"}]}
    requests.post(f"{aws_env['endpoint']}/moto-api/static/sagemaker/endpoint-results", json=scripted, timeout=10)
    codes = readme_exit_codes()
    for cause, command, fragment in cases:
        one_line_error(toolkit(*command, cwd=tmp_path), codes[cause], fragment)


def test_a_closed_endpoint_url_fails_after_few_attempts(monkeypatch):
    """A wrong aws.endpoint_url is one line in about a second, not ~7 s of adaptive retries into the same refusal."""
    import time

    from botocore.exceptions import EndpointConnectionError

    from toolkit import aws
    from toolkit.config.models import AwsSettings

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    s3 = aws.client(AwsSettings(endpoint_url=f"http://127.0.0.1:{closed}"), "s3")
    attempts = []
    s3.meta.events.register("before-send", lambda **_: attempts.append(1))
    started = time.monotonic()
    with pytest.raises(EndpointConnectionError):
        s3.list_buckets()
    assert len(attempts) <= 2 and time.monotonic() - started < 3


def test_every_toolkit_error_says_its_exit_code_by_its_base():
    """A new error class must pick BadInput (2) or Failed (1), so its exit code is the cause's, not a guess."""
    import importlib
    import inspect
    import pkgutil

    from toolkit_train.data import DataError

    import toolkit
    from toolkit.errors import BadInput, Failed

    skip = ("toolkit_train", "toolkit.cli")  # the entrypoints run without the toolkit: DataError is mapped
    classes = set()
    for module in pkgutil.walk_packages(toolkit.__path__, "toolkit."):
        if module.name.startswith(skip):
            continue
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            public = not cls.__name__.startswith("_")  # a private one is caught where it is raised (loader)
            if issubclass(cls, Exception) and cls.__module__.startswith("toolkit.") and public:
                classes.add(cls)
    assert classes, "found no error classes"
    unmapped = sorted(c.__qualname__ for c in classes - {BadInput, Failed} if not issubclass(c, BadInput | Failed))
    assert not unmapped, f"derive these from toolkit.errors.BadInput or Failed: {unmapped}"
    assert not issubclass(DataError, BadInput | Failed)  # mapped by name in errors.classify instead
    # an area's other kind names its base first: the first of the two in the class's MRO decides
    from toolkit.deploy import DeployError, DeployInputError
    from toolkit.errors import classify
    from toolkit.targets.base import TargetError, TargetFailed

    codes = {
        cls: (classify(cls("x")) or (0, ""))[0] for cls in (DeployError, DeployInputError, TargetError, TargetFailed)
    }
    assert codes == {DeployError: 1, DeployInputError: 2, TargetError: 2, TargetFailed: 1}


def test_botocores_own_errors_are_one_line_with_their_exit_code():
    """Errors botocore raises before or instead of an AWS answer (a malformed parameter: several lines of text; no
    region; a read timeout) come out as one line, with the cause's exit code."""
    from botocore.exceptions import NoRegionError, ParamValidationError, ReadTimeoutError

    from toolkit.errors import classify

    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    with pytest.raises(ParamValidationError) as malformed:  # validated against the model before anything is sent
        s3.put_object(Bucket="toolkit-b", Key="", Body=b"", ContentLength=-1)
    assert "\n" in str(malformed.value)
    for exc, code in ((malformed.value, 2), (NoRegionError(), 2), (ReadTimeoutError(endpoint_url="http://x"), 1)):
        classified = classify(exc)
        assert classified is not None and classified[0] == code, exc
        assert "\n" not in classified[1] and str(exc).split()[0] in classified[1], classified
