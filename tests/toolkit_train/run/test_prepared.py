"""Prepared datasets complete or invisible (a killed `toolkit data prepare` leaves the previous dataset, whole), and
trained on only as they were prepared: altered content or other settings are refused before anything launches.
The kills are real SIGKILLs of the real CLI at named moments (tests/faults: toolkit_train/run/moments.py's)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from toolkit_train.data import SAMPLE_PATH
from toolkit_train.run import prepared
from toolkit_train.run.checkpoints import SEAL

from tests import faults
from tests.runs import sample_rows
from toolkit import sdk

CONFIG = "tiny-gpt-oss-local"
TOOLKIT = ["-m", "toolkit.cli"]


def toolkit(*args: str, cwd: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(faults.command(*TOOLKIT, *args), cwd=cwd, env=faults.env(fault=fault), capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def rows_of(directory: Path) -> int:
    import datasets

    return len(datasets.load_from_disk(str(directory)))


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture
def old_dataset(tmp_path, tiny_model_path) -> Path:
    """The sample prepared once into tmp_path/prepared[1], in-process (a glob character in the name: what
    a killed prepare leaves beside it must still be found and removed)."""
    destination = tmp_path / "prepared[1]"
    sdk.prepare_data(CONFIG, destination)
    return destination


def test_a_killed_prepare_leaves_the_old_dataset_whole_and_the_same_command_then_replaces_it(tmp_path, old_dataset):
    bigger = tmp_path / "bigger.jsonl"
    bigger.write_text(SAMPLE_PATH.read_text() * 4)  # four times the rows: what the interrupted re-run prepares
    again = ["data", "prepare", CONFIG, "--set", f"data.source={bigger}", "--output", str(old_dataset)]
    written = toolkit(*again, cwd=tmp_path, fault="prepare-written")  # new Arrow files written, not sealed
    assert written.returncode == -9, written.stderr
    assert prepared.sealed(old_dataset) is not None and rows_of(old_dataset) == sample_rows()  # the old one, whole
    replaced = toolkit(*again, cwd=tmp_path, fault="prepare-replaced")  # sealed; the old one set aside
    assert replaced.returncode == -9, replaced.stderr
    assert not old_dataset.exists()  # neither is where a reader looks: nothing is trained on by mistake
    finished = toolkit(*again, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert prepared.sealed(old_dataset) is not None and rows_of(old_dataset) == 4 * sample_rows()
    assert prepared.sealed(old_dataset)["source"] == str(bigger)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # what the kills left is gone


def test_training_refuses_a_prepared_dataset_of_other_settings_or_altered_content_before_launching(
    tmp_path, old_dataset
):
    run_dir = tmp_path / "run"
    train = ["train", CONFIG, "--set", f"data.source={old_dataset}", "--set", f"local.output_dir={run_dir}"]
    other = toolkit(*train, "--set", "data.max_length=256", cwd=tmp_path)
    assert other.returncode == 2, other.stderr
    assert "data.max_length (prepared with 512, this config: 256)" in last_line(other), other.stderr
    dry = toolkit(*train, "--set", "data.max_length=256", "--dry-run", cwd=tmp_path)  # the dry run checks alike
    assert dry.returncode == 2 and last_line(dry) == last_line(other), dry.stdout + dry.stderr
    arrow = next(old_dataset.glob("*.arrow"))
    data = bytearray(arrow.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size: only its content tells
    arrow.write_bytes(bytes(data))
    altered = toolkit(*train, cwd=tmp_path)
    assert altered.returncode == 2, altered.stderr
    line = last_line(altered)
    assert f"{old_dataset}: the prepared dataset is not complete: {arrow.name} does not hold what was written" in line
    assert "Traceback" not in altered.stderr and not run_dir.exists()  # nothing launched


def test_prepare_replaces_only_a_prepared_dataset_and_a_full_disk_is_one_line(tmp_path, tiny_model_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    foreign = toolkit("data", "prepare", CONFIG, "--output", str(mine), cwd=tmp_path)
    assert foreign.returncode == 2 and "exists and is not a prepared dataset" in last_line(foreign), foreign.stderr
    assert (mine / "notes.txt").read_text() == "keep me"
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        full = toolkit("data", "prepare", CONFIG, "--output", str(small / "prepared"), cwd=tmp_path)
        left = sorted(p.name for p in small.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(small)])
    assert full.returncode == 1, full.stderr
    assert last_line(full) == f"error: cannot write {small / 'prepared'} (No space left on device); nothing " + (
        "half-written was kept"
    )
    assert left == []


def test_a_seal_records_the_source_digest_and_the_settings_that_shape_the_tokens(tmp_path, old_dataset):
    record = json.loads((old_dataset / SEAL).read_text())["about"]
    assert record["source_sha256"] == prepared.source_digest("builtin:multilingual-thinking-sample")
    assert set(record["settings"]) == {"model.id", "model.revision"} | {f"data.{s}" for s in prepared.SHAPING_SETTINGS}
    edited = tmp_path / "rows.jsonl"
    shutil.copy(SAMPLE_PATH, edited)
    before = prepared.source_digest(str(edited))
    assert prepared.source_digest(str(edited)) == before
    edited.write_text(SAMPLE_PATH.read_text().replace("French", "German", 1))  # the same rows count, edited
    assert prepared.source_digest(str(edited)) != before  # plan's statistics of it are stale now


def test_re_preparing_a_prepared_dataset_keeps_its_settings_or_is_refused(tmp_path, old_dataset):
    """A prepared source's tokens pass through as they are: a seal claiming other settings for them would be a
    lie that training then trusts."""
    from toolkit_train.data import DataError

    with pytest.raises(DataError, match=r"data.loss_on \(prepared with 'assistant', this config: 'all'\)"):
        sdk.prepare_data(CONFIG, tmp_path / "again", [f"data.source={old_dataset}", "data.loss_on=all"])
    assert not (tmp_path / "again").exists()
    same = sdk.prepare_data(CONFIG, tmp_path / "again", [f"data.source={old_dataset}"])
    assert same["tokens"] == prepared.sealed(old_dataset)["stats"]["tokens"]


def test_outputs_by_any_spelling_land_where_they_name_and_bad_ones_are_one_line(tmp_path, old_dataset, monkeypatch):
    from toolkit_train.data import DataError

    from toolkit.errors import BadInput

    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    sdk.prepare_data(CONFIG, tmp_path / "link")  # written through the link: the link stays, its target is the data
    assert (tmp_path / "link").is_symlink() and prepared.sealed(target) is not None
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(DataError, match="is the current directory"):  # replacing it would pull the shell's floor
        sdk.prepare_data(CONFIG, ".")
    sdk.prepare_data(CONFIG, "./prepared")
    assert prepared.sealed(here / "prepared") is not None
    assert [p.name for p in [*tmp_path.iterdir(), *here.iterdir()] if p.name.startswith(".")] == []
    (tmp_path / "afile").write_text("x")
    for output, said in ((str(tmp_path / "afile" / "sub"), "cannot write .*afile"), ("s3:/bucket", "s3:// URI"),
                         ("", "neither a directory")):  # fmt: skip
        with pytest.raises(BadInput, match=said):
            sdk.prepare_data(CONFIG, output)
    seal = old_dataset / SEAL
    seal.write_text(json.dumps({"files": []}))  # valid JSON, no record
    with pytest.raises(Exception, match="completion record toolkit-complete.json is unreadable"):
        prepared.sealed(old_dataset)


def test_a_data_source_path_that_does_not_exist_is_refused_before_launching(tmp_path):
    run_dir = tmp_path / "run"
    result = toolkit("train", CONFIG, "--set", f"data.source={tmp_path / 'missing.jsonl'}", "--set",
                     f"local.output_dir={run_dir}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "data.source: " in last_line(result) and "does not exist on this machine" in last_line(result)
    assert not (run_dir / "output" / "train.log").exists()  # nothing launched
