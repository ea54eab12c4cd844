"""Bad data input through the CLI: one line naming the file (and line), exit 2, nothing read that is not data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from toolkit_train.data import load_rows
from toolkit_train.settings import SAMPLE_DATASET

from tests.toolkit.cli_checks import refused


def toolkit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)  # fmt: skip


def statistics(result: subprocess.CompletedProcess) -> dict[str, str]:
    """The statistic -> value table `data prepare` prints."""
    cells = [line.split("│") for line in result.stdout.splitlines() if line.count("│") == 3]
    return {cell[1].strip(): cell[2].strip() for cell in cells}


def sample_rows(n: int = 3) -> list[dict]:
    return [dict(row) for row in load_rows(SAMPLE_DATASET)][:n]


def write_config(directory: Path, source: str, *lines: str) -> Path:
    config = directory / "job.yaml"
    config.write_text("\n".join(["base: tiny-gpt-oss-local", "data:", f"  source: {source!r}", *lines]) + "\n")
    return config


@pytest.mark.parametrize("source", ["", "   "])
def test_an_empty_source_is_refused(tmp_path, source):
    refused(toolkit("config", "validate", str(write_config(tmp_path, source)), cwd=tmp_path), "data.source is empty")


def test_a_directory_source_reads_its_data_files_only_and_resolves_next_to_the_config(tmp_path):
    """data: rows.jsonl is read from next to the config (the command runs elsewhere); .venv/, .git/ and an unrelated
    package.json are not data."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "data" / ".venv").mkdir(parents=True)
    elsewhere.mkdir()
    rows = sample_rows()
    (project / "data" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (project / "data" / ".venv" / "junk.jsonl").write_text('{"not": "a row"}\n')
    (project / "data" / ".hidden.jsonl").write_text('{"not": "a row"}\n')
    (project / "data" / "package.json").write_text('{"name": "not data"}\n')
    config = write_config(project, "data")
    result = toolkit("data", "prepare", str(config), "--output", str(tmp_path / "out"), cwd=elsewhere)
    assert result.returncode == 0, result.stdout + result.stderr
    assert statistics(result)["rows_in"] == str(len(rows)), result.stdout


def test_a_bad_row_names_its_file_and_line(tmp_path):
    rows = sample_rows()
    rows[1].pop("final")
    rows[1].pop("messages")
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = toolkit("data", "prepare", str(write_config(tmp_path, "rows.jsonl")), cwd=tmp_path)
    refused(result, "rows.jsonl line 2: field 'final' is missing", "data.skip_bad_rows")


def test_rows_of_another_format_point_at_data_format(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"prompt": "a", "completion": "b"}\n' * 3)
    result = toolkit("data", "prepare", str(write_config(tmp_path, "rows.jsonl")), cwd=tmp_path)
    refused(
        result,
        "every one of the 3 rows is refused for one reason (rows.jsonl line 1 and the others): field "
        "'reasoning_language' is missing",
        "check data.format (one of multilingual-thinking, messages, preference, prompts)",
    )


def test_one_reason_shared_by_every_row_is_said_once(tmp_path):
    """Rows a template cannot render alike (a developer message Qwen3's template drops) are one reason, said once,
    not five times with "(and 55 more)"."""
    rows = [{"messages": [{"role": "developer", "content": f"Rule {i}."}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello"}]} for i in range(4)]  # fmt: skip
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "job.yaml"
    config.write_text("base: tiny-qwen3-local\ndata:\n  source: rows.jsonl\n  format: messages\n")
    output = refused(toolkit("data", "prepare", str(config), cwd=tmp_path),
                     "every one of the 4 rows is refused for one reason (rows.jsonl line 1 and the others): "
                     "messages[0]: the model's chat template does not render this developer message")  # fmt: skip
    assert output.count("does not render") == 1, output


def test_a_row_left_without_trained_tokens_is_dropped_and_counted(tmp_path):
    rows = sample_rows()
    rows[0]["user"] = "Wie viele Minuten? " * 400  # the prompt alone is far over max_length
    rows[0].pop("messages")
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = write_config(tmp_path, "rows.jsonl", "  max_length: 512", "  overlong: truncate")
    result = toolkit("data", "prepare", str(config), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    stats = statistics(result)
    assert stats["untrained_dropped"] == "1" and stats["rows_out"] == str(len(rows) - 1), result.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_a_pipe_is_refused_plainly(tmp_path):
    os.mkfifo(tmp_path / "rows.jsonl")
    result = toolkit("data", "prepare", str(write_config(tmp_path, "rows.jsonl")), cwd=tmp_path)
    refused(result, "rows.jsonl: not a regular file or directory")


def test_held_out_rows_that_are_the_training_rows_are_refused_and_another_split_is_not(tmp_path):
    """data.eval.source naming data.source (same split, any spelling of the same path): every 'held-out' row would
    be trained on, and `toolkit eval` would score memory as skill. One line naming both and what to set (another
    split only where the source has splits); another split of a hub dataset is fine."""
    same = ["--set", f"data.eval.source={SAMPLE_DATASET}", "--set", "data.eval.fraction=null"]
    output = refused(toolkit("config", "validate", "tiny-gpt-oss-local", *same, cwd=tmp_path),
                     f"data.eval.source is data.source ({SAMPLE_DATASET}, split train): its rows are trained on",
                     "name a source of held-out rows, or hold out part of data.source")  # fmt: skip
    assert "data.eval.split" not in output  # a sample has no splits: that advice would be refused next
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(row) for row in sample_rows(3)) + "\n")
    by_path = ["--set", f"data.source={rows}", "--set", "data.eval.source=./rows.jsonl", "--set",
               "data.eval.fraction=null"]  # fmt: skip
    refused(toolkit("config", "validate", "tiny-gpt-oss-local", *by_path, cwd=tmp_path), "its rows are trained on")
    hub = [
        "--set",
        "data.source=acme/chats",
        "--set",
        "data.eval.source=acme/chats",
        "--set",
        "data.eval.fraction=null",
    ]
    refused(toolkit("config", "validate", "tiny-gpt-oss-local", *hub, cwd=tmp_path), "set data.eval.split to another")
    other_split = toolkit("config", "validate", "tiny-gpt-oss-local", *hub, "--set", "data.eval.split=test",
                          cwd=tmp_path)  # fmt: skip
    assert other_split.returncode == 0, other_split.stdout + other_split.stderr
