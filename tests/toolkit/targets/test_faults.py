"""A run survives every interruption: the real training process tree is killed with SIGKILL at named moments
(the run's moments: tests/faults), and the same `toolkit train` command run again
ends with the adapter of an uninterrupted run, or refuses with one line that says how to go on.

Nothing is mocked: real training of the tiny gpt-oss through the CLI and the local target, real SIGKILLs, a real
size-limited filesystem (tmpfs) for the full disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests import faults
from toolkit.cli import app
from toolkit.targets.jobtree import run_holder

pytestmark = pytest.mark.integration

STEPS = ["--set", "training.max_steps=4", "--set", "training.save_steps=2"]
# Resume is exact (same data order, RNG states restored): measured max |difference| 0.0 on this machine
TOLERANCE = 0.0


def train(root: Path, *extra: str, fault: str | None = None):
    args = ["train", "tiny-gpt-oss-local", "--target", "local", "--set", f"local.output_dir={root}", *STEPS, *extra]
    if not fault:
        return CliRunner().invoke(app, args)
    with faults.switched(fault=fault):
        return CliRunner().invoke(app, args)


def adapter_tensors(root: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(root / "model" / "adapter" / "adapter_model.safetensors")


def assert_same_adapter(root: Path, baseline: Path) -> None:
    run = json.loads((root / "model" / "run.json").read_text())
    assert run["global_step"] == 4
    ours, theirs = adapter_tensors(root), adapter_tensors(baseline)
    assert ours.keys() == theirs.keys()
    worst = max(float((ours[k].float() - theirs[k].float()).abs().max()) for k in ours)
    assert worst <= TOLERANCE, worst
    assert (root / "model" / "merged" / "config.json").exists()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("faults") / "uninterrupted"
    result = train(root)
    assert result.exit_code == 0, result.output
    return root


def test_killed_at_every_moment_the_same_command_ends_with_the_uninterrupted_adapter(tmp_path, baseline):
    root = tmp_path / "run"
    chain = [
        ("model-loaded", None),  # nothing written yet: starts from the beginning
        ("step-3", "checkpoint-2"),  # mid-step: checkpoint-2 is complete
        ("checkpoint-save-4", "checkpoint-2"),  # inside the save: model and optimizer written, the rest not
        ("before-seal-4", "checkpoint-2"),  # every file written, the completion record not
        ("before-merge", "checkpoint-4"),  # trained and the adapter written; the merge not started
        ("merge-written", "checkpoint-4"),  # the merged model written, not yet under its name
    ]
    for moment, resumable in chain:
        result = train(root, fault=moment)
        assert result.exit_code == 1, (moment, result.output)
        assert "Traceback" not in result.output
        assert f"fault point {moment}" in result.output
        hint = f"resumes from {resumable}" if resumable else "starts from the beginning"
        assert hint in result.output.splitlines()[-1], (moment, result.output[-600:])
        assert run_holder(root) is None  # nothing of the run is alive
        assert not (root / "model" / "run.json").exists()
        assert not (root / "model" / "merged").exists()  # a whole merged model, or none
    result = train(root)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "training already finished at step 4 (checkpoint-4)" in out and "[metrics]" not in out
    assert_same_adapter(root, baseline)
    # what the kills left is named and kept apart, never resumed from and never deleted
    aside = sorted(p.name for p in (root / "checkpoints").iterdir() if "incomplete" in p.name)
    assert aside == ["checkpoint-4.incomplete", "checkpoint-4.incomplete-2"]

    again = train(root)  # a finished run is finished: nothing trained, nothing rewritten
    assert again.exit_code == 0 and "already complete" in again.output and "[metrics]" not in again.output
    assert_same_adapter(root, baseline)


def test_raising_max_steps_continues_a_finished_run_from_its_last_checkpoint(tmp_path, baseline):
    """Where a run stops is not what makes it another run: 4 steps done, the same command with max_steps 6 trains
    steps 5-6 from checkpoint-4 (it used to refuse as checkpoints of a different config and ask for --fresh)."""
    root = tmp_path / "run"
    shutil.copytree(baseline, root)
    result = train(root, "--set", "training.max_steps=6")
    assert result.exit_code == 0, result.output
    log = (root / "output" / "train.log").read_text()
    assert f"resuming from {root / 'checkpoints' / 'checkpoint-4'}" in log, log[-2000:]
    assert json.loads((root / "model" / "run.json").read_text())["global_step"] == 6
    assert (root / "model" / "merged" / "config.json").exists()


def test_a_run_killed_without_a_trace_is_reported_failed_with_where_it_resumes(tmp_path):
    from toolkit import job
    from toolkit.config import load_config

    root = tmp_path / "run"
    assert train(root, fault="step-3").exit_code == 1
    (root / "output" / "train.log").unlink()  # as if the CLI had died with the trainer
    config = load_config("tiny-gpt-oss-local", [f"local.output_dir={root}"])
    state = job(config, config.name).status()  # from another shell: no process handle
    assert state.status.value == "Failed"
    assert "ended without an outcome" in state.detail and "resumes from checkpoint-2" in state.detail


def test_rows_appended_between_a_stop_and_the_resume_refuse_it_and_nothing_is_trained(tmp_path):
    """Rows appended to data.source after a kill at step 3 were trained on at the resume from checkpoint-2 (and the
    held-out split drawn again over the changed file). The same command now refuses in one line (exit 2) naming
    what changed since which checkpoint; nothing is launched; with the data restored it resumes."""
    from toolkit_train.data import SAMPLE_PATH

    data = tmp_path / "rows.jsonl"
    shutil.copy(SAMPLE_PATH, data)
    root = tmp_path / "run"
    assert train(root, "--set", f"data.source={data}", fault="step-3").exit_code == 1
    checkpoint = root / "checkpoints" / "checkpoint-2"
    assert checkpoint.is_dir()
    original = data.read_bytes()
    data.write_bytes(original + original.splitlines(keepends=True)[0] * 8)
    log = (root / "output" / "train.log").read_text()
    refused = train(root, "--set", f"data.source={data}")
    assert refused.exit_code == 2, refused.output
    line = refused.output.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert f"data.source {data} changed since {checkpoint} was written" in line
    assert "--fresh" in line and "restore the data" in line
    assert (root / "output" / "train.log").read_text() == log  # nothing launched
    assert [p.name for p in (root / "checkpoints").glob("checkpoint-*")] == ["checkpoint-2"]
    data.write_bytes(original)
    resumed = train(root, "--set", f"data.source={data}")
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming from {checkpoint}" in (root / "output" / "train.log").read_text()


def _truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def _overwrite_in_place(path: Path) -> None:
    """The same size, other bytes (a bad disk block, a stray write): what a size check cannot see."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("name", "corrupt", "said"),
    [
        ("optimizer.pt", _truncate, "optimizer.pt has"),
        ("trainer_state.json", _overwrite_in_place, "trainer_state.json does not hold what was written"),
    ],
    ids=["truncated", "same-size"],
)
def test_a_corrupt_newest_checkpoint_is_skipped_by_name(tmp_path, baseline, name, corrupt, said):
    root = tmp_path / "run"
    shutil.copytree(baseline, root, symlinks=True)
    shutil.rmtree(root / "model")
    corrupt(root / "checkpoints" / "checkpoint-4" / name)
    result = train(root)
    assert result.exit_code == 0, result.output
    assert "skipping" in result.output and f"checkpoint-4: {said}" in result.output.replace(
        f"{root / 'checkpoints'}/", ""
    )
    assert f"resuming from {root / 'checkpoints' / 'checkpoint-2'}" in result.output
    assert_same_adapter(root, baseline)
    assert (root / "checkpoints" / "checkpoint-4.incomplete" / name).exists()  # kept for the user


def _cli(root: Path, *extra: str, slow_save: int | None = None, background: bool = False) -> subprocess.Popen:
    """`toolkit train` in a session of its own; background: started as a shell starts `cmd &` (SIGINT ignored);
    slow_save: each checkpoint takes this many seconds longer (the CLI runs under the fault Python)."""
    args = ["train", "tiny-gpt-oss-local", "--target", "local", "--set", f"local.output_dir={root}", *extra]
    python, env = ([faults.PYTHON], faults.env(slow_save=slow_save)) if slow_save else ([sys.executable], {})
    return subprocess.Popen(
        [*python, "-m", "toolkit.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, **env, "CI": "1"},  # env: the fault Python's (the whole environment) or nothing
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None,
    )


def _wait_for_log(root: Path, text: str, timeout: float = 300) -> None:
    """The run's train.log has the text (the CLI draws a progress bar, not the log lines, without a terminal)."""
    log, deadline = root / "output" / "train.log", time.monotonic() + timeout
    while not (log.exists() and text in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"no {text!r} in {log} within {timeout} s"
        time.sleep(0.2)


def _wait_for(process: subprocess.Popen, text: str, timeout: float = 300) -> list[str]:
    assert process.stdout
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    for line in process.stdout:
        seen.append(line)
        if text in line or time.monotonic() > deadline:
            break
    return seen


def test_a_second_run_of_the_same_name_refuses_while_the_first_runs(tmp_path):
    root = tmp_path / "run"
    first = _cli(root, "--set", "training.max_steps=200", "--set", "training.save_steps=0")
    try:
        _wait_for_log(root, "[metrics] step=1/")
        holder = run_holder(root)
        assert holder and holder["pid"]
        second = train(root)
        assert second.exit_code == 2, second.output
        line = second.output.strip().splitlines()[-1]
        assert f"is already being trained by process {holder['pid']}" in line
        assert "toolkit jobs stop" in line and "Traceback" not in second.output
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    deadline = time.monotonic() + 30
    while run_holder(root) is not None and time.monotonic() < deadline:  # the trainer outlives its CLI: kill it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(holder["pid"]), signal.SIGKILL)
        time.sleep(0.2)
    assert run_holder(root) is None
    result = train(root)  # the lock of a run that is gone is taken over, and said so
    assert result.exit_code == 0, result.output
    assert "is gone; its lock is taken over" in result.output


def test_the_trainer_outlives_a_killed_cli_and_checkpoints_when_stopped_from_another_shell(tmp_path):
    """kill -9 of `toolkit train` alone (a closed terminal): the trainer used to write into the dead CLI's pipe and
    die of EPIPE at its next line, with no checkpoint. Its output now goes through the run's relay to the log: it
    trains on, and a stop from another shell checkpoints it; the same command then resumes from that checkpoint."""
    root = tmp_path / "run"
    long_run = ["--set", "training.max_steps=200", "--set", "training.save_steps=0"]
    cli = _cli(root, *long_run)
    _wait_for_log(root, "[metrics] step=1/")
    holder = run_holder(root)
    assert holder
    os.kill(cli.pid, signal.SIGKILL)  # the CLI alone: the run has its own session
    cli.wait()
    logged = _steps_logged(root)
    _wait_for_log(root, f"[metrics] step={logged + 3}/", timeout=120)  # three more lines written, none lost
    assert run_holder(root) == holder  # the same processes, still training

    running = _found_again(root, "training.max_steps=200")  # as `toolkit jobs stop` finds it
    running.stop()
    deadline = time.monotonic() + 120
    while run_holder(root) is not None:
        assert time.monotonic() < deadline, "the stopped run did not end"
        time.sleep(0.5)
    state = running.status()
    assert state.status.value == "Stopped" and "stopped with a checkpoint" in state.detail, state
    sealed = [p.name for p in (root / "checkpoints").iterdir() if p.name.startswith("checkpoint-")]
    assert len(sealed) == 1 and "incomplete" not in sealed[0], sealed
    assert f"resumes from {sealed[0]}" in state.detail


def _found_again(root: Path, *overrides: str):
    """The run's job handle as another shell's `toolkit jobs ...` finds it: by name, no process of this one."""
    from toolkit import job
    from toolkit.config import load_config

    config = load_config("tiny-gpt-oss-local", [f"local.output_dir={root}", *overrides])
    return job(config, config.name)


def _steps_logged(root: Path) -> int:
    text = (root / "output" / "train.log").read_text(errors="replace")
    return max(int(part.split("/", 1)[0]) for part in text.split("[metrics] step=")[1:])


def test_interrupt_twice_stops_at_once_and_says_where_the_next_run_resumes(tmp_path):
    root = tmp_path / "run"
    # the checkpoint the first Ctrl-C asks for takes 60 s (a test-only delay before its seal), so that the second
    # one certainly lands while it is being written; no earlier checkpoint (save_steps 0)
    # started as a shell starts a background job (SIGINT ignored): `kill -INT` must still reach it (it once did not)
    cli = _cli(root, "--set", "training.max_steps=200", "--set", "training.save_steps=0", slow_save=60, background=True)
    _wait_for_log(root, "[metrics] step=3/")
    cli.send_signal(signal.SIGINT)
    seen = _wait_for(cli, "interrupt again to stop at once")
    cli.send_signal(signal.SIGINT)
    rest, _ = cli.communicate(timeout=120)
    output = "".join(seen) + rest
    assert cli.returncode == 130, output
    assert output.count("stopped at once: no new checkpoint was written") == 1, output
    assert "the next run of the same command starts from the beginning (no complete checkpoint)" in output
    assert "Traceback" not in output
    assert run_holder(root) is None  # no process of the run is left


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem with room for the inputs and one checkpoint, not for the second (tmpfs, as root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("needs root to mount a tmpfs")
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_a_full_disk_fails_in_one_line_and_the_run_resumes_once_there_is_room(small_disk, baseline):
    root = small_disk / "run"
    result = train(root)
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert "out of disk space writing" in last and "local.output_dir" in last, result.output[-2000:]
    assert "Traceback" not in result.output.split("[toolkit] FAILED")[-1]
    later = _found_again(root).status()  # `toolkit jobs status` from another shell: no output/failure fitted
    assert later.status.value == "Failed" and "out of disk space writing" in later.detail, later
    subprocess.run(["mount", "-o", "remount,size=400m", str(small_disk)], check=True)
    result = train(root)
    assert result.exit_code == 0, result.output
    assert_same_adapter(root, baseline)


def test_a_read_only_output_dir_is_bad_input_in_one_line_and_nothing_is_launched(tmp_path):
    """A local.output_dir on a read-only file system (a real one: tmpfs mounted ro, as root) used to end in a
    49-line traceback with exit 1; it is bad input: exit 2, one line naming the setting, no process started."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("needs root to mount a tmpfs")
    try:
        result = train(mount / "run")
    finally:
        subprocess.run(["umount", "-l", str(mount)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: local.output_dir (--set local.output_dir=...): cannot write"), line
    assert "Read-only file system" in line, line
