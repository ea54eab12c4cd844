"""The canary for the SageMaker SDK's internals the toolkit uses (toolkit/sagemaker_sdk.py): each is present in
the installed SDK, and the installed SDK is the one pyproject.toml pins. A new SDK release fails here first."""

from __future__ import annotations

import importlib
import inspect
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from toolkit import sagemaker_sdk

pytest.importorskip("sagemaker.train")
REPO = Path(__file__).resolve().parents[2]


def test_the_installed_sdk_is_the_pinned_one():
    pin = re.search(r'"sagemaker==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert pin is not None, "pyproject.toml pins sagemaker exactly (its internals are used)"
    assert version("sagemaker") == pin.group(1)


@pytest.mark.parametrize(("module", "name"), sagemaker_sdk.PRIVATE_USES, ids=lambda v: str(v))
def test_every_private_use_exists(module, name):
    owner: object = importlib.import_module(module)
    for part in name.split("."):
        if inspect.isclass(owner) and part not in dir(owner):  # an instance attribute: set in __init__
            assert part in inspect.getsource(owner), f"{module}.{name}"
            return
        owner = getattr(owner, part)


def test_private_uses_appear_only_in_the_adapter():
    used = re.compile(r"trainer\._|model_trainer\.|_get_unique_name|_create_training_job_args|_latest_training_job")
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "toolkit").rglob("*.py")
        if path.name != "sagemaker_sdk.py" and used.search(path.read_text())
    ]
    assert offenders == []
