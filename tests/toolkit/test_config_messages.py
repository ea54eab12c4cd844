"""Config messages through the CLI: duplicate keys with both lines, the field named, values shortened, no reprs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.toolkit.cli_checks import refused


def validate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", "config", "validate", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)  # fmt: skip


def test_a_key_written_twice_is_refused_with_both_lines(tmp_path):
    (tmp_path / "job.yaml").write_text(
        "base: tiny-gpt-oss-local\ntraining:\n  max_steps: 3\nlora:\n  r: 4\n  alpha: 8\n  r: 16\n"
    )
    refused(validate("job.yaml", cwd=tmp_path), "job.yaml: key 'r' is written twice (lines 5 and 7)")
    (tmp_path / "job.yaml").write_text("base: tiny-gpt-oss-local\ntraining:\n  max_steps: 3\ntraining:\n  seed: 1\n")
    refused(validate("job.yaml", cwd=tmp_path), "key 'training' is written twice (lines 2 and 4)")


def test_a_key_written_twice_in_a_set_value_is_refused(tmp_path):
    refused(validate("tiny-gpt-oss-local", "--set", "lora={r: 4, r: 8}", cwd=tmp_path),
            "--set 'lora={r: 4, r: 8}': key 'r' is written twice")  # fmt: skip


def test_an_unknown_base_names_base(tmp_path):
    (tmp_path / "job.yaml").write_text("base: gpt-oss-20b-lorra\n")
    refused(validate("job.yaml", cwd=tmp_path), "job.yaml: base: gpt-oss-20b-lorra: neither a file nor a preset")


def test_nested_typos_get_did_you_mean_and_base_is_a_valid_key(tmp_path):
    sets = ["training.report_to=[mlflow]", "training.mlflow={trackin_uri: 'http://x'}"]
    refused(validate("tiny-gpt-oss-local", *[a for s in sets for a in ("--set", s)], cwd=tmp_path),
            "training.mlflow.trackin_uri: unknown key; did you mean 'tracking_uri'?")  # fmt: skip
    (tmp_path / "job.yaml").write_text("bsae: tiny-gpt-oss-local\n")
    output = refused(validate("job.yaml", cwd=tmp_path), "bsae: unknown key; did you mean 'base'?")
    assert output.rstrip().endswith(", base)"), output


def test_long_values_are_shortened_and_sections_are_not_echoed(tmp_path):
    output = refused(validate("tiny-gpt-oss-local", "--set", "name=" + "a" * 5000, cwd=tmp_path),
                     "name: ", "(5002 characters)")  # fmt: skip
    assert max(len(line) for line in output.splitlines()) < 200, output
    output = refused(validate("tiny-gpt-oss-local", "--set", "hyperpod.namespace=Team_A", cwd=tmp_path),
                     "hyperpod.namespace: 'Team_A' is not a Kubernetes object name")  # fmt: skip
    assert "HyperPodSettings(" not in output and "(got" not in output and "hyperpod: hyperpod." not in output, output


def test_no_text_field_echoes_a_long_value_whole():
    """Every text field of the schema, given 5,000 characters: whatever the check says, it shows at most ~80 of them
    (a new message that echoes its value whole fails here)."""
    from tests.toolkit.test_applicability import _fields
    from toolkit.config import Config, ConfigError, load_config

    long = "x" * 5000
    for path, field, _ in _fields(Config):
        if field.annotation not in (str, str | None):
            continue
        try:
            load_config("tiny-gpt-oss-local", [f"{path}={long}", "target=hyperpod", "hyperpod.cluster=c"])
        except ConfigError as exc:
            assert "x" * 100 not in str(exc), f"{path}: {str(exc)[:300]}"
