"""HyperPod on Slurm for real: a two-node Slurm cluster on this machine runs the toolkit's own sbatch script,
torchrun across both nodes (gloo on CPU), the real entrypoint on the tiny gpt-oss; a second cluster with a GPU
GRES (its device /dev/null) checks the GPU request. Not covered: real GPUs,
pyxis containers and FSx itself (a local directory stands in for the shared filesystem)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import slurm_cluster
from toolkit.config import load_config
from toolkit.targets.base import Status, TargetError
from toolkit.targets.hyperpod import TARGET
from toolkit.targets.hyperpod_slurm import SlurmJob, SlurmQueryError, has_gpu_gres, sbatch_script

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not slurm_cluster.available() and not os.environ.get("CI"), reason="slurm-wlm not installed"),
]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, tiny_model_path):
    cluster = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    cluster.stop()
    if previous is None:
        os.environ.pop("SLURM_CONF", None)


def config(shared, *overrides, preset="tiny-gpt-oss-local"):
    return load_config(
        preset,
        ["target=hyperpod", "hyperpod.orchestrator=slurm", "hyperpod.nodes=2",
         "hyperpod.gpus_per_node=0", f"hyperpod.fsx.mount_path={shared}", f"hyperpod.python={sys.executable}",
         "training.save_steps=2", *overrides],
    )  # fmt: skip


def test_script_has_the_cluster_settings(tmp_path):
    in_image = config(tmp_path, "hyperpod.gpus_per_node=8", "hyperpod.image=registry/img:1", "hyperpod.python=python3")
    script = sbatch_script(in_image, gpu_gres=True)  # pyxis: the image's own python, not the nodes'
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script and "#SBATCH --exclusive" in script
    assert "--nproc-per-node=8" in script and "--rdzv-backend=c10d" in script
    assert f"--container-image=registry/img:1 --container-mounts={tmp_path}:{tmp_path}" in script
    assert f"export TOOLKIT_ML_ROOT={tmp_path}/toolkit/tiny-gpt-oss-local" in script
    assert "#SBATCH --mem=0" in script  # exclusive nodes: all their memory
    # the recipes launcher's EFA/NCCL environment (p5: EFA), and the locked stack installed inside the job's
    # named container before the launch step runs in that same container
    assert "export FI_PROVIDER=efa" in script and "export NCCL_SOCKET_IFNAME='^lo,docker0,veth_def_agent'" in script
    install = next(line for line in script.splitlines() if "pip install" in line)
    assert "--container-name=tiny-gpt-oss-local" in install and install.endswith("code/requirements.txt")
    assert script.index("pip install") < script.index("torch.distributed.run")
    bare = sbatch_script(config(tmp_path, "hyperpod.instance_type=ml.g5.xlarge", "hyperpod.install=false"))
    assert "FI_PROVIDER" not in bare and "pip install" not in bare  # no EFA on g5; the Python holds the stack


@pytest.mark.skipif(not slurm_cluster.available(), reason="slurm-wlm not installed")
def test_auto_resume_only_where_the_cluster_has_it(tmp_path, monkeypatch):
    """This machine's real Slurm has no `--auto-resume` (HyperPod's plugin adds it): the job is requeued instead.
    HyperPod's srun cannot run here; a stand-in `srun` whose help lists the option plays it."""
    from toolkit.targets.hyperpod_slurm import supports_auto_resume

    assert not supports_auto_resume()
    script = sbatch_script(config(tmp_path))
    assert "#SBATCH --requeue" in script and "--auto-resume" not in script
    stand_in = tmp_path / "bin" / "srun"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\necho '      --auto-resume=<0|1>   HyperPod: resume the job step on node failure'\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stand_in.parent}:{os.environ['PATH']}")
    assert supports_auto_resume()
    script = sbatch_script(config(tmp_path))
    assert "srun --auto-resume=1 --kill-on-bad-exit=1" in script and "--requeue" not in script


def sbatch_test_only(script: str, path) -> subprocess.CompletedProcess:
    """sbatch --test-only: slurmctld validates the job against the cluster and schedules nothing."""
    path.write_text(script)
    return subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True)


def test_no_gpu_request_where_the_cluster_has_no_gpu_gres(slurm, tmp_path):
    cfg = config(tmp_path, "hyperpod.gpus_per_node=1")
    assert not has_gpu_gres()  # this cluster, as HyperPod clusters without GRES: sinfo's %G is (null)
    detected = sbatch_script(cfg, auto_resume=False)
    assert "--gpus-per-node" not in detected and "--nproc-per-node=1" in detected
    assert sbatch_test_only(detected, tmp_path / "detected.sh").returncode == 0
    forced = sbatch_test_only(sbatch_script(cfg, auto_resume=False, gpu_gres=True), tmp_path / "forced.sh")
    assert forced.returncode != 0 and "gres" in forced.stderr.lower(), forced.stderr  # what users hit before


def test_the_gpu_request_where_the_cluster_has_gpu_gres(slurm, tmp_path, tmp_path_factory, monkeypatch):
    gres_cluster = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm-gres"), gpu_gres=True).start()
    try:
        monkeypatch.setenv("SLURM_CONF", str(gres_cluster.conf))
        assert has_gpu_gres()
        script = sbatch_script(config(tmp_path, "hyperpod.gpus_per_node=1"), auto_resume=False)
        assert "#SBATCH --gpus-per-node=1" in script
        accepted = sbatch_test_only(script, tmp_path / "job.sh")
        assert accepted.returncode == 0, accepted.stderr
    finally:
        gres_cluster.stop()


@pytest.mark.parametrize(
    "column, has_gpus",
    [("(null)\n", False), ("gpu:8(S:0-1)\n", True), ("gpu:h100:8\n(null)\n", True), ("mps:100,gpu:4\n", True),
     ("mps:100\n", False), ("", False)],
)  # fmt: skip
def test_gpu_gres_is_read_from_sinfos_gres_column(column, has_gpus):
    assert has_gpu_gres(column) is has_gpus


def test_pyxis_gets_the_image_in_enroots_form():
    from toolkit.targets.hyperpod_slurm import enroot_image

    ecr = "123456789012.dkr.ecr.us-east-1.amazonaws.com/toolkit-training:1"
    assert enroot_image(ecr) == "123456789012.dkr.ecr.us-east-1.amazonaws.com#toolkit-training:1"
    assert enroot_image("localhost:5000/img:1") == "localhost:5000#img:1"
    assert enroot_image("nvcr.io#nvidia/pytorch:24.01-py3") == "nvcr.io#nvidia/pytorch:24.01-py3"
    assert enroot_image("registry/img:1") == "registry/img:1"  # a Docker Hub user/repository stays as it is


def test_two_node_job_completes_and_writes_to_the_shared_path(slurm, tmp_path, aws_env):
    """Then the hand-over: `toolkit deploy` of a HyperPod config serves this run's model, uploaded once from the
    shared filesystem to S3 (moto server) and named as the endpoint's S3 prefix."""
    shared = tmp_path / "shared"
    cfg = config(
        shared,
        "training.max_steps=4",
        f"aws.role={aws_env['role']}",
        f"aws.bucket={aws_env['bucket']}",
        "serving.instance_type=ml.g4dn.xlarge",
    )  # moto knows older instance types only
    job = TARGET.submit(cfg)
    lines: list[str] = []
    state = job.wait(lines.append, poll_seconds=1)
    assert state.status is Status.COMPLETED, "\n".join(lines[-30:])
    root = shared / "toolkit" / "tiny-gpt-oss-local"
    assert (root / "model" / "adapter" / "adapter_model.safetensors").exists()
    assert (root / "model" / "merged" / "config.json").exists()
    assert state.artifacts["merged"] == str(root / "model" / "merged")
    text = "\n".join(lines)
    assert "ranks agree on the adapter weights (2 processes" in text
    assert text.count("[metrics] step=4/4") == 1  # one writer

    import boto3

    from toolkit import sdk

    s3 = boto3.client("s3")
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/toolkit-serving:serve-0123456789ab"
    planned = sdk.render_deploy(cfg, image_uri=image)  # dry: names the prefix, uploads nothing
    assert "Contents" not in s3.list_objects_v2(Bucket=aws_env["bucket"], Prefix="toolkit/models/")
    sdk.deploy(cfg, image_uri=image, poll_seconds=0)
    model = boto3.client("sagemaker").describe_model(ModelName=planned[0].params["ModelName"])
    served = model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"]
    assert served.startswith(f"s3://{aws_env['bucket']}/toolkit/models/tiny-gpt-oss-local/") and served.endswith("/")
    prefix = served.split("/", 3)[3]
    listed = s3.list_objects_v2(Bucket=aws_env["bucket"], Prefix=prefix)["Contents"]
    names = {o["Key"][len(prefix) :] for o in listed}
    assert {"merged/config.json", "adapter/adapter_config.json", "run.json"} <= names
    again = sdk.deploy(cfg, image_uri=image, poll_seconds=0)  # same run: nothing uploaded, nothing changed
    assert again.actions == [] and s3.list_objects_v2(Bucket=aws_env["bucket"], Prefix=prefix)["Contents"] == listed


def test_cancel_checkpoints_and_stops(slurm, tmp_path, monkeypatch):
    """The preference-tuning preset (training.method dpo) on both nodes: DPO's pairs through torchrun across the
    cluster, cancelled mid-run, leaves a checkpoint to resume from (the SFT preset completes in the test above).
    Also: a failed query (here scontrol pointed at no controller, as when slurmctld restarts) is ridden out by
    wait() and never turned into a FAILED job; a failed scancel is an error, not silence."""

    def dpo(*overrides):
        return config(tmp_path, "training.max_steps=400", "training.save_steps=2", "training.merge_adapter=false",
                      *overrides, preset="tiny-gpt-oss-dpo")  # fmt: skip

    job = TARGET.submit(dpo())
    run = tmp_path / "toolkit" / "tiny-gpt-oss-dpo"
    settings = (run / "input" / "config" / "hyperparameters.json").read_text()
    with pytest.raises(TargetError, match=f"is already Slurm job {job.name} .*toolkit jobs stop CONFIG {job.name}"):
        TARGET.submit(dpo(), fresh=True)
    # one writer: the refused submit touched nothing of the run
    assert (run / "input" / "config" / "hyperparameters.json").read_text() == settings
    lines: list[str] = []

    def controller_blips_then_cancel(line: str) -> None:
        lines.append(line)
        if line.startswith("[metrics] step=1/"):
            monkeypatch.setenv("SLURM_CONF", str(slurm.unreachable_conf()))
        elif "cannot query Slurm job" in line:
            monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
        elif line.startswith("[metrics] step=3/"):
            job.stop()

    state = job.wait(controller_blips_then_cancel, poll_seconds=0.5)
    assert state.status is Status.STOPPED, state
    text = "\n".join(lines)
    assert "DPO on " in text and "the reference: the base model, adapter off" in text, text[-3000:]
    assert any("cannot query Slurm job" in line and "retrying" in line for line in lines)
    checkpoints = list((run / "checkpoints").glob("checkpoint-*"))
    assert checkpoints, "no checkpoint survived the cancellation"
    with pytest.raises(TargetError, match="scancel 4242424 failed: .*[Ii]nvalid job id"):
        SlurmJob("4242424", tmp_path).stop()
    monkeypatch.setenv("SLURM_CONF", str(slurm.unreachable_conf()))
    with pytest.raises(SlurmQueryError, match=f"cannot query Slurm job {job.name}"):
        job.status()


def test_failure_reports_the_entrypoint_reason(slurm, tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text("{not json\n")
    job = TARGET.submit(config(tmp_path, f"data.source={bad}"))
    state = job.wait(poll_seconds=1)
    assert state.status is Status.FAILED
    assert "rows.jsonl line 1: invalid JSON" in state.detail


def test_log_tail_handles_multibyte_text_across_reads(tmp_path):
    from toolkit.targets.hyperpod_slurm import SlurmJob

    job = SlurmJob("7", tmp_path)
    job.output.parent.mkdir(parents=True)
    job.output.write_text("progress ━━━━ 50%\npartial ━")
    assert list(job._new_lines()) == ["progress ━━━━ 50%"]
    with job.output.open("a") as handle:
        handle.write("━ done\nnext █ line\n")
    assert list(job._new_lines()) == ["partial ━━ done", "next █ line"]
