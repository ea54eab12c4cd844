"""Local target: the real training entrypoint on this machine, in an /opt/ml-style tree, under torchrun.

The output directory IS the job's /opt/ml root, so it keeps everything a SageMaker job would have:
  input/config/hyperparameters.json, input/data/train (a link to local data), checkpoints/,
  model/{adapter,merged,run.json}, output/failure, output/train.log, and run.lock (jobtree: one writer per run,
  held by the run's processes; it also says whether the run is alive).
Running the same config again resumes from its newest complete checkpoint, exactly like a spot restart.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from toolkit_train.layout import ML_ROOT_ENV, RunRecord, RunTree
from toolkit_train.run import trained
from toolkit_train.settings import FAILED_PREFIX, failure_elsewhere, to_hyperparameters

from toolkit import errors
from toolkit.config import Config
from toolkit.files import write_atomically
from toolkit.resources import ENTRY_SCRIPT
from toolkit.targets import relay
from toolkit.targets.base import (
    Job,
    Run,
    RunToRegister,
    Status,
    Target,
    TargetError,
    TargetFailed,
    complete_lines,
    tail,
)
from toolkit.targets.jobtree import (
    RunBusy,
    completed_run,
    place_train_channel,
    prepare_run_dir,
    resume_hint,
    run_holder,
    settings_file,
    stage_code,
    stop_record,
    take_run_lock,
)
from toolkit.targets.relay import LOG_ERROR_PREFIX

STOPPED_AT_ONCE, STOP_WITH_CHECKPOINT = "at once", "checkpoint"  # what a stop record says was sent
RELAY = str(Path(relay.__file__))  # run by path: the run's PYTHONPATH holds the staged training code alone


def log_file(root: Path) -> Path:
    return RunTree(root).train_log


def job_root(config: Config) -> Path:
    return Path(config.local.output_dir.format(name=config.name)).resolve()


def launch_command(config: Config) -> list[str]:
    """The staged code's entry script (jobtree.stage_code into <run>/code), as every other target runs it."""
    script = str(job_root(config) / "code" / ENTRY_SCRIPT)
    nproc = config.local.nproc_per_node
    if nproc == 1:
        return [sys.executable, script]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script]


@dataclass
class LocalJob(Job):
    """Started here (process set) or found again from another shell (its run lock names its process group)."""

    name: str
    root: Path
    process: subprocess.Popen | None = None
    stop_requested: bool = False  # torchrun exits 1 on SIGTERM even when the workers checkpointed cleanly
    killed: bool = False  # stopped at once (a second Ctrl-C): no checkpoint was written
    notes: list[str] = field(default_factory=list)  # said first when following (a stale lock taken over)
    last_error: str = ""  # the trainer's FAILED line, for when it could not write output/failure (disk full)
    log_error: str = ""  # why train.log stopped being written
    stops_on_interrupt = True  # Ctrl-C checkpoints and stops a local run (rerun resumes)

    @property
    def log_path(self) -> Path:
        return log_file(self.root)

    def _running_elsewhere(self) -> int | None:
        """The process group of a run started by another toolkit process, while any of its processes lives."""
        holder = run_holder(self.root)
        return None if holder is None else int(holder.get("pid", 0)) or None

    def status(self) -> Run:
        tree = RunTree(self.root)
        failure = next((p for p in (tree.failure, failure_elsewhere(self.root)) if p.exists()), tree.failure)
        code = self.process.poll() if self.process else None
        if (self.process and code is None) or (not self.process and self._running_elsewhere()):
            return Run(self.name, Status.RUNNING)
        resume = resume_hint(self.root)
        asked = self._stop_asked()  # by this handle, or recorded by whoever sent it (another shell's CLI)
        if self.killed or asked == STOPPED_AT_ONCE:
            return Run(self.name, Status.STOPPED, f"stopped at once: no new checkpoint was written; {resume}")
        if failure.exists():
            reason = failure.read_text(errors="replace").strip() or self._why_it_ended(code)
            return Run(self.name, Status.FAILED, f"{reason}; {resume}")
        if tree.stopped.exists():  # the trainer writes it once its stop's checkpoint is saved
            return Run(self.name, Status.STOPPED, f"stopped with a checkpoint; {resume}")
        if self.stop_requested or asked or code == 143:  # stopped before training began (loading): nothing saved
            return Run(self.name, Status.STOPPED, f"stopped before it wrote a checkpoint; {resume}")
        if code not in (None, 0):
            return Run(self.name, Status.FAILED, f"{self._why_it_ended(code)}; {resume}")
        if tree.completed():
            return Run.completed_in(self.name, self.root, _what_trained(self.root))
        if settings_file(self.root).exists():  # started, and every process of it is gone without an outcome
            return Run(self.name, Status.FAILED, f"{self._why_it_ended(None)}; {resume}")
        return Run(self.name, Status.PENDING)

    def _stop_asked(self) -> str | None:
        """What the run's stop record says was sent (STOPPED_AT_ONCE or STOP_WITH_CHECKPOINT), or None."""
        try:
            return stop_record(self.root).read_text().strip() or STOP_WITH_CHECKPOINT
        except OSError:
            return None

    def _why_it_ended(self, code: int | None) -> str:
        reason = self._reason(code)
        return f"{reason} ({self.log_error})" if self.log_error else reason

    def _reason(self, code: int | None) -> str:
        if self.last_error:
            return self.last_error
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name} (out of memory, kill -9?); see {self.log_path}"
        if code is not None:
            return f"exit code {code}; see {self.log_path}"
        free = _free_bytes(self.root)
        if free is not None and free < LOW_DISK_BYTES:  # no record and no room to write one: say what is likely
            return (
                f"its processes ended without an outcome, and {self.root}'s disk has {free // 2**20} MiB free: most "
                f"likely out of disk space; free some and run the same command again; see {self.log_path}"
            )
        return f"its processes ended without an outcome (killed, or the machine went down); see {self.log_path}"

    def logs(self, follow: bool = False) -> Iterator[str]:
        offset = [0]

        def new_lines() -> Iterator[str]:
            lines, offset[0] = complete_lines(self.log_path, offset[0])
            yield from lines

        return tail(new_lines, lambda: self.status().status.finished, follow, poll=1)

    def stop(self, now: bool = False) -> None:
        """SIGTERM, as a spot interruption: the entrypoint checkpoints and exits. now: SIGKILL, no checkpoint."""
        group = self.process.pid if self.process and self.process.poll() is None else None
        if group is None and self.process is None:
            group = self._running_elsewhere()
        if group is None:
            raise TargetError(f"local job {self.name} is not running ({self.status().status.value})")
        # a stop at once is never undone: the first interrupt's checkpoint request may be sent after the second
        # interrupt's kill (the notice that invites it comes first), and must not report a checkpointed stop
        self.stop_requested, self.killed = True, self.killed or now
        self._record_stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL if now else signal.SIGTERM)

    def _record_stop(self) -> None:
        """Written down before the signal goes: a run stopped before its first checkpoint writes no record of its
        own, and `toolkit jobs status` from another shell must say what this one says (Stopped, not killed). A
        stop at once is never overwritten by a later checkpoint request (see above). Best effort: a record that
        cannot be written (a full disk) does not keep the stop from being sent."""
        record = stop_record(self.root)
        with contextlib.suppress(OSError):
            if self.killed or self._stop_asked() != STOPPED_AT_ONCE:
                record.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(record, (STOPPED_AT_ONCE if self.killed else STOP_WITH_CHECKPOINT) + "\n")

    def wait(self, on_line: Callable[[str], None] | None = None, poll_seconds: float = 1) -> Run:
        if self.process is None:  # found again: follow its log until it ends
            for line in self.logs(follow=True):
                if on_line:
                    on_line(line)
            while not self.status().status.finished:
                time.sleep(poll_seconds)
            return self.status()
        for note in self.notes:
            if on_line:
                on_line(note)
        self.notes = []
        assert self.process.stdout
        for line in self.process.stdout:  # the relay's copy of what it writes to the log (toolkit/targets/relay.py)
            if line.startswith(FAILED_PREFIX):
                self.last_error = line[len(FAILED_PREFIX) :].strip()
            if line.startswith(LOG_ERROR_PREFIX):
                self.log_error = line[len(LOG_ERROR_PREFIX) :].strip()
            if on_line:
                on_line(line.rstrip("\n"))
        self.process.wait()
        self._wait_until_released()
        return self.status()

    def _wait_until_released(self, seconds: float = 30) -> None:
        """The relay ended; the trainer's processes may end a moment later (killed with the relay, their exit still
        under way): return once none holds the run (its lock), so "ended" means nothing of it is left."""
        deadline = time.monotonic() + seconds
        while run_holder(self.root) is not None and time.monotonic() < deadline:
            time.sleep(0.1)


class LocalTarget(Target):
    name = "local"

    def render(self, config: Config) -> str:
        root = job_root(config)
        plan = {
            "root": str(root),
            "command": launch_command(config),
            "environment": {ML_ROOT_ENV: str(root)},
            "hyperparameters": to_hyperparameters(config.train_settings()),
        }
        return json.dumps(plan, indent=2)

    def submit(self, config: Config, fresh: bool = False) -> LocalJob:
        root = job_root(config)
        try:  # before anything of the run is touched: a second writer would mix two runs in one directory
            lock = take_run_lock(root)
        except RunBusy as busy:
            raise TargetError(_busy(config, root, busy.owner)) from None
        except OSError as exc:
            raise _unwritable(root, exc) from None
        try:
            try:
                self._lay_out(config, root, fresh)
            except OSError as exc:
                raise _unwritable(root, exc) from None
            env = dict(os.environ, PYTHONUNBUFFERED="1", **{ML_ROOT_ENV: str(root)})
            env["PYTHONPATH"] = str(root / "code")  # the staged code alone: no toolkit module is a top-level name
            through_relay = [sys.executable, RELAY, str(log_file(root)), str(lock.fd), "--"]
            process = subprocess.Popen(
                through_relay + launch_command(config),
                cwd=root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # Ctrl-C reaches us, not the trainer: we stop it cleanly
                pass_fds=(lock.fd,),  # the run's processes hold the lock as long as they live
                # the relay writes the log and copies it here: a dead CLI (kill -9, a closed terminal) ends only
                # the copy, never the trainer
            )
            lock.record(pid=process.pid)  # its process group, for `toolkit jobs` from another shell
        finally:
            lock.release()
        job = LocalJob(config.name, root, process)
        if lock.previous and lock.previous.get("pid"):
            job.notes.append(
                f"[toolkit] the run's earlier process {lock.previous['pid']} ({lock.previous.get('started', '?')}) "
                "is gone; its lock is taken over"
            )
        return job

    def attach(self, config: Config, job_name: str) -> LocalJob:
        root = job_root(config)
        if job_name != config.name or not settings_file(root).exists():
            raise TargetError(
                f"no such local job {job_name!r}: a local job is named after its config and lives in "
                f"local.output_dir ({root}); start it with `toolkit train {config.name} --target local`"
            )
        return LocalJob(job_name, root)

    def latest(self, config: Config) -> Run | None:
        return completed_run(config.name, job_root(config))

    def servable_model(self, config: Config, dry_run: bool = False) -> str:
        """A config whose target is local reaches SageMaker by `toolkit train --target training-job`: its newest
        completed job is what an endpoint serves (a local run is served here, `toolkit deploy --target local`, or
        from S3 through serving.model_data)."""
        from toolkit.targets.base import get_target

        return get_target("training-job").servable_model(config, dry_run)

    def run_to_register(self, config: Config, job_name: str | None = None) -> RunToRegister:
        """As `servable_model`: a model package records a training job (the registry serves from S3), so a local
        config registers its newest completed training job (or `job_name`)."""
        from toolkit.targets.base import get_target

        return get_target("training-job").run_to_register(config, job_name)

    # What plan and serving ask: this machine's GPUs are rented from no one; the model a run makes is here.
    unrented = "this machine's GPUs are not in the price or quota tables"
    model_is_here = True

    @staticmethod
    def _lay_out(config: Config, root: Path, fresh: bool) -> None:
        for name, source in config.data.channels().items():
            if source.startswith("s3://"):
                field = "data.source" if name == "train" else "data.eval.source"
                raise TargetError(
                    f"{field} {source} is on S3: the local target reads local data; "
                    "download it, or train with --target training-job"
                )
        prepare_run_dir(config, root, fresh)
        stage_code(root / "code", config)
        for name, source in config.data.channels().items():
            place_train_channel(source, root, copy=False, name=name)


def _what_trained(root: Path) -> str:
    """The run record's line of what trained (toolkit_train/run/trained.py); empty for a run recorded without one."""
    record = RunRecord.read(RunTree(root).run_record)
    summary = record.trained if record is not None else {}
    return trained.line(summary, summary.get("paths", {})) if summary.get("groups") is not None else ""


LOW_DISK_BYTES = 64 * 2**20  # less free space than this where a run ended without a record: the disk filled up


def _free_bytes(root: Path) -> int | None:
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return None


def _unwritable(root: Path, exc: OSError) -> Exception:
    """A run directory that cannot be written; nothing is launched either way."""
    setting = "local.output_dir (--set local.output_dir=...)"
    return errors.unwritable(exc, root, setting, TargetError, TargetFailed, outcome="nothing was launched")


def _busy(config: Config, root: Path, owner: dict) -> str:
    who = f"process {owner.get('pid', '?')} on {owner.get('host', '?')} since {owner.get('started', '?')}"
    return (
        f"run {config.name} ({root}) is already being trained by {who}: follow it with "
        f"`toolkit jobs logs CONFIG {config.name} --follow`, stop it with "
        f"`toolkit jobs stop CONFIG {config.name}`, or set local.output_dir to train another copy"
    )


TARGET = LocalTarget()
