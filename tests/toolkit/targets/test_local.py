"""The local target: the real entrypoint under torchrun on this machine, through the SDK and the CLI."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from typer.testing import CliRunner

import toolkit
from toolkit.cli import app
from toolkit.config import load_config
from toolkit.targets.base import Status, TargetError
from toolkit.targets.local import LocalJob

pytestmark = pytest.mark.integration


def test_two_processes_ddp_gloo_ranks_agree_only_rank0_writes(tmp_path):
    config = load_config(
        "tiny-gpt-oss-local",
        [
            f"local.output_dir={tmp_path}/run",
            "local.nproc_per_node=2",
            "training.max_steps=6",
            "training.save_steps=3",
        ],
    )
    job = toolkit.train(config)
    lines: list[str] = []
    state = job.wait(lines.append)
    assert state.status is Status.COMPLETED, "\n".join(lines[-40:])
    assert "ranks agree on the adapter weights (2 processes" in "\n".join(lines)
    steps = [line for line in lines if line.startswith("[metrics]")]
    assert [re.search(r"step=(\d+)", s).group(1) for s in steps] == [str(i) for i in range(1, 7)]  # rank 0 only
    run = json.loads((tmp_path / "run" / "model" / "run.json").read_text())
    assert run["global_step"] == 6
    assert set(state.artifacts) == {"adapter", "merged"}
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.is_dir()) == [
        "checkpoint-3",
        "checkpoint-6",
    ]


def test_two_processes_ddp_with_packed_mxfp4_experts(tmp_path):
    """The gpt-oss-120b-lora-1node layout (ddp, every rank holding the packed experts) on two processes: the
    ranks' adapters agree and the merged model keeps the experts in MXFP4."""
    from safetensors import safe_open

    config = load_config(
        "tiny-gpt-oss-local",
        [f"local.output_dir={tmp_path}/run", "local.nproc_per_node=2", "training.max_steps=4",
         "training.save_steps=0", "model.id=builtin:tiny-gpt-oss-mxfp4", "model.experts=mxfp4",
         "lora.target_parameters=[]"],
    )  # fmt: skip
    lines: list[str] = []
    state = toolkit.train(config).wait(lines.append)
    assert state.status is Status.COMPLETED, "\n".join(lines[-40:])
    assert "ranks agree on the adapter weights (2 processes" in "\n".join(lines)
    merged = tmp_path / "run" / "model" / "merged"
    assert json.loads((merged / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"
    with safe_open(str(next(merged.glob("*.safetensors"))), framework="pt") as tensors:
        assert any(key.endswith("experts.gate_up_proj_blocks") for key in tensors.keys())  # noqa: SIM118


def test_stop_checkpoints_then_the_same_command_resumes(tmp_path):
    config = load_config(
        "tiny-gpt-oss-local",
        [f"local.output_dir={tmp_path}/run", "local.nproc_per_node=2", "training.max_steps=12",
         "training.save_steps=100", "training.merge_adapter=false"],
    )  # fmt: skip
    job = toolkit.train(config)

    def stop_at_step_3(line: str) -> None:  # as `toolkit jobs stop` from another shell would
        if line.startswith("[metrics] step=3/"):
            found = toolkit.job(config, config.name)
            assert found.status().status is Status.RUNNING
            found.stop()

    state = job.wait(stop_at_step_3)
    assert state.status is Status.STOPPED, state
    saved = list((tmp_path / "run" / "checkpoints").glob("checkpoint-*"))
    assert len(saved) == 1
    found = toolkit.job(config, config.name)  # later, from anywhere: stopped, and not stoppable again
    assert found.status().status is Status.STOPPED
    with pytest.raises(TargetError, match="is not running"):
        found.stop()
    assert any(line.startswith("[metrics] step=3/") for line in found.logs())

    lines: list[str] = []
    state = toolkit.train(config).wait(lines.append)
    assert state.status is Status.COMPLETED
    assert f"resuming from {saved[0]}" in "\n".join(lines)
    assert toolkit.job(config, config.name).status().status is Status.COMPLETED


def test_output_dir_of_another_config_is_not_mixed_in(tmp_path):
    root = tmp_path / "run"
    (root / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (root / "input" / "config").mkdir(parents=True)
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps({"lora.r": "64"}))
    with pytest.raises(TargetError, match="holds checkpoints of a different config.*--fresh"):
        toolkit.train("tiny-gpt-oss-local", overrides=[f"local.output_dir={root}"])


def test_cli_prepare_then_train_on_prepared_data(tmp_path):
    runner = CliRunner()
    prepared = tmp_path / "prepared"
    result = runner.invoke(app, ["data", "prepare", "tiny-gpt-oss-local", "--output", str(prepared)])
    assert result.exit_code == 0, result.output
    assert "tokens_median" in result.output and (prepared / "state.json").exists()

    result = runner.invoke(
        app,
        ["train", "tiny-gpt-oss-local", "--set", f"data.source={prepared}", "--set", f"local.output_dir={tmp_path}/run",
         "--set", "training.max_steps=2", "--set", "training.merge_adapter=false"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"adapter: {tmp_path}/run/model/adapter" in result.output
    assert (tmp_path / "run" / "input" / "data" / "train").resolve() == prepared.resolve()


def test_cli_reports_a_failed_job_with_its_reason(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text("{broken\n")
    result = CliRunner().invoke(
        app,
        [
            "train",
            "tiny-gpt-oss-local",
            "--set",
            f"data.source={bad}",
            "--set",
            f"local.output_dir={tmp_path}/run",
        ],
    )
    assert result.exit_code == 1
    assert "failed: DataError" in result.output and "line 1: invalid JSON" in result.output


def test_fsdp_two_processes_trains_checkpoints_sharded_and_resumes(tmp_path):
    """The FSDP path (gpt-oss-120b's) on CPU with gloo: sharded checkpoints, resume, rank-0 merge."""
    import shutil

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = load_config(
        "tiny-gpt-oss-local",
        [f"local.output_dir={tmp_path}/run", "local.nproc_per_node=2", "training.distributed=fsdp",
         "training.max_steps=4", "training.save_steps=2"],
    )  # fmt: skip
    state = toolkit.train(config).wait()
    assert state.status is Status.COMPLETED, state
    root = tmp_path / "run"
    shutil.rmtree(root / "checkpoints" / "checkpoint-4")
    shutil.rmtree(root / "model")
    lines: list[str] = []
    state = toolkit.train(config).wait(lines.append)
    assert state.status is Status.COMPLETED
    assert f"resuming from {root / 'checkpoints' / 'checkpoint-2'}" in "\n".join(lines)
    assert json.loads((root / "model" / "run.json").read_text())["global_step"] == 4
    assert AutoModelForCausalLM.from_pretrained(root / "model" / "merged").config.model_type == "gpt_oss"
    from toolkit_train.builtin.tiny_model import tiny_gpt_oss_path

    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_gpt_oss_path()), root / "model" / "adapter"
    )
    trained = [p for n, p in adapted.named_parameters() if "lora_B" in n]
    assert trained and any(float(p.abs().sum()) > 0 for p in trained)  # the full adapter was gathered, not a shard
    # killed during the merge: the re-run trains nothing and merges the adapter it had published
    shutil.rmtree(root / "model" / "merged")
    (root / "model" / "run.json").unlink()
    lines = []
    state = toolkit.train(config).wait(lines.append)
    assert state.status is Status.COMPLETED, "\n".join(lines[-30:])
    assert "training already finished at step 4" in "\n".join(lines)
    assert not any(line.startswith("[metrics]") for line in lines)
    assert (root / "model" / "merged" / "config.json").exists()


def test_a_stop_at_once_is_not_undone_by_the_checkpoint_request_sent_after_it(tmp_path):
    """Ctrl-C prints "interrupt again to stop at once" before it sends its checkpoint request, so a second Ctrl-C can
    kill the run first; the request that follows must not turn the outcome into "stopped with a checkpoint" (CI
    met this race once). The trainer here is a process that outlives the group kill (it leads no group), so the
    request really lands while it lives, as it does between SIGKILL and exit."""
    trainer = subprocess.Popen(["sleep", "600"])
    job = LocalJob("tiny-gpt-oss-local", tmp_path / "run", process=trainer)
    try:
        job.stop(now=True)  # the second Ctrl-C
        job.stop()  # the first one's checkpoint request, sent after it
    finally:
        trainer.kill()
        trainer.wait()
    state = job.status()
    assert state.status is Status.STOPPED and state.detail.startswith("stopped at once: no new checkpoint"), state


def test_a_stop_before_training_began_does_not_claim_a_checkpoint(tmp_path):
    """SIGTERM while the model loads: the trainer exits 143 without saving (it writes output/stopped only once its
    stop's checkpoint is saved), and status used to say "stopped with a checkpoint" all the same. A process that
    exits 143 stands in for that trainer; a second one, with the record written, for a trainer that saved."""
    root = tmp_path / "run"
    (root / "output").mkdir(parents=True)
    early = subprocess.Popen(["bash", "-c", "exit 143"])
    early.wait()
    state = LocalJob("tiny-gpt-oss-local", root, process=early).status()
    assert state.status is Status.STOPPED and state.detail.startswith("stopped before it wrote a checkpoint"), state
    assert "starts from the beginning (no complete checkpoint)" in state.detail
    (root / "output" / "stopped").write_text("stopped at step 3\n")
    saved = subprocess.Popen(["bash", "-c", "exit 143"])
    saved.wait()
    state = LocalJob("tiny-gpt-oss-local", root, process=saved).status()
    assert state.status is Status.STOPPED and state.detail.startswith("stopped with a checkpoint"), state


@pytest.mark.parametrize("now", [False, True])
def test_a_stop_before_the_first_checkpoint_is_what_jobs_status_says_from_another_shell(tmp_path, now):
    """The CLI said "Stopped ... starts from the beginning" (exit 130) for a stop before the first checkpoint, and
    `toolkit jobs status` then said "Failed: its processes ended without an outcome": the trainer writes no record
    of a stop before it has a checkpoint. Whoever sends the stop writes it down first, so both say Stopped. A
    process group that dies of the signal stands in for the run; the CLI's `jobs status` is the other shell."""
    root = tmp_path / "run"
    config = load_config("tiny-gpt-oss-local", [f"local.output_dir={root}"])
    from toolkit.targets.jobtree import prepare_run_dir

    prepare_run_dir(config, root, fresh=False)  # as a launch leaves it: settings written, no outcome
    trainer = subprocess.Popen(["sleep", "600"], start_new_session=True)
    job = LocalJob(config.name, root, process=trainer)
    job.stop(now=now)
    trainer.wait()
    said = job.status()
    assert said.status is Status.STOPPED, said
    from toolkit import sdk

    found = sdk.job_status(config, config.name, None)  # `toolkit jobs status`: found again, no process handle
    assert (found.status, found.detail) == (said.status, said.detail)
    expected = "stopped at once: no new checkpoint" if now else "stopped before it wrote a checkpoint"
    assert found.detail.startswith(expected) and "starts from the beginning" in found.detail, found
    prepare_run_dir(config, root, fresh=False)  # the next attempt starts without the last one's outcome
    assert toolkit.job(config, config.name).status().status is Status.FAILED  # (nothing of it ran here)


def test_a_chat_template_family_trains_and_merges_on_the_local_target(qwen3_job_run):
    """The dense Qwen3 family end to end on the local target (issue 47): the tiny Qwen3 preset as it ships (the
    session's shared run: its rows rendered with the model's own chat template, LoRA on every linear layer, 30 steps,
    a fifth of the rows held out); the adapter and the merged model written, run.json naming the family and its
    format, both LoRA groups moved."""
    from toolkit_train.builtin.tiny_qwen3 import CHAT_TEMPLATE

    _, model = qwen3_job_run
    run = json.loads((model / "run.json").read_text())
    assert (run["family"], run["chat_format"], run["global_step"]) == ("qwen3", "template", 30)
    assert run["data"]["rows_out"] == 48 and run["train_loss"] > 0, run["data"]  # 12 of 60 held out
    assert set(run["trained"]["groups"]) == {"attention LoRA", "other adapted weights"}, run["trained"]
    assert all(group["relative_update"] > 0 for group in run["trained"]["groups"].values()), run["trained"]
    assert (model / "adapter" / "adapter_model.safetensors").exists()
    assert json.loads((model / "merged" / "config.json").read_text())["model_type"] == "qwen3"
    assert (model / "merged" / "chat_template.jinja").read_text().rstrip("\n") == CHAT_TEMPLATE  # served with it


def test_a_moe_chat_template_family_trains_expert_lora_and_merges_on_the_local_target(qwen3_moe_job_run):
    """The Qwen3-MoE family end to end on the local target (issue 47): the tiny Qwen3-MoE preset as it ships (the
    session's shared run): LoRA on the attention and on the 3-D experts (their own group), the router untouched,
    merged into a Qwen3-MoE checkpoint that reloads with the adapter's outputs."""
    import torch
    from toolkit_train.builtin.tiny_qwen3 import tiny_qwen3_path
    from toolkit_train.run.model import load_adapter
    from transformers import AutoModelForCausalLM

    _, model = qwen3_moe_job_run
    run = json.loads((model / "run.json").read_text())
    assert (run["family"], run["chat_format"], run["global_step"]) == ("qwen3-moe", "template", 30)
    assert set(run["trained"]["groups"]) == {"attention LoRA", "expert LoRA"}, run["trained"]
    assert all(group["relative_update"] > 0 for group in run["trained"]["groups"].values()), run["trained"]
    adapter = json.loads((model / "adapter" / "adapter_config.json").read_text())
    assert sorted(adapter["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"], adapter
    assert json.loads((model / "merged" / "config.json").read_text())["model_type"] == "qwen3_moe"
    ids = torch.randint(10, 2000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path(moe=True), dtype=torch.float32)
        before = base(ids).logits
        adapted = load_adapter(base, model / "adapter")(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(model / "merged", dtype=torch.float32)(ids).logits
    assert (adapted - before).abs().max() > 1e-2, "the adapter changes the model"
    torch.testing.assert_close(merged, adapted, rtol=1e-4, atol=1e-4)


def test_a_chat_template_family_trains_dpo_on_pairs_rendered_with_its_template(tmp_path):
    """Preference pairs rendered with the tiny Qwen3's template (the served prompt, each reply through <|im_end|>)
    train through TRL's DPOTrainer on the local target."""
    result = CliRunner().invoke(app, ["train", "tiny-qwen3-local", "--set", f"local.output_dir={tmp_path}/run",
                                      "--set", "training.method=dpo", "--set", "data.format=preference",
                                      "--set", "data.source=builtin:preference-sample", "--set", "data.overlong=drop",
                                      "--set", "training.merge_adapter=false",
                                      "--set", "training.max_steps=5"])  # fmt: skip
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "run" / "model" / "run.json").read_text())
    assert (run["family"], run["trained"]["paths"]["method"], run["global_step"]) == ("qwen3", "dpo", 5)
