"""The public Python API. The CLI is a thin layer over these calls; CI scripts call them directly.

Nothing here parses flags or prints tables: results come back as values, failures as exceptions
(`ConfigError`, `DataError`, `TargetError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolkit.config import Config, load_config
from toolkit.config.loader import validate
from toolkit.targets.base import Job, get_target


def _as_config(config: Config | str | Path, overrides: Sequence[str] = (), target: str | None = None) -> Config:
    cfg = config if isinstance(config, Config) else load_config(config, overrides)
    if target is not None and target != cfg.target:  # re-validate: targets have rules of their own
        cfg = validate({**cfg.model_dump(), "target": target}, f"{cfg.name} with target {target}")
    return cfg


def prepare_data(
    config: Config | str | Path, output: str | Path | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """Load, validate, render and tokenize the config's data once; save it as an Arrow dataset.

    Returns the token statistics and where the dataset went. Point `data.source` at that directory
    to train on it without re-tokenizing.
    """
    from entrypoints.data import PrepareReport, load_rows, prepare
    from entrypoints.model import load_tokenizer

    cfg = _as_config(config, overrides)
    destination = Path(output) if output else Path("runs") / cfg.name / "prepared"
    report = PrepareReport()
    tokenizer = load_tokenizer(cfg.model)
    dataset = prepare(load_rows(cfg.data.source, cfg.data.split), tokenizer, cfg.data, report)
    dataset.save_to_disk(str(destination))
    return {"output": str(destination), **report.summary(), "bad_rows": report.bad_rows}


def train(
    config: Config | str | Path,
    target: str | None = None,
    overrides: Sequence[str] = (),
    fresh: bool = False,
) -> Job:
    """Submit training to a target (default: the config's `target`); returns a job handle.

    Call `job.wait()` to block until it ends; `job.stop()` checkpoints and stops it.
    """
    cfg = _as_config(config, overrides, target)
    return get_target(cfg.target).submit(cfg, fresh=fresh)


def render_train(config: Config | str | Path, target: str | None = None, overrides: Sequence[str] = ()) -> str:
    """What `train` would submit (the dry run): nothing is created or launched."""
    cfg = _as_config(config, overrides, target)
    return get_target(cfg.target).render(cfg)
