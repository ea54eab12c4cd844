"""A local run's output relay: it runs the trainer and copies each line of its output to the run's log and to its
own stdout (the CLI that started the run), so that the CLI can die without taking the trainer with it.

Without it the trainer wrote into the CLI's pipe: once the CLI was gone (a closed terminal, kill -9), the trainer's
next line failed with EPIPE and it died with no checkpoint and no failure record. Here a lost reader only ends the
forwarding, and the log keeps every line; a log that cannot be written (a full disk) ends the log, and the reader
keeps every line and is told once, in a line starting with LOG_ERROR_PREFIX.

It runs by path with the toolkit's Python and the standard library alone (the run's PYTHONPATH holds only the
staged training code):

    python relay.py LOG_FILE KEEP_FD -- COMMAND...

KEEP_FD (or -1): a descriptor the trainer inherits (the run lock). The relay leads the run's process group, so a
stop signal to the group reaches the trainer; the relay lets SIGINT and SIGTERM pass it by and ends when the
trainer ends, with the trainer's status (a death by signal is re-raised on itself).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

LOG_ERROR_PREFIX = "[toolkit] the run's log: "


def _ignore(signum, frame) -> None:  # a handler, not SIG_IGN: an ignored signal would stay ignored in the trainer
    return None


def _write(stream, line: bytes) -> OSError | None:
    """The error, or None once the line is written through."""
    try:
        stream.write(line)
        stream.flush()
        return None
    except OSError as exc:
        return exc


def relay(log_path: str, keep_fd: int, command: list[str]) -> int:
    signal.signal(signal.SIGINT, _ignore)
    signal.signal(signal.SIGTERM, _ignore)
    out = sys.stdout.buffer
    try:
        log = open(log_path, "ab")  # noqa: SIM115 (held for the run's length)
    except OSError as exc:
        log = None
        _write(out, f"{LOG_ERROR_PREFIX}cannot write {log_path}: {exc.strerror}\n".encode())
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             pass_fds=(keep_fd,) if keep_fd >= 0 else ())  # fmt: skip
    assert child.stdout
    reader_alive = True
    for line in iter(child.stdout.readline, b""):
        error = _write(log, line) if log else None
        if error:
            log = None
            _write(out, f"{LOG_ERROR_PREFIX}stopped writing {log_path}: {error.strerror or error}\n".encode())
        if reader_alive and _write(out, line):
            reader_alive = False  # the CLI is gone: the log alone from here (and no flush error at exit)
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    code = child.wait()
    if code < 0:  # the trainer died of a signal: so does the relay, for whoever reads its status
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def main(argv: list[str]) -> int:
    split = argv.index("--")
    log_path, keep_fd = argv[:split]
    return relay(log_path, int(keep_fd), argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
