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


def test_the_run_record_is_read_in_one_place_whole_or_not_at_all(tmp_path):
    """RunRecord: the toolkit's one reader of run.json (targets, eval, the registry): a model directory or the file
    itself; a missing or torn record reads as none (a run killed mid-write is no completed run)."""
    model = tmp_path / "model"
    assert layout.RunRecord.read(model) is None
    layout.write_json_atomically(model / layout.RUN_RECORD, {
        "settings": {"data": {"split": "train", "eval": {"fraction": 0.2}}}, "train_loss": 2, "eval_loss": None,
        "data": {"eval": {"rows_out": 12}}, "log_history": [{"step": 1, "loss": 3.0}], "trained": {"groups": []},
    })  # fmt: skip
    for where in (model, model / layout.RUN_RECORD):
        record = layout.RunRecord.read(where)
        assert record is not None and record.data_settings["eval"] == {"fraction": 0.2}
        assert (record.loss("train_loss"), record.loss("eval_loss"), record.held_out_rows) == (2.0, None, 12)
        assert record.log_history == [{"step": 1, "loss": 3.0}] and record.trained == {"groups": []}
    (model / layout.RUN_RECORD).write_text('{"settings": ')
    assert layout.RunRecord.read(model) is None
    (model / layout.RUN_RECORD).write_text("{}")
    empty = layout.RunRecord.read(model)
    assert empty is not None and (empty.data_settings, empty.log_history, empty.held_out_rows) == ({}, [], None)


def test_no_toolkit_module_parses_the_run_record_itself():
    """run.json is read through RunRecord only: no json.loads of a run record's text outside layout.py."""
    offenders = []
    for root in SOURCES:
        for path in root.rglob("*.py"):
            if path.name == "layout.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if "json.load" in line and ("run_record" in line or "RUN_RECORD" in line or "run.json" in line):
                    offenders.append(f"{path}:{number}: {line.strip()}")
    assert offenders == []
