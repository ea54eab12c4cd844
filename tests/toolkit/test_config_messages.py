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


def test_a_held_out_setting_the_chosen_way_ignores_is_refused(tmp_path):
    """data.eval holds out rows one of two ways; a setting of the other way would do nothing (a split of a source
    that is not used, a seed that chooses nothing): refused with the field and what to do, the way's own accepted."""
    refused(validate("tiny-gpt-oss-local", "--set", "data.eval.fraction=0.25", "--set", "data.eval.split=test",
                     cwd=tmp_path), "data.eval.split: 'test' names a split of data.eval.source")  # fmt: skip
    refused(validate("tiny-gpt-oss-local", "--set", "data.eval.source=held.jsonl", "--set", "data.eval.seed=7",
                     cwd=tmp_path), "data.eval.seed: 7 chooses which rows data.eval.fraction holds out")  # fmt: skip
    for own_way in (["data.eval.fraction=0.25", "data.eval.seed=7"], ["data.eval.source=h.jsonl", "data.eval.split=x"]):
        sets = [arg for value in own_way for arg in ("--set", value)]
        assert validate("tiny-gpt-oss-local", *sets, cwd=tmp_path).returncode == 0, own_way


def test_the_nodes_python_beside_a_slurm_container_image_is_refused(tmp_path):
    """On Slurm with hyperpod.image (pyxis) the job runs the image's own python: hyperpod.python would do nothing."""
    slurm = ["--set", "hyperpod.orchestrator=slurm"]
    with_image = validate("tiny-gpt-oss-local", *slurm, "--set", "hyperpod.python=/opt/venv/bin/python", "--set",
                          "hyperpod.image=registry.local/train:1", cwd=tmp_path)  # fmt: skip
    refused(with_image, "hyperpod.python: '/opt/venv/bin/python' is the nodes' Python for Slurm without a container")
    assert validate("tiny-gpt-oss-local", *slurm, "--set", "hyperpod.python=/opt/venv/bin/python",
                    cwd=tmp_path).returncode == 0  # fmt: skip


def test_an_fsx_mount_path_that_no_pod_or_pyxis_can_mount_is_refused(tmp_path):
    hyperpod = ["--set", "target=hyperpod", "--set", "hyperpod.cluster=c"]
    for bad in ("fsx", "/fsx:/data", "/my fsx", "/fsx/../etc"):
        refused(validate("tiny-gpt-oss-local", *hyperpod, "--set", f"hyperpod.fsx.mount_path={bad}", cwd=tmp_path),
                "hyperpod.fsx.mount_path: ")  # fmt: skip
    assert (
        validate("tiny-gpt-oss-local", *hyperpod, "--set", "hyperpod.fsx.mount_path=/lustre/", cwd=tmp_path).returncode
        == 0
    )
