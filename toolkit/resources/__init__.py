"""Files the toolkit ships besides its code, found the same way in a checkout and in an installed wheel.

In the repository they live at the top (containers/, infra/, entrypoints/: the project's layout); the package
reaches them through links (toolkit/resources/containers, toolkit/resources/infra, toolkit/entrypoints), which
building the wheel turns into real copies. Every module finds them here, never relative to the checkout.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
SERVING_CONTEXT = HERE / "containers" / "serving"  # the serving image's build context
TRAINING_DOCKERFILE = HERE / "containers" / "training" / "Dockerfile"  # + the lock files: its build context
TRAINING_BASE_CHECK = HERE / "containers" / "training" / "check_base.py"  # keeps the base's torch, or stops
INFRA_TEMPLATE = HERE / "infra" / "toolkit.yaml"  # the CloudFormation stack
ENTRYPOINTS_DIR = HERE.parent / "entrypoints"  # what runs in the training container (the code channel)
ENTRYPOINT = ENTRYPOINTS_DIR / "train.py"
TRAINING_LOCK = ENTRYPOINTS_DIR / "requirements.txt"  # the training stack's exact versions, installed in jobs
MLFLOW_LOCK = ENTRYPOINTS_DIR / "requirements-mlflow.txt"  # added only when the run reports to MLflow
