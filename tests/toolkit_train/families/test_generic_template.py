"""The generic chat-template path (issue 66): a causal LM that no family record claims trains through its own chat
template, on the two tiny record-less models (builtin/tiny_generic.py: Llama with Llama 3's template, Gemma with
Gemma 3's; neither template has {% generation %} markers, a reasoning field or tools). The trained tokens are diffed
from the template and must be exactly each answer and its end-of-turn token; the prompt must be what the template
renders for a request (what vLLM serves: tests/toolkit/test_generic_chat_models.py checks the server itself)."""

from __future__ import annotations

import datasets
import pytest
from toolkit_train.data import IGNORE_INDEX, DataError, load_rows, prepare, to_conversation
from toolkit_train.families import GENERIC, family_of, formats
from toolkit_train.settings import PREFERENCE_SAMPLE_DATASET, SAMPLE_DATASET, TOOL_SAMPLE_DATASET, DataSettings

TEMPLATE = formats.CHAT_TEMPLATE


@pytest.fixture(scope="module")
def tokenizer(tiny_generic_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_generic_path)


def settings(**changes) -> DataSettings:
    return DataSettings(**{"source": "unused", "max_length": 2048, "format": "multilingual-thinking", **changes})


def trained_text(tokenizer, labels: list[int]) -> str:
    return tokenizer.decode([t for t in labels if t != IGNORE_INDEX])


def test_a_model_of_no_record_is_the_generic_family_rendered_through_its_template(tiny_generic_path):
    assert family_of(str(tiny_generic_path)) is GENERIC
    assert formats.for_family(GENERIC) is TEMPLATE
    assert GENERIC.vllm_defaults == {}  # served without reasoning or tool parsers unless the config names them


def test_dropping_the_reasoning_trains_each_answer_alone_after_the_prompt_the_template_serves(tokenizer):
    """data.reasoning: drop on the multilingual sample: every example is the template's prompt (the generation
    prompt included) followed by the answer, and only the answer and the end-of-turn token are trained."""
    rows = load_rows(SAMPLE_DATASET)
    examples = prepare(rows, tokenizer, settings(reasoning="drop"), chat_format=TEMPLATE)
    assert len(examples) == len(rows)
    for row, example in zip(list(rows)[:8], list(examples)[:8], strict=True):
        conversation = to_conversation(row, "multilingual-thinking", reasoning="drop")
        request = TEMPLATE.messages({**conversation, "messages": conversation["messages"][:-1]}, tokenizer)
        served = tokenizer.apply_chat_template(request, add_generation_prompt=True, tokenize=True, return_dict=True)
        prompt = list(served["input_ids"])
        assert example["input_ids"][: len(prompt)] == prompt
        assert all(label == IGNORE_INDEX for label in example["labels"][: len(prompt)])
        assert trained_text(tokenizer, example["labels"]) == row["final"].strip() + tokenizer.eos_token


def test_rows_with_reasoning_are_refused_naming_the_setting_that_drops_it(tokenizer):
    with pytest.raises(DataError, match="set data.reasoning: drop"):
        prepare(load_rows(SAMPLE_DATASET), tokenizer, settings(), chat_format=TEMPLATE)


def test_each_turn_of_a_multi_turn_row_trains_its_own_answer(tokenizer):
    row = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "Second question?"},
        {"role": "assistant", "content": "Second answer."},
    ]}  # fmt: skip
    first, second = prepare(datasets.Dataset.from_list([row]), tokenizer, settings(format="messages"),
                            chat_format=TEMPLATE)  # fmt: skip
    assert trained_text(tokenizer, first["labels"]) == "First answer." + tokenizer.eos_token
    assert trained_text(tokenizer, second["labels"]) == "Second answer." + tokenizer.eos_token
    assert second["input_ids"][: len(first["input_ids"])] == first["input_ids"]  # the template keeps the prefix


def test_tool_rows_are_refused_in_one_line_by_a_template_that_cannot_render_them(tokenizer, tiny_generic_path):
    """Neither template reads tools (the whole dataset's problem: one line); Gemma's also refuses a tool message in
    itself (roles must alternate): the row is named with the template's own words, not a traceback."""
    with pytest.raises(DataError, match="does not read tools"):
        prepare(load_rows(TOOL_SAMPLE_DATASET), tokenizer, settings(format="messages"), chat_format=TEMPLATE)
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"},
                        {"role": "assistant", "content": "hello"}]}  # fmt: skip
    if "gemma" in tiny_generic_path.name:
        with pytest.raises(DataError, match="row 0: the model's chat template refuses this conversation: Conversation "
                                            "roles must alternate"):  # fmt: skip
            prepare(datasets.Dataset.from_list([row]), tokenizer, settings(format="messages"), chat_format=TEMPLATE)


def test_preference_pairs_render_through_the_template_without_their_reasoning(tokenizer):
    """DPO on a record-less model: each reply after the prompt the template serves, without its reasoning; the
    bundled sample's pairs, which differ only in their reasoning, are refused once it is dropped (nothing to prefer)."""
    with pytest.raises(DataError, match="differ only in their reasoning, which data.reasoning: drop removes"):
        prepare(load_rows(PREFERENCE_SAMPLE_DATASET), tokenizer, settings(format="preference", reasoning="drop"),
                chat_format=TEMPLATE)  # fmt: skip
    row = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        "chosen": {"content": "4", "reasoning": "Easy."},
        "rejected": {"content": "5", "reasoning": "Hm."},
    }
    (pair,) = prepare(datasets.Dataset.from_list([row]), tokenizer, settings(format="preference", reasoning="drop"),
                      chat_format=TEMPLATE)  # fmt: skip
    request = TEMPLATE.messages({"messages": row["messages"]}, tokenizer)
    served = tokenizer.apply_chat_template(request, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert pair["prompt_ids"] == list(served["input_ids"])
    assert tokenizer.decode(pair["chosen_ids"]) == "4" + tokenizer.eos_token
    assert tokenizer.decode(pair["rejected_ids"]) == "5" + tokenizer.eos_token
