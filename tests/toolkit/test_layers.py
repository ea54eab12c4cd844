"""The floors: cli -> sdk -> deploy / targets / infra -> aws -> config -> toolkit_train. The CLI (every module of
toolkit/cli/) parses, calls the SDK and renders; it reaches nothing below the SDK but the error map and the config
schema. The training code imports no toolkit module (it runs in containers that have none). Read from the source,
so a new import fails."""

from __future__ import annotations

import ast
from pathlib import Path

import toolkit_train

import toolkit

CLI = Path(toolkit.__file__).parent / "cli"  # the CLI's package: the app (common.py) and one module per verb group
CLI_MAY_IMPORT = ("toolkit.sdk", "toolkit.errors", "toolkit.config", "toolkit.cli")  # the last: its own modules


def _imports(path: Path, package: str | None = None) -> set[str]:
    """The modules a file imports. With `package` (the file's own), relative imports too, resolved against it;
    without, they are left out."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                module = node.module or ""
            elif package is None:
                continue
            else:  # `from . import x`, `from ..deploy import local`
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            names.add(module)
            if node.module == "toolkit" or node.level:  # `from toolkit import sdk` imports toolkit.sdk
                names |= {f"{module}.{alias.name}" for alias in node.names}
    return names


def _below_the_sdk(path: Path, package: str = "toolkit.cli") -> set[str]:
    """What a CLI module imports from the toolkit or the training code beyond the SDK, the error map and the config."""
    return {
        name
        for name in _imports(path, package)
        if name.startswith(("toolkit.", "toolkit_train"))
        and not any(name == allowed or name.startswith(allowed + ".") for allowed in CLI_MAY_IMPORT)
    }


def test_the_cli_imports_only_the_sdk_the_error_map_and_the_config():
    modules = {path.relative_to(CLI).as_posix(): path for path in sorted(CLI.rglob("*.py"))}
    assert {"__init__.py", "__main__.py", "common.py"} <= set(modules) and len(modules) > 3, sorted(modules)
    assert not (CLI.parent / "cli.py").exists(), "toolkit/cli.py is back beside the toolkit/cli/ package"
    below = {
        f"cli/{name}: {imported}"
        for name, path in modules.items()
        for imported in _below_the_sdk(path, ".".join(("toolkit", "cli", *Path(name).parent.parts)))
    }
    assert below == set(), f"the CLI reaches below the SDK: {sorted(below)}; add what it needs to toolkit/sdk.py"


def test_the_cli_check_sees_a_reach_below_the_sdk(tmp_path):
    """The check above can fail: imports below the SDK, absolute, relative and function-local, are all seen."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import toolkit.sdk\nfrom toolkit import aws, errors, sdk\nfrom toolkit.cli.common import app\n"
        "from toolkit.config import load_config\nfrom . import app\nfrom ..deploy import local\n"
        "from ..sdk import train\nfrom toolkit.sdkextra import x\n"
        "def f():\n    from toolkit.deploy.client import ChatClient\n    import toolkit_train.families.harmony\n"
    )
    assert _below_the_sdk(probe) == {
        "toolkit.aws", "toolkit.deploy", "toolkit.deploy.local", "toolkit.sdkextra", "toolkit.deploy.client",
        "toolkit_train.families.harmony",
    }  # fmt: skip


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


# The training package's rooms, lowest floor first (docs/architecture.md): a module imports its own floor or one
# below. A new module or folder of the package fails until it has a floor here.
TRAINING_FLOORS = (
    ("methods", "families"),  # the records: what a method and a family are (their rewards, their chat formats)
    ("settings",),  # the schema every target fills in (the toolkit imports it)
    ("layout", "data"),  # where a run's files are; rows validated, rendered and tokenized
    ("kernels",),  # MoE, MXFP4 (packed experts, their LoRA), packing
    ("builtin",),  # the built-in tiny bases the quickstart trains
    ("run",),  # a run: the model loaded, the trainer's arguments, callbacks, checkpoints, what trained, fault points
    ("trainers",),  # each method's trainer (its module, named by its record), and build_trainer over them
    ("train", "pid1"),  # the entry scripts every job runs
)


def _training_rooms() -> dict[str, tuple[str, Path]]:
    """Each module of the training package -> (its room, its file)."""
    package = Path(toolkit_train.__file__).parent
    rooms = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        if parts == ("__init__",):
            continue
        module = ".".join(("toolkit_train", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        rooms[module] = (parts[0], path)
    return rooms


def _arrows_up(rooms: dict[str, tuple[str, Path]], floors: tuple[tuple[str, ...], ...]) -> list[str]:
    floor_of = {room: level for level, members in enumerate(floors) for room in members}
    unplaced = sorted({room for room, _ in rooms.values() if room not in floor_of})
    assert unplaced == [], f"rooms of toolkit_train with no floor in TRAINING_FLOORS: {unplaced}"
    up = []
    for module, (room, path) in rooms.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for name in _imports(path, package):
            target = name.split(".")
            if target[0] != "toolkit_train" or len(target) < 2 or target[1] not in floor_of:
                continue
            if floor_of[target[1]] > floor_of[room]:
                up.append(f"{module} ({room}) imports {name} ({target[1]})")
    return sorted(up)


def test_the_training_package_is_rooms_with_no_arrow_back_up():
    rooms = _training_rooms()
    assert {room for room, _ in rooms.values()} >= {"methods", "families", "kernels", "builtin", "run", "trainers",
                                                     "train"}  # fmt: skip
    assert _arrows_up(rooms, TRAINING_FLOORS) == []


def test_the_rooms_check_sees_an_arrow_back_up():
    """The check above can fail: with the run room put below the kernels, the kernels' importers point up."""
    rooms = _training_rooms()
    swapped = tuple(("run",) if floor == ("kernels",) else ("kernels",) if floor == ("run",) else floor
                    for floor in TRAINING_FLOORS)  # fmt: skip
    assert any("(run) imports toolkit_train.kernels" in arrow for arrow in _arrows_up(rooms, swapped))


def test_nothing_shipped_imports_the_bench_or_the_tests():
    """The bench's FP8 experts (bench/fp8.py) and the tests' props stay out of the package the jobs run."""
    shipped = [path for _, path in _training_rooms().values()] + list(Path(toolkit.__file__).parent.rglob("*.py"))
    found = {f"{path.name}: {name}" for path in shipped for name in _imports(path)
             if name.split(".")[0] in {"bench", "tests", "fp8", "conftest"}}  # fmt: skip
    assert found == set()


def test_no_fault_switch_is_read_by_anything_shipped():
    """The faults the crash tests inject (tests/faults: SIGKILL at a moment, a slow save, a starved gradient) act from
    outside, on the run's moments (toolkit_train/run/moments.py): no shipped file names one of their switches."""
    from tests import faults

    shipped = [path for _, path in _training_rooms().values()] + list(Path(toolkit.__file__).parent.rglob("*.py"))
    found = {f"{path.name}: {switch}" for path in shipped for switch in faults.SWITCHES.values()
             if switch in path.read_text()}  # fmt: skip
    assert found == set()
