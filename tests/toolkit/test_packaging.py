"""The installed package, not the checkout: build the wheel, install it (no deps, no network) into a directory of
its own, and run it from elsewhere. Presets, the training entrypoint and its sample, the serving image's context
and the CloudFormation template must all come from the installed copy, and the wheel must own no import names but
`toolkit` and the training code's `toolkit_train` (PyPI's `entrypoints` distribution owns the folder's name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work), str(REPO)],
        check=True, capture_output=True,
    )  # fmt: skip
    (built,) = work.glob("toolkit-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel) -> Path:
    site = wheel.parent / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    return site


def run_installed(site: Path, cwd: Path, *code: str) -> subprocess.CompletedProcess:
    # the installed copy first on the path; the dependencies come from this environment
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, *code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_owns_only_the_toolkit_import_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"toolkit", "toolkit_train"}
    for shipped in (
        "toolkit_train/train.py",
        "toolkit_train/requirements.txt",
        "toolkit_train/samples/multilingual-thinking.jsonl",
        "toolkit/resources/containers/serving/Dockerfile",
        "toolkit/resources/containers/serving/serve.py",
        "toolkit/resources/containers/serving/toolkit_parsers.py",
        "toolkit/resources/containers/training/Dockerfile",
        "toolkit/resources/containers/training/check_base.py",
        "toolkit_train/requirements-mlflow.txt",
        "toolkit/resources/infra/toolkit.yaml",
        "toolkit/presets/tiny-gpt-oss-local.yaml",
    ):
        assert shipped in names


def test_installed_package_finds_its_files_from_another_directory(installed, tmp_path):
    probe = run_installed(installed, tmp_path, "-c", """
import json, toolkit, toolkit.resources as r
from toolkit_train.data import SAMPLE_PATH
from toolkit.config import preset_names
print(json.dumps({"toolkit": toolkit.__file__, "files": [str(p) for p in (r.SERVING_CONTEXT / "Dockerfile",
    r.SERVING_CONTEXT / "serve.py", r.INFRA_TEMPLATE, r.TRAINING_PACKAGE / "train.py", SAMPLE_PATH)],
    "presets": preset_names()}))
""")  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert Path(found["toolkit"]).is_relative_to(installed)
    for file in found["files"]:
        assert Path(file).is_relative_to(installed) and Path(file).is_file(), file
    assert {"gpt-oss-20b-lora", "gpt-oss-120b-lora", "tiny-gpt-oss-local"} <= set(found["presets"])


def test_installed_cli_validates_a_preset_and_the_entrypoint_runs_as_a_script(installed, tmp_path):
    validated = run_installed(installed, tmp_path, "-m", "toolkit.cli", "config", "validate", "gpt-oss-20b-lora")
    assert validated.returncode == 0, validated.stderr
    assert "ok gpt-oss-20b-lora" in validated.stdout
    planned = run_installed(installed, tmp_path, "-m", "toolkit.cli", "plan", "gpt-oss-20b-lora", "--offline",
                            "--tokens", "1000", "--json")  # fmt: skip
    assert planned.returncode == 0, planned.stderr  # the throughput table and the price file ship in the wheel
    candidates = json.loads(planned.stdout)["candidates"]
    sources = {(c["target"], c["instance_type"]): c["price_source"] for c in candidates}
    assert sources[("training-job", "ml.p5.48xlarge")].startswith("shipped price file"), sources
    # the training container runs train.py as a script: it must import its siblings wherever it is installed
    env = {**os.environ, "TOOLKIT_ML_ROOT": str(tmp_path / "ml"), "PYTHONPATH": ""}
    script = installed / "toolkit_train" / "train.py"
    ran = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ran.returncode == 1, ran.stderr
    assert "no hyperparameters" in (tmp_path / "ml" / "output" / "failure").read_text()
