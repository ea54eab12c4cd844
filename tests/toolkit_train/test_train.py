"""Real LoRA training of the tiny gpt-oss on CPU, through the real entrypoint and the /opt/ml contract."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from tests import faults
from tests.runs import sample_rows
from tests.toolkit_train.helpers import ENTRYPOINT, REPO, entrypoint_env, lay_out, losses, run_entrypoint

pytestmark = pytest.mark.integration

EXPERTS = "lora.target_parameters=[mlp.experts.gate_up_proj,mlp.experts.down_proj]"


def _logits(model, input_ids):
    with torch.no_grad():
        return model(input_ids=input_ids).logits


@pytest.mark.parametrize("lora", [["lora.target_parameters=[]"], [EXPERTS]], ids=["attention", "attention+experts"])
def test_trains_reloads_and_merges(tmp_path, lora, tiny_model_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root = lay_out(tmp_path, [*lora, "training.max_steps=16", "training.save_steps=0", "training.learning_rate=1e-2"])
    result = run_entrypoint(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    curve = losses(result.stdout)
    assert len(curve) == 16
    assert "an optimizer step averages ~" in result.stdout  # packing's batch semantics, said where it is set
    assert sum(curve[-5:]) / 5 < sum(curve[:5]) / 5 - 0.1, curve  # it learns

    adapter, merged = root / "model" / "adapter", root / "model" / "merged"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert {m.rsplit(".", 1)[-1] for m in config["target_modules"]} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    }
    assert bool(config.get("target_parameters")) == (lora == [EXPERTS])

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    input_ids = torch.tensor([[5, 17, 42, 99, 7, 300, 12, 8]])
    base_logits = _logits(base, input_ids)
    with_adapter = PeftModel.from_pretrained(base, adapter).eval()
    adapter_logits = _logits(with_adapter, input_ids)
    assert not torch.allclose(adapter_logits, base_logits, atol=1e-4), "the adapter changed nothing"

    reloaded = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    torch.testing.assert_close(_logits(reloaded, input_ids), adapter_logits, rtol=1e-4, atol=1e-4)
    run = json.loads((root / "model" / "run.json").read_text())
    assert run["global_step"] == 16 and run["data"]["rows_out"] == sample_rows()
    assert not (root / "output" / "failure").exists()


def test_mxfp4_checkpoint_dequantizes_trains_and_merges(tmp_path):
    from toolkit_train.builtin.tiny_model import tiny_gpt_oss_path
    from transformers import AutoModelForCausalLM

    mxfp4 = tiny_gpt_oss_path(mxfp4=True)
    assert json.loads((mxfp4 / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"
    root = lay_out(tmp_path, ["model.id=builtin:tiny-gpt-oss-mxfp4", "training.max_steps=3", EXPERTS])
    result = run_entrypoint(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(losses(result.stdout)) == 3

    # The merged model must reload with the trained experts, not silently re-initialised ones.
    from peft import PeftModel
    from transformers import Mxfp4Config

    base = AutoModelForCausalLM.from_pretrained(
        mxfp4, dtype=torch.float32, quantization_config=Mxfp4Config(dequantize=True)
    )
    input_ids = torch.tensor([[5, 17, 42, 99, 7, 300]])
    expected = _logits(PeftModel.from_pretrained(base, root / "model" / "adapter").eval(), input_ids)
    merged = AutoModelForCausalLM.from_pretrained(root / "model" / "merged", dtype=torch.float32).eval()
    torch.testing.assert_close(_logits(merged, input_ids), expected, rtol=1e-4, atol=1e-4)


def _adapter_weights(root):
    from safetensors.torch import load_file

    return load_file(str(root / "model" / "adapter" / "adapter_model.safetensors"))


def test_sigterm_checkpoints_and_resume_matches_uninterrupted_run(tmp_path):
    common = ["training.max_steps=8", "training.save_steps=100", "training.merge_adapter=false"]
    straight = lay_out(tmp_path / "straight", common)
    assert run_entrypoint(straight).returncode == 0

    interrupted = lay_out(tmp_path / "interrupted", common)
    process = subprocess.Popen(
        [sys.executable, str(ENTRYPOINT)], env=entrypoint_env(interrupted),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("[metrics] step=3/"):
            process.send_signal(signal.SIGTERM)
            break
    output = process.stdout.read()
    assert process.wait(timeout=120) == 143, output
    assert "stopped by SIGTERM" in output
    checkpoints = sorted((interrupted / "checkpoints").glob("checkpoint-*"))
    assert len(checkpoints) == 1 and 3 <= int(checkpoints[0].name.split("-")[1]) < 8
    assert not (interrupted / "model" / "adapter").exists()

    resumed = run_entrypoint(interrupted)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"resuming from {checkpoints[0]}" in resumed.stdout
    assert json.loads((interrupted / "model" / "run.json").read_text())["global_step"] == 8
    expected, actual = _adapter_weights(straight), _adapter_weights(interrupted)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6)


def test_failure_file_on_missing_channel(tmp_path):
    root = lay_out(tmp_path, ["data.source=s3://bucket/never-downloaded/"])
    result = run_entrypoint(root)
    assert result.returncode == 1
    reason = (root / "output" / "failure").read_text()
    assert "data channel 'train' not found" in reason and "s3://bucket/never-downloaded/" in reason


def test_failure_file_on_corrupt_data(tmp_path):
    root = lay_out(tmp_path, [])
    channel = root / "input" / "data" / "train"
    channel.mkdir(parents=True)
    (channel / "rows.jsonl").write_text('{"user": "hi", "final": "hello"\nnot json at all\n')
    result = run_entrypoint(root)
    assert result.returncode == 1
    reason = (root / "output" / "failure").read_text()
    assert "2 of 2 rows" in reason and "rows.jsonl line 1: invalid JSON" in reason and "line 2: invalid JSON" in reason


def test_the_job_reads_its_hf_token_from_the_named_secret(aws_env, monkeypatch):
    """Inside the container: the secret named by the job's environment is read with the job's role (here the
    emulator's Secrets Manager over HTTP), into this process's memory only."""
    import boto3
    from toolkit_train import train

    token = "hf_" + "t" * 34
    boto3.client("secretsmanager").create_secret(Name="hf-token", SecretString=token)
    boto3.client("secretsmanager").create_secret(Name="hf-json", SecretString=json.dumps({"HF_TOKEN": token}))
    for secret in ("hf-token", "hf-json"):
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("TOOLKIT_HF_TOKEN_SECRET", secret)
        train.load_hf_token()
        assert os.environ["HF_TOKEN"] == token
    # in the container: the region the toolkit passed, with none of AWS's own region variables set
    for variable in ("AWS_REGION", "AWS_DEFAULT_REGION", "HF_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TOOLKIT_AWS_REGION", "us-east-1")
    train.load_hf_token()
    assert os.environ["HF_TOKEN"] == token


def boto3_calls_without_a_region(source: str) -> list[str]:
    import ast

    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            made_by_boto3 = isinstance(owner, ast.Name) and owner.id == "boto3"
            regional = "region_name" in {keyword.arg for keyword in node.keywords}
            if made_by_boto3 and node.func.attr in ("client", "resource", "Session") and not regional:
                missing.append(f"line {node.lineno}: boto3.{node.func.attr}")
    return missing


def test_every_aws_client_in_a_job_names_its_region():
    """A container need not know its region (and a VPC endpoint is regional): what runs in a job, the entrypoint
    package and the EKS export pod's script, makes every boto3 client with region_name."""
    from toolkit.targets.hyperpod_eks import EXPORT_SCRIPT

    sources = {str(p): p.read_text() for p in (REPO / "entrypoints" / "toolkit_train").rglob("*.py")} | {
        "export pod": EXPORT_SCRIPT
    }
    assert boto3_calls_without_a_region("import boto3\nboto3.client('s3')\n") == ["line 2: boto3.client"]
    assert {name: found for name, source in sources.items() if (found := boto3_calls_without_a_region(source))} == {}


def _pid1_of(namespace_launcher: subprocess.Popen) -> int:
    """The host PID of the process that is PID 1 inside `unshare -fp` (the launcher's only child)."""
    import time

    for _ in range(100):
        children = subprocess.run(["pgrep", "-P", str(namespace_launcher.pid)], capture_output=True, text=True)
        if children.stdout.split():
            return int(children.stdout.split()[0])
        time.sleep(0.1)
    raise AssertionError("no PID 1 in the namespace")


def _train_as_sagemaker_runs_it(root, relay: bool, slow_save: int | None = None) -> tuple[subprocess.Popen, int]:
    """SageMaker's process tree: PID 1 is the SDK's container command, `bash -c "chmod +x sm_train.sh &&
    sm_train.sh"`; sm_train.sh (the SDK's TRAIN_SCRIPT_TEMPLATE: set -e, an ERR trap, several commands) runs the
    training as a child. With the toolkit's relay, PID 1 is toolkit_train/pid1.py running that same command.
    slow_save: each checkpoint takes this many seconds longer (the training runs under the fault Python)."""
    python, env = (faults.PYTHON, faults.env(entrypoint_env(root), slow_save=slow_save)) if slow_save else (
        sys.executable, entrypoint_env(root))  # fmt: skip
    script = root / "sm_train.sh"
    script.write_text(
        "#!/bin/bash\nset -e\necho 'Starting training script'\n"
        "handle_error() { echo \"An error occurred with exit code $?\"; }\ntrap 'handle_error' ERR\n"
        f"cd {root}\n{python} {ENTRYPOINT}\necho 'Training script finished'\n"
    )
    command = ["/bin/bash", "-c", f"chmod +x {script} && {script}"]
    pid1 = [sys.executable, str(ENTRYPOINT.parent / "pid1.py"), *command] if relay else command
    launcher = subprocess.Popen(["unshare", "-fp", "--mount-proc", *pid1], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    return launcher, _pid1_of(launcher)


def _sigterm_at_step_2(launcher: subprocess.Popen, pid1: int) -> None:
    """Follow the job's output and send SIGTERM to the namespace's PID 1 once training is under way."""
    assert launcher.stdout is not None
    for line in launcher.stdout:
        if line.startswith("[metrics] step=2/"):
            os.kill(pid1, signal.SIGTERM)
            return


def test_a_finished_run_asked_for_more_steps_trains_them(tmp_path):
    """Finished at step 2 (its final checkpoint), then the same run with max_steps 3: step 3 is trained, not skipped
    as finished (the checkpoint's own max_steps is the old run's)."""
    root = lay_out(tmp_path, ["training.max_steps=2", "training.save_steps=2", "training.merge_adapter=false"])
    assert run_entrypoint(root).returncode == 0
    lay_out(root, ["training.max_steps=3", "training.save_steps=2", "training.merge_adapter=false"])
    result = run_entrypoint(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "resuming from" in result.stdout and "already finished" not in result.stdout
    assert len(losses(result.stdout)) == 1
    assert json.loads((root / "model" / "run.json").read_text())["global_step"] == 3


def test_a_save_slower_than_torchruns_30_s_finishes_in_the_stop_window(tmp_path):
    """SageMaker's tree with torchrun (two ranks, as on a multi-GPU instance) and a checkpoint save that takes 40 s
    (a test-only delay before the seal): SIGTERM to PID 1 reaches the ranks, not torchrun, whose own timer (30 s
    before torch 2.12) would kill them mid-save; the checkpoint is complete. SageMaker's window is 120 s."""
    from toolkit_train.run import checkpoints
    from toolkit_train.settings import STOP_WINDOW_SECONDS

    root = lay_out(tmp_path, ["training.max_steps=400", "training.save_steps=1000", "training.merge_adapter=false"])
    os.environ.update(SM_NUM_GPUS="2")
    try:
        launcher, pid1 = _train_as_sagemaker_runs_it(root, relay=True, slow_save=40)
    finally:
        del os.environ["SM_NUM_GPUS"]
    _sigterm_at_step_2(launcher, pid1)
    output = launcher.communicate(timeout=STOP_WINDOW_SECONDS + 60)[0]
    assert "pid1: passing signal 15 to the ranks [" in output, output[-3000:]
    assert "stopped by SIGTERM" in output, output[-3000:]
    saved = list((root / "checkpoints").glob("checkpoint-*"))
    assert len(saved) == 1 and checkpoints.problem(saved[0]) is None, output[-3000:]


def test_sigterm_to_pid1_reaches_the_ranks_through_the_relay(tmp_path):
    """StopTrainingJob / a spot interruption: SIGTERM to the container's PID 1. Under the SDK's bare `bash -c` the
    ranks never hear it and no checkpoint is written; under toolkit_train/pid1.py the entrypoint checkpoints and exits
    143, resumable."""
    settings = ["training.max_steps=400", "training.save_steps=1000", "training.merge_adapter=false"]
    bare = lay_out(tmp_path / "bare", settings)
    launcher, pid1 = _train_as_sagemaker_runs_it(bare, relay=False)
    _sigterm_at_step_2(launcher, pid1)
    try:  # bash as PID 1 passes nothing on: the namespace ends (its init is gone) without a checkpoint
        output = launcher.communicate(timeout=20)[0]
    except subprocess.TimeoutExpired:  # or the signal is lost and training runs on
        os.kill(pid1, signal.SIGKILL)
        output = launcher.communicate(timeout=60)[0]
    assert "stopped by SIGTERM" not in output and not list((bare / "checkpoints").glob("checkpoint-*"))

    relayed = lay_out(tmp_path / "relayed", settings)
    launcher, pid1 = _train_as_sagemaker_runs_it(relayed, relay=True)
    _sigterm_at_step_2(launcher, pid1)
    output = launcher.communicate(timeout=180)[0]
    assert launcher.returncode == 143, output[-3000:]
    assert "stopped by SIGTERM" in output
    checkpoints = list((relayed / "checkpoints").glob("checkpoint-*"))
    assert len(checkpoints) == 1, output[-3000:]


def test_a_disk_that_fills_while_the_merge_is_written_names_model_merged(tmp_path):
    """Issue #68: a full disk during the merge named the run directory (safetensors' error carries no file name).
    A real full disk (a 1 MiB tmpfs, as root) under a real safetensors save through write_whole: the failure line
    names model/merged, and nothing is published under that name."""
    import subprocess

    import torch
    from safetensors.torch import save_file
    from toolkit_train.layout import Paths
    from toolkit_train.train import failure_reason, write_whole

    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("needs root to mount a tmpfs")
    try:
        root = mount / "run"
        paths = Paths(root=root, model_dir=root / "model", checkpoints=root / "checkpoints",
                      train_channel=root / "input", output_data=root / "output")  # fmt: skip
        paths.model_dir.mkdir(parents=True)

        def merge(out):
            out.mkdir(parents=True)
            save_file({"weight": torch.randn(1024, 1024)}, str(out / "model.safetensors"))  # 4 MiB: does not fit

        with pytest.raises(OSError) as raised:
            write_whole(paths.model_dir / "merged", merge)
        line = failure_reason(raised.value, paths)
        assert line.startswith(f"out of disk space writing {paths.model_dir / 'merged'}:"), line
        assert not (paths.model_dir / "merged").exists()
    finally:
        subprocess.run(["umount", "-l", str(mount)])
