"""The one small interface every training target implements, and the registry that picks one by name.

Adding a target = one module with a `TARGET` object; nothing else changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from toolkit.config import Config

# target name -> module holding `TARGET`
TARGET_MODULES = {
    "local": "toolkit.targets.local",
    "training-job": "toolkit.targets.training_job",
    "hyperpod": "toolkit.targets.hyperpod",
}


class Status(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPED = "Stopped"

    @property
    def finished(self) -> bool:
        return self in (Status.COMPLETED, Status.FAILED, Status.STOPPED)


@dataclass
class JobState:
    name: str
    status: Status
    detail: str = ""  # failure reason, secondary status, ...
    artifacts: dict[str, str] = field(default_factory=dict)  # adapter / merged model locations


class Job(Protocol):
    name: str

    def status(self) -> JobState: ...

    def logs(self, follow: bool = False) -> Iterator[str]: ...

    def stop(self) -> None: ...

    def wait(self, on_line: Callable[[str], None] | None = None) -> JobState: ...


class Target(Protocol):
    name: str

    def render(self, config: Config) -> str:
        """What submit would send, for --dry-run: nothing is created."""
        ...

    def submit(self, config: Config, fresh: bool = False) -> Job: ...

    def attach(self, config: Config, job_name: str) -> Job: ...


def tail(new_lines: Callable[[], Iterator[str]], finished: Callable[[], bool], follow: bool, poll: float):
    """Lines as they arrive; with follow, until the job has finished (then the last ones)."""
    import time

    while True:
        yield from new_lines()
        if not follow or finished():
            yield from new_lines()
            return
        time.sleep(poll)


def job_requirements(config: Config) -> str:
    """The requirements file a job installs: the locked training stack, plus MLflow's client only when asked."""
    from toolkit.resources import MLFLOW_LOCK, TRAINING_LOCK

    text = TRAINING_LOCK.read_text()
    if "mlflow" in config.train_settings().training.report_to:
        text += MLFLOW_LOCK.read_text()
    return text


class TargetError(Exception):
    """The target cannot run this job; the message says why and what to do."""


def get_target(name: str) -> Target:
    try:
        module_name = TARGET_MODULES[name]
    except KeyError:
        raise TargetError(f"unknown target {name!r}; choose one of: {', '.join(TARGET_MODULES)}") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise TargetError(f"target {name!r} is not built yet in this version of the toolkit") from None
    return module.TARGET
