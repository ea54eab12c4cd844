"""`--json` prints exactly the SDK's result model, for a pipeline step to parse (on the AWS emulator)."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import requests
from typer.testing import CliRunner

from tests.toolkit.deploy.test_endpoint import IMAGE, completed_training_job
from toolkit.cli import app
from toolkit.registry import Registration

pytestmark = pytest.mark.integration


def run_json(*args: str) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_every_result_verb_prints_its_model_as_json(aws_env, tmp_path):
    job = "tiny-gpt-oss-local-20261130120000"
    completed_training_job(aws_env, job)
    config = tmp_path / "job.yaml"
    config.write_text(f"base: tiny-gpt-oss-local\naws: {{role: '{aws_env['role']}', bucket: {aws_env['bucket']}}}\n"
                      "serving: {instance_type: ml.g4dn.xlarge}\n")  # fmt: skip
    state = run_json("jobs", "status", job, "-c", str(config), "--target", "training-job")
    assert state == {"name": job, "status": "Completed", "detail": state["detail"], "artifacts": state["artifacts"],
                     "metrics": state["metrics"]}  # fmt: skip
    assert state["artifacts"]["model"].endswith(f"/{job}/output/model/")
    assert state["metrics"] == {"train:progress": 100.0}  # the job's FinalMetricDataList, as moto completes it
    registered = run_json("register", str(config), "--image-uri", IMAGE, "--approve")
    assert set(registered) == {f.name for f in fields(Registration)} and registered["status"] == "Approved"
    assert registered["version"] == 1 and registered["report"] is None  # no eval report: --approve decided
    deployed = run_json("deploy", str(config), "--image-uri", IMAGE)
    assert set(deployed) == {"name", "status", "config_name", "detail", "actions"}
    assert deployed["status"] == "InService" and "create_endpoint" in deployed["actions"]
    described = run_json("endpoint", "describe", "-c", str(config))
    assert described["EndpointName"] == deployed["name"] and described["EndpointConfigName"] == deployed["config_name"]
    reply = {"choices": [{"message": {"content": "1440", "reasoning_content": "24 x 60"}, "finish_reason": "stop"}],
             "usage": {"completion_tokens": 3}, "model": "tiny-gpt-oss-local"}  # fmt: skip
    scripted = {"results": [{"Body": json.dumps(reply), "ContentType": "application/json"}]}
    requests.post(f"{aws_env['endpoint']}/moto-api/static/sagemaker/endpoint-results", json=scripted, timeout=10)
    answered = run_json("invoke", str(config), "Wie viele Minuten hat ein Tag?", "--target", "endpoint")
    assert answered == {"content": "1440", "reasoning": "24 x 60", "finish_reason": "stop",
                        "usage": {"completion_tokens": 3}, "model": "tiny-gpt-oss-local", "tool_calls": []}  # fmt: skip


def test_list_verbs_print_typed_rows_not_sagemaker_keys(aws_env, tmp_path):
    job = "tiny-gpt-oss-local-20261130120500"
    completed_training_job(aws_env, job)
    config = tmp_path / "job.yaml"
    config.write_text(f"base: tiny-gpt-oss-local\naws: {{role: '{aws_env['role']}', bucket: {aws_env['bucket']}}}\n"
                      "serving: {instance_type: ml.g4dn.xlarge}\n")  # fmt: skip
    jobs = CliRunner().invoke(app, ["jobs", "list", str(config), "--target", "training-job", "--json"])
    assert jobs.exit_code == 0, jobs.output
    rows = json.loads(jobs.stdout)
    assert [set(row) for row in rows] == [{"name", "status", "created"}] and rows[0]["name"] == job
    assert rows[0]["status"] == "Completed" and rows[0]["created"][:4].isdigit()  # ISO 8601
    alias = CliRunner().invoke(app, ["jobs", "list", "-c", str(config), "--target", "training-job", "--json"])
    assert json.loads(alias.stdout) == rows  # -c stays an alias of the first argument
    run_json("deploy", str(config), "--image-uri", IMAGE)
    listed = run_json("endpoint", "list", str(config))
    assert [set(row) for row in listed] == [{"name", "status", "modified"}] and listed[0]["status"] == "InService"
    validated = run_json("config", "validate", str(config), "gpt-oss-20b-lora")
    assert [v["name"] for v in validated] == ["tiny-gpt-oss-local", "gpt-oss-20b-lora"]
