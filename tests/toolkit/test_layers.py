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


def _toolkit_modules() -> dict[str, Path]:
    root = Path(toolkit.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = ("toolkit", *path.relative_to(root).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _runtime_imports(path: Path) -> set[str]:
    """Every import that runs, at module level or inside a function (a function-local import is still an arrow),
    but not those under `if TYPE_CHECKING:` (annotations only)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_no_import_circle_between_toolkit_modules():
    """Imports as a graph of modules (package-to-own-submodule arrows aside): no strongly connected set. A circle
    hidden in a function-local import is a circle too; three were (config, deploy endpoints, eval report)."""
    modules = _toolkit_modules()
    graph = {
        module: {
            name
            for name in _runtime_imports(path)
            if name in modules and name != module and not module.startswith(name + ".")
        }
        for module, path in modules.items()
    }
    circles = []
    for start in graph:  # a module on a circle reaches itself; each circle reported once, by its members
        if start in _reach(graph, start):
            members = sorted(m for m in _reach(graph, start) if start in _reach(graph, m))
            if members not in circles:
                circles.append(members)
    assert circles == [], f"import circles: {circles}"


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, frontier = set(), list(graph[start])
    while frontier:
        current = frontier.pop()
        if current not in seen:
            seen.add(current)
            frontier.extend(graph[current])
    return seen


def test_no_circle_between_the_toolkits_packages():
    """The same at the level of the packages and top modules (toolkit.deploy, toolkit.evaluate, toolkit.registry,
    ...): the floors run one way. The registry reads eval reports and deploy's serving settings, eval serves through
    deploy; deploy never reaches back into either (it did: the registry lived inside deploy)."""
    modules = _toolkit_modules()

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph: dict[str, set[str]] = {package(m): set() for m in modules}
    for module, path in modules.items():
        graph[package(module)] |= {
            package(name) for name in _runtime_imports(path) if name in modules and package(name) != package(module)
        }
    circles = sorted({tuple(sorted(m for m in _reach(graph, p) if p in _reach(graph, m))) for p in graph
                      if p in _reach(graph, p)})  # fmt: skip
    assert circles == [], f"circles between packages: {circles}"
