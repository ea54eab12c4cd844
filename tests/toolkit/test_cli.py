"""The CLI: thin, instant, and exit code 2 with one clear message on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.config import load_config, preset_names
from toolkit.config.loader import read_source

runner = CliRunner()
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("argv", [["config", "validate", "gpt-oss-20b-lora"], ["--help"], ["plan", "--help"]])
def test_help_and_validate_import_no_heavy_library(argv):
    probe = (
        f"import sys, runpy; sys.argv = ['toolkit', *{argv!r}];\n"
        "try:\n runpy.run_module('toolkit.cli', run_name='__main__')\n"
        "except SystemExit: pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'sagemaker', 'boto3', 'datasets') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "ok gpt-oss-20b-lora" in result.stdout or "Usage" in result.stdout
    assert "HEAVY []" in result.stdout


def test_version_is_the_installed_packages():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"toolkit {version('toolkit')}"


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


def test_a_refused_value_is_echoed_as_written():
    """Values are text: rich's emoji codes (":b:" is one) must not turn a config value into a picture."""
    result = runner.invoke(app, ["config", "validate", "tiny-gpt-oss-local", "--set", "name=x:b:y"])
    assert result.exit_code == 2 and "(got 'x:b:y')" in result.output, result.output


def test_show_prints_the_resolved_config_with_overrides():
    result = runner.invoke(app, ["config", "show", "gpt-oss-20b-lora", "--set", "lora.r=32"])
    assert result.exit_code == 0
    shown = yaml.safe_load(result.stdout)
    assert shown["lora"]["r"] == 32
    assert shown["training_job"]["instance_type"] == "ml.p5.48xlarge"


def test_show_says_what_one_optimizer_step_averages_over_on_the_target():
    """The Databricks recipe's 16 rows per step (1 row x 2 accumulation x 8 GPUs) against the packed path's tokens."""
    result = runner.invoke(app, ["config", "show", "gpt-oss-20b-lora", "--set", "target=training-job"])
    assert result.exit_code == 0 and yaml.safe_load(result.stdout)["target"] == "training-job"  # still YAML
    comments = [line for line in result.stdout.splitlines() if line.startswith("# ")]
    assert comments[0] == "# 8 GPU process(es) x 2 micro-batch(es) per optimizer step"
    assert "up to 196,608 tokens per optimizer step (12,288 per micro-batch)" in comments[1]
    assert "it would be 16 rows" in comments[1] and comments[2] == "# loss on: assistant tokens"
    # the preset's token budget does nothing unpacked: unset with it (refused otherwise: test_applicability)
    unpacked = runner.invoke(app, ["config", "show", "gpt-oss-20b-lora", "--set", "training.packing=false",
                                   "--set", "training.tokens_per_micro_batch=null"])  # fmt: skip
    assert "# unpacked: 2 rows per optimizer step, up to 4,096 tokens" in unpacked.stdout  # local: 1 GPU


def test_schema_is_json_schema_for_the_files_users_write():
    """An editor validates the raw file, as written: `base:`, keys a base supplies left out, ${ENV} values."""
    result = runner.invoke(app, ["config", "schema"])
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for source in [*preset_names(), *map(str, EXAMPLES)]:
        raw = yaml.safe_load(read_source(source)[1])
        assert not list(validator.iter_errors(raw)), source
    validator.validate(load_config("gpt-oss-120b-lora").model_dump(mode="json", exclude_none=True))
    assert validator.is_valid({"base": "tiny-gpt-oss-local", "training": {"max_steps": "${STEPS}"}})
    for broken in (
        {"base": "tiny-gpt-oss-local", "lora": {"rnak": 1}},  # unknown key
        {"base": "tiny-gpt-oss-local", "training": {"max_steps": "many"}},  # wrong type
        {"base": "tiny-gpt-oss-local", "training": {"lr_scheduler": "cosinus"}},  # not a choice
        {"lora": {"r": 8}},  # no base, and the required keys missing
    ):
        assert not validator.is_valid(broken), broken


def test_dry_run_local_launches_nothing(tmp_path):
    out_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", "tiny-gpt-oss-local", "--dry-run", "--set", f"local.output_dir={out_dir}"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["hyperparameters"]["lora.r"] == "8"
    assert not out_dir.exists()


def test_invoke_of_a_local_config_asks_this_machine_not_aws(monkeypatch):
    """Without --target, a config whose training target is local is invoked on this machine's server (here: none
    listens), never on a SageMaker endpoint that would need credentials."""
    import socket

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    result = runner.invoke(app, ["invoke", "tiny-gpt-oss-local", "Hallo", "--set", f"serving.local_port={closed}"])
    assert result.exit_code == 2, result.output
    assert f"cannot reach http://127.0.0.1:{closed}/invocations" in " ".join(result.stderr.split()), result.output
    assert "credentials" not in result.output


def test_unbuilt_target_says_so_plainly(monkeypatch):
    import pytest

    from toolkit.config.targets import TargetSettings
    from toolkit.targets import base

    class Future(TargetSettings, target="future", section="future", module="toolkit.targets.future"):
        pass

    from toolkit.config.targets import TARGET_SETTINGS

    # registered by the class statement; set again through monkeypatch, which removes it after the test
    monkeypatch.setitem(TARGET_SETTINGS, "future", TARGET_SETTINGS.pop("future"))
    with pytest.raises(base.TargetError, match="target 'future' is not built yet"):
        base.get_target("future")
    with pytest.raises(base.TargetError, match="unknown target 'cloud'; choose one of: local"):
        base.get_target("cloud")
