"""The optional parts of the toolkit (pyproject.toml's extras): the table that names the extra of a missing import is
pyproject.toml's, both ways, and a missing one is one line with exit 2 (the slim install's real run:
tests/test_newcomer.py)."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

from toolkit import errors, sdk

REPO = Path(__file__).resolve().parents[2]
SHIPPED_EXTRAS = ("train", "eval", "aws")  # dev is the project's own tooling: no command of the toolkit needs it


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _extra_distributions() -> dict[str, set[str]]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {extra: {_canonical(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0]) for req in extras[extra]}
            for extra in SHIPPED_EXTRAS}  # fmt: skip


def _with_their_requirements(distributions: set[str]) -> set[str]:
    """The distributions and everything they install (botocore comes with boto3, and the toolkit imports it)."""
    found, frontier = set(), list(distributions)
    while frontier:
        name = frontier.pop()
        if name in found:
            continue
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:  # a requirement for another platform (its marker), not installed
            continue
        found.add(name)
        for req in requires:
            if "extra ==" not in req:
                frontier.append(_canonical(re.split(r"[<>=!~\[; (]", req, maxsplit=1)[0]))
    return found


def test_the_table_is_pyprojects_extras_both_ways():
    """Every module of the table is a top-level import of a distribution of its extra (or one it installs), and
    every distribution of an extra has its import in the table (read from the installed metadata of this
    environment, which has them all)."""
    of_module = {module: {_canonical(d) for d in dists} for module, dists in metadata.packages_distributions().items()}
    wanted = _extra_distributions()
    for module, extra in errors.EXTRA_OF_MODULE.items():
        installed = _with_their_requirements(wanted[extra])
        assert of_module.get(module, set()) & installed, f"{module}: no distribution of the `{extra}` extra"
    for extra, distributions in wanted.items():
        listed = {d for module, of in errors.EXTRA_OF_MODULE.items() if of == extra for d in of_module.get(module, ())}
        unlisted = sorted(d for d in distributions if not _with_their_requirements({d}) & listed)  # sagemaker 3:
        assert not unlisted, f"the `{extra}` extra's {unlisted}: no import listed"  # its parts hold the imports
    assert set(errors.WHAT_EXTRA_GIVES) == set(SHIPPED_EXTRAS)


def test_a_missing_extra_is_one_line_with_exit_2(monkeypatch):
    """sagemaker's absence simulated (find_spec answers None for it): this environment has every extra."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sagemaker" else real(name, *a))
    code, line = errors.classify(ModuleNotFoundError("No module named 'sagemaker'", name="sagemaker.core"))
    assert code == errors.BAD_INPUT and "\n" not in line
    assert "`aws` extra is not installed (no sagemaker)" in line and "pip install '.[aws]'" in line, line


def test_a_missing_part_of_an_installed_extra_is_not_a_missing_extra():
    """sagemaker is installed: a submodule it lacks is a version mismatch or a bug, and keeps its traceback."""
    assert errors.classify(ModuleNotFoundError("No module named 'sagemaker.nothing'", name="sagemaker.nothing")) is None


def test_any_other_missing_module_is_a_bug_and_keeps_its_traceback():
    assert errors.classify(ModuleNotFoundError("No module named 'toolkit.nothing'", name="toolkit.nothing")) is None


def test_a_target_that_needs_the_aws_extra_says_so_before_anything_is_read(monkeypatch, tmp_path):
    """The training-job dry run without the aws extra: refused before the config's data or model is looked at.
    The extra's absence is simulated (find_spec answers None for sagemaker): this environment has every extra;
    tests/test_newcomer.py runs the same command in a real install without it."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sagemaker" else real(name, *a))
    with pytest.raises(errors.MissingExtra, match=r"target training-job: the toolkit's `aws` extra .*no sagemaker"):
        sdk.render_train("gpt-oss-20b-lora", target="training-job")


def test_every_name_of_the_readme_sdk_table_is_callable_on_toolkit():
    """`import toolkit` then `toolkit.NAME(...)` for every name of the README's SDK table; `toolkit.deploy` is the
    SDK's function, not the toolkit.deploy sub-package that shares its name (it was: TypeError on the README's
    example)."""
    import toolkit
    import toolkit.deploy.local  # the sub-package and the module that share SDK names, imported first
    import toolkit.plan

    sheet = (REPO / "README.md").read_text().split("## SDK", 1)[1].split("\n## ", 1)[0]
    cells = [cell for cell in re.findall(r"^\| (.+?) \|", sheet, flags=re.M) if not cell.startswith("SDK")]
    names = {name for cell in cells for name in re.findall(r"`(\w+)`", cell)}
    assert {"train", "deploy", "chat_client", "infra_plan"} <= names, sorted(names)
    for name in sorted(names):
        assert callable(getattr(toolkit, name)), f"toolkit.{name} is {getattr(toolkit, name)!r}"
    assert toolkit.deploy is sdk.deploy and toolkit.plan is sdk.plan
