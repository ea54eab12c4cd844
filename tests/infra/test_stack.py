"""infra/toolkit.yaml: cfn-lint clean, least privilege, deployed to moto server and read back into a config.

moto creates the stack's S3/ECR/IAM resources for real (over HTTP on loopback) but ignores bucket policies
and describes no changes for updates: those are checked on the template itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml
from typer.testing import CliRunner

from tests.infra.policy import Stack
from toolkit import aws, infra
from toolkit.cli import app
from toolkit.config import load_config
from toolkit.config.models import AwsSettings

TEMPLATE = infra.TEMPLATE


def template() -> dict:
    return yaml.load(TEMPLATE.read_text(), Loader=infra._CfnLoader)


def statements(document: dict) -> list[dict]:
    found = document["Statement"]
    return found if isinstance(found, list) else [found]


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def test_cfn_lint_passes():
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    result = subprocess.run([str(cfn_lint), str(TEMPLATE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_wildcard_action_on_wildcard_resource():
    parameters = infra.parameters(AwsSettings(), "toolkit", True, "hf-token", ["my-team-bucket"], vpc=True)
    allows = [s for s in Stack("us-east-1", parameters=parameters).role().statements if s["Effect"] == "Allow"]
    assert allows
    unscoped = {  # actions AWS cannot scope to a resource, named one by one
        "ecr:GetAuthorizationToken", "cloudwatch:PutMetricData", "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs",
        "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups",
    }  # fmt: skip
    for statement in allows:
        actions, targets = as_list(statement["Action"]), as_list(statement["Resource"])
        assert not any(a == "*" or a.endswith(":*") for a in actions), statement
        if "*" in targets:
            assert set(actions) <= unscoped, statement
    role = template()["Resources"]["ExecutionRole"]["Properties"]
    assert "ManagedPolicyArns" not in role  # no AmazonSageMakerFullAccess


def test_bucket_is_private_encrypted_versioned_and_tls_only():
    resources = template()["Resources"]
    bucket = resources["ArtifactBucket"]["Properties"]
    assert bucket["VersioningConfiguration"]["Status"] == "Enabled"
    assert all(bucket["PublicAccessBlockConfiguration"].values())
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    assert "expire-old-checkpoints" in rules
    (deny,) = statements(resources["ArtifactBucketPolicy"]["Properties"]["PolicyDocument"])
    assert deny["Effect"] == "Deny" and deny["Action"] == "s3:*"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    repository = resources["Repository"]["Properties"]
    assert repository["ImageTagMutability"] == "IMMUTABLE"
    assert repository["ImageScanningConfiguration"]["ScanOnPush"] is True
    assert "LifecyclePolicyText" in repository["LifecyclePolicy"]


@pytest.mark.integration
def test_deploy_outputs_config_destroy(aws_env, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["infra", "deploy", "--stack", "tk", "--name-prefix", "tk", "--yes"])
    assert result.exit_code == 0, result.output
    assert "ExecutionRole" in result.output and "RoleArn: arn:aws:iam::" in result.output
    assert boto3.client("iam").get_role(RoleName="tk-sagemaker-execution")["Role"]
    assert boto3.client("ecr").describe_repositories(repositoryNames=["tk-serving"])["repositories"]
    bucket = "tk-123456789012-us-east-1"
    boto3.client("s3").head_bucket(Bucket=bucket)

    again = runner.invoke(app, ["infra", "deploy", "--stack", "tk", "--name-prefix", "tk", "--yes"])
    assert again.exit_code == 0 and "up to date" in again.output  # re-running is safe

    written = tmp_path / "job.yaml"
    result = runner.invoke(
        app, ["infra", "outputs", "--stack", "tk", "--base", "gpt-oss-20b-lora", "--write", str(written)]
    )
    assert result.exit_code == 0, result.output
    cfg = load_config(written)
    assert cfg.aws.role == "arn:aws:iam::123456789012:role/tk-sagemaker-execution" and cfg.aws.bucket == bucket

    boto3.client("s3").put_object(Bucket=bucket, Key="toolkit/checkpoints/x", Body=b"weights")
    refused = runner.invoke(app, ["infra", "destroy", "--stack", "tk", "--yes"])
    assert refused.exit_code == 1 and "still holds data" in refused.output
    boto3.client("s3").head_bucket(Bucket=bucket)  # nothing was deleted
    assert runner.invoke(app, ["infra", "destroy", "--stack", "tk", "--yes", "--force"]).exit_code == 0
    assert bucket not in {b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]}


@pytest.mark.integration
def test_failed_stack_names_the_resource_and_reason(aws_env):
    boto3.client("iam").create_role(RoleName="clash-sagemaker-execution", AssumeRolePolicyDocument="{}")
    settings = AwsSettings()
    planned = infra.plan(settings, "clash", {"NamePrefix": "clash"})
    assert {c.logical_id for c in planned.changes} >= {"ArtifactBucket", "ExecutionRole", "Repository"}
    assert "Key" not in {c.logical_id for c in planned.changes}  # CreateKmsKey=false
    with pytest.raises(infra.InfraError, match="clash-sagemaker-execution already exists"):
        infra.apply(settings, planned)


def test_non_interactive_deploy_needs_yes(aws_env):
    result = CliRunner().invoke(app, ["infra", "deploy", "--stack", "tk2"])
    assert result.exit_code == 2 and "--yes" in result.output
    assert boto3.client("cloudformation").list_stacks()["StackSummaries"] == []


def test_template_path_ships_with_the_repo():
    assert Path(infra.TEMPLATE).is_file()


# -- what the role allows, evaluated (tests/infra/policy.py) -------------------------------------------------------


def dlc_catalogue() -> dict[str, str]:
    import json
    from importlib import resources

    from toolkit.targets.training_job import TRAINING_DLC

    catalogue = json.loads((resources.files("sagemaker.core") / "image_uri_config" / "pytorch.json").read_text())
    return catalogue["training"]["versions"][TRAINING_DLC["version"]]["registries"]


def test_the_dlc_registry_mapping_is_the_sdks_catalogue():
    mapping = {region: row["Account"] for region, row in template()["Mappings"]["DlcRegistry"].items()}
    assert mapping == dlc_catalogue()


def training_job_needs(stack: Stack) -> list[tuple[str, str, dict]]:
    p, r, a = aws.partition(stack.region), stack.region, stack.account
    bucket = f"arn:{p}:s3:::toolkit-{a}-{r}"
    dlc = dlc_catalogue()[r]
    return [
        ("s3:GetObject", f"{bucket}/toolkit/data/abc/chat.jsonl", {}),
        ("s3:GetObject", f"{bucket}/toolkit/code/job/entrypoints/train.py", {}),
        ("s3:PutObject", f"{bucket}/toolkit/output/job/output/model/merged/model.safetensors", {}),
        ("s3:PutObject", f"{bucket}/toolkit/checkpoints/job/checkpoint-10/adapter_model.safetensors", {}),
        ("s3:ListBucket", bucket, {"s3:prefix": "toolkit/checkpoints/job/"}),
        ("ecr:BatchGetImage", f"arn:{p}:ecr:{r}:{dlc}:repository/pytorch-training", {}),
        ("ecr:GetDownloadUrlForLayer", f"arn:{p}:ecr:{r}:{dlc}:repository/pytorch-training", {}),
        ("ecr:GetAuthorizationToken", "*", {}),
        ("ecr:BatchGetImage", f"arn:{p}:ecr:{r}:{a}:repository/toolkit-training", {}),  # training_job.image_uri
        ("logs:CreateLogStream", f"arn:{p}:logs:{r}:{a}:log-group:/aws/sagemaker/TrainingJobs:log-stream:j", {}),
        ("logs:PutLogEvents", f"arn:{p}:logs:{r}:{a}:log-group:/aws/sagemaker/TrainingJobs:log-stream:j", {}),
        ("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}),
        ("secretsmanager:GetSecretValue", f"arn:{p}:secretsmanager:{r}:{a}:secret:hf-token-AbCdEf", {}),
    ]


def endpoint_needs(stack: Stack) -> list[tuple[str, str, dict]]:
    p, r, a = aws.partition(stack.region), stack.region, stack.account
    return [
        ("s3:GetObject", f"arn:{p}:s3:::toolkit-{a}-{r}/toolkit/output/job/output/model/merged/config.json", {}),
        ("ecr:BatchGetImage", f"arn:{p}:ecr:{r}:{a}:repository/toolkit-serving", {}),
        ("logs:PutLogEvents", f"arn:{p}:logs:{r}:{a}:log-group:/aws/sagemaker/Endpoints/e:log-stream:x", {}),
    ]


def must_be_denied(stack: Stack) -> list[tuple[str, str, dict]]:
    p, r, a = aws.partition(stack.region), stack.region, stack.account
    bucket = f"arn:{p}:s3:::toolkit-{a}-{r}"
    return [
        ("s3:GetObject", f"arn:{p}:s3:::someone-elses-bucket/secret.csv", {}),
        ("s3:PutObject", f"{bucket}/not-the-prefix/x", {}),
        ("s3:DeleteBucket", bucket, {}),
        ("s3:PutObject", f"arn:{p}:s3:::my-team-bucket/datasets/x", {}),  # data buckets are read-only
        ("ecr:BatchGetImage", f"arn:{p}:ecr:{r}:999988887777:repository/pytorch-training", {}),
        ("ecr:PutImage", f"arn:{p}:ecr:{r}:{a}:repository/toolkit-serving", {}),
        ("ecr:PutImage", f"arn:{p}:ecr:{r}:{a}:repository/toolkit-training", {}),
        ("secretsmanager:GetSecretValue", f"arn:{p}:secretsmanager:{r}:{a}:secret:prod-db-password-AbCdEf", {}),
        ("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "Billing"}),
        ("iam:PassRole", f"arn:{p}:iam::{a}:role/admin", {}),
        ("sagemaker:CreateTrainingJob", f"arn:{p}:sagemaker:{r}:{a}:training-job/x", {}),
    ]


@pytest.mark.parametrize("region", sorted(dlc_catalogue()))
def test_the_role_allows_every_documented_path_and_nothing_else(region):
    stack = Stack(region, parameters={"KeyPrefix": "toolkit"})
    role = stack.role()
    for action, resource, context in training_job_needs(stack) + endpoint_needs(stack):
        assert role.allows(action, resource, context), (region, action, resource)
    for action, resource, context in must_be_denied(stack):
        assert not role.allows(action, resource, context), (region, action, resource)
    # optional paths are closed until asked for
    p = aws.partition(region)
    assert not role.allows("s3:GetObject", f"arn:{p}:s3:::my-team-bucket/datasets/x")
    assert not role.allows("ec2:CreateNetworkInterface", f"arn:{p}:ec2:{region}:{stack.account}:subnet/subnet-1")


def test_optional_paths_open_when_asked_for():
    settings = AwsSettings(region="us-west-2")
    parameters = infra.parameters(settings, "toolkit", True, "hf-token", ["my-team-bucket"], vpc=True)
    stack = Stack("us-west-2", parameters=parameters)
    role = stack.role()
    a = stack.account
    assert role.allows("s3:GetObject", "arn:aws:s3:::my-team-bucket/datasets/support/part-0.parquet")
    assert role.allows("s3:ListBucket", "arn:aws:s3:::my-team-bucket")
    assert not role.allows("s3:PutObject", "arn:aws:s3:::my-team-bucket/datasets/x")
    for action, resource in (
        ("ec2:CreateNetworkInterface", f"arn:aws:ec2:us-west-2:{a}:network-interface/*"),
        ("ec2:CreateNetworkInterface", f"arn:aws:ec2:us-west-2:{a}:subnet/subnet-1"),
        ("ec2:DescribeSubnets", "*"),
        ("ec2:DeleteNetworkInterface", f"arn:aws:ec2:us-west-2:{a}:network-interface/eni-1"),
        ("kms:GenerateDataKey", f"arn:aws:kms:us-west-2:{a}:key/0000-key"),
    ):
        assert role.allows(action, resource), action
    assert not role.allows("ec2:RunInstances", f"arn:aws:ec2:us-west-2:{a}:instance/*")
    assert not role.allows("ec2:CreateNetworkInterface", "arn:aws:ec2:us-west-2:999988887777:subnet/subnet-1")
