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

from toolkit import infra
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
    resources = template()["Resources"]
    documents = [p["PolicyDocument"] for p in resources["ExecutionRole"]["Properties"]["Policies"]]
    documents.append(resources["KmsPolicy"]["Properties"]["PolicyDocument"])
    allows = [s for d in documents for s in statements(d) if s["Effect"] == "Allow"]
    assert allows
    for statement in allows:
        actions, targets = as_list(statement["Action"]), as_list(statement["Resource"])
        assert not any(a == "*" or a.endswith(":*") for a in actions), statement
        if "*" in targets:  # only actions AWS cannot scope to a resource, and named one by one
            assert set(actions) <= {"ecr:GetAuthorizationToken", "cloudwatch:PutMetricData"}, statement
    role = resources["ExecutionRole"]["Properties"]
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
