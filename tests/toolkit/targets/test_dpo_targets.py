"""Every target renders a DPO run (`toolkit train tiny-gpt-oss-dpo --target ... --dry-run`): offline, without
credentials, creating nothing, validated as the SFT renders are (the CreateTrainingJob request against botocore's
service model, the HyperPodPyTorchJob and its ConfigMap against the HyperPod SDK's and the Kubernetes client's
models, the sbatch script by bash; test_hyperpod_slurm.py submits the DPO preset to a real two-node cluster).
What each carries to the entrypoint is read back with the entrypoint's own parser
(toolkit_train.settings.from_hyperparameters, as train.py's read_settings does): training.method dpo, training.dpo
and the preference rows, exactly the config's settings. Cheap: nothing trains (tests/toolkit_train/test_dpo.py trains
DPO through the entrypoint)."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess

import pytest
import yaml
from typer.testing import CliRunner

from tests.botocore_model import assert_valid
from tests.openapi_check import errors
from toolkit.cli import app
from toolkit.config import load_config

PRESET = "tiny-gpt-oss-dpo"
IMAGE = "acct.dkr.ecr.us-east-1.amazonaws.com/train:1"
TARGETS = {
    "training-job": ["--target", "training-job", "--set", "aws.role=arn:aws:iam::123456789012:role/toolkit-execution",
                     "--set", "aws.bucket=toolkit-test-bucket"],
    "hyperpod-eks": ["--target", "hyperpod", "--set", "hyperpod.orchestrator=eks", "--set", f"hyperpod.image={IMAGE}"],
    "hyperpod-slurm": ["--target", "hyperpod", "--set", "hyperpod.orchestrator=slurm"],
}  # fmt: skip


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No credentials, no kubeconfig, no Slurm controller, and no connection anywhere (loopback included): a dry run
    that tried one fails. Returns the empty working directory, to show that nothing was created in it."""
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                     "AWS_ENDPOINT_URL", "HF_TOKEN"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))

    def refuse(*args, **kwargs):
        raise AssertionError(f"a dry run tried to reach {args[1:] or kwargs}")

    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def render(target: str, *extra: str) -> str:
    result = CliRunner().invoke(app, ["train", PRESET, *TARGETS[target], *extra, "--dry-run"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output[-3000:]
    return result.stdout


def the_config(target: str, *extra: str):
    """The config the CLI resolved: --target and each --set, as overrides."""
    args = [*TARGETS[target], *extra]
    overrides = [value for flag, value in itertools.pairwise(args) if flag == "--set"]
    name = args[args.index("--target") + 1]
    return load_config(PRESET, [f"target={name}", *overrides])


def assert_carries_dpo(hyperparameters: dict, config) -> None:
    """What the entrypoint reads (train.py read_settings) is the config's DPO run, whole."""
    from toolkit_train.settings import from_hyperparameters

    settings = from_hyperparameters(hyperparameters)
    assert settings.training.method == "dpo" and settings.data.format == "preference"
    assert settings.training.dpo.model_dump() == {"beta": 0.01, "loss_type": "sigmoid"}  # the preset's, not the default
    assert settings.data.source == "builtin:preference-sample"  # shipped with the entrypoint's code
    assert settings == config.train_settings()


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_target_renders_a_dpo_run_offline_for_the_entrypoint(target, offline, tmp_path):
    shared = tmp_path / "fsx"
    extra = ["--set", f"hyperpod.fsx.mount_path={shared}"] if target == "hyperpod-slurm" else []
    rendered = render(target, *extra)
    config = the_config(target, *extra)
    if target == "training-job":
        request = json.loads(rendered)
        assert_valid("sagemaker", "CreateTrainingJob", request)
        assert json.loads(request["HyperParameters"]["training.method"]) == "dpo"
        assert_carries_dpo(request["HyperParameters"], config)
    elif target == "hyperpod-eks":
        documents = list(yaml.safe_load_all(rendered))
        config_map, job = documents
        assert [config_map["kind"], job["kind"]] == ["ConfigMap", "HyperPodPyTorchJob"]
        assert errors(config_map, "V1ConfigMap") == []
        assert hyperpod_sdk_problems(documents) == []
        assert_carries_dpo(json.loads(config_map["data"]["hyperparameters.json"]), config)
    else:
        # the script runs the entrypoint on the job directory; its settings are what the submit stages there
        # (toolkit.targets.hyperpod.stage, called here as the submit calls it, into this test's stand-in for FSx)
        from toolkit.targets.hyperpod import job_dir, stage

        root = job_dir(config)
        assert not shared.exists()  # the dry run wrote nothing to the shared filesystem
        assert f"export TOOLKIT_ML_ROOT={root}\n" in rendered and f"{root}/code/toolkit_train/train.py" in rendered
        checked = subprocess.run(["bash", "-n"], input=rendered, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        stage(config, root, fresh=False)
        assert (root / "code" / "toolkit_train" / "train.py").is_file()
        assert_carries_dpo(json.loads((root / "input" / "config" / "hyperparameters.json").read_text()), config)
    assert list(offline.iterdir()) == []  # nothing created where it ran


def hyperpod_sdk_problems(documents: list[dict]) -> list[str]:
    from tests.toolkit.targets.test_hyperpod_eks import hyperpod_sdk_problems as check

    return check(documents)
