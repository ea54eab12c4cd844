"""PID 1 of the toolkit's SageMaker training container: run the job's command and pass stop signals on.

SageMaker stops a job (StopTrainingJob, a spot interruption, max run time) with SIGTERM to the container's PID 1.
The SDK's own PID 1 is `bash -c "... sm_train.sh"`, which neither forwards the signal nor dies of it (the kernel
shields PID 1 from signals it has no handler for), so torchrun and the ranks never hear it and the entrypoint's
checkpoint-on-SIGTERM never runs. This process runs the same command in a process group of its own, forwards
SIGTERM/SIGINT to the ranks (every process under it started by torchrun: LOCAL_RANK in its environment; the
whole group when there are none), waits for every process it inherits (when PID 1 exits, the kernel kills
whatever is left, mid-checkpoint), and exits with the command's status (128 + signal when a signal ended it).
The ranks alone, not torchrun: torchrun before 2.12 SIGKILLs its ranks 30 s after it is signalled, whatever its
settings, and a save can take longer than that; SageMaker's own window is 120 s (settings.STOP_WINDOW_SECONDS).

Usage (the job's ContainerEntrypoint/ContainerArguments): python3 pid1.py COMMAND [ARG ...]
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: pid1.py COMMAND [ARG ...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        ranks = ranks_in_group(child.pid)
        where = f"the ranks {ranks}" if ranks else "the job's processes"
        print(f"[toolkit] pid1: passing signal {signum} to {where}", file=sys.stderr, flush=True)
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signum)
        if not ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, forward)
    code = child.wait()
    # The command's shell may end before the ranks (a signal ends it at once, while they checkpoint). They are
    # re-parented to PID 1, and when PID 1 exits the kernel kills everything left: wait for every one of them.
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)
    return code if code >= 0 else 128 - code


def ranks_in_group(leader: int) -> list[int]:
    """The processes under the job's command that a launcher started as ranks (LOCAL_RANK in their environment).
    Found by parentage, not by process group: torchrun starts its ranks in sessions of their own."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                parent = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
        parents.setdefault(parent, []).append(int(entry))
    ranks, todo = [], list(parents.get(leader, []))
    while todo:
        pid = todo.pop()
        todo.extend(parents.get(pid, []))
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environment = handle.read().split(b"\0")
        except OSError:
            continue
        if any(item.startswith(b"LOCAL_RANK=") for item in environment):
            ranks.append(pid)
    return sorted(ranks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
