"""The run tree's names (toolkit_train/layout.py) are spelled once: no other module of the toolkit or the training
package writes `run.json`, `hyperparameters.json`, `checkpoints`, `output/failure`, the ML root or its variable, or
joins a path with a run-tree directory itself; each asks `RunTree`/`Paths`. Read from the syntax tree: docstrings
and messages that mention a name are text (only a name standing alone or as a path part counts)."""

from __future__ import annotations

import ast
from pathlib import Path

import toolkit_train
from toolkit_train import layout

import toolkit

SOURCES = (Path(toolkit.__file__).parent, Path(toolkit_train.__file__).parent)
FILES = (layout.RUN_RECORD, layout.HYPERPARAMETERS, layout.ML_ROOT_ENV, str(layout.DEFAULT_ML_ROOT), "checkpoints",
         "train.log")  # fmt: skip
NAMES = (*FILES, "failure", "stopped")  # the last two are words too: only a path part of them counts
# The same word naming something else: the bucket's S3 layout (infra/toolkit.yaml's lifecycle rule) is not a run tree.
ELSEWHERE = {"toolkit/aws.py": {"checkpoints"}}
DIRECTORIES = ("model", "output", "input", "checkpoints")  # `path / "model"`: a run tree's part, joined by hand


def _docstrings(tree: ast.AST) -> set[int]:
    bodies = [node.body for node in ast.walk(tree) if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                                         ast.AsyncFunctionDef))]  # fmt: skip
    return {id(body[0].value) for body in bodies if body and isinstance(body[0], ast.Expr)}


def _spells(value: str) -> list[str]:
    """The run-tree names `value` spells: the whole of it, or a part of a path in it."""
    return [name for name in NAMES if value == name in FILES or f"/{name}" in value or f"{name}/" in value]


def _is_directory(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in DIRECTORIES


def spellings(source: str, allowed: frozenset[str] | set[str] = frozenset()) -> list[str]:
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found += [f"{node.lineno}: {name!r}" for name in _spells(node.value) if name not in allowed]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_directory(node.right):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def _relative(path: Path) -> str:
    return path.relative_to(SOURCES[0].parent).as_posix()


def test_no_module_but_the_layout_spells_a_run_tree_name():
    found = [
        f"{path}:{where}"
        for root in SOURCES
        for path in sorted(root.rglob("*.py"))
        if path != Path(layout.__file__)
        for where in spellings(path.read_text(), ELSEWHERE.get(_relative(path), set()))
    ]
    assert found == [], f"ask toolkit_train.layout (RunTree, Paths) instead: {found}"


def test_the_check_sees_names_and_joins_but_not_text():
    source = '''
"""Writes run.json and /opt/ml/model."""
def f(root):
    """The run's checkpoints/ directory."""
    message = "no run.json digest recorded"
    return root / "model", f"{root}/input/config/hyperparameters.json", "checkpoints", "/opt/ml"
'''
    assert sorted(line.split(": ", 1)[1] for line in spellings(source)) == [
        "'/opt/ml'", "'checkpoints'", "'hyperparameters.json'", "root / 'model'"]  # fmt: skip
