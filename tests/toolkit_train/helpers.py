"""Run the real training entrypoint in an /opt/ml-style tree, as SageMaker would."""

from __future__ import annotations

import json
import os
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
