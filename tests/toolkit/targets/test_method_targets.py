"""Every target renders a run of each method beyond SFT (`toolkit train tiny-gpt-oss-dpo|tiny-gpt-oss-grpo --target ...
--dry-run`): offline, without
credentials, creating nothing, validated as the SFT renders are (the CreateTrainingJob request against botocore's
service model, the HyperPodPyTorchJob and its ConfigMap against the HyperPod SDK's and the Kubernetes client's
models, the sbatch script by bash; test_hyperpod_slurm.py submits the DPO preset to a real two-node cluster).
What each carries to the entrypoint is read back with the entrypoint's own parser
(toolkit_train.settings.from_hyperparameters, as train.py's read_settings does): training.method, its own section
(training.dpo, training.grpo with its rewards) and its rows' format, exactly the config's settings. Cheap: nothing
trains (tests/toolkit_train/methods/test_dpo.py and test_grpo.py train them through the entrypoint)."""

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

PRESETS = {"dpo": "tiny-gpt-oss-dpo", "grpo": "tiny-gpt-oss-grpo"}  # each method's tiny preset
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


def render(preset: str, target: str, *extra: str) -> str:
    result = CliRunner().invoke(app, ["train", preset, *TARGETS[target], *extra, "--dry-run"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output[-3000:]
    return result.stdout


def the_config(preset: str, target: str, *extra: str):
    """The config the CLI resolved: --target and each --set, as overrides."""
    args = [*TARGETS[target], *extra]
    overrides = [value for flag, value in itertools.pairwise(args) if flag == "--set"]
    name = args[args.index("--target") + 1]
    return load_config(preset, [f"target={name}", *overrides])


def assert_carries_the_method(hyperparameters: dict, config) -> None:
    """What the entrypoint reads (train.py read_settings) is the config's run, whole: its method, the method's own
    section as the preset sets it (not the defaults), its rows' format and source."""
    from toolkit_train.settings import from_hyperparameters

    settings = from_hyperparameters(hyperparameters)
    method = config.training.method_record
    assert settings.training.method == method.name and settings.data.format == method.data_formats[0]
    assert method.section is not None
    section = getattr(settings.training, method.section).model_dump()
    assert section == getattr(config.training, method.section).model_dump()
    assert section != type(getattr(config.training, method.section))().model_dump()  # the preset's, not the default
    assert settings.data.source.startswith("builtin:")  # shipped with the entrypoint's code
    assert settings == config.train_settings()


@pytest.mark.parametrize("method", list(PRESETS))
@pytest.mark.parametrize("target", list(TARGETS))
def test_every_target_renders_each_methods_run_offline_for_the_entrypoint(target, method, offline, tmp_path):
    shared = tmp_path / "fsx"
    extra = ["--set", f"hyperpod.fsx.mount_path={shared}"] if target == "hyperpod-slurm" else []
    rendered = render(PRESETS[method], target, *extra)
    config = the_config(PRESETS[method], target, *extra)
    if target == "training-job":
        request = json.loads(rendered)
        assert_valid("sagemaker", "CreateTrainingJob", request)
        assert json.loads(request["HyperParameters"]["training.method"]) == method
        assert_carries_the_method(request["HyperParameters"], config)
    elif target == "hyperpod-eks":
        documents = list(yaml.safe_load_all(rendered))
        config_map, job = documents
        assert [config_map["kind"], job["kind"]] == ["ConfigMap", "HyperPodPyTorchJob"]
        assert errors(config_map, "V1ConfigMap") == []
        assert hyperpod_sdk_problems(documents) == []
        assert_carries_the_method(json.loads(config_map["data"]["hyperparameters.json"]), config)
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
        assert_carries_the_method(json.loads((root / "input" / "config" / "hyperparameters.json").read_text()), config)
    assert list(offline.iterdir()) == []  # nothing created where it ran


def hyperpod_sdk_problems(documents: list[dict]) -> list[str]:
    from tests.toolkit.targets.test_hyperpod_eks import hyperpod_sdk_problems as check

    return check(documents)
