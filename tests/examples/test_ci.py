"""examples/ci: the GitHub Actions workflow passes zizmor (offline audits) and GitHub's workflow schema (SchemaStore's,
vendored by check-jsonschema: actionlint has no binary wheel on PyPI and its source build downloads from GitHub),
and requires the promotion gate; the Python pipeline runs end to end against the AWS emulator over HTTP on
loopback: the training job completes, its model is downloaded and evaluated, the model registers with the gate's
verdict, and only an Approved version is deployed (a scripted invoke answers the smoke test). moto stands in for
SageMaker (its training job completes at once and writes nothing: the test puts the model files a job writes; its
endpoint answers with the reply the test scripts). vLLM cannot serve the files of a job that never trained, so the
eval's generation (toolkit.evaluate.evaluate_local) is replaced by scripted answers on the real held-out rows;
everything after it (the real scorer, report, register, gate, deploy) runs for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

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


def _steps(job: str) -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"][job]["steps"]


def test_the_workflow_requires_the_gate_on_pull_requests_and_never_approves_by_hand(tmp_path):
    names = [step.get("name", "") for step in _steps("check")]
    gate = next(i for i, name in enumerate(names) if "promotion gate" in name)
    assert gate > names.index("Validate every config (exit 2 names the file, the field and the fix)")
    ship = [step.get("run", "") for step in _steps("ship")]
    (pipeline,) = [run for run in ship if "examples/ci/pipeline.py" in run]
    assert "--approve" not in pipeline  # the gate decides what is deployed, not the workflow
    check = _steps("check")[gate]["run"]
    toolkit = str(Path(sys.executable).parent)
    (tmp_path / "gated.yaml").write_text("base: tiny-gpt-oss-local\nregistry: {gate: {metric: chrF}}\n"
                                         "data: {eval: {fraction: 0.25}}\n")  # fmt: skip
    for config, code in (("tiny-gpt-oss-local", 1), ("gated.yaml", 0)):
        run = subprocess.run(["bash", "-c", check], capture_output=True, text=True, cwd=tmp_path,
                             env={"PATH": f"{toolkit}:/usr/bin:/bin", "CONFIG": config,
                                  "PYTHONPATH": ":".join(sys.path)})  # fmt: skip
        assert run.returncode == code, run.stderr
        assert ("declare registry.gate and data.eval" in run.stderr) == bool(code)


def _pipeline_config(aws_env, tmp_path) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        "base: tiny-gpt-oss-local\ntarget: training-job\n"
        "training_job: {instance_type: ml.g4dn.xlarge}\n"
        f"aws: {{role: '{aws_env['role']}', bucket: {aws_env['bucket']}}}\n"
        "serving: {instance_type: ml.g4dn.xlarge}\n"
        "data: {eval: {fraction: 0.25}}\n"
        "registry: {gate: {metric: rougeL, min_margin: 0.05, min_format_valid: 0.5}}\n"
    )
    return config


def _staged(pipeline, monkeypatch, aws_env, fine_tuned_is_right: bool) -> list[str]:
    """Spy on the pipeline's SDK steps (their order) and stand in for what cannot run on the emulator."""
    import boto3

    import toolkit.evaluate
    from toolkit.evaluate import Generated, ModelResult, eval_rows

    calls: list[str] = []
    for step in ("train", "download_model", "evaluate", "register", "deploy"):
        real = getattr(pipeline.sdk, step)

        def spy(*args, _real=real, _step=step, **kwargs):
            calls.append(_step)
            if _step == "download_model":  # what the training container writes next to the model
                bucket, _, prefix = args[1][len("s3://") :].partition("/")
                s3 = boto3.client("s3")
                for key, body in (("run.json", '{"global_step": 10}'), ("merged/config.json", "{}")):
                    s3.put_object(Bucket=bucket, Key=f"{prefix}{key}", Body=body.encode())
            if _step == "deploy":
                kwargs["poll_seconds"] = 0  # the emulator's endpoint is InService at once
            return _real(*args, **kwargs)

        monkeypatch.setattr(pipeline.sdk, step, spy)

    def scripted(config, model_dir, limit, max_tokens, concurrency, on_row, on_status, tasks=None):
        rows = eval_rows(config, limit)
        right = [Generated(r, r.reference, "Je réfléchis en français à la question posée.", "stop") for r in rows]
        wrong = [Generated(r, "Keine Ahnung.", "Je ne sais pas du tout.", "stop") for r in rows]
        tuned, base = (right, wrong) if fine_tuned_is_right else (wrong, right)
        return [ModelResult("base", "base", base, 1.0), ModelResult("fine-tuned", str(model_dir), tuned, 1.0)]

    monkeypatch.setattr(toolkit.evaluate, "evaluate_local", scripted)
    return calls


@pytest.mark.integration
def test_the_pipeline_deploys_what_the_gate_approves_on_the_emulator(aws_env, tmp_path, monkeypatch):
    import boto3

    sys.path.insert(0, str(REPO / "examples" / "ci"))
    import pipeline

    reply = {"choices": [{"message": {"content": "Ein Tag hat 1440 Minuten.", "reasoning_content": "24 x 60."},
                          "finish_reason": "stop"}], "usage": {"completion_tokens": 20}, "model": "tiny"}  # fmt: skip
    scripted = {"results": [{"Body": json.dumps(reply), "ContentType": "application/json"}]}
    requests.post(f"{aws_env['endpoint']}/moto-api/static/sagemaker/endpoint-results", json=scripted, timeout=10)
    calls = _staged(pipeline, monkeypatch, aws_env, fine_tuned_is_right=True)
    summary = pipeline.run(str(_pipeline_config(aws_env, tmp_path)), IMAGE, "Wie viele Minuten hat ein Tag?", "French")
    assert calls == ["train", "download_model", "evaluate", "register", "deploy"]  # the gate between train and deploy
    assert summary["job"]["status"] == "Completed" and summary["job"]["artifacts"]["model"].endswith("/output/model/")
    assert summary["evaluation"]["metrics"]["rougeL"]["fine-tuned"] == 1.0
    assert summary["registration"]["status"] == "Approved"
    assert summary["registration"]["verdict"].startswith("gate passed: rougeL")
    assert summary["endpoint"]["status"] == "InService"
    assert summary["smoke_test"]["content"] == "Ein Tag hat 1440 Minuten."
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    assert sagemaker.describe_endpoint(EndpointName="tiny-gpt-oss-local")["EndpointStatus"] == "InService"
    (model,) = sagemaker.list_models()["Models"]
    served = sagemaker.describe_model(ModelName=model["ModelName"])["PrimaryContainer"]
    assert served == {"ModelPackageName": summary["registration"]["arn"]}  # the approved version, nothing else


@pytest.mark.integration
def test_the_pipeline_deploys_nothing_the_gate_rejects(aws_env, tmp_path, monkeypatch, capsys):
    import boto3

    sys.path.insert(0, str(REPO / "examples" / "ci"))
    import pipeline

    calls = _staged(pipeline, monkeypatch, aws_env, fine_tuned_is_right=False)
    monkeypatch.setattr(sys, "argv", ["pipeline.py", str(_pipeline_config(aws_env, tmp_path)), "--image-uri", IMAGE])
    with pytest.raises(SystemExit) as ended:
        pipeline.main()
    assert ended.value.code == 1 and calls == ["train", "download_model", "evaluate", "register"]
    captured = capsys.readouterr()
    summary = json.loads(captured.out[captured.out.index('{\n  "job"') :])  # after moto's own lines (in-process)
    assert summary["registration"]["status"] == "Rejected" and summary["endpoint"] is None
    assert f"not deployed: model package {summary['registration']['arn']} is Rejected: gate failed" in captured.err
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    assert sagemaker.list_endpoints()["Endpoints"] == [] and sagemaker.list_models()["Models"] == []
