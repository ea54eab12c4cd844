"""The tiny bases' pre-training text shares no row with any bundled sample, and the base behaves as gpt-oss does
before the multilingual fine-tune: it reasons in English whatever `reasoning language:` says.

Without these, the main job's base-vs-fine-tuned table measures memory, not the fine-tune: the base of an earlier
version was pre-trained on the sample's own rows, held-out ones included, and "fine-tuning hurt".
"""

from __future__ import annotations

import json
import re

import pytest
from toolkit_train.builtin import tiny_corpus
from toolkit_train.builtin.tiny_model import RECIPE, pretraining_conversations, pretraining_documents
from toolkit_train.data import SAMPLE_PATH, to_messages

WINDOW = 8  # words: shorter runs are the shared frame ("Der Nutzer fragt auf Spanisch nach der"), not a row


def _sample_rows() -> list[tuple[str, dict]]:
    return [(path.name, json.loads(line)) for path in sorted(SAMPLE_PATH.parent.glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]  # fmt: skip


def _texts(row: dict) -> list[str]:
    """Every text a row holds: its fields and every message's content, reasoning and tool-call arguments."""
    texts = [row[key] for key in ("user", "analysis", "final") if isinstance(row.get(key), str)]
    for message in row.get("messages") or []:
        texts += [str(message[key]) for key in ("content", "thinking") if message.get(key)]
        texts += [json.dumps(call, sort_keys=True) for call in message.get("tool_calls") or []]
    return [text for text in texts if text.strip()]


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _pretraining_text(tools: bool) -> str:
    conversations = pretraining_conversations(RECIPE["pretrain_conversations"], RECIPE["seed"], tools)
    parts = [json.dumps(conversation, ensure_ascii=False) for conversation in conversations]
    return "\n".join(parts + pretraining_documents(RECIPE["pretrain_documents"], RECIPE["seed"]))


def test_no_multilingual_sample_row_is_in_the_pretraining_text():
    text = _pretraining_text(tools=False)
    words = _words(text)
    windows = {tuple(words[i : i + WINDOW]) for i in range(len(words) - WINDOW + 1)}
    rows = [(name, row) for name, row in _sample_rows() if name == SAMPLE_PATH.name]
    assert len(rows) >= 48  # a quarter held out is at least 12 rows: what the demo's interval needs
    for _, row in rows:
        for sample_text in _texts(row):
            assert sample_text not in text, f"sample text in the pre-training text: {sample_text!r}"
            sample_words = _words(sample_text)
            shared = [sample_words[i : i + WINDOW] for i in range(len(sample_words) - WINDOW + 1)
                      if tuple(sample_words[i : i + WINDOW]) in windows]  # fmt: skip
            assert not shared, f"{WINDOW} words of {sample_text!r} in the pre-training text: {shared[0]}"


def test_the_tools_base_sees_tool_rows_but_no_multilingual_row():
    """The tools variant adds the tool-calling sample (its skill, calling a tool, must exist to be served); still no
    multilingual row."""
    text = _pretraining_text(tools=True)
    for name, row in _sample_rows():
        if name == SAMPLE_PATH.name:
            for sample_text in _texts(row):
                assert sample_text not in text


def test_the_corpus_answers_are_correct_and_in_the_users_language():
    """Spot-check the generator itself: computed answers, the user's language for the answer."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        question = tiny_corpus._Question(rng)
        values = question.values
        answer = question.answer()
        if "c" in values:
            assert str(values["c"]) in answer
        if question.family == "half":
            assert str(values["b"]) in answer
        question_template = tiny_corpus.FAMILIES[question.family][question.user_language][0]
        assert question.text() == question_template.format(**values)  # asked in the user's language


@pytest.mark.integration
def test_the_base_reasons_in_english_whatever_the_system_prompt_names(tiny_model_path):
    """The skill the multilingual fine-tune teaches is not what the base does: at temperature 0 it opens its analysis
    in English (the first token decides the language: tiny_corpus.FRAME) on at least 90% of the sample's questions
    and in the named language on at most 10% of those that name another (measured: 57 of 60 English, 1 of 50 named).
    The instruction is only a weak preference of the base (30% of its conversations follow it), which is what the
    fine-tune turns into the rule."""
    import torch
    from toolkit_train.builtin.tiny_corpus import EN, FRAME
    from toolkit_train.families import harmony
    from transformers import AutoTokenizer, GptOssForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = GptOssForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    opening = {language: tokenizer(FRAME[language][0].split()[0], add_special_tokens=False)["input_ids"][0]
               for language in FRAME}  # fmt: skip
    analysis = tokenizer("<|channel|>analysis<|message|>", add_special_tokens=False)["input_ids"]
    rows = [row for name, row in _sample_rows() if name == SAMPLE_PATH.name]
    english = named = 0
    other_language = [row for row in rows if row["reasoning_language"] != EN]
    for row in rows:
        prompt = harmony.prompt_ids(harmony.normalize({}, to_messages(row, "multilingual-thinking")[:2], "medium",
                                                      complete=False), RECIPE["conversation_date"])  # fmt: skip
        with torch.no_grad():
            first = model(torch.tensor([prompt + analysis])).logits[0, -1].argmax().item()
        english += first == opening[EN]
        named += row["reasoning_language"] != EN and first == opening[row["reasoning_language"]]
    assert english >= 0.9 * len(rows), f"the base opens its analysis in English on {english} of {len(rows)} rows"
    assert named <= 0.1 * len(other_language), f"the base follows the named language on {named} rows"
