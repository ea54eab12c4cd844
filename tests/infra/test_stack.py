"""infra/toolkit.yaml: cfn-lint clean, least privilege, deployed to moto server and read back into a config.

moto creates the stack's S3/ECR/IAM resources for real (over HTTP on loopback) but ignores bucket policies
and describes no changes for updates: those are checked on the template itself.
"""

from __future__ import annotations

import json
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


def test_cfn_lint_passes_with_informational_rules():
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    checks = ["--include-checks", "I", "--non-zero-exit-code", "informational"]
    result = subprocess.run([str(cfn_lint), *checks, "--", str(TEMPLATE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_key_is_kept_with_the_data_it_encrypts():
    resources = template()["Resources"]
    policies = ("DeletionPolicy", "UpdateReplacePolicy")
    for name, resource in resources.items():  # whatever is kept and encrypted with the key keeps the key
        uses_key = "Key.Arn" in str(resource) or "'Key', 'Arn'" in str(resource)
        if uses_key and all(resource.get(policy) == "Retain" for policy in policies):
            assert all(resources["Key"].get(policy) == "Retain" for policy in policies), name


def test_the_checkpoint_rule_expires_what_a_training_job_writes(aws_env):
    from toolkit.targets.training_job import TARGET

    cfg = load_config("gpt-oss-20b-lora", [f"aws.role={aws_env['role']}", f"aws.bucket={aws_env['bucket']}",
                                           "aws.prefix=team-a"])  # fmt: skip
    written = json.loads(TARGET.render(cfg))["CheckpointConfig"]["S3Uri"]
    bucket, _, key = written.removeprefix("s3://").partition("/")
    assert bucket == aws_env["bucket"]
    stack = Stack("us-east-1", parameters=infra.parameters(AwsSettings(prefix="team-a"), "tk", False, "h", [], False))
    stack.role()
    rules = stack.resolve(template()["Resources"]["ArtifactBucket"]["Properties"]["LifecycleConfiguration"]["Rules"])
    (rule,) = [r for r in rules if r["Id"] == "expire-old-checkpoints"]
    assert key.startswith(rule["Prefix"]) and rule["Prefix"] == aws.checkpoint_root("team-a"), (key, rule)
    assert cfg.name in key  # each config's jobs apart, each job apart (a new job starts fresh)


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

    from toolkit.sagemaker_sdk import TRAINING_DLC

    catalogue = json.loads((resources.files("sagemaker.core") / "image_uri_config" / "pytorch.json").read_text())
    return catalogue["training"]["versions"][TRAINING_DLC["version"]]["registries"]


def test_the_dlc_registry_mapping_is_the_sdks_catalogue():
    mapping = {region: row["Account"] for region, row in template()["Mappings"]["DlcRegistry"].items()}
    assert mapping == dlc_catalogue()


def training_job_needs(stack: Stack) -> list[tuple[str, str, dict]]:
    p, r, a = aws.partition(stack.region), stack.region, stack.account
    bucket = f"arn:{p}:s3:::toolkit-{a}-{r}"
    dlc = dlc_catalogue()[r]
    checkpoints = aws.checkpoint_prefix("toolkit", "cfg", "cfg-20260101000000")
    return [
        ("s3:GetObject", f"{bucket}/toolkit/data/abc/chat.jsonl", {}),
        ("s3:GetObject", f"{bucket}/toolkit/code/job/toolkit_train/train.py", {}),
        ("s3:PutObject", f"{bucket}/toolkit/output/job/output/model/merged/model.safetensors", {}),
        ("s3:PutObject", f"{bucket}/{checkpoints}checkpoint-10/adapter_model.safetensors", {}),
        ("s3:ListBucket", bucket, {"s3:prefix": checkpoints}),
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


TRACKING_SERVER = "arn:aws:sagemaker:us-west-2:111122223333:mlflow-tracking-server/team"


def mlflow_actions() -> list[str]:
    (policy,) = [r for r in template()["Resources"].values() if r.get("Condition") == "HasMlflow"]
    (statement,) = statements(policy["Properties"]["PolicyDocument"])
    return statement["Action"]


def test_the_role_may_track_runs_on_the_named_mlflow_server_only():
    settings = AwsSettings(region="us-west-2")
    closed = Stack("us-west-2", parameters=infra.parameters(settings, "toolkit", False, "h", [], False)).role()
    assert not closed.allows("sagemaker-mlflow:CreateRun", TRACKING_SERVER)  # no server named: no access
    parameters = infra.parameters(settings, "toolkit", False, "h", [], False, TRACKING_SERVER)
    role = Stack("us-west-2", parameters=parameters).role()
    assert mlflow_actions()
    for action in mlflow_actions():
        assert role.allows(action, TRACKING_SERVER), action
        assert not role.allows(action, TRACKING_SERVER.replace("/team", "/other-team")), action
    for action in ("sagemaker-mlflow:DeleteExperiment", "sagemaker-mlflow:DeleteRun", "sagemaker-mlflow:AccessUI",
                   "sagemaker-mlflow:CreateRegisteredModel", "sagemaker:DeleteMlflowTrackingServer"):  # fmt: skip
        assert not role.allows(action, TRACKING_SERVER), action


EXPORT = infra.ExportRole(cluster="hp-eks", namespace="ml", service_account="exporter")
POD_IDENTITY = {"Service": "pods.eks.amazonaws.com"}


def export_role(kms: bool):
    parameters = infra.parameters(AwsSettings(region="us-west-2"), "toolkit", kms, "h", [], False, export=EXPORT)
    stack = Stack("us-west-2", parameters=parameters)
    return stack, stack.role("ExportRole")


def pod_tags(**changed: str) -> dict[str, str]:
    tags = {
        "aws:SourceAccount": "111122223333",
        "aws:RequestTag/eks-cluster-name": "hp-eks",
        "aws:RequestTag/kubernetes-namespace": "ml",
        "aws:RequestTag/kubernetes-service-account": "exporter",
    }
    return tags | {f"aws:RequestTag/{k.replace('_', '-')}": v for k, v in changed.items()}  # fmt: skip


def test_the_export_role_is_made_only_for_a_named_cluster():
    settings = AwsSettings(region="us-west-2")
    stack = Stack("us-west-2", parameters=infra.parameters(settings, "toolkit", False, "h", [], False))
    with pytest.raises(AssertionError, match="not created"):
        stack.role("ExportRole")
    added = {c.logical_id for c in infra._resources_to_add(TEMPLATE.read_text(), stack.parameters)}
    assert not {"ExportRole", "ExportPodIdentity", "MlflowPolicy"} & added


def test_only_the_export_service_account_assumes_the_export_role():
    _, role = export_role(kms=False)
    for action in ("sts:AssumeRole", "sts:TagSession"):
        assert role.trusts(POD_IDENTITY, action, pod_tags()), action
    assert not role.trusts(POD_IDENTITY, "sts:AssumeRole", pod_tags(kubernetes_service_account="default"))
    assert not role.trusts(POD_IDENTITY, "sts:AssumeRole", pod_tags(kubernetes_namespace="kube-system"))
    assert not role.trusts(POD_IDENTITY, "sts:AssumeRole", pod_tags(eks_cluster_name="other"))
    assert not role.trusts(POD_IDENTITY, "sts:AssumeRole", pod_tags() | {"aws:SourceAccount": "999988887777"})
    assert not role.trusts({"Service": "sagemaker.amazonaws.com"}, "sts:AssumeRole", pod_tags())
    untagged = {k: v for k, v in pod_tags().items() if k == "aws:SourceAccount"}
    assert not role.trusts(POD_IDENTITY, "sts:AssumeRole", untagged)  # not through Pod Identity's session tags


@pytest.mark.parametrize("kms", [False, True])
def test_the_export_role_writes_models_and_nothing_else(kms):
    stack, role = export_role(kms)
    bucket = f"arn:aws:s3:::toolkit-{stack.account}-us-west-2"
    models = aws.model_prefix("toolkit", "cfg")
    assert role.allows("s3:PutObject", f"{bucket}/{models}/0123abcd/merged/model-00001.safetensors")
    assert role.allows("s3:AbortMultipartUpload", f"{bucket}/{models}/0123abcd/merged/model-00001.safetensors")
    for action, resource in (
        ("s3:PutObject", f"{bucket}/toolkit/checkpoints/cfg/x"),
        ("s3:PutObject", f"{bucket}/toolkit/output/x"),
        ("s3:PutObject", f"{bucket}/other-prefix/models/x"),
        ("s3:GetObject", f"{bucket}/{models}/x"),
        ("s3:DeleteObject", f"{bucket}/{models}/x"),
        ("s3:PutObject", "arn:aws:s3:::someone-elses-bucket/toolkit/models/x"),
        ("kms:ScheduleKeyDeletion", f"arn:aws:kms:us-west-2:{stack.account}:key/0000-key"),
        ("kms:GenerateDataKey", f"arn:aws:kms:us-west-2:{stack.account}:key/other-key"),
        ("iam:PassRole", f"arn:aws:iam::{stack.account}:role/toolkit-sagemaker-execution"),
    ):
        assert not role.allows(action, resource), (action, resource)
    key = f"arn:aws:kms:us-west-2:{stack.account}:key/0000-key"
    for action in ("kms:GenerateDataKey", "kms:Decrypt"):  # SSE-KMS uploads, multipart ones too
        assert role.allows(action, key) is kms, action


def test_the_export_service_account_lands_in_the_written_config():
    values = {"RoleArn": "arn:aws:iam::1:role/r", "BucketName": "b", "ExportServiceAccount": "exporter",
              "TrainingRepositoryUri": "1.dkr.ecr.us-west-2.amazonaws.com/toolkit-training"}  # fmt: skip
    written = yaml.safe_load(infra.config_overlay("gpt-oss-20b-lora", values, "us-west-2"))
    assert written["hyperpod"] == {"image_repository": "toolkit-training", "service_account": "exporter"}
