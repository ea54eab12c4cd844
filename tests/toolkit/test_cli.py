"""The CLI: thin, instant, and exit code 2 with one clear message on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import yaml
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.config import load_config

runner = CliRunner()


def test_help_and_validate_import_no_heavy_library(tmp_path):
    probe = (
        "import sys, runpy; sys.argv = ['toolkit', 'config', 'validate', 'gpt-oss-20b-lora'];\n"
        "try:\n runpy.run_module('toolkit.cli', run_name='__main__')\n"
        "except SystemExit: pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'sagemaker', 'boto3', 'datasets') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "ok gpt-oss-20b-lora" in result.stdout
    assert "HEAVY []" in result.stdout


def test_validate_ok_and_bad(tmp_path):
    assert runner.invoke(app, ["config", "validate", "tiny-gpt-oss-local"]).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: tiny-gpt-oss-local\nlora:\n  rnak: 4\n")
    result = runner.invoke(app, ["config", "validate", str(bad)])
    assert result.exit_code == 2
    assert "lora.rnak: unknown key" in result.output
    assert str(bad) in result.output


def test_bad_input_exit_codes(tmp_path):
    syntax = tmp_path / "syntax.yaml"
    syntax.write_text("name: [unclosed\n")
    for args in (
        ["config", "validate", str(tmp_path / "missing.yaml")],
        ["config", "validate", str(syntax)],
        ["config", "show", "tiny-gpt-oss-local", "--set", "training.max_steps=zero"],
        ["train", "tiny-gpt-oss-local", "--target", "hyperpod"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "error:" in result.output


def test_show_prints_the_resolved_config_with_overrides():
    result = runner.invoke(app, ["config", "show", "gpt-oss-20b-lora", "--set", "lora.r=32"])
    assert result.exit_code == 0
    shown = yaml.safe_load(result.stdout)
    assert shown["lora"]["r"] == 32
    assert shown["training_job"]["instance_type"] == "ml.p5.48xlarge"


def test_schema_is_json_schema_that_accepts_presets():
    result = runner.invoke(app, ["config", "schema"])
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(load_config("gpt-oss-120b-lora").model_dump(mode="json", exclude_none=True), schema)
    broken = load_config("tiny-gpt-oss-local").model_dump(mode="json", exclude_none=True)
    broken["lora"]["rnak"] = 1
    assert not jsonschema.Draft202012Validator(schema).is_valid(broken)


def test_dry_run_local_launches_nothing(tmp_path):
    out_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", "tiny-gpt-oss-local", "--dry-run", "--set", f"local.output_dir={out_dir}"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["hyperparameters"]["lora.r"] == "8"
    assert not out_dir.exists()


def test_unbuilt_target_says_so_plainly(monkeypatch):
    import pytest

    from toolkit.targets import base

    monkeypatch.setitem(base.TARGET_MODULES, "future", "toolkit.targets.future")
    with pytest.raises(base.TargetError, match="target 'future' is not built yet"):
        base.get_target("future")
    with pytest.raises(base.TargetError, match="unknown target 'cloud'; choose one of: local"):
        base.get_target("cloud")
