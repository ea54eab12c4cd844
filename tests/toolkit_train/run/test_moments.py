"""The fault hook and the moments it listens to: one event name, and a Python started through the fault Python loads
the hook (so a switch that reaches nothing fails the tests that set it, never passes silently)."""

from __future__ import annotations

import subprocess

from toolkit_train.run import moments

from tests import faults


def test_the_hook_listens_to_the_event_the_run_raises():
    assert faults.hook.EVENT == moments.EVENT


def test_a_moment_reached_under_the_fault_python_with_its_switch_kills_the_process():
    probe = "from toolkit_train.run.moments import reached; reached('elsewhere'); print('alive'); reached('here')"
    killed = subprocess.run(faults.command("-c", probe), env=faults.env(fault="here"), capture_output=True, text=True)
    assert killed.returncode == -9
    assert killed.stdout.splitlines() == ["alive", "[toolkit] fault point here: killing the run"]
    untouched = subprocess.run(faults.command("-c", probe), env=faults.env(), capture_output=True, text=True)
    assert untouched.returncode == 0 and untouched.stdout == "alive\n"  # no switch: no hook
