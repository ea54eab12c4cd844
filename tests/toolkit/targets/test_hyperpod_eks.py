"""HyperPod on EKS. No Kubernetes API server can run on this machine, so:

- HyperPodPyTorchJob manifests are validated with the HyperPod SDK's own pydantic models (sagemaker-hyperpod,
  in its own environment: TOOLKIT_HYPERPOD_PYTHON or .venv-hyperpod), PyTorchJob manifests strictly against the
  Kubeflow training SDK's OpenAPI-generated models (tests/openapi_check.py);
- submission, status, logs and stop run the toolkit's real Kubernetes client code over HTTP against an
  in-process API emulator (kmock, tests/k8s_emulator.py) that answers 404 for a CRD that is not installed,
  409 for a duplicate and 422 for a schema failure;
- `hyperpod.cluster` (the kubeconfig's context checked against the HyperPod cluster's EKS cluster) against moto
  server's SageMaker DescribeCluster, whose clusters carry no Orchestrator (moto 5.2): the tests add it to the
  cluster record in moto's backend (same process), as test_training_job.py steers job states there.
Not covered: the HyperPod and Kubeflow operators themselves (nothing here runs pods), Kueue, admission webhooks.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.k8s_emulator import KubeApi
from tests.openapi_check import errors
from toolkit.aws import UPLOAD_MARKER
from toolkit.cli import app
from toolkit.config import load_config
from toolkit.targets.base import Status, TargetError
from toolkit.targets.hyperpod_eks import ORCHESTRATOR, EksJob, manifests

REPO = Path(__file__).resolve().parents[3]
HYPERPOD_JOBS = "sagemaker.amazonaws.com/v1/hyperpodpytorchjobs"
PYTORCH_JOBS = "kubeflow.org/v1/pytorchjobs"


def config(*overrides):
    return load_config(
        "gpt-oss-120b-lora",
        ["target=hyperpod", "hyperpod.nodes=2", "hyperpod.image=acct.dkr.ecr/img:1", "hyperpod.queue=team-a",
         *overrides],
    )  # fmt: skip


def test_hyperpod_pytorch_job_has_the_cluster_shape():
    config_map, job = manifests(config())
    assert job["apiVersion"] == "sagemaker.amazonaws.com/v1" and job["kind"] == "HyperPodPyTorchJob"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["nprocPerNode"] == "8" and job["spec"]["runPolicy"]["jobMaxRetryCount"] == 3
    (replicas,) = job["spec"]["replicaSpecs"]
    assert replicas["replicas"] == 2
    pod = replicas["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"}
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    assert {"name": "TOOLKIT_ML_ROOT", "value": "/fsx/toolkit/gpt-oss-120b-lora"} in container["env"]
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in pod["volumes"]
    assert "exec hyperpodrun --nnodes=2 --nproc-per-node=8" in container["command"][2]  # PID 1: it gets the stop
    settings = json.loads(config_map["data"]["hyperparameters.json"])
    assert settings["training.distributed"] == '"fsdp"' and set(config_map["binaryData"]) == {"code.tar.gz"}


def test_kubeflow_pytorch_job_splits_master_and_workers():
    _, job = manifests(config("hyperpod.eks_job_kind=PyTorchJob", "hyperpod.nodes=4"))
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 3
    assert job["spec"]["runPolicy"]["backoffLimit"] == 3


def test_dry_run_prints_yaml_and_needs_an_image():
    """With a hyperpod.cluster that nothing could describe (no credentials, no AWS host reachable): a dry run asks
    nothing of AWS."""
    result = CliRunner().invoke(
        app, ["train", "gpt-oss-120b-lora", "--target", "hyperpod", "--dry-run", "--set", "hyperpod.cluster=c",
              "--set", "hyperpod.image=img:1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == ["ConfigMap", "HyperPodPyTorchJob"]
    missing = CliRunner().invoke(
        app, ["train", "gpt-oss-120b-lora", "--target", "hyperpod", "--dry-run", "--set", "hyperpod.cluster=c"]
    )
    assert missing.exit_code == 2 and "hyperpod.image is required" in missing.output


# -- schemas --------------------------------------------------------------------------------------------------


def hyperpod_sdk_python() -> str:
    python = os.environ.get("TOOLKIT_HYPERPOD_PYTHON") or str(REPO / ".venv-hyperpod" / "bin" / "python")
    if not Path(python).exists():
        if os.environ.get("CI"):
            raise AssertionError(f"{python} missing: scripts/test.sh installs sagemaker-hyperpod there")
        pytest.skip("sagemaker-hyperpod environment not installed (scripts/test.sh makes .venv-hyperpod)")
    return python


def hyperpod_sdk_problems(documents: list[dict]) -> list[str]:
    checked = subprocess.run([hyperpod_sdk_python(), str(REPO / "tests" / "hyperpod_sdk_check.py")],
                             input=json.dumps(documents), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert checked.returncode in (0, 1), checked.stderr
    return [line for line in checked.stdout.splitlines() if line]


@pytest.mark.parametrize("nodes", [1, 4])
def test_hyperpod_pytorch_job_passes_the_hyperpod_sdk_models(nodes):
    rendered = manifests(config(f"hyperpod.nodes={nodes}", "hyperpod.priority=high"))
    assert hyperpod_sdk_problems(rendered) == []


def test_the_hyperpod_sdk_check_catches_a_wrong_manifest():
    _, job = manifests(config())
    job["spec"]["replicaSpecs"][0]["replica"] = 2  # a typo of replicas
    job["spec"]["runPolicy"]["jobMaxRetryCount"] = "three"
    _, typo = manifests(config())
    typo["spec"]["nprocsPerNode"] = "8"  # the spec model ignores unknown keys: reported, not dropped
    assert hyperpod_sdk_problems([job, typo]) == [
        "replicaSpecs.0.replica: Extra inputs are not permitted",
        "runPolicy.jobMaxRetryCount: Input should be a valid integer, unable to parse string as an integer",
        "spec.nprocsPerNode: ignored by the model",
    ]


@pytest.mark.parametrize("nodes", [1, 3])
def test_pytorch_job_matches_the_kubeflow_openapi_models(nodes):
    config_map, job = manifests(config("hyperpod.eks_job_kind=PyTorchJob", f"hyperpod.nodes={nodes}"))
    assert errors(job, "KubeflowOrgV1PyTorchJob") == []
    assert errors(config_map, "V1ConfigMap") == []
    broken = {**job, "spec": {**job["spec"], "nprocPerNode": 8, "replicaSpecs": []}}
    assert errors(broken, "KubeflowOrgV1PyTorchJob") == [
        ".spec.nprocPerNode: expected str, got 8",
        ".spec.replicaSpecs: unknown field of KubeflowOrgV1PyTorchJobSpec",
    ]


# -- submission against the API emulator ----------------------------------------------------------------------


def pytorch_job_schema(body: dict) -> list[str]:
    return errors(body, "KubeflowOrgV1PyTorchJob")


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    with KubeApi(installed={PYTORCH_JOBS: pytorch_job_schema, HYPERPOD_JOBS: None}, missing=[]) as api:
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig", "hyperpod-ctx")))
        yield api


def test_submit_creates_the_config_map_and_job_then_follows_status_and_logs(cluster):
    cfg = config("hyperpod.kube_context=hyperpod-ctx")
    job = ORCHESTRATOR.submit(cfg)
    assert set(cluster.objects(HYPERPOD_JOBS)) == {"gpt-oss-120b-lora"}
    (code_map,) = cluster.objects("v1/configmaps").values()
    assert "code.tar.gz" in code_map["binaryData"] and "hyperparameters.json" in code_map["data"]
    volumes = cluster.objects(HYPERPOD_JOBS)["gpt-oss-120b-lora"]["spec"]["replicaSpecs"][0]["template"]["spec"]
    assert {"name": "code", "configMap": {"name": code_map["metadata"]["name"]}} in volumes["volumes"]
    assert job.status().status is Status.PENDING

    from kubernetes import client
    from kubernetes import config as kubeconfig

    api = kubeconfig.new_client_from_config(os.environ["KUBECONFIG"])  # play the operator: a pod, a condition
    client.CoreV1Api(api).create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpt-oss-120b-lora-pod-0", "namespace": "default",
        "labels": {"app.kubernetes.io/name": "gpt-oss-120b-lora"}}, "spec": {"containers": []}})  # fmt: skip
    cluster.emulator["get /api/v1/namespaces/default/pods/gpt-oss-120b-lora-pod-0/log"] << b"[metrics] step=1/50\n"
    assert list(job.logs()) == ["[gpt-oss-120b-lora-pod-0] [metrics] step=1/50"]
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "sagemaker.amazonaws.com", "v1", "default", "hyperpodpytorchjobs", "gpt-oss-120b-lora",
        {"status": {"conditions": [{"type": "Running", "status": "False"},
                                   {"type": "Completed", "status": "True", "message": "job finished"}]}},
    )  # fmt: skip
    state = job.wait(poll_seconds=0)
    assert state.status is Status.COMPLETED and state.detail == "job finished"
    model = "/fsx/toolkit/gpt-oss-120b-lora/model"  # on the shared filesystem, where `toolkit deploy` takes it
    assert state.artifacts == {"adapter": f"{model}/adapter", "merged": f"{model}/merged"}

    job.stop()
    assert cluster.objects(HYPERPOD_JOBS) == {} and cluster.objects("v1/configmaps") == {}


def test_fresh_clears_the_run_once_per_submission_and_retries_still_resume(cluster, tmp_path):
    """--fresh reaches the pods (only they mount FSx): the first pod clears, retried pods resume. The pods' own
    shell step runs here for real against a directory standing in for the job's FSx path."""
    from toolkit.targets.hyperpod_eks import fresh_start_command

    ORCHESTRATOR.submit(config(), fresh=True)
    (job,) = cluster.objects(HYPERPOD_JOBS).values()
    command = job["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"][2]
    assert "/fsx/toolkit/gpt-oss-120b-lora/.fresh-start" in command
    ORCHESTRATOR.attach(config(), "gpt-oss-120b-lora").stop()
    ORCHESTRATOR.submit(config())
    (job,) = cluster.objects(HYPERPOD_JOBS).values()
    assert ".fresh-start" not in job["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"][2]

    root = tmp_path / "fsx-job"
    (root / "checkpoints" / "checkpoint-10").mkdir(parents=True)
    (root / "input").mkdir()

    def pod_starts(token: str) -> None:
        subprocess.run(["bash", "-c", fresh_start_command(root, token)], check=True)

    pod_starts("submission-a")
    assert not (root / "checkpoints").exists() and (root / "input").exists()  # the old run is gone, data stays
    (root / "checkpoints" / "checkpoint-2").mkdir(parents=True)  # the new run checkpoints, then a pod restarts
    pod_starts("submission-a")
    assert (root / "checkpoints" / "checkpoint-2").exists()
    pod_starts("submission-b")  # the next --fresh submission
    assert not (root / "checkpoints").exists()


def test_a_job_that_does_not_exist_is_no_such_job(cluster):
    with pytest.raises(TargetError, match="no such HyperPodPyTorchJob 'nope' in namespace default"):
        ORCHESTRATOR.attach(config(), "nope")
    ORCHESTRATOR.submit(config())
    assert ORCHESTRATOR.attach(config(), "gpt-oss-120b-lora").status().status is Status.PENDING


def test_submitting_a_running_job_again_is_a_409_that_says_what_to_do(cluster):
    ORCHESTRATOR.submit(config())
    with pytest.raises(TargetError, match="a job named gpt-oss-120b-lora already exists.*409"):
        ORCHESTRATOR.submit(config())


def test_a_pytorch_job_is_checked_against_the_crd_schema(cluster):
    job = ORCHESTRATOR.submit(config("hyperpod.eks_job_kind=PyTorchJob"))
    assert isinstance(job, EksJob) and set(cluster.objects(PYTORCH_JOBS)) == {"gpt-oss-120b-lora"}


def test_a_manifest_the_cluster_rejects_is_a_422_with_its_reasons(cluster, monkeypatch):
    import toolkit.targets.hyperpod_eks as eks

    real = eks.manifests

    def with_a_typo(cfg, **kwargs):  # what a hand-edited or outdated manifest would do
        config_map, job = real(cfg, **kwargs)
        job["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicyy"] = "OnFailure"
        return [config_map, job]

    monkeypatch.setattr(eks, "manifests", with_a_typo)
    with pytest.raises(TargetError, match="the cluster rejected the manifest.*restartPolicyy: unknown field"):
        ORCHESTRATOR.submit(config("hyperpod.eks_job_kind=PyTorchJob"))


def test_a_missing_operator_is_a_404_that_says_so(tmp_path, monkeypatch):
    with KubeApi(installed={}, missing=[HYPERPOD_JOBS]) as api:
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        with pytest.raises(TargetError, match="not installed on this cluster.*404"):
            ORCHESTRATOR.submit(config())


def test_no_kubeconfig_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(TargetError, match="aws eks update-kubeconfig"):
        ORCHESTRATOR.submit(config())


def _operator_completes(name: str, uid: str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0") -> None:
    """Play the API server and the training operator: the run object gets its uid and a Completed condition."""
    from kubernetes import client
    from kubernetes import config as kubeconfig

    api = kubeconfig.new_client_from_config(os.environ["KUBECONFIG"])
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "sagemaker.amazonaws.com", "v1", "default", "hyperpodpytorchjobs", name,
        {"metadata": {"uid": uid}, "status": {"conditions": [{"type": "Completed", "status": "True"}]}},
    )  # fmt: skip


def _job_controller(cluster, outcome: str, seen: list) -> None:
    """Play the Job controller and its pod: run the export Job's container command for real on this machine (the
    FSx mount path is a local directory here; AWS is the emulator), then set the Job's status."""
    import sys
    import time

    from kubernetes import client
    from kubernetes import config as kubeconfig

    deadline = time.monotonic() + 60
    while not cluster.objects("batch/v1/jobs") and time.monotonic() < deadline:
        time.sleep(0.05)
    (job,) = cluster.objects("batch/v1/jobs").values()
    seen.append(job)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    ran = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=120)
    seen.append(ran)
    status = {"succeeded": 1} if outcome == "ok" and ran.returncode == 0 else {
        "failed": 3, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                     "message": "Job has reached the specified backoff limit"}]}  # fmt: skip
    api = kubeconfig.new_client_from_config(os.environ["KUBECONFIG"])
    client.BatchV1Api(api).patch_namespaced_job(job["metadata"]["name"], "default", {"status": status})


def _eks_run_on_fsx(tmp_path, aws_env):
    fsx = tmp_path / "fsx"
    cfg = config(f"hyperpod.fsx.mount_path={fsx}", f"aws.bucket={aws_env['bucket']}", "aws.region=us-east-1",
                 "hyperpod.service_account=model-export")  # fmt: skip
    model = fsx / "toolkit" / cfg.name / "model"
    for name, text in {"run.json": '{"global_step": 50}', "merged/config.json": "{}",
                       "merged/model.safetensors": "weights", "adapter/adapter_config.json": "{}"}.items():  # fmt: skip
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_text(text)
    return cfg, model


def test_deploy_exports_a_completed_eks_run_from_fsx_once(cluster, aws_env, tmp_path):
    """The client cannot mount FSx: `toolkit deploy` has a Job in the cluster upload the run's model directory,
    keyed by the run's uid, and serves that S3 prefix; a second deploy finds the upload whole and starts nothing."""
    import threading

    import boto3

    from toolkit.deploy.endpoint import model_data

    cfg, model = _eks_run_on_fsx(tmp_path, aws_env)
    assert model_data(cfg, dry_run=True).endswith("/<uid of the completed HyperPodPyTorchJob>/")
    ORCHESTRATOR.submit(cfg)
    with pytest.raises(TargetError, match="is Pending, not completed"):
        model_data(cfg)
    _operator_completes(cfg.name)
    seen: list = []
    controller = threading.Thread(target=_job_controller, args=(cluster, "ok", seen))
    controller.start()
    uri = model_data(cfg)
    controller.join()
    job, ran = seen
    assert ran.returncode == 0, ran.stderr
    assert errors(job, "V1Job") == []  # the Kubernetes API's own models (tests/openapi_check.py)
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "model-export" and pod["containers"][0]["image"] == cfg.hyperpod.image
    assert pod["volumes"] == [{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}]
    prefix = f"{cfg.aws.prefix}/models/{cfg.name}/0f1e2d3c4b5a6978"
    assert uri == f"s3://{aws_env['bucket']}/{prefix}/"
    s3 = boto3.client("s3", region_name="us-east-1")
    listed = s3.list_objects_v2(Bucket=aws_env["bucket"], Prefix=prefix)["Contents"]
    keys = {o["Key"][len(prefix) + 1 :] for o in listed}
    expected = {p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file()}
    assert keys == expected | {UPLOAD_MARKER}
    body = s3.get_object(Bucket=aws_env["bucket"], Key=f"{prefix}/merged/model.safetensors")["Body"].read()
    assert body == b"weights"

    assert model_data(cfg) == uri  # uploaded once: no second Job (the first is still the only one)
    assert len(cluster.objects("batch/v1/jobs")) == 1

    # `toolkit register` on the same run: the package serves the exported prefix, and nothing is exported again
    from tests.toolkit.deploy.test_endpoint import IMAGE
    from toolkit import sdk

    registered = sdk.register(cfg, image_uri=IMAGE)
    package = boto3.client("sagemaker", region_name="us-east-1").describe_model_package(ModelPackageName=registered.arn)
    assert package["InferenceSpecification"]["Containers"][0]["ModelDataSource"]["S3DataSource"]["S3Uri"] == uri
    assert package["CustomerMetadataProperties"]["model_data"] == uri and registered.created
    assert len(cluster.objects("batch/v1/jobs")) == 1


def test_a_failed_export_says_where_its_log_is(cluster, aws_env, tmp_path):
    from toolkit.deploy.endpoint import model_data

    cfg, model = _eks_run_on_fsx(tmp_path, aws_env)
    (model / "run.json").unlink()  # the pod finds no completed run on FSx and exits 1
    ORCHESTRATOR.submit(cfg)
    _operator_completes(cfg.name)
    seen: list = []
    import threading

    controller = threading.Thread(target=_job_controller, args=(cluster, "ok", seen))
    controller.start()
    with pytest.raises(TargetError, match=r"export job .* failed \(BackoffLimitExceeded.*kubectl logs job/"):
        model_data(cfg)
    controller.join()
    assert "run.json is missing" in seen[1].stderr


STOPPABLE_TRAINER = """\
import os, signal, sys, time
report = os.environ["TRAINER_REPORT"]
def note(line):
    with open(report, "a") as out:
        out.write(line + "\\n")
def stop(signum, frame):
    note("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
note("pid 1: " + open("/proc/1/cmdline").read().replace("\\0", " "))
time.sleep(120)
"""


def test_the_launcher_is_the_pods_pid_1_so_a_stop_reaches_the_ranks(tmp_path):
    """Kubernetes stops a pod (`toolkit jobs stop`, an eviction, a node drain) with SIGTERM to the container's PID 1;
    the kernel drops a signal to a PID 1 that has no handler for it. The pod's rendered command runs here for real
    as PID 1 of its own PID and mount namespaces, with the ConfigMap's files at their mount path and the job's
    directory standing in for FSx; torchrun is the real launcher (the Kubeflow variant; hyperpodrun is not
    installable here). Only the trainer is a stand-in: a script that notes PID 1's command and the SIGTERM."""
    import io
    import signal
    import sys
    import tarfile
    import time

    from toolkit.resources import ENTRY_SCRIPT

    fsx = tmp_path / "fsx"
    config_map, job = manifests(config("hyperpod.eks_job_kind=PyTorchJob", "hyperpod.nodes=1",
                                       f"hyperpod.fsx.mount_path={fsx}", "hyperpod.install=false"))  # fmt: skip
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    mount = tmp_path / "configmap"  # what the code volume shows the pod
    mount.mkdir()
    for name, text in config_map["data"].items():  # the settings and the trajectory they belong to
        (mount / name).write_text(text)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        trainer = STOPPABLE_TRAINER.encode()
        info = tarfile.TarInfo(ENTRY_SCRIPT)
        info.size = len(trainer)
        tar.addfile(info, io.BytesIO(trainer))
    assert set(config_map["binaryData"]) == {"code.tar.gz"}
    (mount / "code.tar.gz").write_bytes(archive.getvalue())

    # in the namespaces: the ConfigMap at /opt/toolkit and a private /tmp/toolkit (tmpfs), then the pod's command
    pod = (
        "mount --make-rprivate / && mount -t tmpfs none /opt && mkdir /opt/toolkit && "
        'mount --bind "$CONFIGMAP" /opt/toolkit && mkdir -p /tmp/toolkit && mount -t tmpfs none /tmp/toolkit && '
        'exec "$@"'
    )
    report = tmp_path / "trainer.txt"
    env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]}, "CONFIGMAP": str(mount),
           "TRAINER_REPORT": str(report), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    launcher = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "bash", "-c", pod, "pod",
                                 *container["command"]], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (report.exists() and "pid 1:" in report.read_text()):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate(timeout=10)[0]
            time.sleep(0.2)
        assert "torchrun" in report.read_text().split("pid 1:", 1)[1].split()[1], report.read_text()
        pid1 = int(subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()[0])
        os.kill(pid1, signal.SIGTERM)  # what the kubelet does
        output = launcher.communicate(timeout=60)[0]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert "SIGTERM" in report.read_text(), output[-2000:]
    assert (fsx / "toolkit" / "gpt-oss-120b-lora" / "input" / "config" / "hyperparameters.json").is_file()


# -- hyperpod.cluster: the context must reach the HyperPod cluster's EKS cluster --------------------------------

EKS_ARN = "arn:aws:eks:us-east-1:123456789012:cluster/ml-eks"


def _hyperpod_cluster(name: str, eks_arn: str | None) -> None:
    """A HyperPod cluster in moto: created through its API; the orchestrator (moto keeps none) added to its record."""
    import boto3
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import Cluster, sagemaker_backends

    boto3.client("sagemaker", region_name="us-east-1").create_cluster(ClusterName=name, InstanceGroups=[{
        "InstanceGroupName": "workers", "InstanceType": "ml.p5.48xlarge", "InstanceCount": 1,
        "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod", "ThreadsPerCore": 1,
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle/", "OnCreate": "on_create.sh"}}])  # fmt: skip
    record = sagemaker_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].clusters[name]
    orchestrator = {"Orchestrator": {"Eks": {"ClusterArn": eks_arn}}} if eks_arn else {}
    record.describe = lambda: {**Cluster.describe(record), **orchestrator}  # type: ignore[method-assign]


def _entry_named(kubeconfig: Path, cluster_name: str) -> None:
    """Name the kubeconfig's cluster entry as `aws eks update-kubeconfig` does: by the EKS cluster's ARN."""
    written = json.loads(kubeconfig.read_text())
    written["clusters"][0]["name"] = written["contexts"][0]["context"]["cluster"] = cluster_name
    kubeconfig.write_text(json.dumps(written))


@pytest.fixture
def described(cluster, aws_env, monkeypatch):
    """The emulated account with HyperPod cluster ml-cluster on EKS_ARN (and a Slurm one); every AWS request the
    toolkit makes, as sent."""
    import toolkit.aws

    _hyperpod_cluster("ml-cluster", EKS_ARN)
    _hyperpod_cluster("slurm-cluster", None)
    sent: list[tuple[str, str, dict]] = []
    real_session = toolkit.aws.session

    def spying_session(settings):
        made = real_session(settings)
        made.events.register("provide-client-params", lambda params, model, **_: sent.append(
            (model.service_model.service_name, model.name, dict(params))))  # fmt: skip
        return made

    monkeypatch.setattr(toolkit.aws, "session", spying_session)
    return sent


def _train(*sets: str, dry_run: bool = False):
    args = ["train", "gpt-oss-120b-lora", "--target", "hyperpod", "--set", "hyperpod.image=acct.dkr.ecr/img:1",
            "--set", "aws.region=us-east-1", *(["--dry-run"] if dry_run else [])]  # fmt: skip
    for setting in sets:
        args += ["--set", setting]
    return CliRunner().invoke(app, args)


def test_a_context_on_the_clusters_eks_cluster_submits(cluster, described):
    """The context's cluster entry is the EKS cluster DescribeCluster names (by ARN, as update-kubeconfig writes
    it): submitted, then attached to; each request one AWS accepts (botocore's model, patterns included)."""
    from tests.botocore_model import assert_valid

    _entry_named(Path(os.environ["KUBECONFIG"]), EKS_ARN)
    cfg = config("hyperpod.cluster=ml-cluster", "aws.region=us-east-1")
    ORCHESTRATOR.submit(cfg)
    assert set(cluster.objects(HYPERPOD_JOBS)) == {"gpt-oss-120b-lora"}
    assert ORCHESTRATOR.attach(cfg, "gpt-oss-120b-lora").status().status is Status.PENDING
    assert [(service, operation) for service, operation, _ in described] == [("sagemaker", "DescribeCluster")] * 2
    for service, operation, params in described:
        assert params == {"ClusterName": "ml-cluster"}
        assert_valid(service, operation, params)


def test_a_context_on_another_cluster_exits_2_and_submits_nothing(cluster, described):
    other = "arn:aws:eks:us-east-1:123456789012:cluster/other-eks"
    _entry_named(Path(os.environ["KUBECONFIG"]), other)
    result = _train("hyperpod.cluster=ml-cluster", "hyperpod.kube_context=hyperpod-ctx")
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line == (
        f"error: hyperpod.cluster: ml-cluster runs on EKS cluster {EKS_ARN}, but kubeconfig context hyperpod-ctx "
        f"points at cluster {other} ({cluster.url}): run `aws eks update-kubeconfig --name ml-eks --region "
        "us-east-1`, or set hyperpod.kube_context to a context of that cluster"
    )
    assert cluster.objects(HYPERPOD_JOBS) == {} and cluster.objects("v1/configmaps") == {}
    dry = _train("hyperpod.cluster=ml-cluster", "hyperpod.kube_context=hyperpod-ctx", dry_run=True)
    assert dry.exit_code == 0, dry.output  # the same config, dry: rendered, nothing asked of AWS
    with pytest.raises(TargetError, match="^hyperpod.cluster: ml-cluster runs on EKS cluster"):
        ORCHESTRATOR.attach(config("hyperpod.cluster=ml-cluster"), "gpt-oss-120b-lora")  # jobs status/logs/stop
    assert [operation for _, operation, _ in described] == ["DescribeCluster"] * 2


def test_a_cluster_entry_not_named_by_arn_is_compared_by_its_server(cluster, described):
    """An entry named otherwise (eksctl's `NAME.REGION.eksctl.io`, or by hand: the emulator's "emulator") is the
    EKS cluster when its server is the EKS cluster's endpoint (EKS DescribeCluster)."""
    import boto3
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    boto3.client("eks", region_name="us-east-1").create_cluster(
        name="ml-eks", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": ["subnet-1"]}
    )
    cfg = config("hyperpod.cluster=ml-cluster", "aws.region=us-east-1")
    with pytest.raises(TargetError, match=r"points at cluster emulator \(http://"):
        ORCHESTRATOR.submit(cfg)  # moto's endpoint is not the emulator's server
    assert cluster.objects(HYPERPOD_JOBS) == {}
    eks_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].clusters["ml-eks"].endpoint = cluster.url
    ORCHESTRATOR.submit(cfg)
    assert set(cluster.objects(HYPERPOD_JOBS)) == {"gpt-oss-120b-lora"}
    assert ("eks", "DescribeCluster", {"name": "ml-eks"}) in described


@pytest.mark.parametrize(
    ("name", "says"),
    [("no-such-cluster", "error: hyperpod.cluster: no HyperPod cluster 'no-such-cluster' in us-east-1 "
                         "(ValidationException: "),
     ("slurm-cluster", "error: hyperpod.cluster: the HyperPod cluster 'slurm-cluster' is not EKS-orchestrated")],
)  # fmt: skip
def test_a_cluster_that_is_not_there_or_not_on_eks_exits_2(cluster, described, name, says):
    _entry_named(Path(os.environ["KUBECONFIG"]), EKS_ARN)
    result = _train(f"hyperpod.cluster={name}")
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(says), line
    assert cluster.objects(HYPERPOD_JOBS) == {} and cluster.objects("v1/configmaps") == {}
