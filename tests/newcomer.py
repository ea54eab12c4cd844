"""The README's commands as a newcomer runs them (engine helpers for tests/test_newcomer.py): each `toolkit ...` line of
a fenced block in README.md and docs/*.md, its `a|b` alternatives expanded, run by bash in a directory of its own
with one environment's `toolkit` first on PATH, no AWS credentials and nothing beyond loopback reachable."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# `# needs AWS: ...`, `# needs a trained run`: what the command needs first; `# trains: ...`: minutes of training
MARKER = re.compile(r"\s#\s*(needs|trains)\b[:;,]?\s*(.*)$")
COMMENT = re.compile(r"\s+#.*$")
ALTERNATIVES = re.compile(r"(?<![\w.|/-])([a-z]+(?:\|[a-z]+)+)(?![\w|])")  # `status|logs|stop`, not a shell pipe


@dataclass(frozen=True)
class Command:
    page: str
    line: str  # as the page writes it, comment included
    command: str  # what bash runs: the comment dropped, one of its alternatives
    needs: str | None  # the `# needs ...` marker's words ("AWS", "a trained run"), "trains", or None (offline)

    @property
    def kind(self) -> str | None:
        """None (offline), "AWS", "trains" or the first word of another need."""
        return re.sub(r"[:;,]$", "", self.needs.split()[0]) if self.needs else None

    @property
    def id(self) -> str:
        return f"{self.page}: {self.command}"


def commands() -> list[Command]:
    found: dict[str, Command] = {}
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S):
            for line in (raw.strip() for raw in block.splitlines()):
                if not line.startswith("toolkit "):
                    continue
                marker = MARKER.search(line)
                plain = COMMENT.sub("", line)
                parts = ALTERNATIVES.split(plain)  # odd items: the alternatives
                choices = [p.split("|") if i % 2 else [p] for i, p in enumerate(parts)]
                for chosen in itertools.product(*choices):
                    command = "".join(chosen)
                    needs = None if not marker else "trains" if marker.group(1) == "trains" else marker.group(2)
                    found.setdefault(command, Command(page.name, line, command, needs))
    return list(found.values())


def offline_environment(home: Path) -> dict[str, str]:
    """This machine's environment without AWS credentials or settings (HOME is `home`: no ~/.aws, no kubeconfig),
    the hub offline, no instance metadata lookup: a command that needs AWS can reach nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "VIRTUAL_ENV", "PYTHON"))}
    # the machine's caches stay (the tiny models the set-up built: a newcomer's own home has them)
    env["XDG_CACHE_HOME"] = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    env.update(HOME=str(home), AWS_EC2_METADATA_DISABLED="true", HF_HUB_OFFLINE="1", NO_COLOR="1")
    env.update(AWS_CONFIG_FILE=str(home / "no-aws-config"), AWS_SHARED_CREDENTIALS_FILE=str(home / "no-credentials"))
    return env


def workdir(path: Path) -> Path:
    """A directory as a newcomer's checkout gives it: the examples the commands name, and the `my-job.yaml` that
    `toolkit infra outputs --base gpt-oss-20b-lora --write my-job.yaml` writes (from example stack outputs)."""
    from toolkit.sdk import infra_config_overlay

    path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "examples", path / "examples", dirs_exist_ok=True)
    outputs = {"RoleArn": "arn:aws:iam::123456789012:role/toolkit-sagemaker-execution",
               "BucketName": "toolkit-123456789012-us-west-2"}  # fmt: skip
    (path / "my-job.yaml").write_text(infra_config_overlay("gpt-oss-20b-lora", outputs, "us-west-2"))
    return path


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str


def run(command: Command, venv: Path, cwd: Path, home: Path, timeout: float = 300) -> Outcome:
    env = offline_environment(home)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # a session of its own: a command that outlives its time (a server, say) goes with everything it started
    process = subprocess.Popen(["bash", "-c", command.command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return Outcome(-1, stdout, stderr + f"\n(still running after {timeout} s: killed)")
    return Outcome(process.returncode, stdout, stderr)


def problems(command: Command, outcome: Outcome) -> list[str]:
    """What is wrong with how the command ended: offline ones exit 0; `# needs AWS` ones exit 2 (bad input or a
    missing resource: no credentials here); other `# needs ...` ones exit 0, or fail (1 or 2: a model the hub would
    give, a trained run, a GPU); a failure says so in one `error:` line; none prints a traceback."""
    found = []
    text = outcome.stdout + outcome.stderr
    if "Traceback (most recent call last)" in text:
        found.append("printed a traceback")
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("error:")]
    allowed = {None: {0}, "AWS": {2}}.get(command.kind, {0, 1, 2})
    if outcome.code not in allowed:
        found.append(f"exited {outcome.code}, expected {sorted(allowed)}")
    if outcome.code != 0 and len(errors) != 1:
        found.append(f"exit {outcome.code} with {len(errors)} `error:` lines, expected one")
    return found
