"""The registry login of `toolkit image build --push` is never on disk past its process: a build killed during the
push (SIGKILL: nothing of it runs on) left $TMPDIR/toolkit-docker-*/config.json with the base64 user:token; the next
build removes what a process that is gone left, and leaves a live build's alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from toolkit.config import load_config
from toolkit.deploy import image

HOLD_A_LOGIN = """
import json, sys, time
from pathlib import Path
from toolkit.deploy.image import login_directory
with login_directory() as directory:
    (Path(directory) / "config.json").write_text(json.dumps({"auths": {"registry": {"auth": "QVdTOnRva2Vu"}}}))
    print(directory, flush=True)
    time.sleep(600)
"""


def _killed_during_a_push(tmp: Path) -> Path:
    held = subprocess.Popen([sys.executable, "-c", HOLD_A_LOGIN], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp)))  # fmt: skip
    assert held.stdout
    directory = Path(held.stdout.readline().strip())
    held.send_signal(signal.SIGKILL)
    held.wait()
    return directory


def test_a_killed_builds_registry_login_is_removed_by_the_next_build(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(image.tempfile, "tempdir", None)  # read TMPDIR again
    left = _killed_during_a_push(tmp_path)
    assert (left / "config.json").exists()  # what SIGKILL leaves: no code of the killed build runs
    with image.login_directory() as live:  # a build running meanwhile (this process): its login stays
        config = load_config("tiny-gpt-oss-local", [])
        image.ensure_image(config, dry_run=True)  # the next build, any of its kinds (a dry run too)
        assert not left.exists()
        assert Path(live).is_dir()
    assert not Path(live).exists()
    unnamed = tmp_path / "toolkit-docker-abcd1234"  # an older toolkit's name gives no process: not guessed at
    unnamed.mkdir()
    assert image.remove_leftover_logins() == [] and unnamed.exists()
