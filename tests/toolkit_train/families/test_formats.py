"""Chat formats (families/formats.py): the chat template renders what the tokenizer's own template renders, and
trains exactly the assistant's replies; harmony's wrapper is harmony's rendering, unchanged.

The chat-template side runs on the tiny Qwen3 (toolkit_train/builtin/tiny_qwen3.py: Qwen3's template with generation
markers, reasoning in <think>, tools), on the bundled samples."""

from __future__ import annotations

import json

import pytest
from toolkit_train.data import IGNORE_INDEX, DataError, load_rows, prepare, to_conversation
from toolkit_train.families import GPT_OSS, QWEN3, formats, harmony
from toolkit_train.settings import (
    PREFERENCE_SAMPLE_DATASET,
    SAMPLE_DATASET,
    TOOL_SAMPLE_DATASET,
    DataSettings,
    ModelSettings,
)

TEMPLATE = formats.CHAT_TEMPLATE


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


@pytest.fixture(scope="module")
def unmarked(tiny_qwen3_path):
    """The same tokenizer with the template's {% generation %} markers taken out: the mask is diffed instead."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    tokenizer.chat_template = tokenizer.chat_template.replace("{%- generation %}", "").replace(
        "{%- endgeneration %}", ""
    )
    from trl.chat_template_utils import has_generation_markers

    assert not has_generation_markers(tokenizer.chat_template)
    return tokenizer


def settings(**changes) -> DataSettings:
    return DataSettings(**{"source": "unused", "max_length": 2048, **changes})


def request(messages: list[dict]) -> list[dict]:
    """A chat request's messages as a client sends them and vLLM hands them to the template: the reasoning in the
    template's field, tool-call arguments parsed."""
    out = []
    for message in messages:
        item = {k: v for k, v in message.items() if k not in ("reasoning", "thinking")}
        if message.get("reasoning") or message.get("thinking"):
            item["reasoning_content"] = message.get("reasoning") or message.get("thinking")
        if message.get("tool_calls"):
            item["tool_calls"] = [{**call, "function": {**call["function"],
                                   "arguments": json.loads(call["function"]["arguments"])}}
                                  for call in message["tool_calls"]]  # fmt: skip
        out.append(item)
    return out


def served(tokenizer, messages: list[dict], tools=None) -> list[int]:
    return list(tokenizer.apply_chat_template(request(messages), tools=tools, add_generation_prompt=True)["input_ids"])


def reply(message: dict) -> str:
    """What the model generates for one assistant message, in Qwen3's form."""
    reasoning = message.get("reasoning") or message.get("thinking") or ""
    text = f"<think>\n{reasoning}\n</think>\n\n{message.get('content') or ''}"
    for i, call in enumerate(message.get("tool_calls") or []):
        arguments = json.dumps(json.loads(call["function"]["arguments"]), ensure_ascii=False)
        text += ("\n" if i or message.get("content") else "") + (
            f'<tool_call>\n{{"name": "{call["function"]["name"]}", "arguments": {arguments}}}\n</tool_call>'
        )
    return text + "<|im_end|>"


def trained_text(tokenizer, ids, trained) -> str:
    return tokenizer.decode([t for t, m in zip(ids, trained, strict=True) if m])


def test_the_families_name_their_formats():
    assert formats.for_family(GPT_OSS) is formats.HARMONY and formats.for_family(QWEN3) is TEMPLATE
    assert ModelSettings(id="Qwen/Qwen3-0.6B").family is QWEN3
    assert ModelSettings(id="builtin:tiny-qwen3").family is QWEN3


def test_the_served_prompt_is_the_tokenizers_own_template_and_the_mask_is_the_reply(tokenizer):
    rows = load_rows(SAMPLE_DATASET)
    for index in (0, 7):
        row = rows[index]
        conversation = to_conversation(row, "multilingual-thinking")
        (example,) = TEMPLATE.examples(conversation, tokenizer)
        prompt = TEMPLATE.prompt_ids({**conversation, "messages": conversation["messages"][:-1]}, tokenizer)
        assert prompt == served(tokenizer, conversation["messages"][:-1])
        assert example.ids[: len(prompt)] == prompt and not any(example.trained[: len(prompt)])
        assert trained_text(tokenizer, example.ids, example.trained) == (
            f"<think>\n{row['analysis']}\n</think>\n\n{row['final']}<|im_end|>"
        )
        assert (
            tokenizer.decode(example.ids[len(prompt) :])
            == f"<think>\n{row['analysis']}\n</think>\n\n{row['final']}<|im_end|>\n"
        )


def test_tool_calls_and_multi_turn_rows_train_each_turns_replies_only(tokenizer, unmarked):
    """One example per turn: its prompt is what the server renders for the request ending before it (earlier turns'
    reasoning dropped, as Qwen3's template does), its trained tokens that turn's assistant messages (the tool call
    and the answer after the tool result), the tool results not. Without the markers, diffing gives the same."""
    rows = load_rows(TOOL_SAMPLE_DATASET)
    multi_turn = 0
    for row in rows:
        conversation = to_conversation(row, "messages")
        examples = TEMPLATE.examples(conversation, tokenizer)
        assert [(e.ids, e.trained) for e in examples] == [
            (e.ids, e.trained) for e in TEMPLATE.examples(conversation, unmarked)
        ]
        messages = row["messages"]
        answers = [i for i, m in enumerate(messages) if m["role"] == "assistant" and not m.get("tool_calls")]
        assert len(examples) == len(answers)
        multi_turn += len(answers) > 1
        previous = -1
        for example, last in zip(examples, answers, strict=True):
            first = next(i for i in range(previous + 1, last + 1) if messages[i]["role"] == "assistant")
            prompt = served(tokenizer, messages[:first], row.get("tools"))
            assert example.ids[: len(prompt)] == prompt
            turn = [m for m in messages[first : last + 1] if m["role"] == "assistant"]
            assert trained_text(tokenizer, example.ids, example.trained) == "".join(reply(m) for m in turn)
            previous = last
    assert multi_turn >= 1


def test_prepare_renders_in_the_format_it_is_given(tokenizer):
    rows = load_rows(SAMPLE_DATASET).select(range(3))
    dataset = prepare(rows, tokenizer, settings(format="multilingual-thinking"), chat_format=TEMPLATE)
    for row, example in zip(rows, dataset, strict=True):
        trained = [t for t in example["labels"] if t != IGNORE_INDEX]
        assert tokenizer.decode(trained) == f"<think>\n{row['analysis']}\n</think>\n\n{row['final']}<|im_end|>"
    with pytest.raises(DataError, match="the tokenizer's id for <\\|start\\|> is not harmony's"):
        prepare(rows, tokenizer, settings(format="multilingual-thinking"))  # harmony: gpt-oss's tokenizer only


def test_preference_pairs_are_the_served_prompt_and_each_reply_through_its_end_of_turn(tokenizer):
    rows = load_rows(PREFERENCE_SAMPLE_DATASET)
    pairs = prepare(rows, tokenizer, settings(format="preference"), chat_format=TEMPLATE)
    row, pair = rows[0], pairs[0]
    assert pair["prompt_ids"] == served(tokenizer, row["messages"])
    for key in ("chosen", "rejected"):
        answer = row[key] if isinstance(row[key], dict) else {"content": row[key]}
        assert tokenizer.decode(pair[f"{key}_ids"]) == reply(answer)


def test_a_template_without_a_reasoning_field_or_tools_refuses_rows_that_need_them(tiny_qwen3_path):
    import datasets
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_path)
    turns = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    prompt = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    tokenizer.chat_template = turns + prompt
    with pytest.raises(DataError, match="has no reasoning field"):
        prepare(load_rows(SAMPLE_DATASET), tokenizer, settings(format="multilingual-thinking"), chat_format=TEMPLATE)
    plain = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}]
    (example,) = prepare(datasets.Dataset.from_list(plain), tokenizer, settings(format="messages"),
                         chat_format=TEMPLATE)  # fmt: skip
    assert tokenizer.decode([t for t in example["labels"] if t != IGNORE_INDEX]) == "hello there<|im_end|>"  # diffed
    tokenizer.chat_template = turns.replace("{{ m.content }}", "{{ m.reasoning_content }}{{ m.content }}") + prompt
    with pytest.raises(DataError, match="does not read tools"):
        prepare(load_rows(TOOL_SAMPLE_DATASET), tokenizer, settings(format="messages"), chat_format=TEMPLATE)


def test_the_harmony_format_is_harmonys_rendering(tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    formats.HARMONY.check(tokenizer)
    row = load_rows(SAMPLE_DATASET)[0]
    conversation = to_conversation(row, "multilingual-thinking")
    date = "2026-01-01"
    ours = formats.HARMONY.examples(conversation, tokenizer, date)
    assert [(e.ids, e.trained) for e in ours] == [(e.ids, e.trained) for e in harmony.examples(conversation, date)]
    prompt = {**conversation, "messages": conversation["messages"][:-1]}
    assert formats.HARMONY.prompt_ids(prompt, tokenizer, date) == harmony.prompt_ids(prompt, date)


def test_the_harmony_pair_is_the_prompt_and_each_whole_reply_as_before(tiny_model_path):
    """The pair rendering moved into the format: for harmony it is still the prompt, and each reply's rendering after
    it through <|return|> (its last token, trained)."""
    from toolkit_train.data import to_pair

    row = load_rows(PREFERENCE_SAMPLE_DATASET)[0]
    pair = to_pair(row)
    date = "2026-01-01"
    prompt, chosen, rejected = formats.HARMONY.pair(pair, None, date)
    assert prompt == harmony.prompt_ids({**pair["chosen"], "messages": pair["chosen"]["messages"][:-1]}, date)
    for key, ids in (("chosen", chosen), ("rejected", rejected)):
        assert prompt + ids == harmony.examples(pair[key], date)[-1].ids


def test_a_message_the_template_does_not_render_is_a_bad_row_not_a_silent_drop(tokenizer):
    """Qwen3's template renders no `developer` message: training would drop the instructions (and so would serving);
    such rows are named, and data.skip_bad_rows skips them."""
    rows = load_rows(TOOL_SAMPLE_DATASET)
    developer = [i for i, row in enumerate(rows) if row["messages"][0]["role"] == "developer"]
    assert developer
    with pytest.raises(
        DataError, match=f"{len(developer)} of the {len(rows)} rows is refused for one reason"
    ) as caught:
        prepare(rows, tokenizer, settings(format="messages"), chat_format=TEMPLATE)
    assert "messages[0]: the model's chat template does not render this developer message" in str(caught.value)
    assert "use role system" in str(caught.value)
    kept = prepare(rows, tokenizer, settings(format="messages", skip_bad_rows=True), chat_format=TEMPLATE)
    assert len(kept) > len(rows) - len(developer)  # every other row, one example per turn
