"""Rows checked as the docs say (issue #67): a preference pair's reply that is only whitespace and a prompt with no
user message are bad rows (docs/preference-tuning.md: each whole conversation is checked as a training row is), as
is a training answer of whitespace; a line nested too deeply is a bad row with its line number, not a crash."""

from __future__ import annotations

import json

import pytest
from toolkit_train.data import UNREADABLE, read_json_rows, to_conversation

USER = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def reason(row: dict, fmt: str = "preference") -> str:
    with pytest.raises(ValueError) as bad:
        to_conversation(row, fmt)
    return str(bad.value)


@pytest.mark.parametrize("blank", [" ", "\n\t ", {"content": "  "}, {"content": "\n", "reasoning": "thinking"}])
@pytest.mark.parametrize("side", ["chosen", "rejected"])
def test_a_reply_of_whitespace_is_a_bad_pair(blank, side):
    row = {"messages": USER, "chosen": "a", "rejected": "b", side: blank}
    assert reason(row) == f"{side}: messages[2]: the assistant's content is only whitespace; write the answer"


@pytest.mark.parametrize(
    "prompt",
    [
        [{"role": "system", "content": "be brief"}],
        [{"role": "developer", "content": "answer in French"}],
        [
            {"role": "system", "content": "s"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": "again"},
        ],
    ],
)
def test_a_prompt_with_no_user_message_is_a_bad_pair(prompt):
    row = {"messages": prompt, "chosen": "a", "rejected": "b"}
    assert reason(row).startswith("messages: the prompt has no user message"), reason(row)


def test_good_pairs_still_pass():
    pair = to_conversation({"messages": USER, "chosen": "a", "rejected": {"content": "b", "reasoning": "r"}},
                           "preference")  # fmt: skip
    assert pair["chosen"]["messages"][-1]["content"] == "a"
    assert pair["rejected"]["messages"][-1] == {"role": "assistant", "content": "b", "thinking": "r"}


def test_a_training_answer_of_whitespace_is_a_bad_row():
    row = {"messages": [*USER, {"role": "assistant", "content": "  \n"}]}
    assert reason(row, "messages") == "messages[2]: the assistant's content is only whitespace; write the answer"
    multi = {"messages": [*USER, {"role": "assistant", "content": " "}, {"role": "user", "content": "and?"},
                          {"role": "assistant", "content": "fine"}]}  # fmt: skip
    assert reason(multi, "messages").startswith("messages[2]: the assistant's content is only whitespace")


def test_a_line_nested_too_deeply_is_a_bad_row_with_its_line(tmp_path):
    (tmp_path / "rows.jsonl").write_text(json.dumps({"messages": USER}) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    rows = read_json_rows(tmp_path / "rows.jsonl", [tmp_path / "rows.jsonl"])
    assert (
        rows[1][UNREADABLE] == "rows.jsonl line 2: nested too deeply to be a row (arrays or objects inside each other)"
    )
