"""Validate HyperPodPyTorchJob manifests (JSON on stdin) with the HyperPod SDK's own pydantic models.

Runs in the SDK's environment (`sagemaker-hyperpod`, whose pins clash with the test tooling), not under pytest.
Only the models' module is loaded, from its file: the SDK package's import side effects (telemetry) never run.
Prints one problem per line; exit 1 when there are any.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import sagemaker  # a namespace package: locating it runs no SDK code


def load_models():
    root = next(Path(p) for p in sagemaker.__path__ if (Path(p) / "hyperpod").is_dir())
    path = root / "hyperpod" / "training" / "config" / "hyperpod_pytorch_job_unified_config.py"
    spec = importlib.util.spec_from_file_location("hyperpod_job_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dropped(given, kept, path=""):
    """Keys the model ignored (the spec model allows extras: a typo would vanish silently)."""
    if isinstance(given, dict) and isinstance(kept, dict):
        return [p for key, value in given.items()
                for p in ([f"{path}.{key}: ignored by the model"] if key not in kept
                          else dropped(value, kept[key], f"{path}.{key}"))]  # fmt: skip
    if isinstance(given, list) and isinstance(kept, list):
        return [p for i, (a, b) in enumerate(zip(given, kept, strict=False)) for p in dropped(a, b, f"{path}[{i}]")]
    return []


def main() -> int:
    from pydantic import ValidationError

    models = load_models()
    problems = []
    for manifest in json.load(sys.stdin):
        if manifest.get("kind") != "HyperPodPyTorchJob":
            continue
        try:
            metadata = models.Metadata.model_validate(manifest["metadata"], by_name=True)
            spec = models._HyperPodPytorchJob.model_validate(manifest["spec"], by_name=True)
        except ValidationError as exc:
            problems += [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
            continue
        problems += dropped(manifest["spec"], spec.model_dump(exclude_unset=True), "spec")
        problems += dropped(manifest["metadata"], metadata.model_dump(exclude_unset=True), "metadata")
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
