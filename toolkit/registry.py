"""`toolkit register`: record a trained model in a SageMaker Model Package Group (the model catalogue).

One package per training job: the serving image and model data (what `deploy` would serve), the job, its data
and final metrics as metadata, the eval report (`toolkit eval`'s report.json, uploaded once under a digest name and
referenced as ModelMetrics, its key numbers in CustomerMetadataProperties) and an approval status from the
config's gate (toolkit/evaluate/gate.py): passes -> Approved, fails -> Rejected, no report -> PendingManualApproval;
`approve=True` is the manual override. Re-running for the same job returns the existing package and applies the
new verdict and numbers to it (SageMaker cannot change a package's ModelMetrics: those stay the first report's;
`eval:report` names the latest) instead of registering it twice.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit_train.layout import RUN_RECORD

from toolkit import aws, digest
from toolkit.config import Config
from toolkit.deploy import DeployInputError, vllm_environment
from toolkit.deploy.endpoint import model_data_fields
from toolkit.evaluate import eval_dir
from toolkit.evaluate.gate import APPROVED, Verdict, check_scored, judge, key_numbers, load_report
from toolkit.evaluate.report import REPORT_FILE
from toolkit.limits import customer_metadata

APPROVAL_DESCRIPTION_CHARS = 1024  # UpdateModelPackage's ApprovalDescription (botocore's service model)


@dataclass
class Registration:
    arn: str
    group: str
    status: str  # ModelApprovalStatus
    created: bool
    version: int | None = None
    verdict: str = ""  # the gate's one line (and the override, when --approve decided)
    report: str | None = None  # the attached eval report (S3 URI)
    left_out: list[str] = field(default_factory=list)  # metadata keys past SageMaker's limits (toolkit.limits)


def _latest_job(config: Config, sagemaker: Any, job_name: str | None) -> dict:
    if job_name is None:
        from toolkit.targets.base import get_target

        latest = get_target("training-job").latest(config)  # a model package records its training job
        if latest is None:
            raise DeployInputError(
                f"no completed training job of {config.name} found: train with --target training-job first, "
                "or pass --job NAME"
            )
        job_name = latest.name
    job = sagemaker.describe_training_job(TrainingJobName=job_name)
    if job["TrainingJobStatus"] != "Completed":
        raise DeployInputError(
            f"training job {job_name} is {job['TrainingJobStatus']}: only completed jobs are registered"
        )
    return job


def _existing(sagemaker: Any, group: str, job_arn: str) -> dict | None:
    pages = sagemaker.get_paginator("list_model_packages").paginate(ModelPackageGroupName=group)
    for page in pages:
        for summary in page["ModelPackageSummaryList"]:
            package = sagemaker.describe_model_package(ModelPackageName=summary["ModelPackageArn"])
            if package.get("CustomerMetadataProperties", {}).get("training_job_arn") == job_arn:
                return package
    return None


def _run_digest(s3: Any, job: dict) -> str | None:
    """The digest of the run.json the job wrote next to its model (None for a model.tar.gz or none written)."""
    from botocore.exceptions import ClientError

    model = aws.model_artifacts(job).get("model", "")
    if not model.endswith("/"):
        return None  # inside a model.tar.gz: not read without downloading the whole model
    bucket, _, prefix = model[len("s3://") :].partition("/")
    with tempfile.TemporaryDirectory(prefix="toolkit-run-") as staging:
        target = Path(staging) / RUN_RECORD
        try:
            s3.download_file(bucket, f"{prefix}{RUN_RECORD}", str(target))
        except ClientError as exc:
            if aws.is_missing(exc):
                return None
            raise
        return digest.of_files(target)


def _attach(s3: Any, config: Config, report: Path) -> tuple[str, str]:
    """The report uploaded once under its content digest: (its S3 URI, its sha256 as ContentDigest states it)."""
    data = report.read_bytes()
    prefix = aws.upload_once(s3, config.aws, report, kind=f"eval/{config.name}", key=digest.of_bytes(data))
    return f"{prefix}{report.name}", f"sha256:{digest.of_bytes(data, 64)}"


def _version(arn: str) -> int | None:
    tail = arn.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else None


# API_ModelPackageContainerDefinition, Environment: "We support up to 16 entries in the map" (botocore's model says
# 100, which is CreateModel's limit; the package's is the documented one)
PACKAGE_ENVIRONMENT_ENTRIES = 16


def package_environment(config: Config) -> dict[str, str]:
    """The serving settings a model package carries; DeployInputError when they are more than a package holds."""
    environment = vllm_environment(config)
    if len(environment) > PACKAGE_ENVIRONMENT_ENTRIES:
        own = len(environment) - len(config.serving.vllm_args)
        raise DeployInputError(
            f"serving.vllm_args: a model package holds at most {PACKAGE_ENVIRONMENT_ENTRIES} environment entries "
            f"and this config's serving settings make {len(environment)} ({own} of the toolkit's, "
            f"{len(config.serving.vllm_args)} from serving.vllm_args): keep at most "
            f"{PACKAGE_ENVIRONMENT_ENTRIES - own} vllm_args to register it, or deploy without the registry"
        )
    return environment


def register(
    config: Config,
    image_uri: str,
    job_name: str | None = None,
    approve: bool = False,
    report_path: str | Path | None = None,
    sagemaker: Any = None,
    s3: Any = None,
) -> Registration:
    environment = package_environment(config)  # before any call: a package AWS would refuse is never begun
    sagemaker = sagemaker or aws.client(config.aws, "sagemaker")
    job = _latest_job(config, sagemaker, job_name)
    path = Path(report_path) if report_path else eval_dir(config) / REPORT_FILE
    report = load_report(path, explicit=report_path is not None)
    if report is not None:  # checked before anything is written: a report of another model attaches to nothing
        aws.require(config.aws, "bucket")
        s3 = s3 or aws.client(config.aws, "s3")
        check_scored(report, path, job["TrainingJobName"], _run_digest(s3, job))
    verdict = judge(config.registry.gate, report)
    if approve and verdict.status != APPROVED:
        verdict = Verdict(APPROVED, f"{verdict.reason}; Approved by --approve (manual override)")
    group = config.name
    existing_groups = sagemaker.list_model_package_groups(NameContains=group)["ModelPackageGroupSummaryList"]
    if not any(g["ModelPackageGroupName"] == group for g in existing_groups):
        sagemaker.create_model_package_group(
            ModelPackageGroupName=group,
            ModelPackageGroupDescription=f"LoRA fine-tunes of {config.model.id} ({config.name})",
            Tags=[{"Key": "toolkit:config", "Value": config.name}],
        )
    attached, content_digest = _attach(s3, config, path) if report is not None else (None, None)
    entries = {
        "training_job": job["TrainingJobName"],
        "training_job_arn": job["TrainingJobArn"],
        "base_model": config.model.id,
        "data_source": config.data.source,
        "lora": f"r={config.lora.r} alpha={config.lora.alpha}"
        + (f" expert_r={config.lora.expert_r}" if config.lora.expert_r else ""),
        "eval:gate": verdict.status if report is not None else "no report",
    }
    if attached:
        entries["eval:report"] = attached
        entries |= key_numbers(report or {}, config.registry.gate)
    entries |= {f"metric:{m['MetricName']}": f"{m['Value']:.6g}" for m in job.get("FinalMetricDataList", [])}
    metadata, left_out = customer_metadata(entries)
    package = _existing(sagemaker, group, job["TrainingJobArn"])
    if package is not None:
        arn = package["ModelPackageArn"]
        if report is None and not approve:  # nothing new to decide: the package keeps its status
            return Registration(arn, group, package["ModelApprovalStatus"], False, _version(arn),
                                "no eval report and no --approve: the package keeps its status")  # fmt: skip
        _decide(sagemaker, arn, verdict, metadata)
        return Registration(arn, group, verdict.status, False, _version(arn), verdict.reason, attached, left_out)
    created = sagemaker.create_model_package(
        ModelPackageGroupName=group,
        ModelPackageDescription=f"{config.model.id} + LoRA from training job {job['TrainingJobName']}",
        InferenceSpecification={
            "Containers": [
                {
                    "Image": image_uri,
                    "Environment": environment,
                    **model_data_fields(aws.model_artifacts(job)["model"]),
                }
            ],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json", "text/event-stream"],
            "SupportedRealtimeInferenceInstanceTypes": [config.serving.instance_type],
        },
        ModelApprovalStatus=verdict.status,
        CustomerMetadataProperties=metadata,
        MetadataProperties={"GeneratedBy": job["TrainingJobArn"]},
        **({"ModelMetrics": {"ModelQuality": {"Statistics": {
            "ContentType": "application/json", "S3Uri": attached, "ContentDigest": content_digest,
        }}}} if attached else {}),
    )  # fmt: skip
    arn = created["ModelPackageArn"]
    _decide(sagemaker, arn, verdict, metadata)  # CreateModelPackage takes no ApprovalDescription: the reason
    return Registration(arn, group, verdict.status, True, _version(arn), verdict.reason, attached, left_out)


def _decide(sagemaker: Any, arn: str, verdict: Verdict, metadata: dict[str, str]) -> None:
    sagemaker.update_model_package(
        ModelPackageArn=arn,
        ModelApprovalStatus=verdict.status,
        ApprovalDescription=verdict.reason[:APPROVAL_DESCRIPTION_CHARS],
        CustomerMetadataProperties=metadata,
    )
