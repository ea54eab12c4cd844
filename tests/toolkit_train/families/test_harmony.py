"""Harmony beyond one question and one answer: the toolkit's training render (toolkit_train/families/harmony.py) against
`openai_harmony` and against the pinned vLLM's own chat-request render (run in the serving environment), on a
corpus covering tools, tool results, multi-turn with and without tool calls, each effort level, and the developer
prompt present and absent; and which tokens carry labels, per feature."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest
from toolkit_train.data import IGNORE_INDEX, DataError, load_rows, prepare
from toolkit_train.families import harmony
from toolkit_train.settings import DataSettings

from toolkit.deploy.parity import CORPUS, WEATHER, call, generation_points, request

DATE = "2026-12-02"
__all__ = ["CORPUS", "WEATHER", "generation_points", "request"]  # the serving tests take them from here too


def vllm_prompts(bodies: list[dict]) -> list[list[int]]:
    """The pinned vLLM's rendering of each chat request (its own code, in the serving environment)."""
    python = os.environ.get("TOOLKIT_SERVE_PYTHON") or str(Path(__file__).parents[3] / ".venv-serve/bin/python")
    if not Path(python).exists():
        if os.environ.get("CI"):
            raise AssertionError(f"no serving environment at {python}")
        pytest.skip("no serving environment (TOOLKIT_SERVE_PYTHON)")
    done = subprocess.run(
        [python, str(Path(__file__).parents[2] / "vllm_harmony_render.py")],
        input=json.dumps(bodies),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_SYSTEM_START_DATE": DATE},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def harmony_reference(row: dict, upto: int) -> list[int]:
    """openai_harmony's own completion render of the same conversation, after vLLM's analysis drop (every analysis
    before the last final answer: harmony's own drop keeps an earlier turn's analysis once a later turn has a tool
    call, vLLM's does not) and with vLLM's legacy header for earlier tool calls (its one rewrite after harmony)."""
    h = harmony._h()
    messages = harmony._harmony_messages(harmony.normalize(row, row["messages"][:upto], "medium", complete=False), DATE)
    last = max([i for i, m in enumerate(messages) if m.channel == "final"], default=-1)
    messages = [m for i, m in enumerate(messages) if not (i < last and m.channel == "analysis")]
    tokens = harmony.encoding().render_conversation_for_completion(
        h.Conversation.from_messages(messages),
        h.Role.ASSISTANT,
        config=h.RenderConversationConfig(auto_drop_analysis=False),
    )
    start = harmony._special("<|start|>")
    cuts = [i for i, t in enumerate(tokens) if t == start] + [len(tokens)]
    return [t for a, b in itertools.pairwise(cuts) for t in harmony.legacy_tool_call_header(tokens[a:b])]


@pytest.mark.integration  # trains or starts vLLM's Python for real
def test_training_prompts_are_harmonys_and_vllms_for_every_feature():
    cases = [(name, row, upto) for name, row in CORPUS.items() for upto in generation_points(row["messages"])]
    served = vllm_prompts([request(row, upto) for _, row, upto in cases])
    efforts = set()
    for (name, row, upto), vllm_ids in zip(cases, served, strict=True):
        conversation = harmony.normalize(row, row["messages"], "medium")
        efforts.add(conversation["effort"])
        partial = harmony.normalize(row, row["messages"][:upto], "medium", complete=False)
        ours = harmony.prompt_ids(partial, DATE)
        assert ours == vllm_ids, (name, upto, harmony.encoding().decode(ours), harmony.encoding().decode(vllm_ids))
        assert ours == harmony_reference(row, upto), (name, upto)
        # the training example of this turn has exactly this prompt before the generated message begins
        turn = sum(
            bool(m["role"] == "assistant" and m.get("content") and not m.get("tool_calls"))
            for m in row["messages"][:upto]
        )
        example = harmony.examples(conversation, DATE)[turn]
        cut = len(ours) - 2  # vLLM's prompt ends <|start|>assistant: the first tokens of what the model generates
        assert example.ids[: len(ours)] == ours, (name, upto)
        assert example.trained[cut] and not example.trained[cut - 1], (name, upto)
    assert efforts == set(harmony.EFFORTS)


def test_turns_end_as_at_inference_and_analysis_is_kept_as_harmony_keeps_it():
    decode = harmony.encoding().decode
    first, second = (
        decode(e.ids)
        for e in harmony.examples(
            harmony.normalize(
                CORPUS["multi-turn with tool calls, two calls in one turn, no developer prompt"],
                CORPUS["multi-turn with tool calls, two calls in one turn, no developer prompt"]["messages"],
                "medium",
            ),
            DATE,
        )
    )
    assert first.endswith("<|channel|>final<|message|>14:05, sunny, 1 °C.<|return|>")
    assert "Two tools.<|end|>" in first  # the analysis before a tool call, kept within the turn
    assert "functions.get_time<|channel|>commentary json<|message|>" in first and "<|call|>" in first
    assert "Two tools." not in second and "Both known." not in second  # an earlier turn's analysis: dropped
    assert "14:05, sunny, 1 °C.<|end|>" in second and second.endswith("Cloudy, 12 °C.<|return|>")


def trained_text(example: harmony.Example) -> list[str]:
    """The labelled stretches of one example, decoded."""
    runs, current = [], []
    for token, trained in zip(example.ids, example.trained, strict=True):
        if trained:
            current.append(token)
        elif current:
            runs.append(harmony.encoding().decode(current))
            current = []
    if current:
        runs.append(harmony.encoding().decode(current))
    return runs


def test_mask_labels_exactly_the_assistants_analysis_tool_calls_and_finals():
    row = CORPUS["multi-turn with tool calls, two calls in one turn, no developer prompt"]
    first, second = harmony.examples(harmony.normalize(row, row["messages"], "medium"), DATE)
    assert trained_text(first) == [
        "<|start|>assistant<|channel|>analysis<|message|>Two tools.<|end|>"
        '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"zone": "Europe/Oslo"}<|call|>'
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>',
        "<|start|>assistant<|channel|>analysis<|message|>Both known.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>14:05, sunny, 1 °C.<|return|>",
    ]  # not the tool results between them, nor system, developer (tools) or user text
    assert trained_text(second) == [
        "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Weather again.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Rome", '
        '"unit": "celsius"}<|call|>',
        "<|start|>assistant<|channel|>final<|message|>Cloudy, 12 °C.<|return|>",
    ]  # the first turn's answer is in the prompt, trained in the first example only
    plain = CORPUS["multi-turn without tool calls, system prompt, effort medium"]
    one, two = harmony.examples(harmony.normalize(plain, plain["messages"], "medium"), DATE)
    assert trained_text(one) == [
        "<|start|>assistant<|channel|>analysis<|message|>Premier.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Erste Antwort.<|return|>"
    ]
    assert trained_text(two) == [
        "<|start|>assistant<|channel|>analysis<|message|>Second.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Zweite Antwort.<|return|>"
    ]
    effort = harmony.examples(
        harmony.normalize(
            CORPUS["no developer prompt, no tools, effort low"],
            CORPUS["no developer prompt, no tools, effort low"]["messages"],
            "medium",
        ),
        DATE,
    )[0]
    assert "Reasoning: low" in harmony.encoding().decode(effort.ids)
    assert not any("Reasoning" in run for run in trained_text(effort))


BAD = [
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [call("1", "nope", {})]},
                {"role": "tool", "tool_call_id": "1", "content": "r"},
                {"role": "assistant", "content": "y"},
            ],
            "tools": [WEATHER],
        },
        "'nope' is not a declared tool (declared: get_weather)",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": "{city"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "1", "content": "r"},
                {"role": "assistant", "content": "y"},
            ],
            "tools": [WEATHER],
        },
        "arguments is not JSON",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [call("1", "get_weather", {"unit": "kelvin"})]},
                {"role": "tool", "tool_call_id": "1", "content": "r"},
                {"role": "assistant", "content": "y"},
            ],
            "tools": [WEATHER],
        },
        "do not match the schema of 'get_weather'",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [call("1", "get_weather", {"city": "A"})]},
                {"role": "assistant", "content": "y"},
            ],
            "tools": [WEATHER],
        },
        "tool call '1' has no tool message answering it",
    ),
    (
        {
            "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
            "reasoning_effort": "max",
        },
        "reasoning_effort 'max' is not one of low, medium, high",
    ),
]


def test_data_prepare_names_file_line_and_reason_and_counts(tiny_model_path, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    settings = DataSettings(source="unused", format="messages", max_length=1024, reasoning_effort="low")
    for row, reason in BAD:
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(CORPUS["no developer prompt, no tools, effort low"]) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(DataError, match="bad.jsonl line 2: .*" + reason.replace("(", r"\(").replace(")", r"\)")):
            prepare(load_rows(path), tokenizer, settings)
    path = tmp_path / "good.jsonl"
    rows = [
        {k: v for k, v in row.items() if k != "reasoning_effort" or name.startswith("tools")}
        for name, row in CORPUS.items()
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report_rows = load_rows(path)
    from toolkit_train.data import PrepareReport

    report = PrepareReport()
    dataset = prepare(report_rows, tokenizer, settings, report)
    summary = report.summary()
    assert summary["rows_with_tools"] == 2 and summary["tool_calls"] == 4
    assert summary["reasoning_effort"] == {"high": 1, "low": 3}  # the row's own, else data.reasoning_effort
    assert summary["assistant_turns"] == len(dataset) == 6
    assert all(any(label != IGNORE_INDEX for label in example["labels"]) for example in dataset)


def test_the_tool_calling_sample_prepares_with_every_feature(tiny_model_path):
    from toolkit_train.data import PrepareReport
    from transformers import AutoTokenizer

    from toolkit.config import load_config

    cfg = load_config("tiny-gpt-oss-tools-local")
    report = PrepareReport()
    dataset = prepare(load_rows(cfg.data.source), AutoTokenizer.from_pretrained(tiny_model_path), cfg.data, report)
    summary = report.summary()
    assert summary["rows_in"] >= 24 and summary["bad_rows_skipped"] == 0 and summary["overlong_dropped"] == 0
    assert set(summary["reasoning_effort"]) == set(harmony.EFFORTS) and summary["tool_calls"] > summary["rows_in"] / 2
    assert summary["assistant_turns"] == len(dataset) > summary["rows_in"]  # multi-turn rows give several
