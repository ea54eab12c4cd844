"""LoRA adapters on SageMaker (`serving.weights: adapter`): inference components on one endpoint per base model.

    endpoint <model>-lora (instances, no model of its own; blue/green when its config changes)
    └── base inference component <endpoint>-base: model.id served by vLLM with LoRA enabled
        ├── adapter inference component <config name>  (ArtifactUrl: the fine-tune's adapter.tar.gz)
        └── adapter inference component <another config of the same base>

A second fine-tune of the same base adds only its adapter component. SageMaker registers each adapter with the
base's container (vLLM's `POST /adapters`, on with VLLM_ALLOW_RUNTIME_LORA_UPDATING) and routes a request
that names the adapter component (InvokeEndpoint's InferenceComponentName) to the base with the adapter's name in
the X-Amzn-SageMaker-Adapter-Identifier header, which vLLM turns into the request's model.
A changed base (image, vLLM settings, a larger LoRA rank) is a rolling update of the base component, rolled back
by SageMaker when the new copies fail (or an alarm of serving.rollback_alarms fires); a changed adapter is
replaced (deleted, then created: that adapter is unavailable for the minutes in between).
ArtifactUrl must be one gzip-compressed tar archive (the API reference of InferenceComponentContainerSpecification):
the adapter directory of the training output is packed once into `{prefix}/adapters/<config>/<key>/adapter.tar.gz`.
"""

from __future__ import annotations

import math
import tarfile
import tempfile
import time
from collections.abc import Callable
from typing import Any

from toolkit_train.layout import DEFAULT_ML_ROOT, RunTree
from toolkit_train.settings import HF_TOKEN_SECRET_ENV

from toolkit import aws, digest
from toolkit.config import Config
from toolkit.config.names import sagemaker_name_problem
from toolkit.deploy import DeployError, DeployInputError, Refused, vllm_environment
from toolkit.deploy.endpoint import (
    VARIANT,
    Endpoints,
    EndpointState,
    Request,
    _digest,
    endpoint_name,
    production_variant,
)

COMPONENT_BUSY = {"Creating", "Updating", "Deleting"}
ARCHIVE = "adapter.tar.gz"
MULTIPART_BYTES = 64 * 1024 * 1024  # the archive's upload goes in parts of this size above it (S3: 5 MiB-5 GiB each)


def base_component_name(endpoint: str) -> str:
    return f"{endpoint}-base"


def adapter_component_name(config: Config) -> str:
    """The name requests pick the adapter by (InvokeEndpoint's InferenceComponentName): the config's name."""
    return config.name


class AdapterEndpoints(Endpoints):
    """The endpoint, base component and this config's adapter component."""

    def __init__(self, config: Config, sagemaker: Any = None, autoscaling: Any = None, s3: Any = None) -> None:
        super().__init__(config, sagemaker, autoscaling)
        self.name = endpoint_name(config)
        self.base = base_component_name(self.name)
        self.adapter = adapter_component_name(config)
        self._s3 = s3

    @property
    def s3(self) -> Any:
        if self._s3 is None:
            self._s3 = aws.client(self.config.aws, "s3")
        return self._s3

    # -- reading ------------------------------------------------------------------------------------------------

    def component(self, name: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return self.sagemaker.describe_inference_component(InferenceComponentName=name)
        except ClientError as exc:
            if aws.is_missing(exc):
                return None
            raise

    def components(self) -> list[dict]:
        """The endpoint's inference components: name, status, base (adapters), model (the base), artifact."""
        pages = self.sagemaker.get_paginator("list_inference_components").paginate(EndpointNameEquals=self.name)
        found = []
        for page in pages:
            for summary in page["InferenceComponents"]:
                described = self.component(summary["InferenceComponentName"]) or {}
                spec = described.get("Specification", {})
                found.append({
                    "name": summary["InferenceComponentName"],
                    "status": summary.get("InferenceComponentStatus", described.get("InferenceComponentStatus")),
                    "base": spec.get("BaseInferenceComponentName", ""),
                    "model": spec.get("ModelName", ""),
                    "artifact": spec.get("Container", {}).get("ArtifactUrl", ""),
                })  # fmt: skip
        return found

    def _base_rank(self, current_base: dict | None) -> int:
        """The rank the base serves up to: this adapter's, or more when an adapter already there needs more."""
        rank = self.config.lora.max_rank
        model = (current_base or {}).get("Specification", {}).get("ModelName")
        if model and self._exists("describe_model", ModelName=model):
            env = self.sagemaker.describe_model(ModelName=model)["PrimaryContainer"].get("Environment", {})
            rank = max(rank, int(env.get("TOOLKIT_LORA_RANK", 0)))
        return rank

    # -- planning -----------------------------------------------------------------------------------------------

    def _tags(self) -> list[dict[str, str]]:
        """The endpoint, its config and the base are shared by the configs of one base: tagged with the endpoint,
        not a config (a config's tag would make every fine-tune's deploy a different endpoint config)."""
        return [{"Key": "toolkit:endpoint", "Value": self.name}]

    def _check(self) -> None:
        for kind, name in (("endpoint", self.name), ("inference component", self.base),
                           ("inference component", self.adapter)):  # fmt: skip
            problem = sagemaker_name_problem(name, kind)
            if problem:
                raise DeployInputError(f"{kind} name {problem}: set serving.endpoint_name or rename the config")
        if self.config.serving.autoscaling:
            raise DeployInputError(
                "serving.autoscaling is not built for adapters (inference components scale their copy count, not "
                "the variant): remove serving.autoscaling, or serve the merged model (serving.weights: merged)"
            )
        if self.adapter == self.base:
            raise DeployInputError(f"the config is named like the base component {self.base}: rename the config")

    def requests(self, image_uri: str, model_data: str) -> list[Request]:
        self._check()
        aws.require(self.config.aws, "role")
        artifact, package = self._artifact(model_data)
        current_base = self.component(self.base)
        model = self._base_model_request(image_uri, self._base_rank(current_base))
        endpoint_config = self._config_request()
        model.params["ModelName"] = f"{self.name}-{_digest([model.params])}"
        endpoint_config.params["EndpointConfigName"] = f"{self.name}-{_digest([endpoint_config.params])}"
        planned = []
        if not self._exists("describe_model", ModelName=model.params["ModelName"]):
            planned.append(model)
        config_name = endpoint_config.params["EndpointConfigName"]
        if not self._exists("describe_endpoint_config", EndpointConfigName=config_name):
            planned.append(endpoint_config)
        planned += self._endpoint_requests(config_name)
        planned += self._base_requests(current_base, model.params["ModelName"])
        if package is not None:
            planned.append(package)
        planned += self._adapter_requests(artifact)
        return planned

    def _artifact(self, model_data: str) -> tuple[str, Request | None]:
        """The adapter's archive (ArtifactUrl) and the upload that packs it, unless model_data is one already."""
        if model_data.endswith(".tar.gz"):
            return model_data, None
        if "#" in model_data or not model_data.endswith("/"):
            raise DeployInputError(
                f"model data {model_data} is not an S3 prefix holding the adapter: serving.weights: adapter serves "
                "the adapter/ of an uncompressed training output (the toolkit's jobs write one), or an "
                "adapter.tar.gz given as serving.model_data / --model-data"
            )
        aws.require(self.config.aws, "bucket")
        assert self.config.aws.bucket is not None  # required just above
        source = model_data if model_data.rstrip("/").endswith("/adapter") else f"{model_data}adapter/"
        key = f"{self.config.aws.prefix}/adapters/{self.config.name}/{digest.of_bytes(source.encode())}"
        url = f"s3://{self.config.aws.bucket}/{key}/{ARCHIVE}"
        if self._archived(self.config.aws.bucket, f"{key}/{ARCHIVE}"):
            return url, None
        return url, Request("put_object", {"Bucket": self.config.aws.bucket, "Key": f"{key}/{ARCHIVE}",
                                           "Metadata": {"source": source}}, "s3")  # fmt: skip

    def _archived(self, bucket: str, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.s3.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if aws.is_missing(exc):
                return False
            raise

    def _base_model_request(self, image_uri: str, rank: int) -> Request:
        env = vllm_environment(self.config)
        env.pop("SM_VLLM_ADAPTER_NAME", None)  # adapters come at run time, each named after its component
        env |= {"SM_VLLM_SERVED_MODEL_NAME": self.base, "TOOLKIT_LORA_RANK": str(rank),
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}  # fmt: skip
        container: dict[str, Any] = {"Image": image_uri, "Environment": env}
        copy = self.config.serving.base_model_data
        if copy:  # the base from the user's S3 copy, where SageMaker puts model data: no hub, no token, no revision
            container["ModelDataSource"] = {"S3DataSource": {"S3Uri": copy, "S3DataType": "S3Prefix",
                                                             "CompressionType": "None"}}  # fmt: skip
            env["SM_VLLM_BASE_MODEL"] = str(RunTree(DEFAULT_ML_ROOT).model)  # SageMaker's model dir: /opt/ml/model
            for hub_only in ("SM_VLLM_REVISION", HF_TOKEN_SECRET_ENV):
                env.pop(hub_only, None)
        return Request("create_model", {"ExecutionRoleArn": self.config.aws.role, "PrimaryContainer": container,
                                        "Tags": self._tags()})  # fmt: skip

    def _config_request(self) -> Request:
        """Instances for inference components: no model in the variant; the timeouts go to the base component."""
        variant = production_variant(self.config.serving)
        return Request("create_endpoint_config", {"ExecutionRoleArn": self.config.aws.role,
                                                  "ProductionVariants": [variant], "Tags": self._tags()})  # fmt: skip

    def _base_specification(self, model_name: str) -> dict[str, Any]:
        serving = self.config.serving
        return {
            "ModelName": model_name,
            "StartupParameters": {
                "ModelDataDownloadTimeoutInSeconds": serving.download_timeout_seconds,
                "ContainerStartupHealthCheckTimeoutInSeconds": serving.startup_timeout_seconds,
            },
            "ComputeResourceRequirements": {
                "NumberOfAcceleratorDevicesRequired": float(serving.tensor_parallel_size or 1),
                "MinMemoryRequiredInMb": serving.component_memory_mb,
            },
        }

    def _base_requests(self, current: dict | None, model_name: str) -> list[Request]:
        runtime = {"CopyCount": self.config.serving.instance_count}
        if current is None:
            return [Request("create_inference_component", {
                "InferenceComponentName": self.base, "EndpointName": self.name, "VariantName": VARIANT,
                "Specification": self._base_specification(model_name), "RuntimeConfig": runtime,
                "Tags": self._tags()})]  # fmt: skip
        status = current["InferenceComponentStatus"]
        if status in COMPONENT_BUSY:
            raise DeployError(f"inference component {self.base} is {status}: wait until it settles, then re-run")
        if current.get("Specification", {}).get("ModelName") == model_name and status == "InService":
            return []
        serving = self.config.serving
        full = no_room_for_new_copies(serving.instance_type, serving.instance_count, serving.instance_count,
                                      serving.tensor_parallel_size or 1)  # fmt: skip
        if full:
            raise DeployInputError(
                f"serving: the base component {self.base} changes (a new image, base model or serving setting), and "
                f"SageMaker replaces it by starting new copies beside the old ones: {full}. Set "
                "serving.tensor_parallel_size to at most half the instance's GPUs (room beside each copy), or delete "
                f"the endpoint's adapters (`toolkit endpoint delete` per config) and deploy again (a pause in serving)"
            )
        return [Request("update_inference_component", {
            "InferenceComponentName": self.base, "Specification": self._base_specification(model_name),
            "RuntimeConfig": runtime, "DeploymentConfig": self._rolling_update()})]  # fmt: skip

    def _rolling_update(self) -> dict[str, Any]:
        """The base's copies are replaced in the smallest batches AWS allows; SageMaker rolls back when new copies fail
        (or alarms fire)."""
        serving = self.config.serving
        baking = 600 if serving.rollback_alarms else 0
        deployment: dict[str, Any] = {
            "RollingUpdatePolicy": {
                "MaximumBatchSize": rolling_batch(serving.instance_count),
                "WaitIntervalInSeconds": baking,
                "MaximumExecutionTimeoutInSeconds": min(28_800, max(600, serving.instance_count * (
                    serving.startup_timeout_seconds + serving.download_timeout_seconds + baking))),
            }
        }  # fmt: skip
        if serving.rollback_alarms:
            deployment["AutoRollbackConfiguration"] = {"Alarms": [{"AlarmName": a} for a in serving.rollback_alarms]}
        return deployment

    def _adapter_requests(self, artifact: str) -> list[Request]:
        create = Request("create_inference_component", {
            "InferenceComponentName": self.adapter, "EndpointName": self.name,
            "Specification": {"BaseInferenceComponentName": self.base, "Container": {"ArtifactUrl": artifact}},
            "Tags": super()._tags()})  # fmt: skip
        current = self.component(self.adapter)
        if current is None:
            return [create]
        if current["InferenceComponentStatus"] in COMPONENT_BUSY:
            raise DeployError(
                f"inference component {self.adapter} is {current['InferenceComponentStatus']}: wait, then re-run"
            )
        spec = current.get("Specification", {})
        same = spec.get("BaseInferenceComponentName") == self.base and spec.get("Container", {}).get(
            "ArtifactUrl") == artifact  # fmt: skip
        if same and current["InferenceComponentStatus"] == "InService":
            return []
        return [Request("delete_inference_component", {"InferenceComponentName": self.adapter}), create]

    # -- applying -----------------------------------------------------------------------------------------------

    def deploy(
        self,
        image_uri: str,
        model_data: str,
        on_status: Callable[[str], None] | None = None,
        poll_seconds: float = 30,
        verify: Callable[[], None] | None = None,
    ) -> EndpointState:
        """`verify` runs once the adapter serves; a `Refused` from it leaves the components as they are (other
        fine-tunes share the base) and says how to remove this one."""
        report = on_status or (lambda _: None)
        planned = self.requests(image_uri, model_data)
        previous = self.describe()
        previous_base = (self.component(self.base) or {}).get("Specification", {}).get("ModelName", "")
        config_name = previous["EndpointConfigName"] if previous else ""
        for request in planned:
            report(f"{request.operation} {_target(request)}")
            if request.service == "s3":
                self._pack(request.params["Metadata"]["source"], request.params["Bucket"], request.params["Key"])
                continue
            getattr(self.sagemaker, request.operation)(**request.params)
            if request.operation == "delete_endpoint":
                self._wait_deleted(poll_seconds)
            elif request.operation in ("create_endpoint", "update_endpoint"):
                config_name = request.params["EndpointConfigName"]
                self._wait(config_name, report, poll_seconds)
            elif request.operation in ("create_inference_component", "update_inference_component"):
                self._wait_component(request, report, poll_seconds)
            elif request.operation == "delete_inference_component":
                self._wait_component_deleted(request.params["InferenceComponentName"], poll_seconds)
        operations = [r.operation for r in planned]
        if "update_endpoint" in operations and previous:
            self._delete_config_and_model(previous["EndpointConfigName"])
        if any(r.operation == "update_inference_component" for r in planned) and previous_base.startswith(
            f"{self.name}-"
        ):
            self.sagemaker.delete_model(ModelName=previous_base)
        if verify is not None:
            try:
                verify()
            except Refused as exc:
                raise type(exc)(f"{exc}. The adapter component {self.adapter} was left serving: remove it with "
                                f"`toolkit endpoint delete` (the base and other adapters stay)") from None  # fmt: skip
        return EndpointState(self.name, "InService", config_name, f"adapter {self.adapter} on {self.base}", operations)

    def _pack(self, source: str, bucket: str, key: str) -> None:
        """The adapter directory under `source` (s3://...) as one tar.gz, its files at the archive's root."""
        source_bucket, _, prefix = source[len("s3://") :].partition("/")
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=source_bucket, Prefix=prefix)
        sizes = {item["Key"]: item["Size"] for page in pages for item in page.get("Contents", [])}
        if not any(k.endswith("/adapter_config.json") or k == f"{prefix}adapter_config.json" for k in sizes):
            raise DeployInputError(
                f"no adapter_config.json under {source}: the training output holds no adapter (was it trained "
                "with LoRA?); pass --model-data with the adapter's S3 prefix"
            )
        from boto3.s3.transfer import TransferConfig

        # each file streamed into an archive on disk, which goes up in parts: a 120b expert adapter's archive passes
        # one PutObject's 5 GB and would not fit in memory either
        with tempfile.TemporaryFile() as spooled:
            with tarfile.open(fileobj=spooled, mode="w:gz") as archive:
                for object_key, size in sizes.items():
                    info = tarfile.TarInfo(object_key[len(prefix) :])
                    info.size = size
                    archive.addfile(info, self.s3.get_object(Bucket=source_bucket, Key=object_key)["Body"])
            spooled.seek(0)
            parts = TransferConfig(multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES)
            self.s3.upload_fileobj(spooled, bucket, key, ExtraArgs={"Metadata": {"source": source}}, Config=parts)

    def _wait_component(self, request: Request, report: Callable[[str], None], poll_seconds: float) -> None:
        name = request.params["InferenceComponentName"]
        while True:
            current = self.component(name)
            if current is None:
                raise DeployError(f"inference component {name} disappeared while deploying")
            status = current["InferenceComponentStatus"]
            report(f"{name}: {status}")
            if status not in COMPONENT_BUSY:
                break
            time.sleep(poll_seconds)
        reason = current.get("FailureReason") or "no reason given"
        wanted = request.params["Specification"].get("ModelName")
        serving = current.get("Specification", {}).get("ModelName")
        if status == "InService" and (wanted is None or serving == wanted):
            return
        if status == "InService":
            raise DeployError(f"the update of {name} to {wanted} failed and was rolled back: {reason}. "
                              f"{name} still serves {serving}")  # fmt: skip
        raise DeployError(f"inference component {name} is {status}: {reason}")

    def _wait_component_deleted(self, name: str, poll_seconds: float) -> None:
        while self.component(name) is not None:
            time.sleep(poll_seconds)

    # -- deleting -----------------------------------------------------------------------------------------------

    def delete(self) -> list[str]:
        """Delete this config's adapter component; with the last adapter gone, the base, the endpoint, its config
        and the base's model too. Returns what was deleted."""
        deleted = []
        if self.component(self.adapter) is not None:
            self.sagemaker.delete_inference_component(InferenceComponentName=self.adapter)
            self._wait_component_deleted(self.adapter, 5)
            deleted.append(f"adapter inference component {self.adapter}")
        others = [c["name"] for c in self.components() if c["base"] == self.base]
        if others:
            return deleted  # the base keeps serving the other fine-tunes
        base = self.component(self.base)
        if base is not None:
            self.sagemaker.delete_inference_component(InferenceComponentName=self.base)
            self._wait_component_deleted(self.base, 5)
            model = base.get("Specification", {}).get("ModelName", "")
            if model.startswith(f"{self.name}-") and self._exists("describe_model", ModelName=model):
                self.sagemaker.delete_model(ModelName=model)
            deleted.append(f"base inference component {self.base} and model {model}")
        return deleted + super().delete()


def _target(request: Request) -> str:
    params = request.params
    return params.get("InferenceComponentName") or params.get("EndpointName") or params.get("Key") or next(
        (v for k, v in params.items() if k.endswith("Name") and isinstance(v, str)), "")  # fmt: skip


# AWS: each rolling step of an inference component's update replaces between 5% and 50% of its copies
# (API_InferenceComponentRollingUpdatePolicy, MaximumBatchSize); botocore's model does not carry the rule
ROLLING_BATCH_SHARE = (0.05, 0.50)


def rolling_batch(copies: int) -> dict[str, Any]:
    """The smallest batch the rule admits for `copies` copies. One copy has no whole number of copies within
    5-50%: the largest share the rule admits is asked for (a batch cannot be less than the one copy)."""
    smallest, high = rolling_batch_copies(copies), ROLLING_BATCH_SHARE[1]
    if smallest <= copies * high:
        return {"Type": "COPY_COUNT", "Value": smallest}
    return {"Type": "CAPACITY_PERCENT", "Value": round(high * 100)}


def rolling_batch_copies(copies: int) -> int:
    """How many new copies one rolling step starts: the smallest share the rule admits, at least one copy (also
    what rolling_batch's percentage of a single copy comes to)."""
    return max(1, math.ceil(copies * ROLLING_BATCH_SHARE[0]))


def no_room_for_new_copies(instance_type: str, instances: int, copies: int, gpus_per_copy: int) -> str | None:
    """Why a rolling update of a component cannot start its first batch (None: it can). Each step starts its new
    copies beside the running ones before it stops any (API_InferenceComponentRollingUpdatePolicy: "provisions
    capacity on the new endpoint fleet, routes traffic to that fleet, and terminates capacity on the old"), so the
    endpoint's accelerators must hold the copies and one batch more."""
    from toolkit.config.instances import INSTANCES

    total = INSTANCES[instance_type].gpus * instances
    batch = rolling_batch_copies(copies)
    needed = (copies + batch) * gpus_per_copy
    if needed <= total:
        return None
    return (f"its {copies} cop{'y' if copies == 1 else 'ies'} of {gpus_per_copy} GPU{'s' * (gpus_per_copy > 1)} each "
            f"and a first batch of {batch} new one{'s' * (batch > 1)} need {needed} GPUs; {instances} x "
            f"{instance_type} has {total}")  # fmt: skip
