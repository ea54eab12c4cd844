"""The training stack a job installs is the one the tests ran: every line of the lock is an exact pin that equals
the version in this test environment (torch aside: the job's torch is its image's). scripts/env.sh installs the
test environment with the lock as a constraint, so a change to one side without the other fails here."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from toolkit.resources import MLFLOW_LOCK, TRAINING_LOCK

REPO = Path(__file__).resolve().parents[2]


def locked(path: Path) -> list[Requirement]:
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [Requirement(line) for line in lines if line]


@pytest.mark.parametrize("lock", [TRAINING_LOCK, MLFLOW_LOCK], ids=lambda p: p.name)
def test_the_lock_is_exact_and_equals_the_test_environment(lock):
    for requirement in locked(lock):
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"{lock.name}: {requirement} is not an exact pin"
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            pytest.fail(f"{requirement.name} is locked in {lock.name} but not installed in the test environment")
        assert installed == spec.version, f"{lock.name} locks {requirement}, the tests run {installed}"


def test_the_package_extras_admit_the_lock():
    """`pip install toolkit[train]` must be able to resolve to the tested versions."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    allowed = {Requirement(r).name.lower(): Requirement(r).specifier for r in extras["train"]}
    for requirement in locked(TRAINING_LOCK):
        (spec,) = requirement.specifier
        if requirement.name.lower() in allowed:
            assert spec.version in allowed[requirement.name.lower()], f"toolkit[train] excludes {requirement}"
