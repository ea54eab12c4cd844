"""Faults on purpose, from outside what the jobs ship: the run raises named moments (toolkit_train/run/moments.py:
Python audit events), and the fault hook (startup/sitecustomize.py), loaded in every process the fault Python
(`python` here) starts, acts on them when a switch asks: SIGKILL at a moment, a slow checkpoint, a starved gradient,
a log of the trained batches, every FSDP rank loading the model.

    subprocess.run(faults.command(ENTRYPOINT), env=faults.env(entrypoint_env(root), fault="step-3"))
    with faults.switched(fault="step-3"):  # a CLI run in this process (CliRunner): the processes it starts
        CliRunner().invoke(app, [...])
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

PYTHON = str(Path(__file__).with_name("python"))
BASE_PYTHON = "TOOLKIT_FAULTS_PYTHON"  # the Python the fault Python runs (this one)


def _load_hook():
    spec = importlib.util.spec_from_file_location("toolkit_faults_hook", Path(__file__).parent / "startup" /
                                                  "sitecustomize.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _load_hook()  # its switches' names, and its EVENT (tests/toolkit_train/run/test_moments.py)
SWITCHES = {
    "fault": hook.FAULT_POINT,
    "slow_save": hook.SLOW_SAVE,
    "no_gradient": hook.NO_GRADIENT,
    "batch_log": hook.BATCH_LOG,
    "every_rank_loads": hook.EVERY_RANK_LOADS,
}


def env(base: Mapping[str, str] | None = None, **switches: object) -> dict[str, str]:
    """base (default: this process's environment) without any switch, with these set (None: left unset) and the
    Python the fault Python runs."""
    unknown = switches.keys() - SWITCHES.keys()
    assert not unknown, f"no switch {sorted(unknown)}: one of {sorted(SWITCHES)}"
    result = {k: v for k, v in (os.environ if base is None else base).items() if k not in SWITCHES.values()}
    result.update({SWITCHES[name]: str(value) for name, value in switches.items() if value is not None})
    result[BASE_PYTHON] = sys.executable
    return result


def command(*args: object) -> list[str]:
    """The fault Python with these arguments (a script, `-m module`...)."""
    return [PYTHON, *map(str, args)]


@contextlib.contextmanager
def switched(**switches: object) -> Iterator[None]:
    """For a CLI run in this process (CliRunner): the processes it starts (a local run's relay and trainer, started
    as sys.executable) run under the fault Python with these switches; this process's environment and
    sys.executable come back after."""
    saved_env, saved_python = dict(os.environ), sys.executable
    os.environ.clear()
    os.environ.update(env(saved_env, **switches))
    sys.executable = PYTHON
    try:
        yield
    finally:
        sys.executable = saved_python
        os.environ.clear()
        os.environ.update(saved_env)
