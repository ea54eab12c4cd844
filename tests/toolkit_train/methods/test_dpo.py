"""Preference tuning (training.method dpo): pairs rendered with harmony as training renders SFT rows and as vLLM
renders the prompt, and TRL's DPO loss trained for real on the tiny gpt-oss through the entrypoint, the reference
being the base with the adapter off. The pairs: the bundled multilingual sample's rows, the chosen reply reasoning
in the language the system prompt asks for, the rejected one reasoning in another row's language."""

from __future__ import annotations

import json
import signal

import pytest

from tests.toolkit_train.helpers import adapter_tensors, entrypoint, lay_out, losses, steps

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
    from toolkit_train.data import DataError, PrepareReport, load_rows, prepare
    from toolkit_train.families import harmony
    from toolkit_train.run.model import load_tokenizer

    from toolkit.config import load_config

    settings = load_config(
        "tiny-gpt-oss-local", dpo(write_rows(tmp_path / "p.jsonl", preference_rows(4)))
    ).train_settings()
    tokenizer = load_tokenizer(settings.model)
    report = PrepareReport()
    pairs = prepare(load_rows(settings.data.source), tokenizer, settings.data, report)
    assert pairs.column_names == ["prompt_ids", "chosen_ids", "rejected_ids"] and len(pairs) == 4
    row = preference_rows(4)[0]
    date = settings.data.conversation_date  # the preset's, as its server renders it
    served = harmony.prompt_ids(harmony.normalize(row, row["messages"], "medium", complete=False), date)
    assert pairs[0]["prompt_ids"] == served  # the prompt as vLLM renders the request
    chosen = harmony.normalize(row, [*row["messages"], {"role": "assistant", **row["chosen"]}], "medium")
    (example,) = harmony.examples(chosen, date)  # the reply's tokens are exactly the trained tokens of the SFT row
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


def test_dpo_killed_then_stopped_resumes_each_time_with_the_base_as_reference_and_merges(tmp_path):
    """The one trained DPO run of the suite, 6 steps over three processes of the same command: SIGKILLed inside its
    step-4 save (adapter and optimizer written, the rest not), it resumes from checkpoint-2, not from step 0; stopped
    there by SIGTERM, it checkpoints step 3 and exits 143; the third resumes from checkpoint-3, finishes and merges.
    The kill's half-saved checkpoint-4 (set aside, never resumed from) holds the adapter of the run uninterrupted up
    to step 4: the resumed run's checkpoint-4 equals it exactly (as SFT's fault tests: max difference 0.0), and steps
    3-4 log the uninterrupted run's loss and gradient norm: the resumes restored the adapter, the optimizer, the data
    order and the reference (the base, adapter off: a reference reloaded as the trained adapter would make step 3's
    loss 0.693 again)."""
    source = write_rows(tmp_path / "pairs.jsonl", preference_rows(8))
    settings = ["training.max_steps=6", "training.save_steps=2", "training.per_device_batch_size=1"]
    root = lay_out(tmp_path / "run", dpo(source, *settings, "training.learning_rate=1e-2"))
    saved = root / "checkpoints"
    code, killed = entrypoint(root, fault="checkpoint-save-4")
    assert code == -signal.SIGKILL and "fault point checkpoint-save-4: killing the run" in killed, killed[-3000:]
    packed = "each micro-batch's replies packed in one row, no padding"
    assert f"DPO on 8 chosen/rejected pairs ({packed}), beta 0.1, loss sigmoid" in killed
    first = losses(killed)
    assert len(first) == 4
    # the first step: policy == reference, so DPO's loss is -log(sigmoid(0)) = 0.6931, plus the router's
    # load-balancing loss at the model's own coefficient (as SFT adds it): small, never negative
    assert 0.6931 <= first[0] < 0.70, first
    assert sorted(p.name for p in saved.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]  # 4: half saved

    code, stopped = entrypoint(root, sigterm_at="resuming from")
    assert code == 143 and "stopped by SIGTERM at step 3" in stopped, stopped[-3000:]
    assert f"skipping {saved / 'checkpoint-4'}: its save did not finish" in stopped
    assert f"resuming from {saved / 'checkpoint-2'}" in stopped
    assert not (root / "model" / "adapter").exists()

    code, finished = entrypoint(root)
    assert code == 0, finished[-3000:]
    assert f"resuming from {saved / 'checkpoint-3'}" in finished
    before, after = steps(killed), {**steps(stopped), **steps(finished)}
    assert sorted(steps(stopped)) == [3] and sorted(steps(finished)) == [4, 5, 6]
    assert [after[3], after[4]] == [before[3], before[4]], (before, after)
    uninterrupted, ours = adapter_tensors(saved / "checkpoint-4.incomplete"), adapter_tensors(saved / "checkpoint-4")
    assert ours.keys() == uninterrupted.keys()
    assert max(float((ours[k] - uninterrupted[k]).abs().max()) for k in ours) == 0.0
    curve = first[:3] + losses(finished)
    assert min(curve[-3:]) < curve[0] - 0.05, curve  # it prefers the chosen replies more than the base did

    run = json.loads((root / "model" / "run.json").read_text())
    assert run["global_step"] == 6
    assert run["trained"]["paths"]["method"] == "dpo" and run["trained"]["paths"]["packing"] is False
    assert (root / "model" / "adapter" / "adapter_model.safetensors").is_file()
    assert (root / "model" / "merged" / "config.json").is_file()
    # the reference is no adapter of its own: TRL's frozen "ref" copy is not saved (trainers/reference.py)
    assert not [p for p in [*saved.rglob("ref"), *(root / "model").rglob("ref")] if p.is_dir()]


def test_the_method_and_the_rows_must_agree():
    from toolkit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="training.method dpo trains on chosen/rejected pairs"):
        load_config("tiny-gpt-oss-local", ["training.method=dpo"])
    with pytest.raises(ConfigError, match="set training.method: dpo"):
        load_config("tiny-gpt-oss-local", ["data.format=preference", "data.source=p.jsonl"])
    with pytest.raises(ConfigError, match="a preference pair is not truncated"):
        load_config("tiny-gpt-oss-local", dpo("p.jsonl", "data.overlong=truncate"))


def test_bad_pairs_and_a_method_without_pairs_exit_2_through_the_cli(tmp_path):
    """What a user meets first: `toolkit data prepare` names every bad pair by line in one line (exit 2, no
    traceback): the same reply twice, an empty rejected reply, no prompt, a prompt that already holds the reply;
    and a DPO config over conversation rows is refused before anything is rendered."""
    from typer.testing import CliRunner

    from toolkit.cli import app

    user = [{"role": "user", "content": "hi"}]
    bad = [
        *preference_rows(1),
        {"messages": user, "chosen": "same", "rejected": "same"},
        {"messages": user, "chosen": "a", "rejected": ""},
        {"messages": user, "chosen": "a", "rejected": {"content": "", "reasoning": ""}},
        {"chosen": "a", "rejected": "b"},
        {"messages": [*user, {"role": "assistant", "content": "a"}], "chosen": "a", "rejected": "b"},
    ]
    source = write_rows(tmp_path / "pairs.jsonl", bad)
    result = CliRunner().invoke(app, ["data", "prepare", "tiny-gpt-oss-dpo", "--set", f"data.source={source}"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "5 of 6 rows are not valid 'preference' rows" in error
    for line, reason in [
        (2, "chosen and rejected are the same reply"),
        (3, "rejected: messages[1]: an assistant message needs content, reasoning or tool_calls"),
        (4, "rejected: messages[1]: an assistant message needs content, reasoning or tool_calls"),
        (5, "field 'messages' is missing or not a list"),
        (6, "messages: the prompt ends with the user's (or a tool's) message"),
    ]:
        assert f"pairs.jsonl line {line}: {reason}" in error, (line, error)

    refused = CliRunner().invoke(
        app, ["train", "tiny-gpt-oss-dpo", "--target", "training-job", "--dry-run", "--set", "data.format=messages"]
    )
    assert refused.exit_code == 2 and "Traceback" not in refused.output, refused.output
    assert "training.method dpo trains on chosen/rejected pairs, not 'messages' rows" in refused.output
