"""A model training cannot use, through the CLI: one line naming model.id, exit 2, before anything is read,
rendered or launched. No network: the hub is made unreachable (HF_HUB_OFFLINE, an empty HF_HOME), as on a machine
that has not downloaded the model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.toolkit.cli_checks import refused


def toolkit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf-home")}
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)  # fmt: skip


@pytest.mark.parametrize("model", ["mistralai/Mistral-7B-Instruct-v0.3", "meta-llama/Llama-3.1-8B-Instruct"])
def test_a_chat_model_of_no_family_record_goes_the_generic_template_path(tmp_path, model):
    """A causal LM no family record claims trains through its own chat template (issue 66): `data prepare` gets as
    far as its tokenizer (no hub here), and is not refused for its family."""
    output = refused(toolkit("data", "prepare", "tiny-llama-local", "--set", f"model.id={model}", cwd=tmp_path),
                     f"model.id {model}: its tokenizer cannot be loaded here")  # fmt: skip
    assert "family" not in output, output


@pytest.mark.parametrize(
    "command",
    [("train", "tiny-llama-local", "--target", "local"), ("data", "prepare", "tiny-llama-local"),
     ("train", "tiny-llama-local", "--target", "training-job", "--dry-run", "--set", "aws.region=us-east-1",
      "--set", "aws.role=arn:aws:iam::123456789012:role/x", "--set", "aws.bucket=toolkit-test-bucket"),
     ("eval", "tiny-llama-local")],
)  # fmt: skip
def test_a_base_model_without_a_chat_template_is_refused_before_anything_runs(tmp_path, command):
    """A model downloaded before (in the Hugging Face cache) whose tokenizer ships no chat template (a base model,
    not its instruct variant) cannot be rendered: one line naming what to use, before a job is rendered or a run
    folder made; eval, which scores what training rendered, alike."""
    snapshot = tmp_path / "hf-home" / "hub" / "models--acme--llama-base" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    (snapshot / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    (snapshot / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    output = refused(toolkit(*command, "--set", "model.id=acme/llama-base", cwd=tmp_path),
                     "model.id acme/llama-base: its tokenizer has no chat template", "use a chat model")  # fmt: skip
    assert len([line for line in output.splitlines() if line.startswith("error:")]) == 1, output
    assert not (tmp_path / "runs").exists()


def test_a_qwen3_model_is_no_longer_refused_for_its_family(tmp_path):
    """Qwen3 has a record and a chat format (issue 47): `data prepare` gets as far as its tokenizer (not here)."""
    refused(toolkit("data", "prepare", "tiny-qwen3-local", "--set", "model.id=Qwen/Qwen3-0.6B", cwd=tmp_path),
            "model.id Qwen/Qwen3-0.6B: its tokenizer cannot be loaded here")  # fmt: skip


def test_a_qwen3_moe_with_all_linear_written_out_is_asked_for_its_modules_by_name(tmp_path):
    """The dense preset with a Qwen3-MoE id: its `lora.target_modules: all-linear` would, to peft, adapt the router
    and every expert (with dropout, a failure inside the job): one line before anything runs, saying what to write."""
    refused(toolkit("train", "tiny-qwen3-local", "--target", "training-job", "--dry-run", "--set",
                    "model.id=Qwen/Qwen3-30B-A3B", cwd=tmp_path),
            "lora.target_modules: all-linear on qwen3-moe adapts, to peft, the router and every expert too",
            "list the modules, e.g. [q_proj, k_proj, v_proj, o_proj]")  # fmt: skip


def test_a_hub_model_that_is_not_here_is_one_line_not_a_traceback(tmp_path):
    """`data prepare` reads the tokenizer: a hub id not in the cache, the hub unreachable, says so and what to do."""
    refused(toolkit("data", "prepare", "tiny-gpt-oss-local", "--set", "model.id=openai/gpt-oss-20b",
                    "--set", "serving.instance_type=ml.p5.48xlarge", cwd=tmp_path),
            "model.id openai/gpt-oss-20b: its tokenizer cannot be loaded here",
            "or point model.id at a local checkpoint directory")  # fmt: skip


def test_a_qwen3_training_job_is_a_valid_request_the_entrypoint_reads_as_qwen3(tmp_path):
    """`toolkit train tiny-qwen3-local --target training-job --dry-run`: the CreateTrainingJob request is valid against
    botocore's service model, and the entrypoint's parser reads back the Qwen3 run (its family's template format)."""
    import json

    from toolkit_train.settings import from_hyperparameters

    from tests.botocore_model import assert_valid

    result = toolkit("train", "tiny-qwen3-local", "--target", "training-job", "--dry-run",
                     "--set", "aws.role=arn:aws:iam::123456789012:role/toolkit-execution",
                     "--set", "aws.bucket=toolkit-test-bucket", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    request = json.loads(result.stdout)
    assert_valid("sagemaker", "CreateTrainingJob", request)
    settings = from_hyperparameters(request["HyperParameters"])
    assert settings.model.id == "builtin:tiny-qwen3" and settings.model.family.name == "qwen3"
    assert settings.model.family.chat_format == "template"
    assert list(tmp_path.iterdir()) == [], "a dry run creates nothing"


def test_a_qwen3_moe_expert_adapter_served_as_an_adapter_is_refused_and_merged_is_named(tmp_path):
    """Issue #66: vLLM 0.32's Qwen3-MoE layer takes 2-D expert weights and refuses a 3-D expert adapter; the
    deploy would fail on the endpoint after the instance started. Said at validation, with the setting that serves."""
    expert_lora = ["--set", "lora.target_parameters=[mlp.experts.gate_up_proj,mlp.experts.down_proj]",
                   "--set", "lora.dropout=0", "--set", "serving.weights=adapter"]  # fmt: skip
    refused(
        toolkit("config", "validate", "tiny-qwen3-moe-local", *expert_lora, cwd=tmp_path),
        "serving.weights: adapter: vLLM 0.32 cannot load a qwen3-moe adapter that adapts the experts",
        "serve the merged model (serving.weights: merged",
    )
    merged = toolkit("config", "validate", "tiny-qwen3-moe-local", *expert_lora[:4], cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr


@pytest.mark.parametrize(
    ("overrides", "said"),
    [(["data.reasoning=keep"], "set data.reasoning: drop"),
     (["data.source=builtin:tool-calling-sample", "data.format=messages"], "does not read tools"),
     (["training.method=dpo", "data.source=builtin:preference-sample", "data.format=preference"],
      "differ only in their reasoning")],
)  # fmt: skip
@pytest.mark.parametrize("target", ["local", "training-job-dry-run", "config-validate"])
def test_rows_the_template_cannot_render_are_refused_before_anything_launches(tmp_path, overrides, said, target):
    """A record-less model's template with rows it cannot render: `train` (local), a training job's dry run and
    `config validate` refuse in one line, exit 2, nothing launched, no traceback (before, the local run failed inside
    the job, the dry run rendered a job bound to fail, and validate said ok). The local run builds the tiny Llama;
    the others, which build nothing, then find it on this machine."""
    aws = ["aws.region=us-east-1", "aws.role=arn:aws:iam::123456789012:role/x", "aws.bucket=toolkit-test-bucket"]
    command = {
        "local": ["train", "tiny-llama-local", "--target", "local"],
        "training-job-dry-run": ["train", "tiny-llama-local", "--target", "training-job", "--dry-run"]
        + [a for o in aws for a in ("--set", o)],
        "config-validate": ["config", "validate", "tiny-llama-local"],
    }[target]
    args = [a for o in overrides for a in ("--set", o)]
    output = refused(toolkit(*command, *args, cwd=tmp_path), "data.source", said)  # fmt: skip
    assert len([line for line in output.splitlines() if line.startswith("error:")]) == 1, output
    assert not (tmp_path / "runs").exists()
