"""The one adapter over the SageMaker Python SDK's internals (pinned exactly in pyproject.toml: `sagemaker==`).

The training-job target builds its request with the SDK's `ModelTrainer` and needs a few things the SDK does not
offer publicly: the container command (to run PID 1 under the toolkit's signal relay), the job's name before the
request is built (so the checkpoint location carries it), the request itself (the offline dry run) and the name
of the job it submitted. Each private use is here and nowhere else, listed in PRIVATE_USES, which
tests/toolkit/test_sagemaker_sdk.py checks against the installed SDK (a release that moves one fails there, not
in a user's submit).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from toolkit.errors import BadInput

# (module, attribute) the toolkit reads or swaps; `ModelTrainer.<name>` are methods/attributes of the trainer
PRIVATE_USES = [
    ("sagemaker.train.model_trainer", "DEFAULT_CONTAINER_ENTRYPOINT"),
    ("sagemaker.train.model_trainer", "DEFAULT_CONTAINER_ARGUMENTS"),
    ("sagemaker.train.model_trainer", "_get_unique_name"),
    ("sagemaker.train.utils", "_get_unique_name"),
    ("sagemaker.train.constants", "SM_CODE_CONTAINER_PATH"),
    ("sagemaker.train.model_trainer", "ModelTrainer._create_training_job_args"),
    ("sagemaker.train.model_trainer", "ModelTrainer._latest_training_job"),
    ("sagemaker.core.helper.session_helper", "Session._default_bucket_name_override"),
]


class SdkInputError(BadInput):
    """The SDK has nothing for this input (e.g. no training image in the region)."""


def request_of(trainer: Any) -> dict:
    """The CreateTrainingJob request the trainer would send (boto3's shape)."""
    return trainer._create_training_job_args(boto3=True)


def submitted_job_name(trainer: Any) -> str:
    """The name of the job the trainer just created."""
    return trainer._latest_training_job.training_job_name


# The AWS PyTorch training DLC the job runs on (unless training_job.image_uri): the newest release in the
# SageMaker SDK's own image catalogue, looked up there for every region (registry accounts differ by region).
TRAINING_DLC = {"framework": "pytorch", "version": "2.10.0", "py_version": "py313"}


def default_image(region: str, instance_type: str) -> str:
    """The training DLC's URI in `region`, from the SageMaker SDK's image catalogue (offline, a file it ships)."""
    opt_out_of_telemetry()
    from sagemaker.core import image_uris

    try:
        return image_uris.retrieve(region=region, instance_type=instance_type, image_scope="training", **TRAINING_DLC)
    except ValueError as exc:
        raise SdkInputError(
            f"aws.region: no AWS PyTorch {TRAINING_DLC['version']} training image in {region} ({exc}); "
            "set training_job.image_uri to an image in your registry"
        ) from None


def opt_out_of_telemetry() -> None:
    """The SDK phones home to an S3 host unless told not to; say so before it is imported."""
    if "SAGEMAKER_USER_CONFIG_OVERRIDE" in os.environ:
        return
    path = Path(tempfile.gettempdir()) / "toolkit-sagemaker-config.yaml"
    path.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n")
    os.environ["SAGEMAKER_USER_CONFIG_OVERRIDE"] = str(path)


@contextlib.contextmanager
def signal_relay_as_pid1(relay: str):
    """The SDK's container command (`bash -c "... sm_train.sh"`), run under toolkit_train/pid1.py so that SIGTERM to
    PID 1 reaches torchrun and the ranks. The SDK takes the command from module constants, read when it builds the
    request; they are swapped only for that call."""
    from sagemaker.train import model_trainer
    from sagemaker.train.constants import SM_CODE_CONTAINER_PATH  # where the code channel is mounted

    entrypoint, arguments = model_trainer.DEFAULT_CONTAINER_ENTRYPOINT, model_trainer.DEFAULT_CONTAINER_ARGUMENTS
    model_trainer.DEFAULT_CONTAINER_ENTRYPOINT = ["python3"]
    model_trainer.DEFAULT_CONTAINER_ARGUMENTS = [f"{SM_CODE_CONTAINER_PATH}/{relay}", *entrypoint, *arguments]
    try:
        yield
    finally:
        model_trainer.DEFAULT_CONTAINER_ENTRYPOINT, model_trainer.DEFAULT_CONTAINER_ARGUMENTS = entrypoint, arguments


def unique_job_name(base: str) -> str:
    """The job's name, by the SDK's own rule (config name + timestamp), chosen before the request is built so
    that the checkpoint location can carry it."""
    from sagemaker.train.utils import _get_unique_name

    return _get_unique_name(base)


def job_name_stem(base: str) -> str:
    """What every job name of `base` starts with (the ListTrainingJobs NameContains filter)."""
    return base.replace("_", "-") + "-"


def is_job_of(base: str, job_name: str) -> bool:
    """Whether `job_name` has the shape `unique_job_name(base)` gives (the SDK's own rule: the stem, then a
    timestamp's digits, cut at its length limit), so that a config never takes another config's job whose name
    merely starts with its own (gpt-oss-120b-lora vs gpt-oss-120b-lora-1node-20261204120000)."""
    named = unique_job_name(base)
    fixed = min(len(job_name_stem(base)), len(named))
    digits = job_name[fixed:]
    return len(job_name) == len(named) and job_name[:fixed] == named[:fixed] and all(c.isdigit() for c in digits)


@contextlib.contextmanager
def job_named(name: str):
    """The SDK names the job while it builds the request (module function `_get_unique_name`): it takes `name`
    for that call only."""
    from sagemaker.train import model_trainer

    unique_name = model_trainer._get_unique_name
    model_trainer._get_unique_name = lambda base, max_length=63: name
    try:
        yield
    finally:
        model_trainer._get_unique_name = unique_name


def dry_run_session_class():
    from sagemaker.core.helper.session_helper import Session

    class DryRunSession(Session):
        """Answers uploads with the URI they would produce, without writing anything, and takes the configured
        bucket as it is (the real session checks, or creates, it in S3)."""

        def default_bucket(self):
            return self._default_bucket_name_override

        def upload_data(self, path, bucket=None, key_prefix="data", callback=None, extra_args=None):
            bucket = bucket or self.default_bucket()
            if os.path.isfile(path):
                return f"s3://{bucket}/{key_prefix}/{os.path.basename(path)}"
            return f"s3://{bucket}/{key_prefix}"

    return DryRunSession
