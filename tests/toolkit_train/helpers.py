"""Run the real training entrypoint in an /opt/ml-style tree, as SageMaker would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from toolkit_train.settings import to_hyperparameters

from toolkit.config import load_config

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "entrypoints" / "toolkit_train" / "train.py"


def lay_out(root: Path, overrides: list[str], preset: str = "tiny-gpt-oss-local") -> Path:
    settings = load_config(preset, overrides).train_settings()
    config_dir = root / "input" / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "hyperparameters.json").write_text(json.dumps(to_hyperparameters(settings)))
    return root


def entrypoint_env(root: Path) -> dict[str, str]:
    return dict(
        os.environ, TOOLKIT_ML_ROOT=str(root), PYTHONUNBUFFERED="1", PYTHONPATH=""
    )  # as in a job: the file imports its own package


def run_entrypoint(root: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ENTRYPOINT)],
        env=entrypoint_env(root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def losses(stdout: str) -> list[float]:
    return [float(line.split("loss=")[1].split()[0]) for line in stdout.splitlines() if line.startswith("[metrics]")]


def steps(stdout: str) -> dict[int, str]:
    """Each logged step's loss and gradient norm as the run printed them (`[metrics] step=N/M loss=.. grad_norm=..`)."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("[metrics] step="):
            fields = dict(pair.split("=", 1) for pair in line.split()[1:])
            found[int(fields["step"].split("/")[0])] = f"loss={fields['loss']} grad_norm={fields['grad_norm']}"
    return found


def adapter_tensors(path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def entrypoint(root, fault: str | None = None, sigterm_at: str | None = None) -> tuple[int, str]:
    """The entrypoint on this run tree: (exit code, its output). fault: SIGKILL at that moment (tests/faults, as
    test_faults.py kills SFT runs); sigterm_at: SIGTERM once this line appears (spot, scancel, StopTrainingJob)."""
    from tests import faults

    process = subprocess.Popen(
        faults.command(ENTRYPOINT), env=faults.env(entrypoint_env(root), fault=fault),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if sigterm_at is not None and sigterm_at in line:
            process.send_signal(signal.SIGTERM)
            sigterm_at = None
    return process.wait(timeout=600), "".join(seen)
