"""`toolkit register` against moto server: Model Package Groups and packages are real moto resources."""

from __future__ import annotations

import boto3
import pytest
from typer.testing import CliRunner

from tests.toolkit.deploy.test_endpoint import IMAGE, completed_training_job, config
from toolkit import sdk
from toolkit.cli import app
from toolkit.deploy import DeployError

pytestmark = pytest.mark.integration


def test_register_records_the_latest_job_once_and_approval_is_applied_on_rerun(aws_env):
    model_data = completed_training_job(aws_env, "tiny-gpt-oss-local-20261130120000")
    cfg = config(aws_env)
    first = sdk.register(cfg, image_uri=IMAGE)
    assert first.created and first.status == "PendingManualApproval" and first.group == "tiny-gpt-oss-local"

    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    package = sagemaker.describe_model_package(ModelPackageName=first.arn)
    container = package["InferenceSpecification"]["Containers"][0]
    assert container["Image"] == IMAGE  # the job's uncompressed model prefix, as the endpoint serves it
    assert container["ModelDataSource"]["S3DataSource"]["S3Uri"] == model_data
    metadata = package["CustomerMetadataProperties"]
    assert metadata["training_job"] == "tiny-gpt-oss-local-20261130120000"
    assert metadata["base_model"] == "builtin:tiny-gpt-oss" and metadata["lora"] == "r=12 alpha=24"  # the preset's LoRA

    again = sdk.register(cfg, image_uri=IMAGE, approve=True)
    assert not again.created and again.arn == first.arn and again.status == "Approved"
    packages = sagemaker.list_model_packages(ModelPackageGroupName="tiny-gpt-oss-local")["ModelPackageSummaryList"]
    assert len(packages) == 1 and packages[0]["ModelApprovalStatus"] == "Approved"


def test_register_without_a_completed_job_says_what_to_do(aws_env, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"base: tiny-gpt-oss-local\naws: {{role: '{aws_env['role']}'}}\n")
    result = CliRunner().invoke(app, ["register", str(path), "--image-uri", IMAGE])
    assert result.exit_code == 2 and "no completed training job of tiny-gpt-oss-local" in result.output
    with pytest.raises(DeployError):
        sdk.register(config(aws_env), job_name=None, image_uri=IMAGE)


def test_a_package_with_more_environment_entries_than_aws_holds_is_refused_before_any_call(aws_env):
    """A model package's container takes 16 environment entries (AWS's API reference; botocore's model says 100,
    CreateModel's limit): serving settings that make more are refused, naming the field, and nothing is created."""
    completed_training_job(aws_env, "tiny-gpt-oss-local-20261130120000")
    flags = {f"flag-{n}": n for n in range(12)}
    base = config(aws_env)
    cfg = base.model_copy(update={"serving": base.serving.model_copy(update={"vllm_args": flags})})
    with pytest.raises(DeployError, match=r"serving.vllm_args: a model package holds at most 16 environment entries"):
        sdk.register(cfg, image_uri=IMAGE)
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    assert sagemaker.list_model_package_groups()["ModelPackageGroupSummaryList"] == []


# -- the run comes from the config's own target: a HyperPod run registers by its model, brought to S3 once ----------


def hyperpod_config(aws_env, shared, *overrides):
    return config(aws_env, "target=hyperpod", "hyperpod.orchestrator=slurm", f"hyperpod.fsx.mount_path={shared}",
                  *overrides)  # fmt: skip


def completed_hyperpod_run(cfg) -> None:
    """What a finished HyperPod run leaves in its job directory on the shared filesystem (run.json written last)."""
    from toolkit.targets.hyperpod import job_dir

    model = job_dir(cfg) / "model"
    (model / "adapter").mkdir(parents=True)
    (model / "adapter" / "adapter_config.json").write_text("{}")
    (model / "run.json").write_text('{"job": "slurm", "train_loss": 1.25, "eval_loss": null}')


def test_a_hyperpod_run_registers_by_its_model_uploaded_once(aws_env, tmp_path):
    cfg = hyperpod_config(aws_env, tmp_path / "fsx")
    completed_hyperpod_run(cfg)
    first = sdk.register(cfg, image_uri=IMAGE)
    assert first.created and first.status == "PendingManualApproval"

    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    package = sagemaker.describe_model_package(ModelPackageName=first.arn)
    served = package["InferenceSpecification"]["Containers"][0]["ModelDataSource"]["S3DataSource"]["S3Uri"]
    assert served.startswith(f"s3://{aws_env['bucket']}/toolkit/models/tiny-gpt-oss-local/") and served.endswith("/")
    listed = boto3.client("s3").list_objects_v2(Bucket=aws_env["bucket"], Prefix=served.split("/", 3)[3])
    assert {o["Key"].rsplit("/", 1)[-1] for o in listed["Contents"]} >= {"run.json", "adapter_config.json"}
    metadata = package["CustomerMetadataProperties"]
    assert metadata["training_job"] == "tiny-gpt-oss-local" and metadata["model_data"] == served
    assert metadata["metric:train_loss"] == "1.25" and "metric:eval_loss" not in metadata  # run.json's final losses
    assert "training_job_arn" not in metadata and package["ModelPackageDescription"].endswith(
        "from hyperpod run tiny-gpt-oss-local")  # fmt: skip

    again = sdk.register(cfg, image_uri=IMAGE, approve=True)  # the same run: found by its model, not registered twice
    assert not again.created and again.arn == first.arn and again.status == "Approved"


def test_a_hyperpod_run_that_cannot_be_registered_from_here_is_said_plainly(aws_env, tmp_path):
    """No completed run in the job directory (the shared filesystem not mounted here, or nothing trained): exit 2,
    one line saying how to get one; --job of another run than the one whose model the cluster keeps: the same."""
    shared = tmp_path / "fsx"
    path = tmp_path / "hp.yaml"
    path.write_text(f"base: tiny-gpt-oss-local\ntarget: hyperpod\naws: {{role: '{aws_env['role']}', bucket: "
                    f"{aws_env['bucket']}}}\nhyperpod: {{orchestrator: slurm, fsx: {{mount_path: "
                    f"'{shared}'}}}}\n")  # fmt: skip
    result = CliRunner().invoke(app, ["register", str(path), "--image-uri", IMAGE])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "no completed hyperpod run of tiny-gpt-oss-local found" in result.output
    with pytest.raises(DeployError, match="toolkit train tiny-gpt-oss-local --target hyperpod"):
        sdk.register(hyperpod_config(aws_env, shared), image_uri=IMAGE)

    completed_hyperpod_run(hyperpod_config(aws_env, shared))
    other = CliRunner().invoke(app, ["register", str(path), "--image-uri", IMAGE, "--job", "4242"])
    assert other.exit_code == 2 and "keeps the model of tiny-gpt-oss-local's newest run only" in other.output
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    assert sagemaker.list_model_package_groups()["ModelPackageGroupSummaryList"] == []
