"""data.conversation_date: harmony's `Current date:` pinned, so that the tiny presets' training examples and the prompts
vLLM serves for them are the same tokens on any day. Before, the day went into every example: a fresh machine's CI
that reached the main job after midnight failed it (the tiny fine-tune sits near its quality check's edge), and the
tiny base's pre-training rendered the day it was built."""

from __future__ import annotations

import datetime

import pytest
from toolkit_train import data
from toolkit_train.builtin import tiny_model

from toolkit.config import load_config
from toolkit.deploy import vllm_environment

TINY_HARMONY_PRESETS = ("tiny-gpt-oss-local", "tiny-gpt-oss-tools-local", "tiny-gpt-oss-dpo")


def _on_day(monkeypatch, day: datetime.date) -> None:
    """`datetime.date.today()` answers `day` (the clock is the only input that changes at midnight)."""

    class Day(datetime.date):
        @classmethod
        def today(cls):
            return cls(day.year, day.month, day.day)

    monkeypatch.setattr(datetime, "date", Day)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_model.build_tokenizer()  # gpt-oss's o200k_harmony, as the tiny base ships it (no model is built)


def _rendered(preset: str, monkeypatch, day: datetime.date, tokenizer) -> dict:
    """The preset's first rows as training renders them (tokens and loss mask), on `day`."""
    cfg = load_config(preset)
    rows = data.load_rows(cfg.data.source, cfg.data.split)
    conversations = [data.to_conversation(row, cfg.data.format, cfg.data.reasoning_effort) for row in list(rows)[:4]]
    with monkeypatch.context() as patched:
        _on_day(patched, day)
        if cfg.data.format == "preference":
            return data.tokenize_pairs(conversations, tokenizer=tokenizer, date=cfg.data.conversation_date)
        return data._tokenize(conversations, tokenizer, date=cfg.data.conversation_date)


@pytest.mark.parametrize("preset", TINY_HARMONY_PRESETS)
def test_a_tiny_preset_renders_the_same_tokens_on_two_days(preset, monkeypatch, tokenizer):
    first = _rendered(preset, monkeypatch, datetime.date(2026, 12, 6), tokenizer)
    second = _rendered(preset, monkeypatch, datetime.date(2027, 3, 1), tokenizer)
    assert first == second


def test_without_the_setting_the_day_changes_the_tokens(monkeypatch, tokenizer):
    """The check above can fail: unpinned, the two days render differently."""
    conversation = [{"role": "user", "content": "Hallo"}, {"role": "assistant", "content": "Hi"}]
    days = []
    for day in (datetime.date(2026, 12, 6), datetime.date(2027, 3, 1)):
        with monkeypatch.context() as patched:
            _on_day(patched, day)
            days.append(data._tokenize([conversation], tokenizer))
    assert days[0] != days[1]


@pytest.mark.parametrize("preset", TINY_HARMONY_PRESETS)
def test_the_date_is_the_tiny_bases_and_vllm_serves_it(preset):
    """One date: the tiny base was pre-trained with it (its recipe), the preset trains with it, vLLM renders it into
    every served prompt (VLLM_SYSTEM_START_DATE, read by vLLM 0.32's harmony system message)."""
    cfg = load_config(preset)
    pinned = datetime.date.fromisoformat(tiny_model.RECIPE["conversation_date"])
    assert cfg.data.conversation_date == pinned
    assert vllm_environment(cfg, gpu=False)["VLLM_SYSTEM_START_DATE"] == pinned.isoformat()


def test_an_unpinned_config_leaves_the_server_on_its_own_clock():
    assert "VLLM_SYSTEM_START_DATE" not in vllm_environment(load_config("gpt-oss-20b-lora"))
