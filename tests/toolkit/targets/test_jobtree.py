"""The run's layout, the same on every target: one code tree (every file of the training package arrives, a
subpackage or data file too), the foreign-checkpoint guard and --fresh, and no links in the repository."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from toolkit.config import load_config
from toolkit.resources import ENTRY_SCRIPT, TRAINING_PACKAGE
from toolkit.targets.base import TargetError
from toolkit.targets.jobtree import code_archive, prepare_run_dir, stage_code, trajectory_file

REPO = Path(__file__).resolve().parents[3]


def _package_files() -> set[str]:
    listed = subprocess.run(["git", "ls-files", str(TRAINING_PACKAGE)], cwd=REPO, capture_output=True, text=True)
    return {str(Path(name).relative_to("entrypoints")) for name in listed.stdout.split()}


def _archived(config) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(code_archive(config)), mode="r:gz") as archive:
        return {member.name for member in archive.getmembers() if member.isfile()}


@pytest.fixture
def config(tmp_path):
    return load_config("tiny-gpt-oss-local", [f"local.output_dir={tmp_path}/{{name}}"])


def test_the_staged_tree_and_the_archive_hold_every_file_of_the_training_package(config, tmp_path, monkeypatch):
    staged = stage_code(tmp_path / "code", config)
    on_disk = {str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()}
    assert on_disk == _package_files() | {"requirements.txt"}
    assert _archived(config) == on_disk
    assert code_archive(config) == code_archive(config)  # content-named ConfigMaps stay stable across submits
    # a new file in a new subpackage travels too (the EKS path once flattened *.py into a ConfigMap)
    package = tmp_path / "pkg" / TRAINING_PACKAGE.name
    shutil.copytree(TRAINING_PACKAGE, package)
    (package / "extra").mkdir()
    (package / "extra" / "table.json").write_text("{}")
    monkeypatch.setattr("toolkit.resources.TRAINING_PACKAGE", package)
    assert f"{TRAINING_PACKAGE.name}/extra/table.json" in _archived(config)


def test_the_staged_entry_script_runs_with_only_the_staged_code_on_its_path(config, tmp_path):
    staged = stage_code(tmp_path / "code", config)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(staged), "TOOLKIT_ML_ROOT": str(tmp_path / "ml")}
    ran = subprocess.run([sys.executable, str(staged / ENTRY_SCRIPT)], env=env, capture_output=True, text=True)
    assert ran.returncode == 1 and "no hyperparameters" in (tmp_path / "ml" / "output" / "failure").read_text()
    probe = "import sys, toolkit_train.train as t; print(t.__name__, [p for p in sys.path if 'code' in p])"
    shown = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert shown.stdout.split()[0] == "toolkit_train.train", shown.stderr


def test_foreign_checkpoints_refuse_and_fresh_clears(config, tmp_path):
    root = tmp_path / "run"
    prepare_run_dir(config, root, fresh=False)
    (root / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    prepare_run_dir(config, root, fresh=False)  # same settings: resumes
    other = load_config("tiny-gpt-oss-local", ["lora.r=4"])
    with pytest.raises(TargetError, match="checkpoints of a different config.*--fresh"):
        prepare_run_dir(other, root, fresh=False)
    prepare_run_dir(other, root, fresh=True)
    assert not (root / "checkpoints").exists()


LONGER = [
    ["training.max_steps=9"],
    ["training.save_steps=3", "training.max_steps=null", "training.num_epochs=3"],
    ["training.logging_steps=5", "training.merge_adapter=false"],
]


@pytest.mark.parametrize("longer", LONGER)
def test_where_a_run_stops_is_not_what_makes_it_another_run(config, tmp_path, longer):
    """Raising max_steps (or the save cadence, epochs, logging, the merge) over a run's checkpoints continues it;
    a setting of its trajectory (the learning rate) refuses. The pod's guard on EKS compares the same file."""
    root = tmp_path / "run"
    prepare_run_dir(config, root, fresh=False)
    (root / "checkpoints" / "checkpoint-6").mkdir(parents=True)
    written = trajectory_file(root).read_text()
    prepare_run_dir(load_config("tiny-gpt-oss-local", longer), root, fresh=False)  # no refusal: the same run
    assert trajectory_file(root).read_text() == written
    assert (root / "checkpoints" / "checkpoint-6").exists()
    with pytest.raises(TargetError, match="checkpoints of a different config"):
        prepare_run_dir(load_config("tiny-gpt-oss-local", [*longer, "training.learning_rate=0.002"]), root, False)


def test_the_repository_holds_no_links():
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=True)
    assert [line for line in listed.stdout.splitlines() if line.startswith("120000")] == []


def test_artifacts_are_the_same_kinds_on_every_target(tmp_path):
    """Every target fills one typed Artifacts (adapter, merged, model): a run directory by what is there, whole."""
    from toolkit.targets.base import Artifacts
    from toolkit.targets.jobtree import completed_run

    model = tmp_path / "run" / "model"
    (model / "adapter").mkdir(parents=True)
    (model / "merged.partial").mkdir()  # an unfinished merge is not an artifact
    assert completed_run("run", tmp_path / "run") is None  # no run.json: not complete
    (model / "run.json").write_text("{}")
    state = completed_run("run", tmp_path / "run")
    assert state is not None and dict(state.artifacts) == {"adapter": str(model / "adapter")}
    prefix = "s3://b/p/job/output/model/"
    served = Artifacts(adapter=f"{prefix}adapter/", merged=f"{prefix}merged/", model=prefix)
    assert list(served) == ["model", "adapter", "merged"] and served["model"] == prefix
    assert served == {"model": prefix, "adapter": f"{prefix}adapter/", "merged": f"{prefix}merged/"}


def _sealed_checkpoint(root: Path, step: int) -> Path:
    from toolkit_train.run.checkpoints import seal

    checkpoint = root / "checkpoints" / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 9}))
    seal(checkpoint)
    return checkpoint


def test_a_resume_over_changed_data_refuses_naming_the_checkpoint_and_fresh_or_restoring_goes_on(tmp_path):
    """Rows appended to data.source between a stop and the resume were trained on silently (and the held-out split
    drawn again over the changed file): the run records its data's digest, and a resume over other data refuses in
    one line naming the source and the checkpoint; the data restored, it resumes; --fresh starts over on it."""
    data = tmp_path / "rows.jsonl"
    data.write_text('{"messages": []}\n' * 4)
    config = load_config("tiny-gpt-oss-local", [f"local.output_dir={tmp_path}/{{name}}", f"data.source={data}"])
    root = tmp_path / "run"
    prepare_run_dir(config, root, fresh=False)
    checkpoint = _sealed_checkpoint(root, 2)
    prepare_run_dir(config, root, fresh=False)  # the same data: resumes
    original = data.read_bytes()
    data.write_bytes(original + b'{"messages": []}\n')
    with pytest.raises(TargetError) as refused:
        prepare_run_dir(config, root, fresh=False)
    line = str(refused.value)
    assert "\n" not in line
    assert f"data.source {data} changed since {checkpoint} was written" in line
    assert "--fresh" in line and "restore the data" in line
    assert checkpoint.exists()  # nothing touched
    data.write_bytes(original)
    prepare_run_dir(config, root, fresh=False)  # restored: resumes
    data.write_bytes(original + b'{"messages": []}\n')
    prepare_run_dir(config, root, fresh=True)  # over the new data, from the beginning
    assert not (root / "checkpoints").exists()
    _sealed_checkpoint(root, 2)
    prepare_run_dir(config, root, fresh=False)  # and its own checkpoints resume on it


def test_the_data_a_run_records_by_kind_of_source(tmp_path):
    """A file or directory: its bytes; a prepared dataset: its seal; a builtin sample: the file it ships as; a hub
    dataset id or an s3:// URI: nothing (not read from here), so nothing is checked."""
    from toolkit_train.run.checkpoints import SEAL, seal

    from toolkit.targets.jobtree import data_digests

    def digest(source: str, *more: str) -> str | None:
        config = load_config("tiny-gpt-oss-local", [f"data.source={source}", *more])
        return data_digests(config)["train"]["sha256"]

    rows = tmp_path / "rows" / "a.jsonl"
    rows.parent.mkdir()
    rows.write_text('{"messages": []}\n')
    by_file, by_dir = digest(str(rows)), digest(str(rows.parent))
    assert by_file and by_dir
    rows.write_text('{"messages": []}\n{"messages": []}\n')
    assert digest(str(rows)) != by_file and digest(str(rows.parent)) != by_dir
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "state.json").write_text("{}")
    seal(prepared, {"source": str(rows)})
    assert digest(str(prepared)).startswith("seal:")
    assert digest("builtin:multilingual-thinking-sample")
    assert digest("HuggingFaceH4/Multilingual-Thinking") is None
    with_eval = data_digests(load_config("tiny-gpt-oss-local", [f"data.eval={{source: {rows}}}"]))
    assert with_eval["eval"]["sha256"] == digest(str(rows))
    assert (prepared / SEAL).exists()
