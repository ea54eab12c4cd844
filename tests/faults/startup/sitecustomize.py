"""The fault hook: Python imports this module at the start of every process the fault Python (tests/faults/python)
starts, and of their children (its folder is first on their PYTHONPATH). Where a switch below is set, it installs an
audit hook that acts on the run's moments (toolkit_train/run/moments.py); else it does nothing. Standard library only:
it starts in every process of a run, the output relay's too, before anything of the toolkit is importable."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

# = toolkit_train.run.moments.EVENT (tests/toolkit_train/run/test_moments.py holds them equal)
EVENT = "toolkit_train.moment"
FAULT_POINT = "TOOLKIT_FAULT_POINT"  # SIGKILL the run at this moment (rank 0's)
SLOW_SAVE = "TOOLKIT_TEST_SLOW_SAVE_SECONDS"  # a checkpoint that takes this much longer before its seal
# the trainable parameters whose names match this regex get a zero gradient, as when a kernel's backward does not
# reach an adapter (tests/toolkit_train/run/test_trained.py: the run must fail naming their group)
NO_GRADIENT = "TOOLKIT_TEST_NO_GRADIENT"
# append every training micro-batch's input_ids to this JSON Lines file (held-out rows never reach training)
BATCH_LOG = "TOOLKIT_TEST_BATCH_LOG"
# every FSDP rank reads the whole base model, as before rank-0 loading (the path the FSDP load test and its bench
# compare against: trainer.loads_from_rank0)
EVERY_RANK_LOADS = "TOOLKIT_TEST_FSDP_EVERY_RANK_LOADS"
SWITCHES = (FAULT_POINT, SLOW_SAVE, NO_GRADIENT, BATCH_LOG, EVERY_RANK_LOADS)
RELAY_SCRIPT = "relay.py"  # toolkit/targets/relay.py: a local run's session leader, which reports the run's death


def install() -> None:
    """Where a switch is set: the audit hook, and every Python this process starts (torchrun's ranks, a local run's
    relay and trainer, all started as sys.executable) is the fault Python too."""
    if any(os.environ.get(name) for name in SWITCHES):
        sys.addaudithook(_on_event)
        sys.executable = str(Path(__file__).resolve().parents[1] / "python")


def _on_event(event: str, arguments: tuple) -> None:
    if event == EVENT:  # every other audit event (open, import, exec...) passes untouched
        _on_moment(arguments[0], arguments[1:])


def _on_moment(moment: str, objects: tuple) -> None:
    if moment == "load-model" and os.environ.get(EVERY_RANK_LOADS):
        sys.modules["toolkit_train.run.trainer"].loads_from_rank0 = lambda settings: False  # type: ignore[attr-defined]
    if moment == "model-loaded" and os.environ.get(NO_GRADIENT):
        _starve(objects[0], os.environ[NO_GRADIENT])
    if moment == "trainer-built":
        _instrument(objects[0])
    kill_if_asked(moment)
    if moment.startswith("before-seal-") and _rank() == 0:
        time.sleep(float(os.environ.get(SLOW_SAVE) or 0))


def kill_if_asked(moment: str) -> None:
    """SIGKILL the run at this moment when asked: in a local run (its own session, led by the output relay) every
    process of the run's group but the relay (the trainer's processes die, the relay reports it, as after a crash
    or the OOM killer), else only this process (in a CI whose runner leads the session, the group is the runner's)."""
    if os.environ.get(FAULT_POINT) != moment or _rank() != 0:
        return
    print(f"[toolkit] fault point {moment}: killing the run", flush=True)
    group = os.getpgrp()
    if _led_by_the_relay(group):
        for pid in _group_members(group) - {group, os.getpid()}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _led_by_the_relay(group: int) -> bool:
    if os.getsid(0) != group:
        return False
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{group}/cmdline").read_bytes().split(b"\0")
        return any(Path(os.fsdecode(arg)).name == RELAY_SCRIPT for arg in argv[1:3])
    return False


def _group_members(group: int) -> set[int]:
    """The processes of a process group (Linux /proc: stat's fifth field is the group)."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == group:
                members.add(int(stat.parent.name))
    return members


def _starve(model: Any, pattern: str) -> None:
    import re

    for name, parameter in model.named_parameters():
        if parameter.requires_grad and re.search(pattern, name):
            parameter.register_hook(lambda grad: grad * 0)


def _instrument(trainer: Any) -> None:
    """The built trainer's own moments: each step's start and the middle of a checkpoint save (model and optimizer
    written, trainer state not yet) for FAULT_POINT; each training micro-batch for BATCH_LOG."""
    if os.environ.get(FAULT_POINT):
        from transformers import TrainerCallback

        class StepStarts(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                kill_if_asked(f"step-{state.global_step + 1}")  # killed while that step runs

        trainer.add_callback(StepStarts())
        save_rng_state = trainer._save_rng_state

        def mid_save(*args, **kwargs):
            kill_if_asked(f"checkpoint-save-{trainer.state.global_step}")
            return save_rng_state(*args, **kwargs)

        trainer._save_rng_state = mid_save
    if os.environ.get(BATCH_LOG):
        log_file, training_step = Path(os.environ[BATCH_LOG]), trainer.training_step

        def logged(model, inputs, *args, **kwargs):  # training batches only, never evaluation ones
            with log_file.open("a") as out:
                for row in inputs["input_ids"].tolist():
                    out.write(json.dumps(row) + "\n")
            return training_step(model, inputs, *args, **kwargs)

        trainer.training_step = logged


if __name__ == "sitecustomize":  # at a process's start; not when the tests load it for its names
    install()
