"""examples/ci: the GitHub Actions workflow passes zizmor (offline audits) and GitHub's workflow schema (SchemaStore's,
vendored by check-jsonschema: actionlint has no binary wheel on PyPI and its source build downloads from GitHub);
the Python pipeline runs end to end against the AWS emulator over HTTP on loopback: the training job completes,
the model registers, the endpoint is created and a scripted invoke answers the smoke test. moto stands in for
SageMaker (its training job completes at once and its endpoint answers with the reply the test scripts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "examples" / "ci" / "github-actions.yml"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/toolkit-serving:serve-0123456789ab"


def tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def test_the_workflow_passes_zizmor_and_githubs_schema():
    audit = subprocess.run([tool("zizmor"), "--offline", str(WORKFLOW)], capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    schema = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                            capture_output=True, text=True)  # fmt: skip
    assert schema.returncode == 0, schema.stdout + schema.stderr


@pytest.mark.integration
def test_the_pipeline_runs_end_to_end_on_the_emulator(aws_env, tmp_path, monkeypatch):
    import boto3

    sys.path.insert(0, str(REPO / "examples" / "ci"))
    import pipeline

    config = tmp_path / "job.yaml"
    config.write_text(
        "base: tiny-gpt-oss-local\ntarget: training-job\n"
        "training_job: {instance_type: ml.g4dn.xlarge}\n"
        f"aws: {{role: '{aws_env['role']}', bucket: {aws_env['bucket']}}}\n"
        "serving: {instance_type: ml.g4dn.xlarge}\n"
    )
    reply = {"choices": [{"message": {"content": "Ein Tag hat 1440 Minuten.", "reasoning_content": "24 x 60."},
                          "finish_reason": "stop"}], "usage": {"completion_tokens": 20}, "model": "tiny"}  # fmt: skip
    scripted = {"results": [{"Body": json.dumps(reply), "ContentType": "application/json"}]}
    requests.post(f"{aws_env['endpoint']}/moto-api/static/sagemaker/endpoint-results", json=scripted, timeout=10)
    monkeypatch.setattr(pipeline.sdk, "deploy", _fast(pipeline.sdk.deploy))
    summary = pipeline.run(str(config), IMAGE, "Wie viele Minuten hat ein Tag?", "French", approve=True)
    assert summary["job"]["status"] == "Completed" and summary["job"]["artifacts"]["model"].endswith("/output/model/")
    assert summary["registration"]["status"] == "Approved"
    assert summary["endpoint"]["status"] == "InService"
    assert summary["smoke_test"]["content"] == "Ein Tag hat 1440 Minuten."
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    assert sagemaker.describe_endpoint(EndpointName="tiny-gpt-oss-local")["EndpointStatus"] == "InService"


def _fast(deploy):
    """The emulator's endpoint is InService at once: poll without the real 30 s pause."""

    def fast_deploy(*args, **kwargs):
        return deploy(*args, **kwargs, poll_seconds=0)

    return fast_deploy
