"""data.eval: held-out rows give a validation loss during a real tiny training run and never reach training."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests import faults
from tests.runs import held_out_rows, sample_rows
from tests.toolkit_train.helpers import ENTRYPOINT, entrypoint_env, lay_out
from toolkit.config import load_config

pytestmark = pytest.mark.integration
SPLIT = ["data.eval.fraction=0.25", "data.eval.steps=2"]


def _contains(haystack: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _tokenized(settings, rows):
    from toolkit_train.data import prepare
    from toolkit_train.run.model import load_tokenizer

    return [list(ids) for ids in prepare(rows, load_tokenizer(settings.model), settings.data)["input_ids"]]


def test_held_out_rows_give_a_validation_loss_and_never_reach_training(tmp_path, tiny_model_path):
    from toolkit_train.data import load_rows, split_rows

    overrides = [*SPLIT, "training.max_steps=4", "training.save_steps=0", "training.merge_adapter=false"]
    root = lay_out(tmp_path / "job", overrides)
    batches = tmp_path / "batches.jsonl"
    result = subprocess.run(
        faults.command(ENTRYPOINT), env=faults.env(entrypoint_env(root), batch_log=batches),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    evals = [line for line in result.stdout.splitlines() if line.startswith("[metrics]") and "eval_loss=" in line]
    # before training (the base model: LoRA starts as the identity), every 2 steps, and at the end
    assert [line.split()[1] for line in evals] == ["step=0/4", "step=2/4", "step=4/4", "step=4/4"], evals
    run = json.loads((root / "model" / "run.json").read_text())
    assert run["data"]["eval"]["rows_out"] == held_out_rows()  # a quarter of the sample held out
    assert run["data"]["rows_out"] == sample_rows() - held_out_rows()
    assert run["eval_loss"] == pytest.approx(float(evals[-1].split("eval_loss=")[1]), abs=1e-4)
    assert sum("eval_loss" in entry for entry in run["log_history"]) == 4

    settings = load_config("tiny-gpt-oss-local", overrides).train_settings()
    kept, held = split_rows(load_rows(settings.data.source), settings.data)
    trained = [json.loads(line) for line in batches.read_text().splitlines()]
    assert trained, "no training batch was logged"
    assert not any(_contains(batch, row) for row in _tokenized(settings, held) for batch in trained)
    seen = [row for row in _tokenized(settings, kept) if any(_contains(batch, row) for batch in trained)]
    assert len(seen) >= 4, "the log does not show the training rows either: the check above would prove nothing"


def test_the_held_out_rows_are_the_same_on_every_load_and_differ_by_seed():
    from toolkit_train.data import held_out_indices

    assert held_out_indices(24, 0.25, 1234) == held_out_indices(24, 0.25, 1234)
    assert held_out_indices(24, 0.25, 1234) != held_out_indices(24, 0.25, 99)
    assert len(held_out_indices(3, 0.01, 1)) == 1 and len(held_out_indices(3, 0.99, 1)) == 2  # at least one, not all
