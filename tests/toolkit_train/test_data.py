"""Data: schema checks with row numbers, the harmony rendering, and a label mask that trains only the answer."""

from __future__ import annotations

import json

import pytest
from toolkit_train.data import IGNORE_INDEX, DataError, PrepareReport, load_rows, prepare
from toolkit_train.settings import SAMPLE_DATASET, DataSettings


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def settings(**changes) -> DataSettings:
    return DataSettings(**{"source": "unused", "max_length": 512, **changes})


def test_sample_ships_in_the_multilingual_thinking_schema():
    rows = load_rows(SAMPLE_DATASET)
    assert len(rows) >= 20
    assert {"reasoning_language", "developer", "user", "analysis", "final", "messages"} <= set(rows.column_names)
    assert len(set(rows["reasoning_language"])) >= 5
    assert rows[0]["messages"][0]["content"].startswith("reasoning language: ")


def test_label_mask_trains_exactly_the_assistant_analysis_and_final(tokenizer):
    rows = load_rows(SAMPLE_DATASET)
    dataset = prepare(rows, tokenizer, settings())
    for index in (0, 7):
        row, example = rows[index], dataset[index]
        trained = [t for t in example["labels"] if t != IGNORE_INDEX]
        expected = (
            f"<|start|>assistant<|channel|>analysis<|message|>{row['analysis']}<|end|>"
            f"<|start|>assistant<|channel|>final<|message|>{row['final']}<|return|>"
        )
        assert tokenizer.decode(trained) == expected
        # the trained tokens are one contiguous tail: nothing of the prompt leaks into the loss
        first = next(i for i, t in enumerate(example["labels"]) if t != IGNORE_INDEX)
        assert example["labels"][first:] == example["input_ids"][first:]
        prompt = tokenizer.decode(example["input_ids"][:first])
        assert f"reasoning language: {row['reasoning_language']}" in prompt and row["user"] in prompt


def test_loss_on_all_trains_every_token_as_the_recipe_does(tokenizer):
    rows = load_rows(SAMPLE_DATASET).select(range(3))
    assistant = prepare(rows, tokenizer, settings())
    everything = prepare(rows, tokenizer, settings(loss_on="all"))
    for narrow, wide in zip(assistant, everything, strict=True):
        assert wide["input_ids"] == narrow["input_ids"] and wide["labels"] == wide["input_ids"]
        assert sum(t != IGNORE_INDEX for t in narrow["labels"]) < len(narrow["labels"])


def test_plain_messages_format(tokenizer, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]})
        + "\n"
    )
    dataset = prepare(load_rows(path), tokenizer, settings(format="messages"))
    trained = tokenizer.decode([t for t in dataset[0]["labels"] if t != IGNORE_INDEX])
    assert trained.endswith("<|channel|>final<|message|>hello there<|return|>")


def test_bad_rows_are_reported_with_index_and_reason(tokenizer, tmp_path):
    good = load_rows(SAMPLE_DATASET)[0]
    rows = [good, {**good, "final": ""}, good, {**good, "user": None}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as caught:
        prepare(load_rows(path), tokenizer, settings())
    message = str(caught.value)
    assert "2 of 4 rows" in message and "rows.jsonl line 2: field 'final'" in message  # file and line, 1-based
    assert "rows.jsonl line 4: field 'user'" in message
    assert "data.skip_bad_rows" in message

    report = PrepareReport()
    dataset = prepare(load_rows(path), tokenizer, settings(skip_bad_rows=True), report)
    assert len(dataset) == 2 and [i for i, _ in report.bad_rows] == [1, 3]


def test_overlong_rows_are_dropped_or_truncated_and_counted(tokenizer):
    rows = load_rows(SAMPLE_DATASET)
    report = PrepareReport()
    kept = prepare(rows, tokenizer, settings(max_length=170), report)
    assert report.dropped_overlong > 0 and len(kept) == len(rows) - report.dropped_overlong
    assert max(len(ids) for ids in kept["input_ids"]) <= 170

    dropped = report.dropped_overlong
    report = PrepareReport()
    cut = prepare(rows, tokenizer, settings(max_length=170, overlong="truncate"), report)
    assert len(cut) == len(rows) and report.truncated == dropped
    assert max(len(ids) for ids in cut["input_ids"]) == 170


def test_parquet_and_save_to_disk_sources(tokenizer, tmp_path):
    rows = load_rows(SAMPLE_DATASET)
    rows.to_parquet(str(tmp_path / "rows.parquet"))
    assert len(load_rows(tmp_path / "rows.parquet")) == len(rows)
    prepared = prepare(rows, tokenizer, settings())
    prepared.save_to_disk(str(tmp_path / "prepared"))
    again = prepare(load_rows(tmp_path / "prepared"), tokenizer, settings())  # already tokenized: as is
    assert again["input_ids"] == prepared["input_ids"]


def test_unreadable_source_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(DataError, match=r"no \.jsonl, \.json, \.parquet or save_to_disk dataset found"):
        load_rows(tmp_path)


def test_broken_lines_are_bad_rows_with_their_line_number(tokenizer, tmp_path):
    good = json.dumps(load_rows(SAMPLE_DATASET)[0]).encode()
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join([good, b'{"user": "half a row', good, b"\xff\xfe not utf-8", b"[1, 2]", good]) + b"\n")
    with pytest.raises(DataError) as caught:
        prepare(load_rows(path), tokenizer, settings())
    message = str(caught.value)
    assert "3 of 6 rows" in message
    assert "rows.jsonl line 2: invalid JSON" in message and "rows.jsonl line 4: not UTF-8" in message
    assert "rows.jsonl line 5: a row must be a JSON object" in message
    report = PrepareReport()
    assert len(prepare(load_rows(path), tokenizer, settings(skip_bad_rows=True), report)) == 3
    assert [i for i, _ in report.bad_rows] == [1, 3, 4]


def test_an_empty_file_says_so(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no rows"):
        load_rows(tmp_path / "empty.jsonl")


def test_multi_turn_rows_keep_every_turn(tokenizer, tmp_path):
    row = load_rows(SAMPLE_DATASET)[0]
    turns = [
        {"role": "system", "content": "reasoning language: French"},
        {"role": "user", "content": "Erste Frage?"},
        {"role": "assistant", "content": "Erste Antwort.", "thinking": "Premier."},
        {"role": "user", "content": "Zweite Frage?"},
        {"role": "assistant", "content": "Zweite Antwort.", "thinking": "Second."},
    ]
    path = tmp_path / "turns.jsonl"
    path.write_text(json.dumps({**row, "messages": turns}) + "\n")
    dataset = prepare(load_rows(path), tokenizer, settings())
    assert len(dataset) == 2  # one example per assistant turn (tests/toolkit_train/families/test_harmony.py: the masks)
    text = tokenizer.decode(dataset[1]["input_ids"])
    assert "Erste Frage?" in text and "Zweite Frage?" in text and "Zweite Antwort." in text
    assert "Premier." not in text  # the first turn's analysis: dropped after its final answer, as at inference
