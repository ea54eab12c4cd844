"""Assertions shared by the tests that drive the CLI as a user would."""

from __future__ import annotations

import subprocess


def refused(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2 (bad input), no traceback, and each fragment in what the user saw; returns that output."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    for fragment in fragments:
        assert fragment in output, output
    return output
