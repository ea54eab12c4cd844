"""The run tree: what a training run writes where under its ML root (SageMaker's /opt/ml contract; elsewhere the
directory $TOOLKIT_ML_ROOT names). One table for the entrypoint that writes it and for every toolkit module that
reads it (targets, eval, register, deploy), so a name is spelled once."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the schema sits on its own floor
    from .settings import TrainSettings

ML_ROOT_ENV = "TOOLKIT_ML_ROOT"  # where a run's tree is, outside a SageMaker training job
DEFAULT_ML_ROOT = Path("/opt/ml")  # SageMaker's
RUN_RECORD = "run.json"  # the run's record, written last in its model directory: present = the run completed
HYPERPARAMETERS = "hyperparameters.json"  # the run's settings (flattened TrainSettings), under input/config/


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
        return self.root / "input" / "config" / HYPERPARAMETERS

    def channel(self, name: str) -> Path:
        """A data channel's directory (SageMaker's /opt/ml/input/data/<channel>)."""
        return self.root / "input" / "data" / name

    @property
    def train_channel(self) -> Path:
        return self.channel("train")

    @property
    def eval_channel(self) -> Path:
        return self.channel("eval")

    @property
    def outputs(self) -> tuple[Path, ...]:
        """What a run writes (checkpoints, model, output): what `--fresh` clears."""
        return self.checkpoints, self.model, self.output

    @property
    def output(self) -> Path:
        return self.root / "output"

    @property
    def failure(self) -> Path:
        """Why the last attempt failed (SageMaker's /opt/ml/output/failure)."""
        return self.output / "failure"

    @property
    def train_log(self) -> Path:
        """The run's log where a target keeps one beside the run (local)."""
        return self.output / "train.log"

    @property
    def stopped(self) -> Path:
        """Written once a stop's checkpoint is saved."""
        return self.output / "stopped"

    def completed(self) -> bool:
        return self.run_record.exists()


@dataclass(frozen=True)
class RunRecord:
    """run.json as its readers see it (the entrypoint writes it last, train.write_outputs): one reader for the
    targets, eval and the registry, so a key is spelled here and nowhere else."""

    fields: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> RunRecord | None:
        """The record at `path` (a run.json, or a model directory holding one); None where there is none or it does
        not parse (a run whose record is unreadable is read as one without it)."""
        path = path / RUN_RECORD if path.is_dir() else path
        try:
            fields = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return cls(fields if isinstance(fields, dict) else {})

    @property
    def data_settings(self) -> dict[str, Any]:
        """The data settings the run trained with (they decided its held-out rows)."""
        return (self.fields.get("settings") or {}).get("data") or {}

    @property
    def log_history(self) -> list[dict[str, Any]]:
        return self.fields.get("log_history") or []

    @property
    def held_out_rows(self) -> int | None:
        """How many rows the run held out for validation (None where it held out none)."""
        return ((self.fields.get("data") or {}).get("eval") or {}).get("rows_out")

    @property
    def trained(self) -> dict[str, Any]:
        """What trained (toolkit_train/run/trained.py's summary; empty for a run recorded without one)."""
        return self.fields.get("trained") or {}

    def loss(self, name: str) -> float | None:
        """A final loss the run recorded (train_loss, eval_loss); None where it has none."""
        value = self.fields.get(name)
        return float(value) if isinstance(value, (int, float)) else None


@dataclass(frozen=True)
class Paths:
    """Where this process reads and writes its run: the run tree, each part overridable by the environment
    (SageMaker's SM_* variables; a target's TOOLKIT_CHECKPOINT_DIR)."""

    root: Path
    model_dir: Path
    checkpoints: Path
    train_channel: Path
    output_data: Path

    @classmethod
    def from_env(cls) -> Paths:
        env = os.environ
        tree = RunTree(Path(env.get(ML_ROOT_ENV, DEFAULT_ML_ROOT)))
        return cls(
            root=tree.root,
            model_dir=Path(env.get("SM_MODEL_DIR", tree.model)),
            checkpoints=Path(env.get("TOOLKIT_CHECKPOINT_DIR", tree.checkpoints)),
            train_channel=Path(env.get("SM_CHANNEL_TRAIN", tree.train_channel)),
            output_data=Path(env.get("SM_OUTPUT_DATA_DIR", tree.output / "data")),
        )

    @property
    def hyperparameters(self) -> Path:
        return RunTree(self.root).hyperparameters

    @property
    def failure(self) -> Path:
        return RunTree(self.root).failure


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


def data_source(settings: TrainSettings, paths: Paths) -> str:
    """Where the job reads its training rows: the 'train' channel when it has one, else data.source where it can be
    read from here."""
    if paths.train_channel.exists():
        return str(paths.train_channel)
    source = settings.data.source
    if source.startswith("builtin:") or Path(source).exists() or ("://" not in source and not source.startswith("/")):
        return source
    raise FileNotFoundError(
        f"data channel 'train' not found at {paths.train_channel}, and data.source {source!r} "
        "cannot be read from inside the job: pass it as the 'train' channel"
    )


def eval_source(settings: TrainSettings, paths: Paths) -> str | None:
    """Where the job reads data.eval.source: its 'eval' channel when it has one, else the source itself."""
    split = settings.data.eval
    if split is None or split.source is None:
        return None
    channel = Path(os.environ.get("SM_CHANNEL_EVAL", RunTree(paths.root).eval_channel))
    return str(channel) if channel.exists() else split.source
