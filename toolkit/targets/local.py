"""Local target: the real training entrypoint on this machine, in an /opt/ml-style tree, under torchrun.

The output directory IS the job's /opt/ml root, so it keeps everything a SageMaker job would have:
  input/config/hyperparameters.json, input/data/train (a link to local data), checkpoints/,
  model/{adapter,merged,run.json}, output/failure, output/train.log.
Running the same config again resumes from its newest checkpoint, exactly like a spot restart.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from toolkit.config import Config
from toolkit.entrypoints.settings import to_hyperparameters
from toolkit.resources import ENTRYPOINT
from toolkit.targets.base import Job, JobState, Status, Target, TargetError, complete_lines, tail
from toolkit.targets.jobtree import place_train_channel, settings_file, write_settings


def job_root(config: Config) -> Path:
    return Path(config.local.output_dir.format(name=config.name)).resolve()


def launch_command(config: Config) -> list[str]:
    nproc = config.local.nproc_per_node
    if nproc == 1:
        return [sys.executable, str(ENTRYPOINT)]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", str(ENTRYPOINT),
    ]  # fmt: skip


@dataclass
class LocalJob(Job):
    """Started here (process set) or found again from another shell (its process group id in output/job.pid)."""

    name: str
    root: Path
    process: subprocess.Popen | None = None
    stop_requested: bool = False  # torchrun exits 1 on SIGTERM even when the workers checkpointed cleanly
    stops_on_interrupt = True  # Ctrl-C checkpoints and stops a local run (rerun resumes)

    @property
    def log_path(self) -> Path:
        return self.root / "output" / "train.log"

    @property
    def pid_path(self) -> Path:
        return self.root / "output" / "job.pid"

    def _running_elsewhere(self) -> int | None:
        """The process group of a run started by another toolkit process, while it still runs."""
        try:
            pid = int(self.pid_path.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if ENTRYPOINT.name.encode() in cmdline or b"torch.distributed.run" in cmdline else None

    def artifacts(self) -> dict[str, str]:
        found = {}
        for kind in ("adapter", "merged"):
            path = self.root / "model" / kind
            if (path / "config.json").exists() or (path / "adapter_config.json").exists():
                found[kind] = str(path)
        return found

    def status(self) -> JobState:
        failure = self.root / "output" / "failure"
        code = self.process.poll() if self.process else None
        if (self.process and code is None) or (not self.process and self._running_elsewhere()):
            return JobState(self.name, Status.RUNNING)
        if failure.exists():
            return JobState(self.name, Status.FAILED, failure.read_text().strip())
        if self.stop_requested or code == 143 or (self.root / "output" / "stopped").exists():
            return JobState(self.name, Status.STOPPED, "stopped; run the same command again to resume")
        if code not in (None, 0):
            return JobState(self.name, Status.FAILED, f"exit code {code}; see {self.log_path}")
        if (self.root / "model" / "run.json").exists():
            return JobState(self.name, Status.COMPLETED, artifacts=self.artifacts())
        return JobState(self.name, Status.PENDING)

    def logs(self, follow: bool = False) -> Iterator[str]:
        offset = [0]

        def new_lines() -> Iterator[str]:
            lines, offset[0] = complete_lines(self.log_path, offset[0])
            yield from lines

        return tail(new_lines, lambda: self.status().status.finished, follow, poll=1)

    def stop(self) -> None:
        """SIGTERM, as a spot interruption: the entrypoint checkpoints and exits."""
        if self.process and self.process.poll() is None:
            self.stop_requested = True
            os.killpg(self.process.pid, signal.SIGTERM)
            return
        elsewhere = None if self.process else self._running_elsewhere()
        if elsewhere is None:
            raise TargetError(f"local job {self.name} is not running ({self.status().status.value})")
        self.stop_requested = True
        os.killpg(elsewhere, signal.SIGTERM)

    def wait(self, on_line: Callable[[str], None] | None = None, poll_seconds: float = 1) -> JobState:
        if self.process is None:  # found again: follow its log until it ends
            for line in self.logs(follow=True):
                if on_line:
                    on_line(line)
            while not self.status().status.finished:
                time.sleep(poll_seconds)
            return self.status()
        assert self.process.stdout
        with self.log_path.open("a") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                if on_line:
                    on_line(line.rstrip("\n"))
        self.process.wait()
        return self.status()


class LocalTarget(Target):
    name = "local"

    def render(self, config: Config) -> str:
        root = job_root(config)
        plan = {
            "root": str(root),
            "command": launch_command(config),
            "environment": {"TOOLKIT_ML_ROOT": str(root)},
            "hyperparameters": to_hyperparameters(config.train_settings()),
        }
        return json.dumps(plan, indent=2)

    def submit(self, config: Config, fresh: bool = False) -> LocalJob:
        root = job_root(config)
        self._lay_out(config, root, fresh)
        env = dict(os.environ, TOOLKIT_ML_ROOT=str(root), PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENTRYPOINT.parents[1]), env.get("PYTHONPATH")]))
        process = subprocess.Popen(
            launch_command(config),
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # Ctrl-C reaches us, not the trainer: we stop it cleanly
        )
        (root / "output").mkdir(parents=True, exist_ok=True)
        (root / "output" / "job.pid").write_text(str(process.pid))  # for `toolkit jobs` from another shell
        return LocalJob(config.name, root, process)

    def attach(self, config: Config, job_name: str) -> LocalJob:
        root = job_root(config)
        if job_name != config.name or not settings_file(root).exists():
            raise TargetError(
                f"no such local job {job_name!r}: a local job is named after its config and lives in "
                f"local.output_dir ({root}); start it with `toolkit train {config.name} --target local`"
            )
        return LocalJob(job_name, root)

    @staticmethod
    def _lay_out(config: Config, root: Path, fresh: bool) -> None:
        if config.data.source.startswith("s3://"):
            raise TargetError(
                f"data.source {config.data.source} is on S3: the local target reads local data; "
                "download it, or train with --target training-job"
            )
        if fresh:
            for stale in (root / "checkpoints", root / "model", root / "output"):
                shutil.rmtree(stale, ignore_errors=True)
        elif _has_checkpoints(root) and _settings_changed(config, root):
            raise TargetError(
                f"{root} holds checkpoints of a different config; resuming would mix runs. "
                "Pass --fresh to start over, or set local.output_dir to another directory"
            )
        for outcome in ("failure", "stopped"):  # of an earlier attempt: this one resumes it
            (root / "output" / outcome).unlink(missing_ok=True)
        write_settings(config, root)
        place_train_channel(config.data.source, root, copy=False)


def _has_checkpoints(root: Path) -> bool:
    return any((root / "checkpoints").glob("checkpoint-*"))


def _settings_changed(config: Config, root: Path) -> bool:
    written = settings_file(root)
    return written.exists() and json.loads(written.read_text()) != to_hyperparameters(config.train_settings())


TARGET = LocalTarget()
