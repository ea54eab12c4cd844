"""Tests only: every switch that makes a run misbehave on purpose, in one module, each unset in every job.

SIGKILL at a named moment (tests/toolkit/targets/test_faults.py, tests/toolkit_train/run/test_prepared.py), to prove
that what a kill leaves behind is complete or ignored; a slow save; a zero gradient; a log of the trained batches; every
FSDP rank loading the whole model."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

FAULT_POINT_ENV = "TOOLKIT_FAULT_POINT"
# Set by the local target for the processes of a run: their process group is the run's own, led by its output relay
# (toolkit/targets/relay.py), so a fault point may kill the whole group. Anywhere else (a CLI run by a test, in a
# CI whose runner leads the session) only the process itself is killed: the group would be the runner's.
RUN_GROUP_ENV = "TOOLKIT_RUN_OWNS_GROUP"
# Tests only (tests/toolkit_train/run/test_trained.py): the trainable parameters whose names match this regex get a zero
# gradient, as when a kernel's backward does not reach an adapter; the run must fail naming their group.
NO_GRADIENT_ENV = "TOOLKIT_TEST_NO_GRADIENT"
SLOW_SAVE_ENV = "TOOLKIT_TEST_SLOW_SAVE_SECONDS"  # a checkpoint save that takes this much longer
# (tests/toolkit_train/test_eval_split.py): append every training micro-batch's input_ids to this JSON Lines file,
# to prove that held-out rows never reach training.
BATCH_LOG_ENV = "TOOLKIT_TEST_BATCH_LOG"
# Tests and bench (tests/toolkit_train/run/test_fsdp_load.py, bench/fsdp_load_memory.py): every FSDP rank reads the
# whole base model, as before rank-0 loading (the path they compare against).
FSDP_EVERY_RANK_LOADS_ENV = "TOOLKIT_TEST_FSDP_EVERY_RANK_LOADS"


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


def with_fault_points(trainer_class: Any) -> Any:
    class FaultInjected(trainer_class):
        def _save_rng_state(self, *args, **kwargs):  # mid-save: model and optimizer written, trainer state not yet
            fault_point(f"checkpoint-save-{self.state.global_step}")
            return super()._save_rng_state(*args, **kwargs)

    return FaultInjected


def with_batch_log(trainer_class: Any, log_file: Path) -> Any:
    class BatchLogged(trainer_class):
        def training_step(self, model, inputs, *args, **kwargs):  # training batches only, never evaluation ones
            with log_file.open("a") as out:
                for row in inputs["input_ids"].tolist():
                    out.write(json.dumps(row) + "\n")
            return super().training_step(model, inputs, *args, **kwargs)

    return BatchLogged
