"""`toolkit register`: record a trained model in a SageMaker Model Package Group (the model catalogue).

One package per training job: the serving image and model data (what `deploy` would serve), the job, its data
and final metrics as metadata, and an approval status. Re-running for the same job returns the existing package
(and applies a changed approval status) instead of registering it twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit import aws
from toolkit.config import Config
from toolkit.deploy import DeployInputError, vllm_environment
from toolkit.deploy.endpoint import model_data_fields

APPROVAL = {True: "Approved", False: "PendingManualApproval"}


@dataclass
class Registration:
    arn: str
    group: str
    status: str
    created: bool


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


def register(
    config: Config, image_uri: str, job_name: str | None = None, approve: bool = False, sagemaker: Any = None
) -> Registration:
    sagemaker = sagemaker or aws.client(config.aws, "sagemaker")
    job = _latest_job(config, sagemaker, job_name)
    group = config.name
    existing_groups = sagemaker.list_model_package_groups(NameContains=group)["ModelPackageGroupSummaryList"]
    if not any(g["ModelPackageGroupName"] == group for g in existing_groups):
        sagemaker.create_model_package_group(
            ModelPackageGroupName=group,
            ModelPackageGroupDescription=f"LoRA fine-tunes of {config.model.id} ({config.name})",
            Tags=[{"Key": "toolkit:config", "Value": config.name}],
        )
    status = APPROVAL[approve]
    package = _existing(sagemaker, group, job["TrainingJobArn"])
    if package is not None:
        if approve and package["ModelApprovalStatus"] != status:
            sagemaker.update_model_package(ModelPackageArn=package["ModelPackageArn"], ModelApprovalStatus=status)
            return Registration(package["ModelPackageArn"], group, status, created=False)
        return Registration(package["ModelPackageArn"], group, package["ModelApprovalStatus"], created=False)
    metadata = {
        "training_job": job["TrainingJobName"],
        "training_job_arn": job["TrainingJobArn"],
        "base_model": config.model.id,
        "data_source": config.data.source,
        "lora": f"r={config.lora.r} alpha={config.lora.alpha}",
    }
    metadata |= {f"metric:{m['MetricName']}": f"{m['Value']:.6g}" for m in job.get("FinalMetricDataList", [])}
    created = sagemaker.create_model_package(
        ModelPackageGroupName=group,
        ModelPackageDescription=f"{config.model.id} + LoRA from training job {job['TrainingJobName']}",
        InferenceSpecification={
            "Containers": [
                {
                    "Image": image_uri,
                    "Environment": vllm_environment(config),
                    **model_data_fields(aws.model_artifacts(job)["model"]),
                }
            ],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json", "text/event-stream"],
            "SupportedRealtimeInferenceInstanceTypes": [config.serving.instance_type],
        },
        ModelApprovalStatus=status,
        CustomerMetadataProperties=metadata,
        MetadataProperties={"GeneratedBy": job["TrainingJobArn"]},
    )
    return Registration(created["ModelPackageArn"], group, status, created=True)
