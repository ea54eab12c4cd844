"""`toolkit register`: record a trained model in a SageMaker Model Package Group (the model catalogue).

One package per completed run, which the config's own target finds (`Target.run_to_register`: a training job by
its ARN, a HyperPod run by its model's S3 prefix): the serving image and model data (what `deploy` would serve),
the run, its data and final metrics as metadata, the eval report (`toolkit eval`'s report.json, uploaded once
under a digest name and referenced as ModelMetrics, its key numbers in CustomerMetadataProperties) and an approval
status from the config's gate (toolkit/evaluate/gate.py): passes -> Approved, fails -> Rejected, no report ->
PendingManualApproval; `approve=True` is the manual override. Re-running for the same run returns the existing
package and applies the new verdict and numbers to it (SageMaker cannot change a package's ModelMetrics: those
stay the first report's; `eval:report` names the latest) instead of registering it twice.
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
from toolkit.targets.base import RunToRegister, TargetError, get_target, reraised_as

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


class NothingToRegister(DeployInputError, TargetError):
    """No completed run to register, or its model cannot reach S3 from here: the registry's bad input (exit 2), and
    still the target's error (SDK callers catch either)."""


def _run_to_register(config: Config, job_name: str | None) -> RunToRegister:
    """The config's own target finds the run (a training job, a HyperPod run, ...); the registry names none."""
    with reraised_as(NothingToRegister):
        return get_target(config.target).run_to_register(config, job_name)


def _existing(sagemaker: Any, group: str, run: RunToRegister) -> dict | None:
    """The group's package of this run, found by the metadata entry that names the run alone."""
    key, value = run.identity
    pages = sagemaker.get_paginator("list_model_packages").paginate(ModelPackageGroupName=group)
    for page in pages:
        for summary in page["ModelPackageSummaryList"]:
            package = sagemaker.describe_model_package(ModelPackageName=summary["ModelPackageArn"])
            if package.get("CustomerMetadataProperties", {}).get(key) == value:
                return package
    return None


def _run_digest(s3: Any, model: str) -> str | None:
    """The digest of the run.json the run wrote next to its model (None for a model.tar.gz or none written)."""
    from botocore.exceptions import ClientError

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
    run = _run_to_register(config, job_name)
    path = Path(report_path) if report_path else eval_dir(config) / REPORT_FILE
    report = load_report(path, explicit=report_path is not None)
    if report is not None:  # checked before anything is written: a report of another model attaches to nothing
        aws.require(config.aws, "bucket")
        s3 = s3 or aws.client(config.aws, "s3")
        check_scored(report, path, run.name, _run_digest(s3, run.model))
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
        "training_job": run.name,
        run.identity[0]: run.identity[1],
        "base_model": config.model.id,
        "data_source": config.data.source,
        "lora": f"r={config.lora.r} alpha={config.lora.alpha}"
        + (f" expert_r={config.lora.expert_r}" if config.lora.expert_r else ""),
        "eval:gate": verdict.status if report is not None else "no report",
    }
    if attached:
        entries["eval:report"] = attached
        entries |= key_numbers(report or {}, config.registry.gate)
    entries |= {f"metric:{name}": f"{value:.6g}" for name, value in run.metrics.items()}
    metadata, left_out = customer_metadata(entries)
    package = _existing(sagemaker, group, run)
    if package is not None:
        arn = package["ModelPackageArn"]
        if report is None and not approve:  # nothing new to decide: the package keeps its status
            return Registration(arn, group, package["ModelApprovalStatus"], False, _version(arn),
                                "no eval report and no --approve: the package keeps its status")  # fmt: skip
        _decide(sagemaker, arn, verdict, metadata)
        return Registration(arn, group, verdict.status, False, _version(arn), verdict.reason, attached, left_out)
    created = sagemaker.create_model_package(
        ModelPackageGroupName=group,
        ModelPackageDescription=f"{config.model.id} + LoRA from {run.described_as}",
        InferenceSpecification={
            "Containers": [
                {
                    "Image": image_uri,
                    "Environment": environment,
                    **model_data_fields(run.model),
                }
            ],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json", "text/event-stream"],
            "SupportedRealtimeInferenceInstanceTypes": [config.serving.instance_type],
        },
        ModelApprovalStatus=verdict.status,
        CustomerMetadataProperties=metadata,
        MetadataProperties={"GeneratedBy": run.identity[1]},
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
