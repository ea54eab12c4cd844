"""Tests only (tests/toolkit/targets/test_faults.py, tests/toolkit_train/test_prepared.py): SIGKILL at a named
moment, to prove that what a kill leaves behind is complete or ignored. `TOOLKIT_FAULT_POINT` is unset in every job."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

FAULT_POINT_ENV = "TOOLKIT_FAULT_POINT"
# Set by the local target for the processes of a run: their process group is the run's own, led by its output relay
# (toolkit/targets/relay.py), so a fault point may kill the whole group. Anywhere else (a CLI run by a test, in a
# CI whose runner leads the session) only the process itself is killed: the group would be the runner's.
RUN_GROUP_ENV = "TOOLKIT_RUN_OWNS_GROUP"
# Tests only (tests/toolkit_train/test_trained.py): the trainable parameters whose names match this regex get a zero
# gradient, as when a kernel's backward does not reach an adapter; the run must fail naming their group.
NO_GRADIENT_ENV = "TOOLKIT_TEST_NO_GRADIENT"


def fault_point(moment: str) -> None:
    """SIGKILL the run at this moment when a test asks for it: in a local run's own session (RUN_GROUP_ENV) every
    process of the run's group but its leader, the output relay (toolkit/targets/relay.py: the trainer's processes
    die, the relay reports it, as after a crash or the OOM killer), else only this process."""
    if os.environ.get(FAULT_POINT_ENV) != moment or os.environ.get("RANK", "0") != "0":
        return
    print(f"[toolkit] fault point {moment}: killing the run", flush=True)
    group = os.getpgrp()
    if os.environ.get(RUN_GROUP_ENV) and os.getsid(0) == group:
        for pid in _group_members(group) - {group, os.getpid()}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _group_members(group: int) -> set[int]:
    """The processes of a process group (Linux /proc: stat's fifth field is the group)."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == group:
                members.add(int(stat.parent.name))
    return members


def starve_for_test(model) -> None:
    """Zero the gradient of the trainable parameters NO_GRADIENT_ENV names (nothing when it is unset)."""
    import re

    pattern = os.environ.get(NO_GRADIENT_ENV)
    if not pattern:
        return
    for name, parameter in model.named_parameters():
        if parameter.requires_grad and re.search(pattern, name):
            parameter.register_hook(lambda grad: grad * 0)
