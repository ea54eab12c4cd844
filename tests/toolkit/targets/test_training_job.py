"""SageMaker training jobs against moto server (a real HTTP emulator on loopback).

moto completes a job the moment it is created and implements neither StopTrainingJob nor training-job log
creation: the tests steer job states through moto's backend (same process), write the log events
themselves, and use botocore's Stubber for StopTrainingJob. What this does not cover: a real container run.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from typer.testing import CliRunner

from tests.botocore_model import assert_valid
from toolkit.aws import AwsError
from toolkit.cli import app
from toolkit.config import load_config
from toolkit.targets.base import Status, TargetError
from toolkit.targets.training_job import LOG_GROUP, METRIC_DEFINITIONS, TARGET, TrainingJob

pytestmark = pytest.mark.integration
DATA = "chat.jsonl"


def config(aws_env, *overrides):
    Path(DATA).write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
    )
    return load_config(
        "gpt-oss-20b-lora",
        [f"aws.role={aws_env['role']}", f"aws.bucket={aws_env['bucket']}", f"data.source={DATA}",
         "data.format=messages", *overrides],
    )  # fmt: skip


def keys(bucket="toolkit-test-bucket"):
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket)
    return {o["Key"]: o["ETag"] for o in listed.get("Contents", [])}


def backend_job(name):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    return sagemaker_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].training_jobs[name]


def test_submit_creates_the_job_the_config_describes(aws_env, monkeypatch):
    import toolkit.aws

    sent: dict = {}
    real_session = toolkit.aws.session

    def spying_session(settings):  # moto does not echo MetricDefinitions: read what was sent
        made = real_session(settings)
        made.events.register(
            "provide-client-params.sagemaker.CreateTrainingJob", lambda params, **_: sent.update(params)
        )
        return made

    monkeypatch.setattr(toolkit.aws, "session", spying_session)
    cfg = config(
        aws_env, "training_job.spot=true", "training_job.max_run_seconds=3600", "training_job.instance_count=2"
    )
    job = TARGET.submit(cfg)
    d = job.describe()
    assert d["AlgorithmSpecification"]["TrainingImage"].endswith("/pytorch-training:2.10.0-gpu-py313")
    assert d["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge" and d["ResourceConfig"]["InstanceCount"] == 2
    assert d["EnableManagedSpotTraining"] is True
    assert d["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    assert d["CheckpointConfig"]["S3Uri"].startswith("s3://toolkit-test-bucket/")
    assert d["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in d["InputDataConfig"]}
    assert {"train", "code", "sm_drivers"} <= set(channels)
    assert d["HyperParameters"]["lora.r"] == str(cfg.lora.r) and d["HyperParameters"]["training.packing"] == "true"
    assert_valid("sagemaker", "CreateTrainingJob", sent)  # what AWS itself accepts, not only the emulator
    assert sent["OutputDataConfig"]["CompressionType"] == "NONE"  # the model lands uncompressed (40-240 GB merged)
    metrics = sent["AlgorithmSpecification"]["MetricDefinitions"]
    assert {m["Name"]: m["Regex"] for m in metrics} == METRIC_DEFINITIONS
    assert {"Key": "toolkit:config", "Value": "gpt-oss-20b-lora"} in sent["Tags"]
    stored = keys()
    assert any(k.endswith("/chat.jsonl") and k.startswith("toolkit/data/") for k in stored)
    assert any(k.endswith("code/toolkit_train/train.py") for k in stored)
    # PID 1 is the toolkit's signal relay (in the code channel), running the SDK's own command
    assert any(k.endswith("code/toolkit_train/pid1.py") for k in stored)
    algorithm = sent["AlgorithmSpecification"]
    assert algorithm["ContainerEntrypoint"] == ["python3"]
    relay, *command = algorithm["ContainerArguments"]
    assert relay == "/opt/ml/input/data/code/toolkit_train/pid1.py"
    assert command[:2] == ["/bin/bash", "-c"] and "sm_train.sh" in command[2]
    assert any(k.endswith("code/requirements.txt") for k in stored)
    distributed = next(k for k in stored if k.endswith("distributed.json"))
    body = boto3.client("s3").get_object(Bucket="toolkit-test-bucket", Key=distributed)["Body"].read()
    assert json.loads(body)["process_count_per_node"] == 8  # one process per GPU of a p5.48xlarge


def test_endpoint_url_in_the_config_reaches_every_client(aws_env, monkeypatch):
    """aws.endpoint_url from the config file (no AWS_ENDPOINT_URL): the SDK's own clients (its uploads of the
    code channel, its lookups) go there too, not to the real regional endpoints. Also: the job installs the
    locked training stack, plus MLflow's client only when the run reports to MLflow."""
    import toolkit.aws
    from toolkit.resources import MLFLOW_LOCK, TRAINING_LOCK

    hosts: list[str] = []
    real_session = toolkit.aws.session

    def spying_session(settings):
        made = real_session(settings)
        made.events.register("before-send", lambda request, **_: hosts.append(request.url.split("/")[2]))
        return made

    monkeypatch.setattr(toolkit.aws, "session", spying_session)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    tracking = ["training.report_to=[mlflow]", "training.mlflow.tracking_uri=https://mlflow.example.com"]
    job = TARGET.submit(config(aws_env, f"aws.endpoint_url={aws_env['endpoint']}", *tracking))
    assert job.describe()["TrainingJobStatus"]
    emulator = aws_env["endpoint"].split("/")[2]
    assert hosts and set(hosts) == {emulator}, set(hosts)
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws_env["endpoint"])  # for the test's own look at the bucket
    code = next(k for k in keys() if k.endswith("code/requirements.txt"))
    shipped = boto3.client("s3").get_object(Bucket=aws_env["bucket"], Key=code)
    assert shipped["Body"].read().decode() == TRAINING_LOCK.read_text() + MLFLOW_LOCK.read_text()


def test_every_request_the_target_makes_is_one_aws_accepts(aws_env, monkeypatch):
    """Submit, follow, list, attach, find the latest: each request (the SDK's own included) checked against
    botocore's service model, patterns and enums included (the emulator accepts more than AWS)."""
    import toolkit.aws

    sent: list[tuple[str, str, dict]] = []
    real_session = toolkit.aws.session

    def spying_session(settings):
        made = real_session(settings)

        def record(params, model, **_):
            sent.append((model.service_model.service_name, model.name, dict(params)))

        made.events.register("provide-client-params", record)
        return made

    monkeypatch.setattr(toolkit.aws, "session", spying_session)
    cfg = config(aws_env, "training_job.hf_token_secret=hf-token")
    boto3.client("secretsmanager").create_secret(Name="hf-token", SecretString="hf_x")
    job = TARGET.submit(cfg)
    backend_job(job.name).training_job_status = "Completed"
    job.wait(poll_seconds=0.01)
    list(TARGET.attach(cfg, job.name).logs())
    TARGET.list(cfg)
    TARGET.latest(cfg)
    operations = {operation for _, operation, _ in sent}
    assert {"CreateTrainingJob", "DescribeTrainingJob", "PutObject", "HeadBucket", "DescribeSecret"} <= operations
    assert {"ListTrainingJobs"} <= operations, operations
    for service, operation, params in sent:
        assert_valid(service, operation, params)


def test_metric_regexes_read_the_entrypoint_lines():
    """The writer's line (toolkit_train.run.metrics), read by SageMaker's regexes and by the toolkit's parser alike,
    also behind a pod-name prefix; other lines are no metrics."""
    from toolkit_train.run.metrics import format_metrics, parse_metrics

    values = {"loss": 6.9348, "learning_rate": 3.333e-3, "grad_norm": 0.2373, "tokens_per_second": 182.5,
              "gpu_memory_gib": 41.2}  # fmt: skip
    line = format_metrics(3, 30, values)
    assert line == ("[metrics] step=3/30 loss=6.9348 learning_rate=3.333e-03 grad_norm=0.2373 "
                    "tokens_per_second=182.5 gpu_memory_gib=41.20")  # fmt: skip
    found = {name: float(m.group(1)) for name, regex in METRIC_DEFINITIONS.items() if (m := re.search(regex, line))}
    assert found == {f"train:{name}": value for name, value in values.items()}
    validation = format_metrics(4, 30, {"eval_loss": 1.25})  # data.eval's own line
    assert float(re.search(METRIC_DEFINITIONS["validation:loss"], validation).group(1)) == 1.25
    assert re.search(METRIC_DEFINITIONS["train:loss"], validation) is None
    for shown in (line, f"[worker-0] {line}"):
        parsed = parse_metrics(shown)
        assert parsed is not None and (parsed.step, parsed.total_steps) == (3, 30) and parsed.values == values
    assert parse_metrics("loss went [metrics] up") is None and parse_metrics("[toolkit] started") is None


def test_unchanged_data_is_not_uploaded_twice(aws_env):
    cfg = config(aws_env)
    TARGET.submit(cfg)
    data_before = {k: v for k, v in keys().items() if k.startswith("toolkit/data/")}
    s3 = boto3.client("s3")
    uploads = []
    s3.meta.events.register("before-call.s3.PutObject", lambda **kw: uploads.append(kw["params"]["Key"]))
    from toolkit.aws import upload_once

    assert upload_once(s3, cfg.aws, Path(DATA)) in {
        f"s3://toolkit-test-bucket/{k.rsplit('/', 1)[0]}/" for k in data_before
    }
    assert uploads == []
    TARGET.submit(cfg)
    assert {k: v for k, v in keys().items() if k.startswith("toolkit/data/")} == data_before


@pytest.mark.timeout(60)
def test_following_in_progress_to_completed_with_logs(aws_env):
    job = TARGET.submit(config(aws_env))
    backend_job(job.name).training_job_status = "InProgress"
    logs = boto3.client("logs")
    logs.create_log_group(logGroupName=LOG_GROUP)
    for host in ("algo-1-1700000000", "algo-2-1700000000"):
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"{job.name}/{host}")
        event = {"timestamp": int(time.time() * 1000), "message": f"[metrics] step=1/2 loss=1.5 on {host[:6]}"}
        logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=f"{job.name}/{host}", logEvents=[event])
    lines: list[str] = []

    def on_line(line):
        lines.append(line)
        if line.startswith("[metrics]"):  # first poll saw the job running: now let it finish
            backend_job(job.name).training_job_status = "Completed"

    state = job.wait(on_line, poll_seconds=0.01)
    assert state.status is Status.COMPLETED
    assert any("InProgress" in line for line in lines) and any("Completed" in line for line in lines)
    assert "[metrics] step=1/2 loss=1.5 on algo-1" in lines
    assert "[algo-2-1700000000] [metrics] step=1/2 loss=1.5 on algo-2" in lines
    output = f"s3://{aws_env['bucket']}/toolkit/output/{job.name}/output/model/"  # uncompressed (CompressionType NONE)
    assert state.artifacts == {"model": output, "adapter": f"{output}adapter/", "merged": f"{output}merged/"}
    assert json.loads(Path("runs/gpt-oss-20b-lora/training-job.json").read_text())["job"] == job.name
    assert TARGET.latest(config(aws_env)).name == job.name


def test_a_config_never_takes_the_job_of_a_config_whose_name_starts_with_its_own(aws_env):
    """Jobs are found by name (`<config name>-<time>`): the shipped gpt-oss-20b-lora must not deploy, register or
    wait on a job of a config named gpt-oss-20b-lora-1node; and a name the SDK cut at 63 characters still belongs
    to its config. (The emulator ignores ListTrainingJobs' sort order, so each case has one candidate per state.)"""
    from toolkit import sagemaker_sdk

    mine = TARGET.submit(config(aws_env))
    other = TARGET.submit(config(aws_env, "name=gpt-oss-20b-lora-1node"))
    assert other.name.startswith(f"{mine.name.rsplit('-', 1)[0]}-")  # what a prefix match would take
    backend_job(mine.name).training_job_status, backend_job(other.name).training_job_status = "InProgress", "Completed"
    assert TARGET.latest(config(aws_env)) is None and TARGET.running(config(aws_env)) == mine.name
    backend_job(mine.name).training_job_status, backend_job(other.name).training_job_status = "Completed", "InProgress"
    assert TARGET.running(config(aws_env)) is None and TARGET.latest(config(aws_env)).name == mine.name
    assert TARGET.running(config(aws_env, "name=gpt-oss-20b-lora-1node")) == other.name

    long_name = "a" * 55
    cut = sagemaker_sdk.unique_job_name(long_name)
    assert len(cut) == 63 and sagemaker_sdk.is_job_of(long_name, cut)
    assert not sagemaker_sdk.is_job_of("a" * 54, cut) and not sagemaker_sdk.is_job_of(long_name, cut[:-1] + "x")


def test_failed_job_reports_its_reason(aws_env):
    job = TARGET.submit(config(aws_env))
    backend = backend_job(job.name)
    backend.training_job_status = "Failed"
    backend.failure_reason = "AlgorithmError: CUDA out of memory"
    state = job.wait(poll_seconds=0.01)
    assert state.status is Status.FAILED and "CUDA out of memory" in state.detail
    result = CliRunner().invoke(app, ["jobs", "status", job.name, "-c", "gpt-oss-20b-lora", "--target", "training-job"])
    assert result.exit_code == 1 and "CUDA out of memory" in result.output


def test_stop_calls_stop_training_job(aws_env):
    job = TrainingJob("some-job", config(aws_env), boto3.Session())
    client = boto3.client("sagemaker")
    with Stubber(client) as stub:  # moto has no StopTrainingJob
        stub.add_response("stop_training_job", {}, {"TrainingJobName": "some-job"})
        job._sagemaker = lambda: client  # type: ignore[method-assign]
        job.stop()
        stub.assert_no_pending_responses()


def test_dry_run_is_offline_and_creates_nothing(aws_env, tmp_path):
    """No network (a loopback-only network namespace), no credentials, no AWS call: the request is rendered
    locally. The HF token's secret is only named; its value is never read."""
    import os
    import subprocess
    import sys

    Path(DATA).write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                   {"role": "assistant", "content": "ho"}]}) + "\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent", HOME=str(tmp_path))
    command = [sys.executable, "-m", "toolkit.cli", "train", "gpt-oss-20b-lora", "--target", "training-job",
               "--dry-run", "--set", f"aws.role={aws_env['role']}", "--set", f"aws.bucket={aws_env['bucket']}",
               "--set", f"data.source={DATA}", "--set", "training_job.hf_token_secret=hf-token"]  # fmt: skip
    isolated = ["unshare", "-n", "bash", "-c", 'ip link set lo up 2>/dev/null; exec "$@"', "offline", *command]
    result = subprocess.run(isolated, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    request = json.loads(result.stdout)
    assert_valid("sagemaker", "CreateTrainingJob", request)
    assert request["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge"
    assert request["Environment"] == {"TOOLKIT_HF_TOKEN_SECRET": "hf-token", "TOOLKIT_AWS_REGION": "us-east-1"}
    assert keys() == {}
    assert boto3.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []


def test_the_training_image_comes_from_the_sdks_catalogue_in_every_region():
    """Registry accounts differ by region (ap-northeast-3, cn-*, us-gov-*, ...): every region the SageMaker SDK's
    image catalogue lists for the pinned DLC gets that region's account and domain, none a guessed default."""
    from importlib import resources

    from toolkit.sagemaker_sdk import TRAINING_DLC, default_image

    catalogue = json.loads((resources.files("sagemaker.core") / "image_uri_config" / "pytorch.json").read_text())
    registries = catalogue["training"]["versions"][TRAINING_DLC["version"]]["registries"]
    assert len(registries) > 30 and registries["ap-northeast-3"] != registries["us-east-1"]
    for region, account in registries.items():
        image = default_image(region, "ml.p5.48xlarge")
        assert image.startswith(f"{account}.dkr.ecr.{region}."), (region, image)
        assert image.endswith(f"/pytorch-training:{TRAINING_DLC['version']}-gpu-{TRAINING_DLC['py_version']}")


@pytest.mark.parametrize(("instance_type", "volume_key"), [("ml.p5.48xlarge", False), ("ml.p3.16xlarge", True)])
def test_a_kms_key_encrypts_ebs_volumes_only_where_aws_allows_it(aws_env, instance_type, volume_key):
    """NVMe instance storage (p5, p4d, g5, g6e) takes no VolumeKmsKeyId (AWS refuses the job); the output keeps
    the key on every type."""
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    cfg = config(aws_env, f"training_job.instance_type={instance_type}", f"training_job.kms_key_id={key}")
    request = json.loads(TARGET.render(cfg))
    assert ("VolumeKmsKeyId" in request["ResourceConfig"]) is volume_key
    assert request["OutputDataConfig"]["KmsKeyId"] == key
    assert_valid("sagemaker", "CreateTrainingJob", request)


def test_the_hf_token_stays_in_secrets_manager(aws_env, monkeypatch):
    """The client names the secret and checks it exists (metadata only); the job reads the value itself."""
    import toolkit.aws

    token = "hf_" + "s" * 34
    boto3.client("secretsmanager").create_secret(Name="hf-token", SecretString=token)
    monkeypatch.setenv("HF_TOKEN", "hf_" + "e" * 34)  # the caller's own token is not forwarded either
    sent: dict = {}
    read_values: list[str] = []
    real_session = toolkit.aws.session

    def spying_session(settings):
        made = real_session(settings)
        made.events.register(
            "provide-client-params.sagemaker.CreateTrainingJob", lambda params, **_: sent.update(params)
        )
        made.events.register("before-call.secretsmanager.GetSecretValue", lambda **_: read_values.append("read"))
        return made

    monkeypatch.setattr(toolkit.aws, "session", spying_session)
    job = TARGET.submit(config(aws_env, "training_job.hf_token_secret=hf-token"))
    assert sent["Environment"] == {"TOOLKIT_HF_TOKEN_SECRET": "hf-token", "TOOLKIT_AWS_REGION": "us-east-1"}
    assert read_values == []  # the secret's name and region, not a token
    described = json.dumps(job.describe(), default=str)
    assert token not in json.dumps(sent) and token not in described and "hf_eeee" not in json.dumps(sent)
    missing = config(aws_env, "training_job.hf_token_secret=no-such-secret")
    with pytest.raises(TargetError, match="no secret named 'no-such-secret'"):
        TARGET.submit(missing)


def test_missing_role_or_credentials_fail_before_any_request(aws_env, monkeypatch):
    cfg = load_config("gpt-oss-20b-lora", [f"aws.bucket={aws_env['bucket']}"])
    with pytest.raises(AwsError, match=r"aws.role not set"):
        TARGET.submit(cfg)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # a laptop: no instance metadata service
    result = CliRunner().invoke(
        app, ["train", "gpt-oss-20b-lora", "--target", "training-job", "--set", f"aws.role={aws_env['role']}",
              "--set", f"aws.bucket={aws_env['bucket']}"],
    )  # fmt: skip
    assert result.exit_code == 2 and "no AWS credentials found" in result.output
    assert keys() == {}


def test_fsx_source_becomes_a_mounted_channel(aws_env):
    from toolkit.config import ConfigError

    with pytest.raises(ConfigError, match="set training_job.subnets"):
        config(aws_env, "target=training-job", "data.source=fsx://fs-0abc/fsx/datasets/chat")
    cfg = config(aws_env, "target=training-job", "data.source=fsx://fs-0abc/fsx/datasets/chat",
                 "training_job.subnets=[subnet-1]", "training_job.security_group_ids=[sg-1]",
                 f"training_job.image_uri={BUILT_IMAGE}")  # fmt: skip
    request = json.loads(TARGET.render(cfg))
    train = next(c for c in request["InputDataConfig"] if c["ChannelName"] == "train")
    assert train["DataSource"]["FileSystemDataSource"] == {
        "FileSystemId": "fs-0abc", "FileSystemAccessMode": "ro", "FileSystemType": "FSxLustre",
        "DirectoryPath": "/fsx/datasets/chat",
    }  # fmt: skip
    assert request["VpcConfig"] == {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]}


BUILT_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/toolkit-training:train-0123456789ab"
VPC = ["target=training-job", "training_job.subnets=[subnet-1]", "training_job.security_group_ids=[sg-1]"]


def installs_at_start(cfg) -> bool:
    trainer, _ = TARGET._trainer(cfg, dry_run=True, job_name="x")
    shutil.rmtree(trainer.source_code.source_dir, ignore_errors=True)
    return trainer.source_code.requirements is not None


def test_a_vpc_job_must_run_the_built_image_and_installs_nothing(aws_env):
    from toolkit.config import ConfigError

    with pytest.raises(ConfigError, match=r"training_job.subnets: a job in your VPC would pip-install .* set "
                       r"training_job.image_uri to the URI `toolkit image build training` prints"):  # fmt: skip
        config(aws_env, *VPC)
    with pytest.raises(ConfigError, match="training_job.subnets: a job in your VPC"):  # a DLC is no built image
        config(aws_env, *VPC, "training_job.image_uri=763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2")
    assert not installs_at_start(config(aws_env, *VPC, f"training_job.image_uri={BUILT_IMAGE}"))
    assert installs_at_start(config(aws_env, "target=training-job"))  # the DLC: the locked stack at start


def test_data_prepared_to_s3_becomes_the_jobs_train_channel(aws_env, tmp_path):
    from datasets import load_from_disk

    uri = f"s3://{aws_env['bucket']}/prepared/tiny/"
    prepared = CliRunner().invoke(app, ["data", "prepare", "tiny-gpt-oss-local", "--output", uri])
    assert prepared.exit_code == 0, prepared.output
    assert f"saved to {uri}" in prepared.output

    s3 = boto3.client("s3")
    names = [o["Key"] for o in s3.list_objects_v2(Bucket=aws_env["bucket"], Prefix="prepared/tiny/")["Contents"]]
    assert "prepared/tiny/state.json" in names
    for key in names:  # what the job's channel will hold: it loads back as the tokenized dataset
        target = tmp_path / "download" / key.removeprefix("prepared/tiny/")
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(aws_env["bucket"], key, str(target))
    assert set(load_from_disk(str(tmp_path / "download")).column_names) >= {"input_ids", "labels"}

    request = json.loads(TARGET.render(config(aws_env, f"data.source={uri}")))
    train = next(c for c in request["InputDataConfig"] if c["ChannelName"] == "train")
    assert train["DataSource"]["S3DataSource"]["S3Uri"] == uri


def test_a_second_submit_while_a_job_of_the_config_runs_refuses_unless_fresh(aws_env):
    cfg = config(aws_env)
    first = TARGET.submit(cfg)
    backend_job(first.name).training_job_status = "InProgress"
    with pytest.raises(TargetError, match=f"training job {first.name} of config .* is still running.*--fresh"):
        TARGET.submit(cfg)
    result = CliRunner().invoke(app, ["train", "gpt-oss-20b-lora", "--target", "training-job",
                                      *[a for o in cfg_overrides(aws_env) for a in ("--set", o)]])  # fmt: skip
    assert result.exit_code == 2 and "is still running" in result.output, result.output
    second = TARGET.submit(cfg, fresh=True)  # asked for explicitly: another job beside it
    assert second.name != first.name
    backend_job(first.name).training_job_status = "Completed"
    backend_job(second.name).training_job_status = "Completed"
    assert TARGET.submit(cfg).name not in (first.name, second.name)  # nothing runs: a new job as before


def cfg_overrides(aws_env) -> list[str]:
    return [f"aws.role={aws_env['role']}", f"aws.bucket={aws_env['bucket']}", f"data.source={DATA}",
            "data.format=messages"]  # fmt: skip


def test_a_jobs_model_is_fetched_whole_once_for_evaluation(aws_env):
    """`toolkit eval` on a training job's run: the target brings its model from S3 into runs/<name>/models/<job>/
    once; a download that died left only a partial directory, which neither counts nor stays."""
    from tests.toolkit.deploy.test_endpoint import completed_training_job

    cfg = config(aws_env)
    job = "gpt-oss-20b-lora-20261201120000"
    model_data = completed_training_job(aws_env, job)
    bucket, _, prefix = model_data[len("s3://") :].partition("/")
    s3 = boto3.client("s3")
    for key in ("run.json", "adapter/adapter_config.json", "merged/config.json"):
        s3.put_object(Bucket=bucket, Key=prefix + key, Body=b"{}")
    destination = Path("runs/gpt-oss-20b-lora/models") / job
    partial = destination.with_name(f".{job}.partial")
    (partial / "merged").mkdir(parents=True)
    (partial / "merged" / "stale.bin").write_text("from a download that died")

    newest = TARGET.latest(cfg)
    assert newest is not None and newest.name == job
    fetched = TARGET.fetch(cfg, newest)
    assert fetched == destination and not partial.exists()
    assert sorted(p.relative_to(fetched).as_posix() for p in fetched.rglob("*") if p.is_file()) == [
        "adapter/adapter_config.json", "merged/config.json", "run.json"]  # fmt: skip
    s3.delete_object(Bucket=bucket, Key=prefix + "run.json")  # a second fetch reads nothing from S3
    assert TARGET.fetch(cfg, newest) == destination and (destination / "run.json").is_file()
