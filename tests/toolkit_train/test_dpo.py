"""Preference tuning (training.method dpo): pairs rendered with harmony as training renders SFT rows and as vLLM
renders the prompt, and TRL's DPO loss trained for real on the tiny gpt-oss through the entrypoint, the reference
being the base with the adapter off. The pairs: the bundled multilingual sample's rows, the chosen reply reasoning
in the language the system prompt asks for, the rejected one reasoning in another row's language."""

from __future__ import annotations

import json

import pytest

from tests.toolkit_train.helpers import lay_out, losses, run_entrypoint

pytestmark = pytest.mark.integration


def preference_rows(count: int | None = None) -> list[dict]:
    """The bundled preference sample (builtin:preference-sample), its first `count` rows."""
    from toolkit_train.data import SAMPLE_PATH

    lines = (SAMPLE_PATH.parent / "preference.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()][:count]


def test_the_preference_sample_is_the_multilingual_sample_with_english_rejected_reasoning():
    """Its chosen reply is the multilingual row's own (reasoning in the language asked for), the rejected one the
    same answer reasoning in English, as gpt-oss reasons untuned: one skill apart."""
    from toolkit_train.data import SAMPLE_PATH

    rows = [json.loads(line) for line in SAMPLE_PATH.read_text().splitlines() if line.strip()]
    assert len(preference_rows()) == len(rows)
    for row, pair in zip(rows, preference_rows(), strict=True):
        assert pair["messages"][0]["content"].startswith(f"reasoning language: {row['reasoning_language']}")
        assert pair["messages"][1] == {"role": "user", "content": row["user"]}
        assert pair["chosen"] == {"content": row["final"], "reasoning": row["analysis"]}
        assert pair["rejected"] == {"content": row["final"],
                                    "reasoning": f"The user asks: {row['user']} I answer that directly."}  # fmt: skip


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def dpo(source: str, *overrides: str) -> list[str]:
    return [f"data.source={source}", "data.format=preference", "training.method=dpo", *overrides]


def test_a_pair_is_its_served_prompt_and_each_reply_as_training_renders_it(tmp_path, tiny_model_path):
    from toolkit_train import harmony
    from toolkit_train.data import DataError, PrepareReport, load_rows, prepare
    from toolkit_train.model import load_tokenizer

    from toolkit.config import load_config

    settings = load_config(
        "tiny-gpt-oss-local", dpo(write_rows(tmp_path / "p.jsonl", preference_rows(4)))
    ).train_settings()
    tokenizer = load_tokenizer(settings.model)
    report = PrepareReport()
    pairs = prepare(load_rows(settings.data.source), tokenizer, settings.data, report)
    assert pairs.column_names == ["prompt_ids", "chosen_ids", "rejected_ids"] and len(pairs) == 4
    row = preference_rows(4)[0]
    served = harmony.prompt_ids(harmony.normalize(row, row["messages"], "medium", complete=False))
    assert pairs[0]["prompt_ids"] == served  # the prompt as vLLM renders the request
    chosen = harmony.normalize(row, [*row["messages"], {"role": "assistant", **row["chosen"]}], "medium")
    (example,) = harmony.examples(chosen)  # the reply's tokens are exactly the trained tokens of the SFT row
    assert served + pairs[0]["chosen_ids"] == example.ids
    trained = [t for t, on in zip(example.ids, example.trained, strict=True) if on]
    assert trained == served[-2:] + pairs[0]["chosen_ids"]  # SFT also trains `<|start|>assistant`: DPO's prompt
    assert pairs[0]["chosen_ids"] != pairs[0]["rejected_ids"]

    bad = [*preference_rows(2), {"messages": [{"role": "user", "content": "hi"}], "chosen": "a"},
           {"messages": [{"role": "user", "content": "hi"}], "chosen": "same", "rejected": "same"}]  # fmt: skip
    with pytest.raises(DataError) as refused:
        prepare(load_rows(write_rows(tmp_path / "bad.jsonl", bad)), tokenizer, settings.data)
    message = str(refused.value)
    assert "2 of 4 rows are not valid 'preference' rows" in message and "\n" not in message
    assert "line 3: field 'rejected' must be the assistant's reply" in message
    assert "line 4: chosen and rejected are the same reply" in message


def test_dpo_trains_from_the_base_as_reference_and_merges(tmp_path):
    source = write_rows(tmp_path / "pairs.jsonl", preference_rows(8))
    root = lay_out(tmp_path / "run", dpo(source, "training.max_steps=6", "training.save_steps=0",
                                         "training.learning_rate=1e-2"))  # fmt: skip
    result = run_entrypoint(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "DPO on 8 chosen/rejected pairs (unpacked), beta 0.1, loss sigmoid" in result.stdout
    curve = losses(result.stdout)
    assert len(curve) == 6
    # the first step: policy == reference, so DPO's loss is -log(sigmoid(0)) = 0.6931, plus the router's
    # load-balancing loss at the model's own coefficient (as SFT adds it): small, never negative
    assert 0.6931 <= curve[0] < 0.70, curve
    assert min(curve[-3:]) < curve[0] - 0.05, curve  # it prefers the chosen replies more than the base did
    run = json.loads((root / "model" / "run.json").read_text())
    assert run["trained"]["paths"]["method"] == "dpo" and run["trained"]["paths"]["packing"] is False
    assert (root / "model" / "adapter" / "adapter_model.safetensors").is_file()
    assert (root / "model" / "merged" / "config.json").is_file()


def test_eval_says_plainly_that_scoring_a_dpo_run_is_not_built():
    from typer.testing import CliRunner

    from toolkit.cli import app

    result = CliRunner().invoke(app, ["eval", "tiny-gpt-oss-dpo"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "\n" not in result.output.strip()
    assert "scoring a preference-tuned run on held-out pairs is not built yet" in result.output


def test_the_method_and_the_rows_must_agree():
    from toolkit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="training.method dpo trains on chosen/rejected pairs"):
        load_config("tiny-gpt-oss-local", ["training.method=dpo"])
    with pytest.raises(ConfigError, match="set training.method: dpo"):
        load_config("tiny-gpt-oss-local", ["data.format=preference", "data.source=p.jsonl"])
    with pytest.raises(ConfigError, match="a preference pair is not truncated"):
        load_config("tiny-gpt-oss-local", dpo("p.jsonl", "data.overlong=truncate"))
