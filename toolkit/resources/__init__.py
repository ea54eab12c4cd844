"""Files the toolkit ships besides its code, found the same way in a checkout and in an installed wheel.

The training code is its own package, `toolkit_train` (entrypoints/toolkit_train/ in the repository, top level in
the wheel), found by import. containers/ and infra/ live at the top of the repository; building the wheel copies
them under toolkit/resources/ (pyproject.toml maps them as packages of data), so an installed toolkit finds them
here and a checkout finds them at the top. Every module finds them through this one module.
"""

from __future__ import annotations

from pathlib import Path

import toolkit_train

HERE = Path(__file__).parent
REPOSITORY = HERE.parents[1]


def _shipped(name: str) -> Path:
    """containers/ or infra/: the wheel's copy beside this module, else the checkout's at the top."""
    return HERE / name if (HERE / name).is_dir() else REPOSITORY / name


SERVING_CONTEXT = _shipped("containers") / "serving"  # the serving image's build context
TRAINING_DOCKERFILE = _shipped("containers") / "training" / "Dockerfile"  # + the lock files: its build context
TRAINING_BASE_CHECK = _shipped("containers") / "training" / "check_base.py"  # keeps the base's torch, or stops
INFRA_TEMPLATE = _shipped("infra") / "toolkit.yaml"  # the CloudFormation stack
TRAINING_PACKAGE = Path(toolkit_train.__file__).parent  # what runs in the training container (the code channel)
ENTRY_SCRIPT = f"{TRAINING_PACKAGE.name}/train.py"  # the file every job runs, relative to the staged code
TRAINING_LOCK = TRAINING_PACKAGE / "requirements.txt"  # the training stack's exact versions, installed in jobs
MLFLOW_LOCK = TRAINING_PACKAGE / "requirements-mlflow.txt"  # added only when the run reports to MLflow
