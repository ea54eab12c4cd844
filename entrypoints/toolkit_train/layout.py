"""The run tree: what a training run writes where under its ML root (SageMaker's /opt/ml contract; elsewhere the
directory $TOOLKIT_ML_ROOT names). One table for the entrypoint that writes it and for every toolkit module that
reads it (targets, eval, register, deploy), so a name is spelled once."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

ML_ROOT_ENV = "TOOLKIT_ML_ROOT"  # where a run's tree is, outside a SageMaker training job
DEFAULT_ML_ROOT = Path("/opt/ml")  # SageMaker's
RUN_RECORD = "run.json"  # the run's record, written last in its model directory: present = the run completed


@dataclass(frozen=True)
class RunTree:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def run_record(self) -> Path:
        return self.model / RUN_RECORD

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def hyperparameters(self) -> Path:
        return self.root / "input" / "config" / "hyperparameters.json"

    @property
    def output(self) -> Path:
        return self.root / "output"

    @property
    def failure(self) -> Path:
        """Why the last attempt failed (SageMaker's /opt/ml/output/failure)."""
        return self.output / "failure"

    @property
    def stopped(self) -> Path:
        """Written once a stop's checkpoint is saved."""
        return self.output / "stopped"

    def completed(self) -> bool:
        return self.run_record.exists()


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write beside the target, flush to disk, then rename over it (a rename within a directory is atomic): a kill
    at any instant leaves the whole new file or the old one, never a torn one (run.json says "complete" by being
    there). The toolkit's writes use this one too (toolkit/files.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with open(staging, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def write_json_atomically(path: Path, value: object) -> None:
    write_atomically(path, json.dumps(value, indent=2))
