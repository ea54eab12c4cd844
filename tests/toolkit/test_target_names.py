"""Target knowledge lives in the target records: nothing outside toolkit/targets/ and the settings sections of
toolkit/config/targets.py compares a target's name (or a HyperPod orchestrator's) or keys a table by one. Plan,
preflight, the registry and serving ask the record (`get_target(config.target)`) instead, so a new target cannot be
silently left out by one of them. Read from the source's syntax tree: docstrings, help texts and messages that name a
target are text, not a branch."""

from __future__ import annotations

import ast
from pathlib import Path

import toolkit
from toolkit.config.targets import TARGET_SETTINGS
from toolkit.targets.hyperpod import ORCHESTRATORS

ROOT = Path(toolkit.__file__).parent
RECORDS = ("targets/", "config/targets.py")  # the records: the behaviour modules and their settings sections
NAMES = frozenset(TARGET_SETTINGS) | frozenset(ORCHESTRATORS)

# Other vocabularies that share a target's name. "local" is also where a model is served or evaluated (vLLM on this
# machine, the ServeTarget and EvalTarget of the CLI), beside "endpoint". Only that value, only in these functions
# ("": module level), and never compared with a config's `.target` (that is the training target).
OTHER_VOCABULARY = {
    ("cli/serve_cmds.py", "deploy"): {"local"},
    ("cli/serve_cmds.py", "invoke"): {"local"},
    ("sdk.py", "serve_target"): {"local"},
    ("sdk.py", "chat_client"): {"local"},
    ("evaluate/flow.py", "evaluate"): {"local"},
    # "slurm" is also a service that receives set values (sbatch's options), beside "kubernetes" and "docker"
    ("config/members.py", ""): {"slurm"},
}


class _NameUses(ast.NodeVisitor):
    """(function's qualified name, line, name, whether it is compared with an attribute `.target`) of each
    comparison with a target name (==, !=, in, not in a tuple, list or set of them, `case "name":`), each dict
    literal keyed by one, and each `get_target("name")`."""

    def __init__(self, names: frozenset[str]):
        self.names, self.scope, self.found = names, [], []

    def _named(self, node: ast.AST | None) -> list[str]:
        if isinstance(node, ast.Constant) and node.value in self.names:
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [name for element in node.elts for name in self._named(element)]
        return []

    def _note(self, node: ast.AST, names: list[str], on_config_target: bool = False) -> None:
        self.found += [(".".join(self.scope), getattr(node, "lineno", 0), name, on_config_target) for name in names]

    def _enter(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _enter

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = (node.left, *node.comparators)
        on_config_target = any(isinstance(side, ast.Attribute) and side.attr == "target" for side in sides)
        self._note(node, [name for side in sides for name in self._named(side)], on_config_target)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if called == "get_target":
            self._note(node, [name for argument in node.args for name in self._named(argument)])
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        self._note(node, [name for key in node.keys for name in self._named(key)])
        self.generic_visit(node)

    def visit_MatchValue(self, node: ast.MatchValue) -> None:
        self._note(node, self._named(node.value))
        self.generic_visit(node)


def name_uses(source: str, names: frozenset[str] = NAMES) -> list[tuple[str, int, str, bool]]:
    visitor = _NameUses(names)
    visitor.visit(ast.parse(source))
    return visitor.found


def _outside_the_records() -> dict[tuple[str, str], list[tuple[int, str, bool]]]:
    """(module path, function) -> the (line, name, on a config's target) uses there, for every toolkit module but
    the records."""
    uses: dict[tuple[str, str], list[tuple[int, str, bool]]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(RECORDS):
            continue
        for function, line, name, on_config_target in name_uses(path.read_text()):
            uses.setdefault((relative, function), []).append((line, name, on_config_target))
    return uses


def _excused(module: str, function: str, name: str, on_config_target: bool) -> bool:
    return not on_config_target and name in OTHER_VOCABULARY.get((module, function), set())


def test_the_names_come_from_the_registry_of_targets():
    assert {"local", "training-job", "hyperpod", "eks", "slurm"} <= NAMES


def test_no_module_outside_the_target_records_branches_on_a_target_name():
    found = [
        f"toolkit/{module}:{line} ({function or 'module level'}) compares, keys or gets {name!r}"
        for (module, function), uses in _outside_the_records().items()
        for line, name, on_config_target in uses
        if not _excused(module, function, name, on_config_target)
    ]
    assert found == [], (
        "target names branched on outside the target records; ask the record instead "
        "(get_target(config.target): sizes, preflight, run_to_register, ...):\n" + "\n".join(found)
    )


def test_every_exception_is_still_needed():
    uses = _outside_the_records()
    stale = [
        f"toolkit/{module} {function}: {name!r}"
        for (module, function), names in OTHER_VOCABULARY.items()
        for name in names
        if name not in {used for _, used, _ in uses.get((module, function), [])}
    ]
    assert stale == [], f"no longer compared there: remove from this test's lists: {stale}"


def test_the_check_sees_branches_and_tables_but_not_text():
    source = '''
"""Targets: local, training-job, hyperpod."""
TABLE = {"training-job": 1, "other": 2}
HELP = "--target hyperpod runs on the cluster"


def pick(cfg, target="local"):
    """On "eks" ..."""
    if cfg.target == "hyperpod" or target in ("local", "endpoint"):
        print("slurm")
    match cfg.hyperpod.orchestrator:
        case "slurm":
            pass
    return get_target("training-job") if f"target {cfg.target}" != "x" else get_target(cfg.target)
'''
    found = {(function, name, on_config_target) for function, _, name, on_config_target in name_uses(source)}
    assert found == {("", "training-job", False), ("pick", "hyperpod", True), ("pick", "local", False),
                     ("pick", "slurm", False), ("pick", "training-job", False)}  # fmt: skip
    assert _excused("sdk.py", "serve_target", "local", on_config_target=False)
    assert not _excused("sdk.py", "serve_target", "local", on_config_target=True)  # config.target == "local"
