"""The docs say only what is true: every `toolkit ...` in README.md is a real command (run as written unless it
carries a trailing `# needs ...` comment, e.g. `# needs AWS`), every row of docs/performance.md cites a
bench/results file that exists, every bench/results file is cited or read by code, and every relative link in
README.md and docs/*.md resolves (anchors included)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from toolkit.cli import app

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
RESULTS = REPO / "bench" / "results"
NEEDS = re.compile(r"\s+#\s*needs\b.*$")  # the marker: a command that needs AWS, a trained run, ...
COMMENT = re.compile(r"\s+#.*$")


def readme_commands() -> list[tuple[str, bool]]:
    """(command, inline) for each `toolkit ...` line of a fenced block and each inline `toolkit ...` span."""
    text = README.read_text()
    found: list[tuple[str, bool]] = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S):
        found += [(line.strip(), False) for line in block.splitlines() if line.strip().startswith("toolkit ")]
    outside = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    found += [(span, True) for span in re.findall(r"`(toolkit [^`]+)`", outside)]
    return found


def is_group(command: Any) -> bool:
    return hasattr(command, "commands")  # typer vendors click: its groups are not `click.Group`s


def resolve(tokens: list[str]) -> tuple[Any, list[str], list[str], list[str]]:
    """(command, its path, its arguments, the positional ones among them); fails on a verb or option that is not
    there."""
    command: Any = typer.main.get_command(app)
    path: list[str] = []
    rest = list(tokens)
    while True:
        rest, positional = check_options(command, path, rest, stop_at_positional=is_group(command))
        if not is_group(command) or not rest:
            return command, path, rest, positional
        name = rest.pop(0)
        sub = command.commands.get(name)
        assert sub is not None, f"`toolkit {' '.join(path)}` has no verb {name!r} (has: {sorted(command.commands)})"
        command, path = sub, [*path, name]


def check_options(
    command: Any, path: list[str], args: list[str], stop_at_positional: bool
) -> tuple[list[str], list[str]]:
    """Every option named exists on the command; returns (the arguments from the first positional on when stopping
    there (a group's verb), else all of them; the positional arguments)."""
    options = {name: p for p in command.params if p.param_type_name == "option" for name in p.opts + p.secondary_opts}
    positional: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("-") and token != "-":
            name = token.split("=", 1)[0]
            assert name in options, f"`toolkit {' '.join(path)}` has no option {name} (has: {sorted(options)})"
            takes_value = not options[name].is_flag and not options[name].count
            i += 2 if takes_value and "=" not in token else 1
            continue
        if stop_at_positional:
            return args[i:], positional
        positional.append(token)
        i += 1
    return ([] if stop_at_positional else args), positional


COMMANDS = readme_commands()


def test_the_readme_has_commands_to_check():
    blocks = [c for c, inline in COMMANDS if not inline]
    assert len(blocks) >= 5, "README.md's command blocks moved: see readme_commands"


@pytest.mark.parametrize("line, inline", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_every_readme_command_is_real(line, inline, tmp_path, monkeypatch):
    needs = bool(NEEDS.search(line))
    tokens = shlex.split(COMMENT.sub("", line))[1:]
    command, path, args, positional = resolve(tokens)
    if inline and not positional:
        return  # a reference to a verb (`toolkit jobs list`, `toolkit deploy --dry-run`): path and options exist
    assert not is_group(command), f"`{line}`: `toolkit {' '.join(path)}` needs a verb"
    command.make_context(f"toolkit {' '.join(path)}", list(args))  # arguments, choices and types parse
    if needs:
        return
    monkeypatch.chdir(tmp_path)  # offline commands write runs/ where they run
    result = CliRunner().invoke(app, tokens)
    assert result.exit_code == 0, f"`{line}` (no `# needs ...` marker) exited {result.exit_code}:\n{result.output}"


def test_a_readme_command_with_a_verb_that_does_not_exist_fails():
    with pytest.raises(AssertionError, match="no verb 'trian'"):
        resolve(["trian", "my-job.yaml"])
    with pytest.raises(AssertionError, match="no option --dry-runn"):
        resolve(["train", "my-job.yaml", "--dry-runn"])


def test_the_cheat_sheet_names_every_verb():
    sheet = README.read_text().split("## Use", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", sheet, flags=re.M))
    verbs = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    missing, unknown = sorted(verbs - listed), sorted(listed - verbs)
    assert listed == verbs, f"README.md's verb table (## Use): missing {missing}, not a verb {unknown}"


def cited(text: str) -> set[str]:
    return set(re.findall(r"bench/results/([\w.-]+\.json)", text))


def test_every_performance_row_cites_an_existing_results_file():
    rows = [
        line
        for line in (REPO / "docs" / "performance.md").read_text().splitlines()
        if line.startswith("|") and not re.fullmatch(r"[|\s:-]+", line)
    ]
    headers = {line for line in rows if "source |" in line}
    data = [line for line in rows if line not in headers]
    assert data, "docs/performance.md has no table rows"
    for line in data:
        files = cited(line)
        assert files, f"docs/performance.md row cites no bench/results file: {line}"
        for name in files:
            assert (RESULTS / name).is_file(), f"docs/performance.md cites bench/results/{name}, which does not exist"


def test_every_results_file_is_cited_and_every_citation_exists():
    docs = cited("\n".join(p.read_text() for p in [README, *DOCS]))
    for name in docs:
        assert (RESULTS / name).is_file(), f"the docs cite bench/results/{name}, which does not exist"
    sources = [p for d in ("toolkit", "bench", "entrypoints") for p in (REPO / d).rglob("*.py")]
    sources += list((REPO / "toolkit").rglob("*.json"))
    code = "\n".join(p.read_text() for p in sources if RESULTS not in p.parents)
    for path in RESULTS.glob("*.json"):
        assert path.name in docs or path.name in code, (
            f"bench/results/{path.name}: cited by no doc, read by no code: cite it in docs/performance.md or delete it"
        )


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lowercased, punctuation dropped, spaces to dashes."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s)://, mailto:
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        assert linked.exists(), f"{page.relative_to(REPO)}: link {target} -> {file} does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.relative_to(REPO)}: link {target}: no heading #{anchor} there"
