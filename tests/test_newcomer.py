"""The newcomer's path is the tested path: every `toolkit ...` command of README.md and docs/*.md, run as written in
the environment the README's set-up builds (scripts/test.sh runs `bash scripts/demo.sh` into .venv-demo before the
tests: the demo's own extras, not this test environment's), each in a fresh directory as a newcomer's checkout has it
(`my-job.yaml` as `toolkit infra outputs` writes it), without AWS credentials and with nothing beyond loopback to
reach. Offline commands exit 0; `# needs AWS` ones exit 2 with one `error:` line; other `# needs ...` ones exit 0, or
fail in one `error:` line; `# trains` ones (minutes of CPU each) are trained by the named integration tests instead.
None prints a traceback. Then the README's slim install (`pip install .`, no extras: .venv-slim): a verb that needs
an extra names it in one line, exit 2.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
from pathlib import Path

import pytest

from tests import newcomer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
DEMO_VENV = REPO / ".venv-demo"  # what `bash scripts/demo.sh` built (scripts/test.sh: VENV=.venv-demo)
SLIM_VENV = REPO / ".venv-slim"  # `pip install .` (scripts/env.sh: make_slim_venv)
COMMANDS = newcomer.commands()
RUN = [c for c in COMMANDS if c.kind != "trains"]


def _environment(path: Path) -> Path:
    if not (path / "bin" / "toolkit").exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} was not built: scripts/test.sh builds it before the tests")
        pytest.skip(f"{path} was not built (scripts/test.sh builds it)")
    return path


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, newcomer.Outcome]:
    """Every command's outcome, four at a time (each is mostly a Python start-up), each in its own directory."""
    venv = _environment(DEMO_VENV)
    home = tmp_path_factory.mktemp("home")

    def one(i_command: tuple[int, newcomer.Command]) -> tuple[str, newcomer.Outcome]:
        i, command = i_command
        cwd = newcomer.workdir(tmp_path_factory.mktemp(f"checkout{i}"))
        return command.id, newcomer.run(command, venv, cwd, home)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, enumerate(RUN)))


def test_the_pages_have_commands_of_every_kind():
    kinds = {c.kind for c in COMMANDS}
    assert {None, "AWS", "trains"} <= kinds and len(RUN) >= 30, sorted(map(str, kinds))


@pytest.mark.parametrize("command", RUN, ids=[c.id for c in RUN])
def test_a_documented_command_ends_as_its_page_says(command, outcomes):
    outcome = outcomes[command.id]
    problems = newcomer.problems(command, outcome)
    tail = "\n".join((outcome.stdout + outcome.stderr).strip().splitlines()[-6:])
    assert not problems, f"`{command.line}` ({command.page}): {'; '.join(problems)}\n{tail}"


def test_every_command_that_trains_is_trained_by_a_test():
    """A `# trains` command is left to the integration tests that train its preset: each names one."""
    sources = "\n".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    for command in (c for c in COMMANDS if c not in RUN):
        preset = command.command.split()[2]
        assert f'"{preset}"' in sources or f"'{preset}'" in sources, f"`{command.line}`: no test trains {preset}"


SLIM = {  # what `pip install .` alone runs, and what names its missing extra
    "toolkit config validate tiny-gpt-oss-local": (0, None),
    "toolkit plan gpt-oss-20b-lora --offline": (0, None),
    "toolkit train tiny-gpt-oss-local --dry-run": (0, None),
    "toolkit train gpt-oss-20b-lora --target training-job --dry-run": (2, "aws"),
    "toolkit endpoint list my-job.yaml": (2, "aws"),
    "toolkit data prepare tiny-gpt-oss-local": (2, "train"),
}


@pytest.mark.parametrize("line", SLIM)
def test_the_slim_install_runs_or_names_the_extra(line, tmp_path):
    venv = _environment(SLIM_VENV)
    command = newcomer.Command("README.md", line, line, None)
    outcome = newcomer.run(command, venv, newcomer.workdir(tmp_path / "checkout"), tmp_path)
    code, extra = SLIM[line]
    assert "Traceback" not in outcome.stdout + outcome.stderr and outcome.code == code, outcome
    if extra:
        errors = [line for line in outcome.stderr.splitlines() if line.startswith("error:")]
        wanted = rf"`{extra}` extra is not installed.*pip install '\.\[{extra}\]'"
        assert len(errors) == 1 and re.search(wanted, errors[0]), outcome.stderr


SDK_BLOCK = re.search(r"^## SDK\n.*?^```python\n(.*?)^```", (REPO / "README.md").read_text(), flags=re.M | re.S)
RUN_BLOCK = """
import sys, traceback
from toolkit.errors import classify
try:
    exec(compile(open(sys.argv[1]).read(), "README.md's SDK block", "exec"))
except BaseException as exc:
    known = classify(exc)
    print(f"stopped at: {type(exc).__name__}: {known[1] if known else exc}")
    sys.exit(3 if known else 4)  # 3: the toolkit's own error (the AWS part, here); 4: a bug (TypeError, ...)
"""


def test_the_readme_sdk_block_runs_as_written(tmp_path):
    """The README's Python block, as written, in the demo's environment: it trains (10 steps of the tiny model on the
    chat-messages example) and prints the job's state, then reaches `toolkit.deploy("my-job.yaml")`, which needs AWS
    (here: no credentials, no trained run of that config) and raises the toolkit's own error, not a TypeError (it
    did: `toolkit.deploy` was the sub-package)."""
    venv = _environment(DEMO_VENV)
    assert SDK_BLOCK, "README.md's ## SDK section has no python block"
    cwd = newcomer.workdir(tmp_path / "checkout")
    (cwd / "block.py").write_text(SDK_BLOCK.group(1))
    (cwd / "run_block.py").write_text(RUN_BLOCK)
    command = newcomer.Command("README.md", "python block", "python run_block.py block.py", None)
    outcome = newcomer.run(command, venv, cwd, tmp_path, timeout=600)
    printed = re.search(r"print\(state.status, state.artifacts\)  # (\w+ \w+\(adapter=)", SDK_BLOCK.group(1))
    assert printed and printed.group(1) in outcome.stdout, outcome  # what the block's comment says it prints
    assert outcome.code == 3 and "stopped at: " in outcome.stdout, outcome  # the toolkit's own one-line error
