"""The SageMaker endpoint lifecycle against moto server (a real HTTP emulator on loopback).

moto implements create/describe/delete for models, endpoint configs and endpoints (an endpoint is InService
at once) and Application Auto Scaling, but not UpdateEndpoint: the blue/green update, its rollback and a busy
endpoint are driven with botocore's Stubber on a real client. What this does not cover: a real endpoint's
container start-up, health checks and traffic shifting (SageMaker's side).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re

import boto3
import pytest
from botocore.stub import Stubber
from typer.testing import CliRunner

from tests.botocore_model import assert_valid_call
from tests.runs import REPO
from toolkit import sdk
from toolkit.cli import app
from toolkit.config import load_config
from toolkit.deploy import DeployError
from toolkit.deploy.endpoint import Endpoints

pytestmark = pytest.mark.integration
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/toolkit-serving:serve-0123456789ab"
MODEL = "s3://toolkit-test-bucket/jobs/tiny-1/output/model.tar.gz"


def config(aws_env, *overrides):
    return load_config(
        "tiny-gpt-oss-local",
        [f"aws.role={aws_env['role']}", f"aws.bucket={aws_env['bucket']}", "serving.instance_type=ml.g4dn.xlarge",
         *overrides],
    )  # fmt: skip


def sagemaker():
    return boto3.client("sagemaker", region_name="us-east-1")


def completed_training_job(aws_env, name):
    sagemaker().create_training_job(
        TrainingJobName=name,
        AlgorithmSpecification={"TrainingImage": "train:1", "TrainingInputMode": "File"},
        RoleArn=aws_env["role"],
        OutputDataConfig={"S3OutputPath": f"s3://{aws_env['bucket']}/jobs", "CompressionType": "NONE"},
        ResourceConfig={"InstanceType": "ml.g4dn.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 50},
        StoppingCondition={"MaxRuntimeInSeconds": 3600},
    )
    return f"s3://{aws_env['bucket']}/jobs/{name}/output/model/"  # uncompressed, as the toolkit's jobs write it


def test_deploy_creates_model_config_and_endpoint_from_the_latest_training_job(aws_env):
    model_data = completed_training_job(aws_env, "tiny-gpt-oss-local-20261130120000")
    cfg = config(aws_env, "serving.max_model_len=2048", "serving.vllm_args.enable-prefix-caching=true")
    state = sdk.deploy(cfg, image_uri=IMAGE, poll_seconds=0)

    assert state.status == "InService" and state.actions == ["create_model", "create_endpoint_config",
                                                             "create_endpoint"]  # fmt: skip
    endpoint = sagemaker().describe_endpoint(EndpointName="tiny-gpt-oss-local")
    assert endpoint["EndpointConfigName"] == state.config_name
    variant = sagemaker().describe_endpoint_config(EndpointConfigName=state.config_name)["ProductionVariants"][0]
    assert variant["InstanceType"] == "ml.g4dn.xlarge" and variant["InitialInstanceCount"] == 1
    model = sagemaker().describe_model(ModelName=variant["ModelName"])
    container = model["PrimaryContainer"]
    assert container["Image"] == IMAGE and "ModelDataUrl" not in container  # served as an S3 prefix, no tarball
    assert container["ModelDataSource"]["S3DataSource"] == {
        "S3Uri": model_data,
        "S3DataType": "S3Prefix",
        "CompressionType": "None",
    }
    assert container["Environment"]["SM_VLLM_MAX_MODEL_LEN"] == "2048"
    assert container["Environment"]["SM_VLLM_ENABLE_PREFIX_CACHING"] == "true"
    assert container["Environment"]["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "1"
    assert model["ExecutionRoleArn"] == aws_env["role"]


def test_redeploying_the_same_model_changes_nothing(aws_env):
    cfg = config(aws_env)
    first = sdk.deploy(cfg, image_uri=IMAGE, model_data=MODEL, poll_seconds=0)
    again = sdk.deploy(cfg, image_uri=IMAGE, model_data=MODEL, poll_seconds=0)
    assert again.actions == [] and again.config_name == first.config_name
    assert len(sagemaker().list_models()["Models"]) == 1
    assert len(sagemaker().list_endpoint_configs()["EndpointConfigs"]) == 1


def test_no_training_job_and_no_model_data_is_a_clear_error(aws_env):
    with pytest.raises(DeployError, match="no completed training job of tiny-gpt-oss-local.*--model-data"):
        sdk.deploy(config(aws_env), image_uri=IMAGE, poll_seconds=0)
    assert sagemaker().list_models()["Models"] == []


def test_a_failed_endpoint_is_replaced(aws_env):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    cfg = config(aws_env)
    sdk.deploy(cfg, image_uri=IMAGE, model_data=MODEL, poll_seconds=0)
    sagemaker_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].endpoints["tiny-gpt-oss-local"].endpoint_status = "Failed"
    state = sdk.deploy(cfg, image_uri=IMAGE, model_data="s3://toolkit-test-bucket/other/model.tar.gz", poll_seconds=0)
    assert state.status == "InService" and state.actions[-2:] == ["delete_endpoint", "create_endpoint"]


def test_autoscaling_policy_tracks_invocations(aws_env):
    cfg = config(aws_env, "serving.autoscaling.max_instances=4", "serving.autoscaling.invocations_per_instance=30")
    sdk.deploy(cfg, image_uri=IMAGE, model_data=MODEL, poll_seconds=0)
    scaling = boto3.client("application-autoscaling", region_name="us-east-1")
    target = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"][0]
    assert target["ResourceId"] == "endpoint/tiny-gpt-oss-local/variant/AllTraffic"
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 4)
    policy = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"][0]
    assert policy["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == 30.0


def test_delete_removes_endpoint_config_and_model(aws_env):
    sdk.deploy(config(aws_env), image_uri=IMAGE, model_data=MODEL, poll_seconds=0)
    result = CliRunner().invoke(app, ["endpoint", "delete", "-c", "tiny-gpt-oss-local", "--yes"])
    assert result.exit_code == 0 and "deleted endpoint tiny-gpt-oss-local" in result.stdout
    assert sagemaker().list_endpoints()["Endpoints"] == []
    assert sagemaker().list_models()["Models"] == [] and sagemaker().list_endpoint_configs()["EndpointConfigs"] == []
    again = CliRunner().invoke(app, ["endpoint", "delete", "-c", "tiny-gpt-oss-local", "--yes"])
    assert again.exit_code == 0 and "does not exist" in again.stdout  # re-running is safe


def test_cli_dry_run_prints_every_request_and_creates_nothing(aws_env, tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(f"base: tiny-gpt-oss-local\naws: {{role: '{aws_env['role']}'}}\n"
                    "serving: {instance_type: ml.g4dn.xlarge}\n")  # fmt: skip
    result = CliRunner().invoke(app, ["deploy", str(path), "--dry-run", "--image-uri", IMAGE, "--model-data", MODEL])
    assert result.exit_code == 0, result.output
    requests = json.loads(result.stdout)
    assert [next(iter(r)) for r in requests] == ["create_model", "create_endpoint_config", "create_endpoint"]
    assert requests[0]["create_model"]["PrimaryContainer"]["Image"] == IMAGE
    assert sagemaker().list_models()["Models"] == [] and sagemaker().list_endpoints()["Endpoints"] == []


@contextlib.contextmanager
def _aws_call_log(calls: list[str]):
    """toolkit.aws's call log (`toolkit -v`: one line per AWS call) into `calls`."""
    logger = logging.getLogger("toolkit.aws")
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: calls.append(record.getMessage())  # type: ignore[method-assign]
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_endpoint_dry_runs_only_read_and_the_docs_name_every_read(aws_env):
    """`deploy --dry-run` shows what would change, so it reads what exists (the endpoint, its config and model);
    it never writes, and docs/config-reference.md names each read it makes (the toolkit.aws call log)."""
    sdk.deploy(config(aws_env), image_uri=IMAGE, model_data=MODEL, poll_seconds=0)
    completed_training_job(aws_env, "tiny-gpt-oss-local-20261130120000")
    reads = set()
    for existing, model in ((True, ["--model-data", MODEL]), (False, []), (False, ["--model-data", MODEL])):
        if not existing and sagemaker().list_endpoints()["Endpoints"]:  # an update, then first deployments
            sagemaker().delete_endpoint(EndpointName="tiny-gpt-oss-local")
        calls: list[str] = []
        with _aws_call_log(calls):
            result = CliRunner().invoke(app, ["deploy", "tiny-gpt-oss-local", "--set", f"aws.role={aws_env['role']}",
                                              "--dry-run", "--image-uri", IMAGE + "x", *model])  # fmt: skip
        assert result.exit_code == 0, result.output
        reads |= {re.match(r"[\w-]+\.\w+", call).group(0) for call in calls}  # type: ignore[union-attr]
    assert reads and all(op.split(".")[1].startswith(("Describe", "List", "Get")) for op in reads), reads
    docs = " ".join((REPO / "docs" / "config-reference.md").read_text().split())
    assert all(op.split(".")[1] in docs for op in reads), sorted(reads)


def test_every_deploy_request_is_valid_for_aws_and_the_dry_run_shows_autoscaling(aws_env):
    cfg = config(aws_env, "serving.autoscaling.min_instances=1", "serving.autoscaling.max_instances=3",
                 "serving.rollback_alarms=[tiny-5xx]")  # fmt: skip
    planned = sdk.render_deploy(cfg, IMAGE, MODEL)
    assert [(r.service, r.operation) for r in planned] == [
        ("sagemaker", "create_model"), ("sagemaker", "create_endpoint_config"), ("sagemaker", "create_endpoint"),
        ("application-autoscaling", "register_scalable_target"), ("application-autoscaling", "put_scaling_policy"),
    ]  # fmt: skip
    sdk.deploy(cfg, IMAGE, MODEL, poll_seconds=0)
    changed = config(aws_env, "serving.autoscaling.min_instances=1", "serving.autoscaling.max_instances=3",
                     "serving.rollback_alarms=[tiny-5xx]", "serving.max_model_len=2048")  # fmt: skip
    update = sdk.render_deploy(changed, IMAGE, MODEL)  # blue/green with alarms: UpdateEndpoint's DeploymentConfig
    assert "update_endpoint" in [r.operation for r in update]
    for request in [*planned, *update]:
        assert_valid_call(request.service, request.operation, request.params)


def test_cli_deploy_then_describe(aws_env, tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(f"base: tiny-gpt-oss-local\naws: {{role: '{aws_env['role']}'}}\n"
                    "serving: {instance_type: ml.g4dn.xlarge}\n")  # fmt: skip
    deployed = CliRunner().invoke(app, ["deploy", str(path), "--image-uri", IMAGE, "--model-data", MODEL])
    assert deployed.exit_code == 0, deployed.output
    assert "deployed: endpoint tiny-gpt-oss-local serves tiny-gpt-oss-local-" in deployed.stdout
    described = CliRunner().invoke(app, ["endpoint", "describe", "-c", str(path)])
    assert described.exit_code == 0 and "tiny-gpt-oss-local: InService" in described.stdout


# -- UpdateEndpoint (not in moto): Stubber on a real client ----------------------------------------------------


def stubbed(cfg, old_config="tiny-gpt-oss-local-0000000000"):
    client = boto3.client("sagemaker", region_name="us-east-1")
    return client, Stubber(client), Endpoints(cfg, sagemaker=client), old_config


def describe(config_name, status="InService", reason=None):
    reply = {"EndpointName": "tiny-gpt-oss-local", "EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:"
             "endpoint/tiny-gpt-oss-local", "EndpointConfigName": config_name, "EndpointStatus": status,
             "CreationTime": "2026-11-30T00:00:00Z", "LastModifiedTime": "2026-11-30T00:00:00Z"}  # fmt: skip
    if reason:
        reply["FailureReason"] = reason
    return reply


def missing(stub, operation):
    stub.add_client_error(operation, "ValidationException", "Could not find model/config")


def plan_update(stub, old):
    missing(stub, "describe_model")
    missing(stub, "describe_endpoint_config")
    stub.add_response("describe_endpoint", describe(old))  # requests(): the current endpoint
    stub.add_response("describe_endpoint", describe(old))  # deploy(): what serves now


def test_update_is_blue_green_with_alarm_rollback_and_cleans_up_the_old_config(aws_env):
    cfg = config(aws_env, "serving.rollback_alarms=[tiny-5xx]")
    client, stub, endpoints, old = stubbed(cfg)
    missing(stub, "describe_model")
    missing(stub, "describe_endpoint_config")
    stub.add_response("describe_endpoint", describe(old))
    with stub:  # the planned requests name the new model and config (same inputs -> same names)
        new = endpoints.requests(IMAGE, MODEL)
    assert [r.operation for r in new] == ["create_model", "create_endpoint_config", "update_endpoint"]
    assert new[2].params["DeploymentConfig"]["AutoRollbackConfiguration"] == {"Alarms": [{"AlarmName": "tiny-5xx"}]}
    stub = Stubber(client)
    plan_update(stub, old)
    stub.add_response("create_model", {"ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/m"})
    stub.add_response("create_endpoint_config", {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:1:ec/c"})
    new_config = new[1].params["EndpointConfigName"]
    stub.add_response(
        "update_endpoint",
        {"EndpointArn": "arn:aws:sagemaker:us-east-1:1:endpoint/e"},
        {
            "EndpointName": "tiny-gpt-oss-local",
            "EndpointConfigName": new_config,
            "DeploymentConfig": new[2].params["DeploymentConfig"],
        },
    )
    stub.add_response("describe_endpoint", describe(old, "Updating"))
    stub.add_response("describe_endpoint", describe(new_config))
    stub.add_response("describe_endpoint_config", {
        "EndpointConfigName": old, "EndpointConfigArn": "arn:aws:sagemaker:us-east-1:1:ec/old",
        "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": old}],
        "CreationTime": "2026-11-30T00:00:00Z"})  # fmt: skip
    stub.add_response("delete_endpoint_config", {}, {"EndpointConfigName": old})
    stub.add_response("delete_model", {}, {"ModelName": old})
    # then the sweep of replaced leftovers: the serving config's age, the endpoint's configs and models (none left)
    created = "2026-12-01T00:00:00Z"
    stub.add_response("describe_endpoint_config", {
        "EndpointConfigName": new_config, "EndpointConfigArn": "arn:aws:sagemaker:us-east-1:1:ec/new",
        "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": new_config}], "CreationTime": created},
        {"EndpointConfigName": new_config})  # fmt: skip
    stub.add_response("list_endpoint_configs", {"EndpointConfigs": [{
        "EndpointConfigName": new_config, "EndpointConfigArn": "arn:aws:sagemaker:us-east-1:1:ec/new",
        "CreationTime": created}]}, {"NameContains": "tiny-gpt-oss-local"})  # fmt: skip
    stub.add_response("list_models", {"Models": [{
        "ModelName": new_config, "ModelArn": "arn:aws:sagemaker:us-east-1:1:model/new", "CreationTime": created}]},
        {"NameContains": "tiny-gpt-oss-local"})  # fmt: skip
    policy = new[2].params["DeploymentConfig"]["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"]["Type"] == "ALL_AT_ONCE"
    assert policy["TrafficRoutingConfiguration"]["WaitIntervalInSeconds"] > 0  # baking while alarms watch
    with stub:
        state = endpoints.deploy(IMAGE, MODEL, poll_seconds=0)
        stub.assert_no_pending_responses()
    assert state.config_name == new_config and "update_endpoint" in state.actions


def test_a_failed_update_rolls_back_and_the_old_config_keeps_serving(aws_env):
    cfg = config(aws_env, "serving.autoscaling.max_instances=3")
    _client, stub, endpoints, old = stubbed(cfg)
    plan_update(stub, old)
    stub.add_response("create_model", {"ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/m"})
    stub.add_response("create_endpoint_config", {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:1:ec/c"})
    stub.add_response("update_endpoint", {"EndpointArn": "arn:aws:sagemaker:us-east-1:1:endpoint/e"})
    stub.add_response("describe_endpoint", describe(old, "Updating"))
    stub.add_response("describe_endpoint", describe(old, "RollingBack"))
    stub.add_response("describe_endpoint", describe(old, "InService", "The primary container failed health checks"))
    with stub, pytest.raises(DeployError) as failure:  # no delete_* stubbed: the old config must stay
        endpoints.deploy(IMAGE, MODEL, poll_seconds=0)
    assert "rolled back: The primary container failed health checks" in str(failure.value)
    assert f"still serves {old}" in str(failure.value)
    scaling = boto3.client("application-autoscaling", region_name="us-east-1")
    (target,) = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert target["MaxCapacity"] == 3  # deregistered for the update, restored on the old config


def test_a_busy_endpoint_is_left_alone(aws_env):
    cfg = config(aws_env)
    _client, stub, endpoints, old = stubbed(cfg)
    missing(stub, "describe_model")
    missing(stub, "describe_endpoint_config")
    stub.add_response("describe_endpoint", describe(old, "Updating"))
    with stub, pytest.raises(DeployError, match="is Updating: wait until it settles"):
        endpoints.deploy(IMAGE, MODEL, poll_seconds=0)


def test_a_deploy_removes_the_toolkits_replaced_configs_and_models_and_nothing_else(aws_env):
    """What a deploy killed after its update leaves (the replaced config and model: only the deploy that updates
    deletes them) is removed by the next deploy that ends serving, even one with nothing to change; a config or
    model named otherwise (another tool's), or another endpoint's, is never touched."""
    import time

    client = sagemaker()
    cfg = config(aws_env)

    def leftover(name):
        client.create_model(ModelName=name, ExecutionRoleArn=aws_env["role"],
                            PrimaryContainer={"Image": IMAGE})  # fmt: skip
        client.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.g4dn.xlarge",
            "InitialInstanceCount": 1}])  # fmt: skip

    replaced, half = "tiny-gpt-oss-local-0123456789", "tiny-gpt-oss-local-abcdefabcd"
    others = ("tiny-gpt-oss-local-blue", "other-endpoint-0123456789")
    for name in (replaced, *others):
        leftover(name)
    client.create_model(ModelName=half, ExecutionRoleArn=aws_env["role"], PrimaryContainer={"Image": IMAGE})
    time.sleep(1.1)  # CreationTime has whole seconds here: the leftovers are older than what the deploy creates
    first = sdk.deploy(cfg, image_uri=IMAGE, model_data=MODEL, poll_seconds=0)
    configs = {c["EndpointConfigName"] for c in client.list_endpoint_configs()["EndpointConfigs"]}
    models = {m["ModelName"] for m in client.list_models()["Models"]}
    assert configs == {first.config_name, *others} and models == {first.config_name, *others}
    leftover(replaced)  # newer than what serves: maybe another deploy's in flight, kept
    again = sdk.deploy(cfg, image_uri=IMAGE, model_data=MODEL, poll_seconds=0)
    assert again.actions == [] and replaced in {c["EndpointConfigName"] for c in
                                                client.list_endpoint_configs()["EndpointConfigs"]}  # fmt: skip
