"""The floors: cli -> sdk -> deploy / targets / infra -> aws -> config -> toolkit_train. The CLI parses, calls the
SDK and renders; it reaches nothing below the SDK but the error map and the config schema. The training code
imports no toolkit module (it runs in containers that have none). Read from the source, so a new import fails."""

from __future__ import annotations

import ast
from pathlib import Path

import toolkit_train

import toolkit

CLI_MAY_IMPORT = ("toolkit.sdk", "toolkit.errors", "toolkit.config")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "toolkit":  # `from toolkit import sdk` imports toolkit.sdk
                names |= {f"toolkit.{alias.name}" for alias in node.names}
    return names


def test_the_cli_imports_only_the_sdk_the_error_map_and_the_config():
    cli = Path(toolkit.__file__).parent / "cli.py"
    below = {
        name
        for name in _imports(cli)
        if (name.startswith(("toolkit.", "toolkit_train")) and not name.startswith(CLI_MAY_IMPORT))
    }
    assert below == set(), f"cli.py reaches below the SDK: {sorted(below)}; add what it needs to toolkit/sdk.py"


def test_the_training_code_imports_no_toolkit_module():
    package = Path(toolkit_train.__file__).parent
    found = {
        f"{path.name}: {name}"
        for path in package.rglob("*.py")
        for name in _imports(path)
        if name == "toolkit" or name.startswith("toolkit.")
    }
    assert found == set()


def test_deploy_the_sdk_and_the_config_never_reach_into_a_named_target():
    """Deploy, the registry and the SDK ask the target contract (toolkit.targets.base: latest, servable_model);
    a target's own module is imported only by the registry of targets."""
    root = Path(toolkit.__file__).parent
    named = ("toolkit.targets.local", "toolkit.targets.training_job", "toolkit.targets.hyperpod")
    sources = [*(root / "deploy").glob("*.py"), *(root / "config").glob("*.py"), root / "sdk.py", root / "aws.py"]
    found = {f"{path.name}: {name}" for path in sources for name in _imports(path) if name.startswith(named)}
    assert found == set()
