"""Training-job target: the entrypoint as a SageMaker training job, through the SageMaker Python SDK v3.

`ModelTrainer` builds and submits the job (torchrun with one process per GPU, managed spot, checkpoints
synced with S3); boto3 follows it (status, CloudWatch logs from every host, stop). Local data is uploaded
once per content hash; a dry run renders the exact CreateTrainingJob request and uploads nothing.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit_train.layout import DEFAULT_ML_ROOT, RunTree
from toolkit_train.run.metrics import FIELDS as METRIC_FIELDS
from toolkit_train.run.metrics import SAGEMAKER_METRIC, metric_regex
from toolkit_train.settings import AWS_REGION_ENV, HF_TOKEN_SECRET_ENV, to_hyperparameters

from toolkit import aws, digest, limits, sagemaker_sdk
from toolkit.config import Config
from toolkit.config.instances import INSTANCES, instance
from toolkit.config.members import CONFIG_TAG
from toolkit.config.targets import run_home
from toolkit.files import write_atomically
from toolkit.resources import ENTRY_SCRIPT, TRAINING_PACKAGE
from toolkit.targets.base import (
    Artifacts,
    Job,
    Run,
    RunToRegister,
    Size,
    Status,
    Target,
    TargetError,
    tail,
)
from toolkit.targets.jobtree import stage_code

# SageMaker's metrics, read from the entrypoint's `[metrics]` lines (toolkit_train/run/metrics.py: the one format)
METRIC_DEFINITIONS = {SAGEMAKER_METRIC.get(name, f"train:{name}"): metric_regex(name) for name in METRIC_FIELDS}
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
STATUS = {
    "InProgress": Status.RUNNING,
    "Completed": Status.COMPLETED,
    "Failed": Status.FAILED,
    "Stopping": Status.RUNNING,
    "Stopped": Status.STOPPED,
}
USER_VALIDATE_ROLE = os.environ.get("SAGEMAKER_VALIDATE_ROLE", "true")


def token_environment(config: Config, boto_session, dry_run: bool) -> dict[str, str]:
    """The job learns the Hugging Face token's *secret name*, never its value: the entrypoint reads the value in
    the container with the execution role (DescribeTrainingJob shows the environment to anyone who may describe
    the job). At submit time only the secret's existence is checked (DescribeSecret: metadata, not the value)."""
    secret = config.training_job.hf_token_secret
    if not secret:
        return {}
    if not dry_run:
        client = aws.client(config.aws, "secretsmanager", boto_session)
        try:
            client.describe_secret(SecretId=secret)
        except client.exceptions.ResourceNotFoundException:
            raise TargetError(
                f"training_job.hf_token_secret: no secret named {secret!r} in {config.aws.region}: create it with "
                f"`aws secretsmanager create-secret --name {secret} --secret-string <token>`"
            ) from None
    return {HF_TOKEN_SECRET_ENV: secret, AWS_REGION_ENV: config.aws.region}


@dataclass
class TrainingJob(Job):
    """A handle on a SageMaker training job (submitted now or earlier, from any machine)."""

    name: str
    config: Config
    boto_session: Any
    stops_on_interrupt = False  # Ctrl-C detaches; the job runs on
    _seen_status: tuple[str, str] = ("", "")
    _log_tokens: dict[str, str] = field(default_factory=dict)

    def _sagemaker(self):
        return aws.client(self.config.aws, "sagemaker", self.boto_session)

    def describe(self) -> dict:
        return self._sagemaker().describe_training_job(TrainingJobName=self.name)

    def status(self) -> Run:
        return _state(self.describe())

    def logs(self, follow: bool = False) -> Iterator[str]:
        """Events from every host's log stream, oldest first; with follow, until the job ends."""
        return tail(self._new_log_lines, lambda: self.status().status.finished, follow, poll=5)

    def _new_log_lines(self) -> Iterator[str]:
        logs = aws.client(self.config.aws, "logs", self.boto_session)
        try:
            streams = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{self.name}/")
        except logs.exceptions.ResourceNotFoundException:
            return
        for stream in streams.get("logStreams", []):
            name = stream["logStreamName"]
            kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": name, "startFromHead": True}
            if name in self._log_tokens:
                kwargs["nextToken"] = self._log_tokens[name]
            page = logs.get_log_events(**kwargs)
            self._log_tokens[name] = page["nextForwardToken"]
            host = name.split("/", 1)[-1]
            for event in page["events"]:
                message = event["message"]
                yield message if host.startswith("algo-1") else f"[{host}] {message}"

    def stop(self, now: bool = False) -> None:  # SageMaker has no immediate stop: it always gives 120 s
        self._sagemaker().stop_training_job(TrainingJobName=self.name)

    def wait(self, on_line: Callable[[str], None] | None = None, poll_seconds: float = 10) -> Run:
        emit = on_line or (lambda line: None)
        while True:
            description = self.describe()
            transition = (description["TrainingJobStatus"], description.get("SecondaryStatus", ""))
            if transition != self._seen_status:
                self._seen_status = transition
                emit(f"[toolkit] {self.name}: {transition[0]} / {transition[1]}")
            for line in self._new_log_lines():
                emit(line)
            state = _state(description)
            if state.status.finished:
                if state.status is Status.COMPLETED:
                    _record(self.config, state)
                return state
            time.sleep(poll_seconds)


def _jobs_of(config: Config, status: str) -> Iterator[str]:
    """This config's jobs in `status`, newest first, across every page (a name filter still lets through other
    configs whose names contain this one; sagemaker_sdk.is_job_of keeps only this config's own)."""
    pages = aws.client(config.aws, "sagemaker").get_paginator("list_training_jobs").paginate(
        NameContains=sagemaker_sdk.job_name_stem(config.name), StatusEquals=status, SortBy="CreationTime",
        SortOrder="Descending",
    )  # fmt: skip
    for page in pages:
        for summary in page["TrainingJobSummaries"]:
            if sagemaker_sdk.is_job_of(config.name, summary["TrainingJobName"]):
                yield summary["TrainingJobName"]


def _state(description: dict) -> Run:
    status = STATUS.get(description["TrainingJobStatus"], Status.PENDING)
    artifacts = Artifacts(**aws.model_artifacts(description))
    detail = description.get("FailureReason", "") or description.get("SecondaryStatus", "")
    metrics = {m["MetricName"]: m["Value"] for m in description.get("FinalMetricDataList", [])}
    return Run(description["TrainingJobName"], status, detail, artifacts, metrics)


def _record(config: Config, state: Run) -> None:
    """Remember the latest finished job locally too (deploy also finds it through the API)."""
    path = run_home(config.name) / "training-job.json"
    write_atomically(path, json.dumps({"job": state.name, "artifacts": dict(state.artifacts)}, indent=2))


class TrainingJobTarget(Target):
    name = "training-job"
    extras = ("aws",)

    def render(self, config: Config) -> str:
        """The CreateTrainingJob request, rendered offline: no AWS call, no credentials, nothing uploaded. Values
        fixed only at submit time (the job name's timestamp, the code and data upload prefixes) are marked."""
        request = self._request(config, dry_run=True)
        return json.dumps(request, indent=2, default=str)

    def submit(self, config: Config, fresh: bool = False) -> TrainingJob:
        """Every submission is a new job whose checkpoints live under its own name, so it always starts fresh; a
        spot interruption resumes within the job from those checkpoints. While a job of this config runs, a
        submission refuses (a re-run after a submit that went through would start a second one) unless `fresh`
        asks for another job explicitly."""
        running = None if fresh else self.running(config)
        if running:
            raise TargetError(
                f"training job {running} of config {config.name} is still running: follow it with `toolkit jobs "
                f"logs CONFIG {running} --follow`, stop it with `toolkit jobs stop CONFIG {running}`, or pass "
                "--fresh to start another job beside it"
            )
        job_name = sagemaker_sdk.unique_job_name(config.name)
        trainer, boto_session = self._trainer(config, dry_run=False, job_name=job_name)
        try:
            with (
                sagemaker_sdk.signal_relay_as_pid1(f"{TRAINING_PACKAGE.name}/pid1.py"),
                sagemaker_sdk.job_named(job_name),
            ):
                trainer.train(wait=False, logs=False)
        finally:
            shutil.rmtree(trainer.source_code.source_dir, ignore_errors=True)
        job_name = sagemaker_sdk.submitted_job_name(trainer)
        return TrainingJob(job_name, config, boto_session)

    def attach(self, config: Config, job_name: str) -> TrainingJob:
        from botocore.exceptions import ClientError

        job = TrainingJob(job_name, config, aws.session(config.aws))
        try:
            job.describe()
        except ClientError as exc:
            if aws.is_missing(exc):
                raise TargetError(
                    f"no such training job {job_name!r} in {config.aws.region}: list them with "
                    f"`toolkit jobs list -c {config.name}`"
                ) from None
            raise
        return job

    def list(self, config: Config, limit: int = 20) -> list[dict]:
        client = aws.client(config.aws, "sagemaker")
        jobs = client.list_training_jobs(SortBy="CreationTime", SortOrder="Descending", MaxResults=limit)
        return jobs["TrainingJobSummaries"]

    def running(self, config: Config) -> str | None:
        """The newest job of this config that is in progress (jobs are named `<config name>-<time>`)."""
        return next(_jobs_of(config, "InProgress"), None)

    def servable_model(self, config: Config, dry_run: bool = False) -> str:
        """The newest completed job's model prefix (already on S3: the job wrote it there)."""
        latest = self.latest(config)
        if latest is None:
            raise TargetError(
                f"no completed training job of {config.name} found: run `toolkit train {config.name} "
                "--target training-job` first, or set serving.model_data (or pass --model-data s3://...)"
            )
        return latest.artifacts["model"]

    def latest(self, config: Config) -> Run | None:
        """The newest completed job of this config: what `toolkit deploy` serves by default."""
        name = next(_jobs_of(config, "Completed"), None)
        if name is None:
            return None
        return _state(aws.client(config.aws, "sagemaker").describe_training_job(TrainingJobName=name))

    def run_to_register(self, config: Config, job_name: str | None = None) -> RunToRegister:
        """The named job, else the newest completed one: a model package records the training job (its ARN)."""
        if job_name is None:
            latest = self.latest(config)
            if latest is None:
                raise TargetError(
                    f"no completed training job of {config.name} found: train with --target training-job first, "
                    "or pass --job NAME"
                )
            job_name = latest.name
        job = aws.client(config.aws, "sagemaker").describe_training_job(TrainingJobName=job_name)
        if job["TrainingJobStatus"] != "Completed":
            raise TargetError(
                f"training job {job_name} is {job['TrainingJobStatus']}: only completed jobs are registered"
            )
        run = _state(job)
        return RunToRegister(job_name, run.artifacts["model"], ("training_job_arn", job["TrainingJobArn"]),
                             f"training job {job_name}", run.metrics)  # fmt: skip

    # What plan and preflight ask: any instance type at the configured count, on demand or managed spot.
    offers_spot = True

    def configured_size(self, config: Config) -> Size:
        return self._size(config, config.training_job.instance_type)

    def sizes(self, config: Config) -> builtins.list[Size]:  # `list` here is the class's own method
        return [self._size(config, name) for name in INSTANCES]

    @staticmethod
    def _size(config: Config, instance_type: str) -> Size:
        job = config.training_job
        usage = limits.SPOT_TRAINING_JOB if job.spot else limits.TRAINING_JOB
        return Size(instance_type, job.instance_count, INSTANCES[instance_type].gpus * job.instance_count, usage)

    def preflight(
        self, config: Config, on_note: Callable[[str], None] | None = None, online: bool = True
    ) -> str | None:
        """Every job launches its own instances: the account's quota for them, and their price."""
        size = self.configured_size(config)
        return limits.preflight(config.aws, size.instance_type, size.nodes, size.usage, on_note, online)

    def _request(self, config: Config, dry_run: bool) -> dict:  # dry_run: the offline rendering
        job_name = sagemaker_sdk.unique_job_name(config.name)
        trainer, _ = self._trainer(config, dry_run=dry_run, job_name=job_name)
        try:
            with (
                sagemaker_sdk.signal_relay_as_pid1(f"{TRAINING_PACKAGE.name}/pid1.py"),
                sagemaker_sdk.job_named(job_name),
            ):
                request = sagemaker_sdk.request_of(trainer)
        finally:
            shutil.rmtree(trainer.source_code.source_dir, ignore_errors=True)
        return request

    def _trainer(self, config: Config, dry_run: bool, job_name: str):
        aws.require(config.aws, "role", "bucket")
        boto_session = aws.offline_session(config.aws) if dry_run else aws.session(config.aws)
        sagemaker_sdk.opt_out_of_telemetry()
        # the SDK checks the role with IAM's SimulatePrincipalPolicy: not in an offline rendering, and not against an
        # emulator (which lacks it); otherwise as the user set it (default on)
        skip_check = dry_run or aws.endpoint_url(config.aws)
        os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false" if skip_check else USER_VALIDATE_ROLE
        from sagemaker.core.helper.session_helper import Session
        from sagemaker.core.shapes import MetricDefinition, StoppingCondition, Tag
        from sagemaker.core.training.configs import (
            CheckpointConfig,
            Compute,
            InputData,
            Networking,
            OutputDataConfig,
            SourceCode,
        )
        from sagemaker.train.distributed import Torchrun
        from sagemaker.train.model_trainer import ModelTrainer

        job = config.training_job
        session_class = sagemaker_sdk.dry_run_session_class() if dry_run else Session
        session = session_class(
            boto_session=boto_session,
            sagemaker_client=aws.client(config.aws, "sagemaker", boto_session),
            default_bucket=config.aws.bucket,
            default_bucket_prefix=config.aws.prefix,
        )
        if not dry_run:  # the SDK would create a missing bucket on its own: the toolkit's bucket must exist
            aws.require_bucket(config.aws, boto_session)
        environment = token_environment(config, boto_session, dry_run)  # before any upload: fails early
        channels = self._channels(config, boto_session, dry_run)
        trainer = ModelTrainer(
            sagemaker_session=session,
            role=config.aws.role,
            base_job_name=config.name,
            training_image=job.image_uri or sagemaker_sdk.default_image(config.aws.region, job.instance_type),
            source_code=SourceCode(
                source_dir=str(stage_code(Path(tempfile.mkdtemp(prefix="toolkit-code-")), config)),
                entry_script=ENTRY_SCRIPT,
                # the built training image holds the locked stack: nothing to install (nor any network at start)
                requirements=None if config.runs_the_built_training_image() else "requirements.txt",
            ),
            distributed=Torchrun(process_count_per_node=instance(job.instance_type, "training_job.instance_type").gpus),
            compute=Compute(
                instance_type=job.instance_type,
                instance_count=job.instance_count,
                volume_size_in_gb=job.volume_size_gb,
                # NVMe instance storage is encrypted by the hardware; SageMaker refuses a volume key there
                volume_kms_key_id=None if instance(job.instance_type, "").local_nvme else job.kms_key_id,
                enable_managed_spot_training=job.spot,
            ),
            stopping_condition=StoppingCondition(
                max_runtime_in_seconds=job.max_run_seconds, max_wait_time_in_seconds=job.max_wait_seconds
            ),
            networking=Networking(subnets=job.subnets, security_group_ids=job.security_group_ids)
            if job.subnets
            else None,
            # uncompressed: a merged gpt-oss is 40-240 GB; gzip at the end of training and gunzip at endpoint start
            # would cost long minutes to hours and risk the endpoint's download timeout
            output_data_config=OutputDataConfig(
                s3_output_path=f"s3://{config.aws.bucket}/{config.aws.prefix}/output",
                kms_key_id=job.kms_key_id,
                compression_type="NONE",
            ),
            # under the prefix the stack's lifecycle rule expires (the SDK's default puts the config name first)
            checkpoint_config=CheckpointConfig(
                local_path=str(RunTree(DEFAULT_ML_ROOT).checkpoints),
                s3_uri=f"s3://{config.aws.bucket}/{aws.checkpoint_prefix(config.aws.prefix, config.name, job_name)}",
            ),
            input_data_config=[InputData(channel_name=name, data_source=uri) for name, uri in channels.items()],
            hyperparameters=to_hyperparameters(config.train_settings()),
            environment=environment,
            tags=[Tag(key=k, value=v) for k, v in {**job.tags, CONFIG_TAG: config.name}.items()],
        )
        trainer.with_metric_definitions([MetricDefinition(name=k, regex=v) for k, v in METRIC_DEFINITIONS.items()])
        return trainer, boto_session

    @staticmethod
    def _channels(config: Config, boto_session, dry_run: bool) -> dict[str, Any]:
        channels = {}  # 'train', and 'eval' for data.eval.source
        for name, source in config.data.channels().items():
            channel = TrainingJobTarget._channel(config, source, boto_session, dry_run)
            if channel is not None:
                channels[name] = channel
        return channels

    @staticmethod
    def _channel(config: Config, source: str, boto_session, dry_run: bool) -> Any:
        if source.startswith("s3://"):
            return source
        if source.startswith("fsx://"):  # fsx://<file system id>/<mount name>/<path>: mounted, not copied
            from sagemaker.core.shapes import FileSystemDataSource

            system, _, directory = source[len("fsx://") :].partition("/")
            return FileSystemDataSource(
                file_system_id=system,
                file_system_type="FSxLustre",
                file_system_access_mode="ro",
                directory_path=f"/{directory}",
            )
        path = Path(source)
        if source.startswith("builtin:") or not path.exists():
            return None  # builtin sample or hub dataset: the entrypoint loads it by name
        if dry_run:
            return f"s3://{config.aws.bucket}/{config.aws.prefix}/data/{digest.of_files(path)}/"
        return aws.upload_once(aws.client(config.aws, "s3", boto_session), config.aws, path)


TARGET = TrainingJobTarget()
