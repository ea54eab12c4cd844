"""Names checked as AWS and Kubernetes check them, wherever a name appears, through the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.toolkit.cli_checks import refused
from toolkit.config.names import bucket_name_problem, k8s_name_problem, known_regions, region_problem


def toolkit(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})  # fmt: skip


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("My_Team_Data", "not a valid S3 bucket name"),
        ("s3://my-team-bucket", "a bucket name, not a URI (e.g. 'my-team-bucket')"),
        ("my-team-bucket/prefix", "a bucket name, not a URI"),
        ("ab", "not a valid S3 bucket name"),
        ("a" * 64, "not a valid S3 bucket name"),
        ("my..bucket", "not a valid S3 bucket name"),
        ("192.168.5.4", "formatted as an IP address"),
        ("xn--bucket", "S3 reserves 'xn--'"),
        ("sthree-bucket", "S3 reserves 'sthree-'"),
        ("amzn-s3-demo-bucket", "S3 reserves"),
        ("my-bucket-s3alias", "S3 reserves '-s3alias'"),
        ("my-bucket--ol-s3", "S3 reserves"),
        ("my-bucket.mrap", "S3 reserves"),
        ("my-bucket--x-s3", "S3 reserves"),
        ("my-bucket--table-s3", "S3 reserves"),
    ],
)
def test_bucket_names_as_s3_checks_them(name, problem):
    assert problem in (bucket_name_problem(name) or "")


@pytest.mark.parametrize("name", ["my-team-bucket", "a.b.c", "abc", "toolkit-123456789012-us-east-1"])
def test_valid_bucket_names_pass(name):
    assert bucket_name_problem(name) is None


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ("aws.bucket=My_Bucket", "aws.bucket: 'My_Bucket' is not a valid S3 bucket name"),
        ("aws.data_buckets=[My_Team_Data]", "aws.data_buckets[0]: 'My_Team_Data' is not a valid S3 bucket name"),
        ("aws.data_buckets=[s3://my-team-bucket]", "aws.data_buckets[0]: 's3://my-team-bucket' is a URI or path"),
        ("data.source=s3://Team_Data/rows.jsonl", "data.source: the bucket of 's3://Team_Data/rows.jsonl'"),
        ("serving.model_data=s3://Models/m/", "serving.model_data: the bucket of 's3://Models/m/'"),
        ("aws.region=eu-west-9", "aws.region: 'eu-west-9' is not an AWS region"),
        ("aws.region=us-east1", "did you mean us-east-1"),
    ],
)
def test_config_names_refused_through_the_cli(setting, fragment):
    refused(toolkit("config", "validate", "tiny-gpt-oss-local", "--set", setting), fragment)


def test_infra_deploy_refuses_a_bad_data_bucket_before_any_call():
    """No endpoint at all: the refusal comes before a request (a request would fail with 'cannot reach')."""
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    for bad, fragment in (("My_Bad_Bucket", "not a valid S3 bucket name"), ("s3://my-team-bucket", "not a URI")):
        refused(toolkit("infra", "deploy", "--data-bucket", bad, "--yes", env=env), "--data-bucket: ", fragment)


def test_regions_come_from_botocores_partition_data():
    regions = known_regions()
    assert regions is not None
    assert (
        regions["us-east-1"] == "aws" and regions["cn-north-1"] == "aws-cn" and regions["us-gov-west-1"] == "aws-us-gov"
    )
    assert region_problem("eu-west-1") is None and region_problem("aws-global") is not None


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        (["name=MyJob"], "name: on EKS the job is a Kubernetes object named after the config: 'MyJob'"),
        (["hyperpod.namespace=Team_A"], "hyperpod.namespace: 'Team_A' is not a Kubernetes object name"),
        (["hyperpod.service_account=Model_Export"], "hyperpod.service_account: 'Model_Export'"),
        (["hyperpod.fsx.claim=FSx-Claim"], "hyperpod.fsx.claim: 'FSx-Claim'"),
        (["hyperpod.queue=Team.Queue"], "hyperpod.queue: 'Team.Queue'"),
    ],
)
def test_kubernetes_names_on_eks(setting, fragment):
    sets = [*setting, "target=hyperpod", "hyperpod.cluster=c"]
    refused(toolkit("config", "validate", "tiny-gpt-oss-local", *[a for s in sets for a in ("--set", s)]), fragment)


def test_capitals_in_the_name_are_fine_off_eks():
    """Only EKS makes Kubernetes objects from the config's name; it is not lowercased for them (refused instead)."""
    sets = ["name=MyJob", "target=hyperpod", "hyperpod.orchestrator=slurm"]
    assert toolkit("config", "validate", "tiny-gpt-oss-local", *[a for s in sets for a in ("--set", s)]).returncode == 0
    assert k8s_name_problem("team-a.queue") is None and k8s_name_problem("team-a.queue", "label") is not None
