"""The named moments of a run, raised as Python audit events (sys.audit, PEP 578) with the objects involved: the
model loaded, the trainer built, a checkpoint's files written but not yet sealed, a prepared dataset set aside.

Nothing in the package listens. Whoever installs an audit hook in the process sees them: the crash tests do
(tests/faults/: SIGKILL at a moment, a slow save, a starved gradient), from outside what the jobs ship. With no hook
installed an event costs one function call."""

from __future__ import annotations

import sys

EVENT = "toolkit_train.moment"


def reached(moment: str, *objects: object) -> None:
    """This moment of the run has come; objects: what a listener may look at (the model, the trainer, the settings)."""
    sys.audit(EVENT, moment, *objects)
