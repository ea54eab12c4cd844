"""HyperPod on EKS: a `HyperPodPyTorchJob` (HyperPod training operator) or a Kubeflow `PyTorchJob`.

The training code (the staged tree, as one archive: every file arrives) and the job's settings travel in a
ConfigMap mounted into every pod, so nothing has to
be copied onto the cluster's filesystem from the submitting machine; the job directory (checkpoints, model)
is on the FSx for Lustre claim. Submitted with the Kubernetes Python client and the user's kubeconfig; with
`hyperpod.cluster` set, the kubeconfig's context is first checked to be that HyperPod cluster's EKS cluster
(`check_cluster`).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from toolkit_train.layout import HYPERPARAMETERS, ML_ROOT_ENV, RUN_RECORD, RunTree
from toolkit_train.settings import (
    RANK_SHUTDOWN_SECONDS,
    STOP_WINDOW_SECONDS,
    TORCHRUN_SHUTDOWN_ENV,
    to_hyperparameters,
)

from toolkit import digest
from toolkit.aws import UPLOAD_MARKER
from toolkit.config import Config
from toolkit.config.instances import instance
from toolkit.errors import service_text
from toolkit.resources import ENTRY_SCRIPT
from toolkit.targets.base import Artifacts, Job, Run, Status, Target, TargetError, TargetFailed, tail
from toolkit.targets.hyperpod import job_dir
from toolkit.targets.jobtree import (
    TRAJECTORY_FILE,
    code_archive,
    foreign_checkpoints,
    trajectory_file,
    trajectory_text,
)

CODE_MOUNT = "/opt/toolkit"
CODE_LABEL = "toolkit/job"
KINDS = {
    "HyperPodPyTorchJob": ("sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
}


CODE_ARCHIVE = "code.tar.gz"  # the ConfigMap key holding jobtree.code_archive()
CODE_DIR = "/tmp/toolkit/code"  # where every pod unpacks it: the trainer's PYTHONPATH
CONFIG_MAP_LIMIT_BYTES = 1024 * 1024  # Kubernetes: a ConfigMap's data may not exceed 1 MiB


def code_data(config: Config) -> dict[str, dict[str, str]]:
    """The ConfigMap's payload: the code tree as one archive (binaryData), the settings as text (data)."""
    archive = base64.b64encode(code_archive(config)).decode()
    hyperparameters = to_hyperparameters(config.train_settings())
    settings = json.dumps(hyperparameters)
    if len(archive) + len(settings) > CONFIG_MAP_LIMIT_BYTES:
        raise TargetError(
            f"the training code and settings take {len(archive) + len(settings)} bytes, over a ConfigMap's "
            f"{CONFIG_MAP_LIMIT_BYTES}: remove large files from the training package (entrypoints/toolkit_train/)"
        )
    data = {
        HYPERPARAMETERS: settings,
        TRAJECTORY_FILE: trajectory_text(to_hyperparameters(config.train_settings())),
    }
    return {"binaryData": {CODE_ARCHIVE: archive}, "data": data}


def fresh_start_command(root: Path, token: str) -> str:
    """`--fresh` on EKS, where only the pods reach the shared filesystem: the first pod of this submission to start
    clears the job's checkpoints and outputs and leaves the submission's token; later pods and restarted pods
    (the operator's retries) find the token and keep what the run has written, so retries still resume. Every pod
    runs this before the rendezvous, so no clear can follow a checkpoint."""
    marker, quoted = shlex.quote(str(root / ".fresh-start")), shlex.quote(token)
    stale = " ".join(shlex.quote(str(path)) for path in RunTree(root).outputs)
    return (
        f'if [ "$(cat {marker} 2>/dev/null)" != {quoted} ]; then '
        f"rm -rf {stale} && mkdir -p {shlex.quote(str(root))} && echo {quoted} > {marker}; fi"
    )


def foreign_checkpoints_command(root: Path) -> str:
    """The foreign-checkpoint guard of jobtree.prepare_run_dir, run in the pod (only pods reach FSx here): the job
    directory's checkpoints belong to another trajectory than this submission's (jobtree.trajectory_file; a raised
    max_steps is the same run) -> stop before training."""
    written = shlex.quote(str(trajectory_file(root)))
    return (
        f"if ls {shlex.quote(str(RunTree(root).checkpoints))}/checkpoint-* >/dev/null 2>&1 && [ -f {written} ] && "
        f"! cmp -s {CODE_MOUNT}/{TRAJECTORY_FILE} {written}; then "
        f"echo {shlex.quote('error: ' + foreign_checkpoints(root))} >&2; exit 2; fi"
    )


def _container(config: Config, launcher: list[str], fresh_token: str | None = None) -> dict[str, Any]:
    hp = config.hyperpod
    if not hp.image:
        raise TargetError(
            "hyperpod.image is required on EKS: the training image every pod runs. Build the toolkit's with "
            "`toolkit image build CONFIG training` (it prints the URI) and set hyperpod.image"
        )
    spec = instance(hp.instance_type, "hyperpod.instance_type")
    root = job_dir(config)
    settings_dir = RunTree(root).hyperparameters.parent
    # the staged code tree, unpacked whole, then launch. The launcher is exec'd: it must be the pod's PID 1, the
    # process Kubernetes stops with SIGTERM. A bash left as PID 1 has no handler, so the kernel drops the signal
    # (PID 1 is shielded) and no rank checkpoints; torchrun and hyperpodrun pass it on within their own timers.
    setup = (
        (f"{fresh_start_command(root, fresh_token)} && " if fresh_token else "")
        + f"{foreign_checkpoints_command(root)}; "
        f"mkdir -p {CODE_DIR} {settings_dir} && tar -xzf {CODE_MOUNT}/{CODE_ARCHIVE} -C {CODE_DIR} && "
        f"cp {CODE_MOUNT}/{HYPERPARAMETERS} {CODE_MOUNT}/{TRAJECTORY_FILE} {settings_dir}/ && "
        + (f"pip install -q -r {CODE_DIR}/requirements.txt && " if hp.install else "")
        + " ".join(["exec", *launcher, f"{CODE_DIR}/{ENTRY_SCRIPT}"])
    )
    resources = {"nvidia.com/gpu": str(hp.gpus_per_node)}  # quantities: strings are valid everywhere
    if spec.efa:
        resources["vpc.amazonaws.com/efa"] = str(spec.efa)
    return {
        "name": "pytorch",
        "image": hp.image,
        "command": ["bash", "-c", setup],
        "env": [
            {"name": ML_ROOT_ENV, "value": str(root)},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            *({"name": k, "value": v} for k, v in TORCHRUN_SHUTDOWN_ENV.items()),
        ],
        "resources": {"requests": resources, "limits": resources},
        "volumeMounts": [
            {"name": "fsx", "mountPath": hp.fsx.mount_path},
            {"name": "code", "mountPath": CODE_MOUNT},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }


def _pod_template(config: Config, launcher: list[str], code_map: str, fresh_token: str | None) -> dict[str, Any]:
    hp = config.hyperpod
    return {
        "metadata": {"labels": {"app.kubernetes.io/name": config.name}},
        "spec": {
            "terminationGracePeriodSeconds": STOP_WINDOW_SECONDS,  # the stop window (settings.py)
            "nodeSelector": {"node.kubernetes.io/instance-type": hp.instance_type},
            "containers": [_container(config, launcher, fresh_token)],
            "volumes": [
                {"name": "fsx", "persistentVolumeClaim": {"claimName": hp.fsx.claim}},
                {"name": "code", "configMap": {"name": code_map}},
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }


def manifests(config: Config, fresh_token: str | None = None) -> list[dict[str, Any]]:
    """The ConfigMap (code + settings) and the job, as Kubernetes objects; a fresh token starts the run over."""
    hp = config.hyperpod
    labels = {}
    if hp.queue:
        labels["kueue.x-k8s.io/queue-name"] = hp.queue
    if hp.priority:
        labels["kueue.x-k8s.io/priority-class"] = hp.priority
    metadata = {"name": config.name, "namespace": hp.namespace, "labels": labels}
    payload = code_data(config)
    # named by content: a re-submission never changes the code under pods that are still running
    code_map = f"{config.name}-code-" + digest.of_value(payload, 10)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": code_map, "namespace": hp.namespace, "labels": {CODE_LABEL: config.name}},
        **payload,
    }
    procs = hp.gpus_per_node
    if hp.eks_job_kind == "HyperPodPyTorchJob":
        job = {
            "apiVersion": "sagemaker.amazonaws.com/v1",
            "kind": "HyperPodPyTorchJob",
            "metadata": metadata,
            "spec": {
                "nprocPerNode": str(procs),
                "runPolicy": {"cleanPodPolicy": "None", "jobMaxRetryCount": hp.max_retries},
                "replicaSpecs": [
                    {
                        "name": "pods",
                        "replicas": hp.nodes,
                        "template": _pod_template(
                            config,
                            [
                                "hyperpodrun",
                                f"--nnodes={hp.nodes}",
                                f"--nproc-per-node={procs}",
                                "--shutdown-signal=SIGTERM",
                                f"--shutdown-timeout={RANK_SHUTDOWN_SECONDS}",
                            ],
                            code_map,
                            fresh_token,
                        ),
                    }
                ],
            },
        }
    else:  # Kubeflow's operator sets PET_* for torchrun (nodes, rank, master)
        template = _pod_template(config, ["torchrun"], code_map, fresh_token)
        replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
        if hp.nodes > 1:
            replicas["Worker"] = {"replicas": hp.nodes - 1, "restartPolicy": "OnFailure", "template": template}
        job = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": metadata,
            "spec": {
                "nprocPerNode": str(procs),
                "runPolicy": {"backoffLimit": hp.max_retries, "cleanPodPolicy": "None"},
                "pytorchReplicaSpecs": replicas,
            },
        }
    return [config_map, job]


def _clients(config: Config):
    try:
        from kubernetes import client
        from kubernetes import config as kubeconfig
    except ImportError:
        raise TargetError("the EKS orchestrator needs the Kubernetes client: pip install -e .[aws]") from None
    try:
        # KUBECONFIG is read now, not when the client library was imported
        api = kubeconfig.new_client_from_config(os.environ.get("KUBECONFIG"), context=config.hyperpod.kube_context)
    except Exception as exc:
        raise TargetError(
            f"no usable kubeconfig ({exc}): run `aws eks update-kubeconfig --name CLUSTER` "
            "(hyperpod.kube_context picks a context; KUBECONFIG another file)"
        ) from None
    return client.CoreV1Api(api), client.CustomObjectsApi(api)


class ClusterError(TargetError):
    """hyperpod.cluster names no EKS-orchestrated HyperPod cluster, or not the one the kubeconfig's context reaches."""


def _context_cluster(config: Config) -> tuple[str, str]:
    """(context, its cluster entry's name): the context the toolkit uses (hyperpod.kube_context, else the current)."""
    from kubernetes import config as kubeconfig

    try:
        contexts, current = kubeconfig.list_kube_config_contexts(os.environ.get("KUBECONFIG"))
        name = config.hyperpod.kube_context or current["name"]
        (context,) = [c for c in contexts if c["name"] == name]
        return name, str(context["context"]["cluster"])
    except Exception as exc:  # _clients read the same file already: only a context without a cluster gets here
        raise TargetError(f"no usable kubeconfig context ({exc!r}): set hyperpod.kube_context") from None


def _eks_cluster_arn(config: Config) -> str:
    """What `hyp set-cluster-context --cluster-name` reads: SageMaker DescribeCluster's Orchestrator.Eks.ClusterArn."""
    from botocore.exceptions import ClientError

    from toolkit import aws

    name = config.hyperpod.cluster
    try:
        described = aws.client(config.aws, "sagemaker").describe_cluster(ClusterName=name)
    except ClientError as exc:
        if not aws.is_missing(exc):
            raise  # access, throttling: the CLI's error map says which
        error = exc.response.get("Error", {})
        raise ClusterError(
            f"hyperpod.cluster: no HyperPod cluster {name!r} in {config.aws.region} ({error.get('Code')}: "
            f"{service_text(str(error.get('Message', '')))}): set hyperpod.cluster to a cluster of "
            "`aws sagemaker list-clusters` (or aws.region to its region), or remove it"
        ) from None
    arn = described.get("Orchestrator", {}).get("Eks", {}).get("ClusterArn")
    if not arn:
        raise ClusterError(
            f"hyperpod.cluster: the HyperPod cluster {name!r} is not EKS-orchestrated (Slurm): set "
            "hyperpod.orchestrator: slurm and remove hyperpod.cluster, or name an EKS-orchestrated cluster"
        )
    return str(arn)


def _eks_endpoint(config: Config, eks_arn: str) -> str:
    """The EKS cluster's API server (EKS DescribeCluster), for a kubeconfig whose cluster entry is not named by ARN."""
    from toolkit import aws

    eks = aws.client(config.aws, "eks")
    return str(eks.describe_cluster(name=eks_arn.split("/", 1)[-1])["cluster"].get("endpoint") or "")


def _same_server(one: str, other: str) -> bool:
    return bool(one) and one.rstrip("/").lower() == other.rstrip("/").lower()


def check_cluster(config: Config, core: Any) -> None:
    """With hyperpod.cluster set: the kubeconfig context the toolkit uses must reach that HyperPod cluster's EKS
    cluster (what `hyp set-cluster-context --cluster-name` points kubectl at), before anything is sent to it.
    `aws eks update-kubeconfig` names the context's cluster entry by the EKS cluster's ARN: compared by ARN. An
    entry named otherwise (eksctl, by hand) is compared by its server against the EKS cluster's endpoint (EKS
    DescribeCluster). Not cached: one or two AWS calls per command. `core`: the client _clients made (its host is the
    entry's server). Dry runs never get here (render sends nothing)."""
    if not config.hyperpod.cluster:
        return
    context, entry = _context_cluster(config)
    eks_arn = _eks_cluster_arn(config)
    server = str(core.api_client.configuration.host)
    by_arn = entry.startswith("arn:")
    if not (entry == eks_arn if by_arn else _same_server(_eks_endpoint(config, eks_arn), server)):
        eks_name, region = eks_arn.split("/", 1)[-1], eks_arn.split(":")[3]
        raise ClusterError(
            f"hyperpod.cluster: {config.hyperpod.cluster} runs on EKS cluster {eks_arn}, but kubeconfig context "
            f"{context} points at cluster {entry} ({server}): run `aws eks update-kubeconfig --name {eks_name} "
            f"--region {region}`, or set hyperpod.kube_context to a context of that cluster"
        )


@dataclass
class EksJob(Job):
    name: str
    config: Config
    stops_on_interrupt = False

    def _kind(self) -> tuple[str, str, str]:
        return KINDS[self.config.hyperpod.eks_job_kind]

    def status(self) -> Run:
        _, custom = _clients(self.config)
        group, version, plural = self._kind()
        obj = custom.get_namespaced_custom_object(group, version, self.config.hyperpod.namespace, plural, self.name)
        conditions = obj.get("status", {}).get("conditions", [])
        current: dict = next((c for c in reversed(conditions) if c.get("status") == "True"), {})
        status = {
            "Succeeded": Status.COMPLETED,
            "Completed": Status.COMPLETED,
            "Failed": Status.FAILED,
            "Running": Status.RUNNING,
        }.get(current.get("type", ""), Status.PENDING)
        artifacts = Artifacts()
        if status is Status.COMPLETED:  # on the shared filesystem (FSx), as the pods see it: named, not looked at
            model = RunTree(job_dir(self.config)).model
            merged = str(model / "merged") if self.config.training.merge_adapter else None
            artifacts = Artifacts(adapter=str(model / "adapter"), merged=merged)
        return Run(self.name, status, current.get("message", current.get("type", "")), artifacts)

    def logs(self, follow: bool = False) -> Iterator[str]:
        """Every pod's log, prefixed with the pod name; with follow, new lines until the job ends."""
        seen: dict[str, int] = {}
        return tail(lambda: self._new_log_lines(seen), lambda: self.status().status.finished, follow, poll=5)

    def _new_log_lines(self, seen: dict[str, int]) -> Iterator[str]:
        from kubernetes.client.exceptions import ApiException

        core, _ = _clients(self.config)
        namespace = self.config.hyperpod.namespace
        pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name={self.config.name}")
        for pod in pods.items:
            name = pod.metadata.name
            try:
                lines = core.read_namespaced_pod_log(name, namespace).splitlines()
            except ApiException as exc:
                if exc.status in (400, 404):  # not started yet, or already gone
                    continue
                raise
            for line in lines[seen.get(name, 0) :]:
                yield f"[{name}] {line}"
            seen[name] = len(lines)

    def stop(self, now: bool = False) -> None:  # `now` is not offered: the pods' grace period applies
        """Delete the job (pods get SIGTERM: the entrypoint checkpoints) and its code ConfigMaps."""
        core, custom = _clients(self.config)
        group, version, plural = self._kind()
        namespace = self.config.hyperpod.namespace
        custom.delete_namespaced_custom_object(group, version, namespace, plural, self.name)
        for code_map in core.list_namespaced_config_map(namespace, label_selector=f"{CODE_LABEL}={self.name}").items:
            core.delete_namespaced_config_map(code_map.metadata.name, namespace)

    def wait(self, on_line: Callable[[str], None] | None = None, poll_seconds: float = 10) -> Run:
        emit = on_line or (lambda line: None)
        seen, lines_seen = None, dict[str, int]()  # every pod's log lines too: progress and loss on EKS as elsewhere
        while True:
            for line in self._new_log_lines(lines_seen):
                emit(line)
            state = self.status()
            if (state.status, state.detail) != seen:
                seen = (state.status, state.detail)
                emit(f"[toolkit] {self.name}: {state.status.value} {state.detail}")
            if state.status.finished:
                for line in self._new_log_lines(lines_seen):
                    emit(line)
                return state
            time.sleep(poll_seconds)


# Runs in the export pod (the training image: Python + boto3, the pod's AWS role); argv: model dir, bucket, prefix,
# region
EXPORT_SCRIPT = """
import pathlib, sys, boto3
source, bucket, prefix, region = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3].rstrip("/"), sys.argv[4]
if not (source / "RUN_RECORD").is_file():
    sys.exit(f"no completed run in {source}: RUN_RECORD is missing")
s3 = boto3.client("s3", region_name=region)
files = sorted(p for p in source.rglob("*") if p.is_file())
for number, path in enumerate(files, 1):
    s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(source).as_posix()}")
    print(f"[{number}/{len(files)}] {path.relative_to(source)}", flush=True)
s3.put_object(Bucket=bucket, Key=f"{prefix}/MARKER", Body=b"")
print(f"exported {len(files)} files to s3://{bucket}/{prefix}/", flush=True)
""".replace("MARKER", UPLOAD_MARKER).replace(
    "RUN_RECORD", RUN_RECORD
)  # the marker last: the prefix holds a whole model


def export_job(config: Config, run_id: str, bucket: str, prefix: str) -> dict[str, Any]:
    """A batch/v1 Job that uploads the run's model directory from FSx to s3://bucket/prefix/."""
    hp = config.hyperpod
    if not hp.image:
        raise TargetError("hyperpod.image is required on EKS: the export pod runs the training image")
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{
            "name": "export", "image": hp.image,
            "command": ["python3", "-c", EXPORT_SCRIPT, str(RunTree(job_dir(config)).model), bucket, prefix,
                        config.aws.region],
            "volumeMounts": [{"name": "fsx", "mountPath": hp.fsx.mount_path, "readOnly": True}],
        }],
        "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": hp.fsx.claim}}],
    }  # fmt: skip
    if hp.service_account:
        pod["serviceAccountName"] = hp.service_account
    metadata = {"name": f"{config.name[:40]}-export-{run_id[:8]}", "namespace": hp.namespace,
                "labels": {CODE_LABEL: config.name}}  # fmt: skip
    spec = {"backoffLimit": 2, "activeDeadlineSeconds": 7200, "ttlSecondsAfterFinished": 86400,
            "template": {"spec": pod}}  # fmt: skip
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def export_model(config: Config, dry_run: bool = False, poll_seconds: float = 5) -> str:
    """The hand-over from a completed EKS run to `toolkit deploy`: the client cannot mount FSx, so a Job in the
    cluster uploads the run's model directory to S3, once per run (keyed by the training job's uid; a marker
    object written last says the upload is whole). Returns the S3 prefix an endpoint serves."""
    from toolkit import aws

    aws.require(config.aws, "bucket")
    base = aws.model_prefix(config.aws.prefix, config.name)
    if dry_run:  # the run's id is the cluster's: named, not looked up
        return f"s3://{config.aws.bucket}/{base}/<uid of the completed {config.hyperpod.eks_job_kind}>/"
    state = ORCHESTRATOR.attach(config, config.name).status()
    if state.status is not Status.COMPLETED:
        raise TargetError(
            f"the HyperPod run {config.name} is {state.status.value}, not completed: deploy it once "
            f"`toolkit jobs status {config.name} --target hyperpod` says completed"
        )
    _, custom = _clients(config)
    group, version, plural = KINDS[config.hyperpod.eks_job_kind]
    run = custom.get_namespaced_custom_object(group, version, config.hyperpod.namespace, plural, config.name)
    run_id = run["metadata"]["uid"].replace("-", "")[:16]
    bucket, prefix = str(config.aws.bucket), f"{base}/{run_id}"
    s3 = aws.client(config.aws, "s3")
    if not aws.upload_complete(s3, bucket, prefix):
        _run_export(config, export_job(config, run_id, bucket, prefix), poll_seconds)
        if not aws.upload_complete(s3, bucket, prefix):
            raise TargetFailed(f"the export job finished but s3://{bucket}/{prefix}/ is incomplete")
    return f"s3://{bucket}/{prefix}/"


def _run_export(config: Config, job: dict[str, Any], poll_seconds: float) -> None:
    """Create the export Job (or find the one a previous, interrupted deploy created) and wait for it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, _ = _clients(config)
    batch = client.BatchV1Api(core.api_client)
    namespace, name = config.hyperpod.namespace, job["metadata"]["name"]
    try:
        batch.create_namespaced_job(namespace, job)
    except ApiException as exc:
        if exc.status != 409:  # 409: an earlier deploy started it: wait for that one
            raise TargetError(f"EKS refused the export job {name}: {exc.status} {exc.reason} ({exc.body})") from None
    while True:
        status = batch.read_namespaced_job(namespace=namespace, name=name).status
        if status and status.succeeded:
            return
        failed = [c for c in (status.conditions or []) if c.type == "Failed" and c.status == "True"] if status else []
        if failed:
            raise TargetFailed(
                f"the export job {name} failed ({failed[0].reason}: {failed[0].message}): see "
                f"`kubectl logs job/{name} -n {namespace}`; delete it with `kubectl delete job {name}` to retry"
            )
        time.sleep(poll_seconds)


class EksOrchestrator(Target):
    name = "hyperpod (eks)"

    def latest(self, config: Config) -> Run | None:
        """The run's job object, when the cluster still holds it and it completed (pods cannot be read from here)."""
        try:
            state = self.attach(config, config.name).status()
        except ClusterError:
            raise  # the config names another cluster than the context's: not "no run here"
        except TargetError:
            return None
        return state if state.status is Status.COMPLETED else None

    def servable_model(self, config: Config, dry_run: bool = False) -> str:
        return export_model(config, dry_run)

    def render(self, config: Config) -> str:
        return yaml.safe_dump_all(manifests(config), sort_keys=False)

    def submit(self, config: Config, fresh: bool = False) -> EksJob:
        from kubernetes.client.exceptions import ApiException

        core, custom = _clients(config)
        config_map, job = manifests(config, fresh_token=uuid.uuid4().hex[:12] if fresh else None)
        check_cluster(config, core)  # after the local checks, before anything reaches the cluster
        namespace = config.hyperpod.namespace
        try:
            try:
                core.create_namespaced_config_map(namespace, config_map)
            except ApiException as exc:
                if exc.status != 409:  # 409: this exact code and settings are there already
                    raise
            group, version, plural = KINDS[config.hyperpod.eks_job_kind]
            custom.create_namespaced_custom_object(group, version, namespace, plural, job)
        except ApiException as exc:
            reason = {404: "the job kind is not installed on this cluster (is the training operator there?)",
                      409: f"a job named {config.name} already exists: delete it (toolkit jobs stop) or rename",
                      422: "the cluster rejected the manifest"}.get(exc.status, exc.reason)  # fmt: skip
            raise TargetError(f"EKS refused the job: {reason} ({exc.status}: {exc.body})") from None
        return EksJob(config.name, config)

    def attach(self, config: Config, job_name: str) -> EksJob:
        from kubernetes.client.exceptions import ApiException

        job = EksJob(job_name, config)
        core, custom = _clients(config)
        check_cluster(config, core)  # status, logs, stop and the export all start here (`toolkit jobs ...`)
        group, version, plural = job._kind()
        try:
            custom.get_namespaced_custom_object(group, version, config.hyperpod.namespace, plural, job_name)
        except ApiException as exc:
            if exc.status == 404:
                raise TargetError(
                    f"no such {config.hyperpod.eks_job_kind} {job_name!r} in namespace {config.hyperpod.namespace} "
                    "(or its operator is not installed): see `kubectl get hyperpodpytorchjobs,pytorchjobs -A`"
                ) from None
            raise
        return job


ORCHESTRATOR = EksOrchestrator()
