"""The SageMaker endpoint lifecycle: model -> endpoint config -> endpoint, updated blue/green with automatic rollback.

Model and endpoint-config names carry a hash of everything that defines a deployment: a re-run with the same
inputs changes nothing, a changed one creates new resources next to the serving ones. The old ones are deleted
only after the new config serves and passes `verify` (deploy's prompt-parity check); a failed update is rolled back
by SageMaker and reported, the old config serving. A deployment that serves but fails `verify` is undone: a new
endpoint deleted with its config and model, an update rolled back to the config that served before.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolkit import aws, digest
from toolkit.config import Config
from toolkit.deploy import DeployError, DeployInputError, Refused, vllm_environment
from toolkit.targets.base import TargetError

VARIANT = "AllTraffic"
BUSY = {"Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting"}
SCALING_DIMENSION = "sagemaker:variant:DesiredInstanceCount"


@dataclass
class Request:
    operation: str  # the boto3 method name
    params: dict[str, Any]
    service: str = "sagemaker"


@dataclass
class EndpointState:
    name: str
    status: str
    config_name: str = ""
    detail: str = ""
    actions: list[str] = field(default_factory=list)


def endpoint_name(config: Config) -> str:
    """serving.endpoint_name, else the config's own (merged weights) or, for an adapter, one endpoint per base
    model that every fine-tune of model.id at its model.revision shares: two revisions of one id are two bases (one
    endpoint each, its base component named after it), never one base that the last deploy's revision replaces
    under every adapter trained on the other. Without a revision the name is the id's alone."""
    if config.serving.endpoint_name:
        return config.serving.endpoint_name
    if config.serving.weights != "adapter":
        return config.name
    base = config.model.id.rstrip("/").rsplit("/", 1)[-1].split(":")[-1]
    revision = re.sub(r"[^a-zA-Z0-9]+", "-", config.model.revision or "").strip("-")[:12].strip("-")
    suffix = f"-{revision}-lora" if revision else "-lora"
    return re.sub(r"[^a-zA-Z0-9]+", "-", base).strip("-")[: 52 - len(suffix)].strip("-") + suffix


class Endpoints:
    """Endpoint operations for one config. Pass `sagemaker` (a boto3 client) to reuse or stub one."""

    def __init__(self, config: Config, sagemaker: Any = None, autoscaling: Any = None) -> None:
        self.config = config
        self.name = endpoint_name(config)
        self._sagemaker = sagemaker
        self._autoscaling = autoscaling
        self.model_package: str | None = None  # a registered version's ARN: the model is made from it (for_package)
        # an unapproved version's container environment: its model is made from its parts (for_package)
        self.package_environment: dict[str, str] | None = None

    @property
    def sagemaker(self) -> Any:
        if self._sagemaker is None:
            self._sagemaker = aws.client(self.config.aws, "sagemaker")
        return self._sagemaker

    @property
    def autoscaling(self) -> Any:
        if self._autoscaling is None:
            self._autoscaling = aws.client(self.config.aws, "application-autoscaling")
        return self._autoscaling

    # -- reading ------------------------------------------------------------------------------------------------

    def describe(self) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return self.sagemaker.describe_endpoint(EndpointName=self.name)
        except ClientError as exc:
            if aws.is_missing(exc):
                return None
            raise

    def _exists(self, operation: str, **params: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            getattr(self.sagemaker, operation)(**params)
            return True
        except ClientError as exc:
            if aws.is_missing(exc):
                return False
            raise

    def list_endpoints(self) -> list[dict]:
        pages = self.sagemaker.get_paginator("list_endpoints").paginate(SortBy="CreationTime", SortOrder="Descending")
        return [endpoint for page in pages for endpoint in page["Endpoints"]]

    # -- planning -----------------------------------------------------------------------------------------------

    def requests(self, image_uri: str, model_data: str) -> list[Request]:
        """Every request a deployment of this image and model makes, given what exists now (reads only)."""
        aws.require(self.config.aws, "role")
        model, endpoint_config = self._model_request(image_uri, model_data), self._config_request()
        suffix = _digest([model.params, endpoint_config.params])
        model.params["ModelName"] = f"{self.name}-{suffix}"
        endpoint_config.params["EndpointConfigName"] = f"{self.name}-{suffix}"
        endpoint_config.params["ProductionVariants"][0]["ModelName"] = model.params["ModelName"]
        planned = []
        if not self._exists("describe_model", ModelName=model.params["ModelName"]):
            planned.append(model)
        if not self._exists(
            "describe_endpoint_config", EndpointConfigName=endpoint_config.params["EndpointConfigName"]
        ):
            planned.append(endpoint_config)
        planned += self._endpoint_requests(endpoint_config.params["EndpointConfigName"])
        return planned

    def _model_request(self, image_uri: str, model_data: str) -> Request:
        environment = vllm_environment(self.config) if self.package_environment is None else self.package_environment
        container: dict[str, Any] = (
            {"ModelPackageName": self.model_package}  # the package's image, model data and environment, and lineage
            if self.model_package
            else {"Image": image_uri, "Environment": environment, **model_data_fields(model_data)}
        )
        return Request(
            "create_model",
            {"ExecutionRoleArn": self.config.aws.role, "PrimaryContainer": container, "Tags": self._tags()},
        )

    def _config_request(self) -> Request:
        serving = self.config.serving
        variant = production_variant(serving) | {
            "ContainerStartupHealthCheckTimeoutInSeconds": serving.startup_timeout_seconds,
            "ModelDataDownloadTimeoutInSeconds": serving.download_timeout_seconds,
        }
        return Request("create_endpoint_config", {"ProductionVariants": [variant], "Tags": self._tags()})

    def _endpoint_requests(self, config_name: str) -> list[Request]:
        current = self.describe()
        if current is None:
            return [Request("create_endpoint", {"EndpointName": self.name, "EndpointConfigName": config_name,
                                                "Tags": self._tags()})]  # fmt: skip
        status = current["EndpointStatus"]
        if status in BUSY:
            raise DeployError(
                f"endpoint {self.name} is {status}: wait until it settles (toolkit endpoint describe), then re-run"
            )
        if status == "Failed":  # it serves nothing: replace it
            return [
                Request("delete_endpoint", {"EndpointName": self.name}),
                Request("create_endpoint", {"EndpointName": self.name, "EndpointConfigName": config_name,
                                            "Tags": self._tags()}),
            ]  # fmt: skip
        if current["EndpointConfigName"] == config_name:
            return []
        return [Request("update_endpoint", {"EndpointName": self.name, "EndpointConfigName": config_name,
                                            "DeploymentConfig": self._deployment_config()})]  # fmt: skip

    def _deployment_config(self) -> dict[str, Any]:
        """Blue/green: the new fleet must pass health checks (and alarms) before traffic moves; else rollback."""
        serving = self.config.serving
        baking = 600 if serving.rollback_alarms else 0
        deployment: dict[str, Any] = {
            "BlueGreenUpdatePolicy": {
                "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": baking},
                "TerminationWaitInSeconds": 120,
                "MaximumExecutionTimeoutInSeconds": min(
                    14_400, serving.startup_timeout_seconds + serving.download_timeout_seconds + baking + 1200
                ),
            }
        }
        if serving.rollback_alarms:
            deployment["AutoRollbackConfiguration"] = {"Alarms": [{"AlarmName": a} for a in serving.rollback_alarms]}
        return deployment

    def _tags(self) -> list[dict[str, str]]:
        return [{"Key": "toolkit:config", "Value": self.config.name}]

    # -- applying -----------------------------------------------------------------------------------------------

    def deploy(
        self,
        image_uri: str,
        model_data: str,
        on_status: Callable[[str], None] | None = None,
        poll_seconds: float = 30,
        verify: Callable[[], None] | None = None,
    ) -> EndpointState:
        """Create or update the endpoint and wait until it serves. Safe to re-run.

        `verify` runs once it serves (before the replaced config is deleted); a `Refused` from it undoes the
        deployment (`undo`) and is raised again with what was undone."""
        report = on_status or (lambda _: None)
        planned = self.requests(image_uri, model_data)
        previous = self.describe()
        target_config = next(
            (r.params["EndpointConfigName"] for r in planned if r.operation in ("create_endpoint", "update_endpoint")),
            previous["EndpointConfigName"] if previous else "",
        )
        updating = any(r.operation == "update_endpoint" for r in planned)
        if updating:
            self._deregister_autoscaling()  # SageMaker refuses to update a variant that is a scalable target
        for request in planned:
            report(f"{request.operation} {request.params.get('EndpointName') or _resource_name(request)}")
            getattr(self.sagemaker, request.operation)(**request.params)
            if request.operation == "delete_endpoint":
                self._wait_deleted(poll_seconds)
        try:
            state = self._wait(target_config, report, poll_seconds)
        except DeployError:
            if updating:  # rolled back: the old config serves again, with the scaling it had
                self._restore_autoscaling(report)
            raise
        if planned:
            self._apply_autoscaling()
        state.actions = [r.operation for r in planned]
        if verify is not None:
            try:
                verify()
            except Refused as exc:
                undone = self.undo(planned, previous, report, poll_seconds)
                raise type(exc)(f"{exc}. {undone}") from None
        if updating and previous:
            self._delete_config_and_model(previous["EndpointConfigName"])
        self._remove_replaced(state.config_name, report)
        return state

    def undo(
        self, planned: list[Request], previous: dict | None, report: Callable[[str], None], poll_seconds: float
    ) -> str:
        """Put the endpoint back as it was before `planned` ran; says what was done."""
        operations = [r.operation for r in planned]
        if "update_endpoint" in operations and previous:
            old, new = previous["EndpointConfigName"], self.describe()
            report(f"update_endpoint {self.name} (back to {old})")
            self._deregister_autoscaling()
            self.sagemaker.update_endpoint(EndpointName=self.name, EndpointConfigName=old,
                                           DeploymentConfig=self._deployment_config())  # fmt: skip
            self._wait(old, report, poll_seconds)
            self._apply_autoscaling()
            if new is not None and new["EndpointConfigName"] != old:
                self._delete_config_and_model(new["EndpointConfigName"])
            return f"Rolled back: endpoint {self.name} serves {old} again"
        if "create_endpoint" in operations:
            report(f"delete_endpoint {self.name}")
            self.delete()
            self._wait_deleted(poll_seconds)
            return f"The new endpoint {self.name} was deleted, with its config and model"
        return f"Endpoint {self.name} already served this model and was left as it was: fix it, or delete it " \
               f"(toolkit endpoint delete)"  # fmt: skip

    def _wait(self, config_name: str, report: Callable[[str], None], poll_seconds: float) -> EndpointState:
        while True:
            current = self.describe()
            if current is None:
                raise DeployError(f"endpoint {self.name} disappeared while deploying")
            status = current["EndpointStatus"]
            report(f"{self.name}: {status}")
            if status not in BUSY:
                break
            time.sleep(poll_seconds)
        reason = current.get("FailureReason", "")
        serving = current["EndpointConfigName"]
        if status == "InService" and serving == config_name:
            return EndpointState(self.name, status, serving)
        if status == "InService":
            raise DeployError(
                f"the update to {config_name} failed and was rolled back: {reason or 'no reason given'}. "
                f"{self.name} still serves {serving}"
            )
        if status == "UpdateRollbackFailed":
            raise DeployError(f"the update of {self.name} failed and so did its rollback: {reason}")
        raise DeployError(f"endpoint {self.name} is {status}: {reason or 'no reason given'} (nothing was serving)")

    def _wait_deleted(self, poll_seconds: float) -> None:
        while self.describe() is not None:
            time.sleep(poll_seconds)

    def _remove_replaced(self, serving: str, report: Callable[[str], None]) -> None:
        """The toolkit's own configs and models of this endpoint (named `<endpoint>-<digest>`) that it no longer
        serves and that are older than what it serves: left by a deploy killed after its update (only the deploy
        that issues an update deletes what it replaced), removed by the next one that ends serving. Newer ones may
        be another deploy's in flight, and other names another tool's: never touched."""
        own = re.compile(rf"^{re.escape(self.name)}-[0-9a-f]{{{DIGEST_LENGTH}}}$")
        described = self.sagemaker.describe_endpoint_config(EndpointConfigName=serving)
        since = described["CreationTime"]
        kept_models = {v.get("ModelName", "") for v in described["ProductionVariants"]}
        for page in self.sagemaker.get_paginator("list_endpoint_configs").paginate(NameContains=self.name):
            for item in page["EndpointConfigs"]:
                name = item["EndpointConfigName"]
                if not own.match(name) or name == serving:
                    continue
                if item["CreationTime"] < since:
                    report(f"delete_endpoint_config {name} (replaced, no longer served)")
                    self._delete_config_and_model(name)
                else:
                    described = self.sagemaker.describe_endpoint_config(EndpointConfigName=name)
                    kept_models |= {v.get("ModelName", "") for v in described["ProductionVariants"]}
        for page in self.sagemaker.get_paginator("list_models").paginate(NameContains=self.name):
            for item in page["Models"]:
                name = item["ModelName"]
                if own.match(name) and name not in kept_models and item["CreationTime"] < since:
                    report(f"delete_model {name} (replaced, no longer served)")
                    self.sagemaker.delete_model(ModelName=name)

    def _delete_config_and_model(self, config_name: str) -> None:
        """Remove a replaced deployment's config and model (only the toolkit's own: named after the endpoint)."""
        if not config_name.startswith(f"{self.name}-"):
            return
        old = self.sagemaker.describe_endpoint_config(EndpointConfigName=config_name)
        self.sagemaker.delete_endpoint_config(EndpointConfigName=config_name)
        for variant in old["ProductionVariants"]:  # an endpoint for inference components names no model
            if variant.get("ModelName", "").startswith(f"{self.name}-"):
                self.sagemaker.delete_model(ModelName=variant["ModelName"])

    # -- autoscaling --------------------------------------------------------------------------------------------

    def _resource_id(self) -> str:
        return f"endpoint/{self.name}/variant/{VARIANT}"

    def autoscaling_requests(self) -> list[Request]:
        """What deploy applies once the endpoint serves (application-autoscaling), when serving.autoscaling is set."""
        scaling = self.config.serving.autoscaling
        if scaling is None:
            return []
        target = {"ServiceNamespace": "sagemaker", "ResourceId": self._resource_id(),
                  "ScalableDimension": SCALING_DIMENSION}  # fmt: skip
        policy = {
            "TargetValue": float(scaling.invocations_per_instance),
            "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
            "ScaleInCooldown": 300,
            "ScaleOutCooldown": 60,
        }
        return [
            Request("register_scalable_target",
                    {**target, "MinCapacity": scaling.min_instances, "MaxCapacity": scaling.max_instances},
                    "application-autoscaling"),
            Request("put_scaling_policy",
                    {"PolicyName": f"{self.name}-invocations", **target, "PolicyType": "TargetTrackingScaling",
                     "TargetTrackingScalingPolicyConfiguration": policy}, "application-autoscaling"),
        ]  # fmt: skip

    def _apply_autoscaling(self) -> None:
        for request in self.autoscaling_requests():
            getattr(self.autoscaling, request.operation)(**request.params)

    def _restore_autoscaling(self, report: Callable[[str], None]) -> None:
        from botocore.exceptions import ClientError

        try:
            self._apply_autoscaling()
        except ClientError as exc:  # never hide why the update failed
            report(f"could not restore autoscaling on {self.name}: {exc}; re-run deploy to apply it")

    def _deregister_autoscaling(self) -> None:
        targets = self.autoscaling.describe_scalable_targets(
            ServiceNamespace="sagemaker", ResourceIds=[self._resource_id()]
        )
        if targets["ScalableTargets"]:
            self.autoscaling.deregister_scalable_target(
                ServiceNamespace="sagemaker", ResourceId=self._resource_id(), ScalableDimension=SCALING_DIMENSION
            )

    # -- deleting -----------------------------------------------------------------------------------------------

    def delete(self) -> list[str]:
        """Delete the endpoint, its config and model; returns what was deleted (nothing if it does not exist)."""
        current = self.describe()
        if current is None:
            return []
        deleted = [f"endpoint {self.name}"]
        if self.config.serving.autoscaling:
            self._deregister_autoscaling()
        self.sagemaker.delete_endpoint(EndpointName=self.name)
        config_name = current["EndpointConfigName"]
        if config_name.startswith(f"{self.name}-") and self._exists(
            "describe_endpoint_config", EndpointConfigName=config_name
        ):
            self._delete_config_and_model(config_name)
            deleted.append(f"endpoint config and model {config_name}")
        return deleted


DIGEST_LENGTH = 10  # hex digits of the content digest in a model's and an endpoint config's name


def _digest(value: Any) -> str:
    return digest.of_value(value, DIGEST_LENGTH)


def _resource_name(request: Request) -> str:
    return next((v for k, v in request.params.items() if k.endswith("Name") and isinstance(v, str)), "")


def model_data_fields(model_data: str) -> dict[str, Any]:
    """A container's model data: an uncompressed S3 prefix (what training jobs write: nothing to unpack, and no
    download-timeout risk for a 40-240 GB merged model) or a model.tar.gz."""
    if model_data.endswith("/"):
        return {"ModelDataSource": {"S3DataSource": {"S3Uri": model_data, "S3DataType": "S3Prefix",
                                                     "CompressionType": "None"}}}  # fmt: skip
    return {"ModelDataUrl": model_data}


def production_variant(serving: Any) -> dict[str, Any]:
    """The endpoint config's one variant: its instances (type, count, routing, AMI, volume). A model's variant adds
    the container timeouts; inference components carry their own."""
    variant: dict[str, Any] = {
        "VariantName": VARIANT,
        "InstanceType": serving.instance_type,
        "InitialInstanceCount": serving.instance_count,
        "RoutingConfig": {"RoutingStrategy": serving.routing},
        "InferenceAmiVersion": serving.inference_ami_version,
    }
    if serving.volume_size_gb:
        variant["VolumeSizeInGB"] = serving.volume_size_gb
    return variant


class NothingToServe(DeployInputError, TargetError):
    """No completed run to serve: deploy's bad input, and still the target's error (SDK callers catch either)."""


def model_data(config: Config, explicit: str | None = None, dry_run: bool = False) -> str:
    """What to serve: an explicit S3 URI, serving.model_data, the HyperPod run's model (uploaded once) when the
    config trains on HyperPod, or the latest completed training job's model."""
    chosen = explicit or config.serving.model_data
    if chosen:
        if not chosen.startswith("s3://"):
            raise DeployInputError(f"model data {chosen!r} is not an s3:// URI (serving.model_data or --model-data)")
        return chosen
    from toolkit.targets.base import get_target, reraised_as

    with reraised_as(NothingToServe):
        return get_target(config.target).servable_model(config, dry_run)


class UnapprovedModel(DeployInputError):
    """A registered version that is not Approved, deployed without --allow-unapproved."""


@dataclass
class Package:
    """A registered model version as deploy serves it."""

    arn: str
    name: str  # group/version
    status: str  # ModelApprovalStatus
    image: str
    model_data: str
    note: str = ""  # said when an unapproved version is deployed on purpose
    environment: dict[str, str] = field(default_factory=dict)  # the package container's


def model_package(config: Config, ref: str, sagemaker: Any) -> Package:
    """A version of the config's Model Package Group (`toolkit register` writes them): its number or its ARN."""
    from botocore.exceptions import ClientError

    group = config.name
    arn = ref
    if ref.isdigit():
        pages = sagemaker.get_paginator("list_model_packages").paginate(ModelPackageGroupName=group)
        found = [s["ModelPackageArn"] for page in pages for s in page["ModelPackageSummaryList"]
                 if s.get("ModelPackageVersion") == int(ref)]  # fmt: skip
        if not found:
            raise DeployInputError(
                f"--model-package {ref}: model package group {group} has no version {ref}: register one with "
                f"toolkit register, or list them: aws sagemaker list-model-packages --model-package-group-name {group}"
            )
        arn = found[0]
    elif not ref.startswith("arn:"):
        raise DeployInputError(f"--model-package {ref!r}: give a version number of group {group} or a package's ARN")
    try:
        described = sagemaker.describe_model_package(ModelPackageName=arn)
    except ClientError as exc:
        if aws.is_missing(exc):
            raise DeployInputError(f"--model-package {ref}: no such model package") from None
        raise
    container = described.get("InferenceSpecification", {}).get("Containers", [{}])[0]
    source = container.get("ModelDataSource", {}).get("S3DataSource", {}).get("S3Uri")
    return Package(
        described["ModelPackageArn"],
        f"{described.get('ModelPackageGroupName', group)}/{described.get('ModelPackageVersion', '?')}",
        described.get("ModelApprovalStatus", "PendingManualApproval"),
        container.get("Image", ""),
        source or container.get("ModelDataUrl", ""),
        described.get("ApprovalDescription") or "",
        dict(container.get("Environment") or {}),
    )


def for_package(config: Config, ref: str, allow_unapproved: bool = False) -> tuple[Endpoints, Package]:
    """The config's endpoint serving a registered version; refused (`UnapprovedModel`, exit 2, nothing created)
    unless the version is Approved or `allow_unapproved` says otherwise explicitly."""
    if config.serving.weights == "adapter":
        raise DeployInputError(
            "--model-package serves the package's merged model on the config's own endpoint, but serving.weights is "
            "adapter (a shared base's component): set serving.weights: merged to deploy a registered version"
        )
    endpoints = Endpoints(config)
    package = model_package(config, ref, endpoints.sagemaker)
    if package.status != "Approved":
        why = f" ({package.note})" if package.note else ""
        if not allow_unapproved:
            raise UnapprovedModel(
                f"model package {package.name} is {package.status}{why}: only Approved versions are deployed; "
                "approve it (toolkit register --approve, or the Model Registry) or pass --allow-unapproved"
            )
        package.note = (
            f"deploying model package {package.name}, which is {package.status} (--allow-unapproved): the model is "
            "made from its image, model data and environment (SageMaker deploys a versioned package by name only "
            "once it is Approved)"
        )
        endpoints.package_environment = package.environment
    else:
        package.note = ""
        endpoints.model_package = package.arn
    return endpoints, package
