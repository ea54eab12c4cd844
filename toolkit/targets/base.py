"""The one small interface every training target implements, and the registry that picks one by name.

Adding a target = one module with a `TARGET` object (a `Target`) whose jobs are `Job`s, and its settings section
(toolkit/config/targets.py), which registers the module under the target's name; nothing else changes.
Both are abstract: a target that leaves a method out cannot be instantiated, and
tests/toolkit/targets/test_contract.py runs the same contract against every target.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.errors import BadInput, Failed

if TYPE_CHECKING:
    from toolkit_train.metrics import Metrics

    from toolkit.config import Config


class Status(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"

    @property
    def finished(self) -> bool:
        return self in (Status.COMPLETED, Status.FAILED, Status.STOPPED)


@dataclass(frozen=True, eq=False)
class Artifacts(Mapping[str, str]):
    """Where a completed run's outputs are, the same kinds on every target: the adapter, the merged model, and the
    model prefix an endpoint serves where the target already has one (a training job's S3 output). Read as a
    mapping of the kinds that are there (`for kind, where in artifacts.items()`)."""

    adapter: str | None = None
    merged: str | None = None
    model: str | None = None

    @classmethod
    def in_run_dir(cls, model_dir: Path) -> Artifacts:
        """A run directory's model/ (local, the shared filesystem as this machine sees it): what is there, whole
        (adapter/ and merged/ appear under their names only once complete)."""
        found = {kind: str(model_dir / kind) for kind in ("adapter", "merged") if (model_dir / kind).is_dir()}
        return cls(**found)

    def _present(self) -> dict[str, str]:
        return {kind: where for kind in ("model", "adapter", "merged") if (where := getattr(self, kind))}

    def __getitem__(self, kind: str) -> str:
        return self._present()[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._present())

    def __len__(self) -> int:
        return len(self._present())


@dataclass
class JobState:
    name: str
    status: Status
    detail: str = ""  # failure reason, secondary status, ...
    artifacts: Artifacts = field(default_factory=Artifacts)


class Job(ABC):
    """A training run on some target, submitted now or found again later (from any machine)."""

    name: str
    # Ctrl-C while following: True stops the job (it checkpoints); False detaches and the job runs on
    stops_on_interrupt: bool = False

    @abstractmethod
    def status(self) -> JobState:
        """Where the job is; a completed job names its artifacts (adapter, merged model)."""

    @abstractmethod
    def logs(self, follow: bool = False) -> Iterator[str]:
        """The job's log lines so far; with follow, new ones until it ends."""

    @abstractmethod
    def stop(self, now: bool = False) -> None:
        """Ask the job to checkpoint and stop; `TargetError` when that cannot be done. now: end it at once, without
        a checkpoint (a second Ctrl-C), where the target can; others stop as without it."""

    @abstractmethod
    def wait(self, on_line: Callable[[str], None] | None = None, poll_seconds: float = 2) -> JobState:
        """Block until the job ends, passing each log or status line to on_line; returns the final state."""

    def follow(
        self, on_progress: Callable[[Metrics], None] | None = None, on_line: Callable[[str], None] | None = None
    ) -> JobState:
        """wait(), with the entrypoint's `[metrics]` lines given to on_progress (parsed) and every other line to
        on_line, and the interrupt policy of every target: Ctrl-C or SIGTERM (a CI runner cancelling) either
        detaches (`JobDetached`: the job runs on) or, on targets whose jobs die with this process, asks the job to
        checkpoint and stop, waits for it and raises `JobInterrupted`; an interrupt during that stop ends the job
        at once (no new checkpoint). The notices go to on_line as `[toolkit]` lines."""
        from toolkit_train.metrics import parse_metrics

        def each(line: str) -> None:
            metrics = parse_metrics(line)
            if metrics is not None and on_progress is not None:
                on_progress(metrics)
            elif metrics is None and on_line is not None:
                on_line(line)

        with _interrupts_raise():
            try:
                return self.wait(each)
            except KeyboardInterrupt:
                if not self.stops_on_interrupt:
                    raise JobDetached(self.name) from None
            with _interrupts_call(self._stop_now):  # before the notice: a second interrupt may follow it at once
                each(INTERRUPT_NOTICE)
                self._stop_unless_ended(now=False)
                raise JobInterrupted(self.wait(each))

    def _stop_now(self) -> None:
        self._stop_unless_ended(now=True)

    def _stop_unless_ended(self, now: bool) -> None:
        with contextlib.suppress(BadInput, Failed):  # it may have ended meanwhile (or a second interrupt ended it)
            self.stop(now=now)


class Target(ABC):
    """Where jobs run: renders, submits and finds jobs."""

    name: str

    @abstractmethod
    def render(self, config: Config) -> str:
        """What submit would send, for --dry-run: nothing is created, nothing is called."""

    @abstractmethod
    def submit(self, config: Config, fresh: bool = False) -> Job:
        """Start the job (fresh: drop earlier checkpoints and outputs of this config instead of resuming)."""

    @abstractmethod
    def attach(self, config: Config, job_name: str) -> Job:
        """A handle on an existing job; `TargetError` ("no such ... job") when the target does not know it."""

    # The hand-over to deploy and the registry: they ask these two, never a named target.
    @abstractmethod
    def latest(self, config: Config) -> JobState | None:
        """The newest completed run of this config on this target (with its artifacts), or None."""

    @abstractmethod
    def servable_model(self, config: Config, dry_run: bool = False) -> str:
        """The S3 prefix an endpoint serves for the newest completed run, made available there once (uploaded or
        exported from where the target keeps it); a dry run names it and moves nothing. `TargetError` (saying
        how to get one) when there is no completed run."""


INTERRUPT_NOTICE = "[toolkit] interrupted: asking the job to checkpoint and stop ... (interrupt again to stop at once)"


class JobDetached(KeyboardInterrupt):
    """Following was interrupted; the job runs on (exit 130)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


class JobInterrupted(KeyboardInterrupt):
    """Following was interrupted and the job stopped (checkpointed, unless stopped at once); exit 130."""

    def __init__(self, state: JobState):
        super().__init__(state.name)
        self.state = state


@contextlib.contextmanager
def _interrupts_raise():
    """SIGINT and SIGTERM raise KeyboardInterrupt while following (main thread only: elsewhere no handler). SIGINT
    too, explicitly: a process started in the background by a shell (`toolkit train ... &`, a CI step) inherits
    SIGINT ignored, and Python then installs no handler of its own, so `kill -INT` did nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _interrupts_call(action: Callable[[], None]):
    """While a stop is under way, a further Ctrl-C or SIGTERM calls `action` instead of raising."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: action()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def tail(new_lines: Callable[[], Iterator[str]], finished: Callable[[], bool], follow: bool, poll: float):
    """Lines as they arrive; with follow, until the job has finished (then the last ones)."""
    import time

    while True:
        yield from new_lines()
        if not follow or finished():
            yield from new_lines()
            return
        time.sleep(poll)


def complete_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """The complete lines a growing log file gained after byte `offset`, and the offset after them (bytes, so a
    multi-byte character split across two reads is never decoded in halves)."""
    if not path.exists():
        return [], offset
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read()
    complete = data.rfind(b"\n") + 1
    return data[:complete].decode("utf-8", errors="replace").splitlines(), offset + complete


class TargetError(BadInput):
    """The target cannot run this job (exit 2); the message says why and what to do."""


class TargetFailed(Failed, TargetError):
    """An operation on a job that the target had accepted failed (exit 1; still a TargetError)."""


def get_target(name: str) -> Target:
    """The target registered under `name` (its settings section names the module holding `TARGET`)."""
    from toolkit.config.targets import TARGET_SETTINGS

    try:
        module_name = TARGET_SETTINGS[name].module
    except KeyError:
        raise TargetError(f"unknown target {name!r}; choose one of: {', '.join(TARGET_SETTINGS)}") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise TargetError(f"target {name!r} is not built yet in this version of the toolkit") from None
    return module.TARGET
