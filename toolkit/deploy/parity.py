"""The served prompt is the trained prompt: for a corpus of chat requests covering every feature the toolkit trains
(tools, tool results, multi-turn with and without tool calls, reasoning, each reasoning effort, the developer prompt
present and absent), the prompt token ids a running vLLM renders (`return_token_ids`) must equal the ids training
renders for the same conversation up to the assistant turn being generated, in the model family's chat format
(toolkit_train/families/formats.py: harmony for gpt-oss, the tokenizer's own chat template for Qwen3).
`toolkit deploy` runs it against the model it serves, on a SageMaker endpoint (through InvokeEndpoint, the OpenAI
body on the container's /invocations route) and locally (`--target local`), and refuses to finish on drift
(`PromptDrift`, exit 1). A template is checked with the tokenizer training rendered with: a served template that
differs (another template, `--chat-template`, template kwargs such as Qwen3's `enable_thinking`) is drift.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from toolkit.deploy import Refused

if TYPE_CHECKING:
    from toolkit_train.families.formats import ChatFormat


class PromptDrift(Refused):
    """The served model renders a request differently from training (exit 1); the message names the feature and
    the first differing token."""


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}


def call(id_: str, name: str, arguments: dict) -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


CORPUS: dict[str, dict[str, Any]] = {
    "tools, a tool result, developer prompt, effort high": {
        "tools": [WEATHER, CLOCK],
        "reasoning_effort": "high",
        "messages": [
            {"role": "developer", "content": "Answer in one sentence."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "reasoning": "I need the weather tool.",
                "tool_calls": [call("c1", "get_weather", {"city": "Paris"})],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 3, "sky": "rain"}'},
            {"role": "assistant", "reasoning": "3 degrees and rain.", "content": "3 °C and rain in Paris."},
        ],
    },
    "no developer prompt, no tools, effort low": {
        "reasoning_effort": "low",
        "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "reasoning": "Easy.", "content": "4"}],
    },
    "multi-turn without tool calls, system prompt, effort medium": {
        "reasoning_effort": "medium",
        "messages": [
            {"role": "system", "content": "reasoning language: French"},
            {"role": "user", "content": "Erste Frage?"},
            {"role": "assistant", "reasoning": "Premier.", "content": "Erste Antwort."},
            {"role": "user", "content": "Zweite Frage?"},
            {"role": "assistant", "reasoning": "Second.", "content": "Zweite Antwort."},
        ],
    },
    "multi-turn with tool calls, two calls in one turn, no developer prompt": {
        "tools": [WEATHER, CLOCK],
        "messages": [
            {"role": "user", "content": "Time and weather in Oslo?"},
            {
                "role": "assistant",
                "reasoning": "Two tools.",
                "tool_calls": [
                    call("a", "get_time", {"zone": "Europe/Oslo"}),
                    call("b", "get_weather", {"city": "Oslo"}),
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "14:05"},
            {"role": "tool", "tool_call_id": "b", "content": "sunny, 1 degree"},
            {"role": "assistant", "reasoning": "Both known.", "content": "14:05, sunny, 1 °C."},
            {"role": "user", "content": "And in Rome?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "reasoning": "Weather again.",
                "tool_calls": [call("c", "get_weather", {"city": "Rome", "unit": "celsius"})],
            },
            {"role": "tool", "tool_call_id": "c", "content": "cloudy, 12"},
            {"role": "assistant", "content": "Cloudy, 12 °C."},
        ],
    },
}


def generation_points(messages: list[dict]) -> list[int]:
    """Where inference asks the model for the next assistant message: after a user or tool message."""
    return [
        i + 1
        for i, m in enumerate(messages[:-1])
        if m["role"] in ("user", "tool") and messages[i + 1]["role"] == "assistant"
    ]


def corpus(chat_format: ChatFormat, tokenizer: Any = None) -> dict[str, dict[str, Any]]:
    """The corpus as requests for this format: a format with no developer role (a chat template) gets the
    developer prompt as the system message, as its rows are trained (formats.ChatTemplate.validate refuses it); a
    template with no reasoning field gets the rows without reasoning (data.reasoning: drop), and the rows it cannot
    train are left out (tools it does not read, roles it refuses, a conversation it does not render
    prefix-preserving): training refuses them too, so no served prompt of theirs was trained."""
    if chat_format.developer_role:
        return CORPUS
    rows = {
        name: {**row, "messages": [dict(m, role="system") if m["role"] == "developer" else m for m in row["messages"]]}
        for name, row in CORPUS.items()
    }
    if tokenizer is None:
        return rows
    from toolkit_train.families import harmony
    from toolkit_train.families.formats import FormatError

    field, _ = chat_format.reads(tokenizer)  # type: ignore[attr-defined]
    trainable = {}
    for name, row in rows.items():
        if field is None:
            row = {**row, "messages": [{k: v for k, v in m.items() if k != "reasoning"} for m in row["messages"]]}
        try:
            conversation = harmony.normalize(row, row["messages"], "medium")
            chat_format.validate(conversation, tokenizer)
            chat_format.examples(conversation, tokenizer)
        except (FormatError, ValueError):
            continue
        trainable[f"{name} (no reasoning)" if field is None else name] = row
    return trainable


def request(row: dict, upto: int) -> dict:
    body: dict = {"messages": row["messages"][:upto]}
    body.update({k: row[k] for k in ("tools", "reasoning_effort") if k in row})
    return body


def drift(
    send: Callable[[dict], dict],
    model: str,
    chat_format: ChatFormat | None = None,
    tokenizer: Any = None,
    date: datetime.date | None = None,
) -> list[str]:
    """One line per request of the corpus whose served prompt differs from training's; [] when none does.
    `chat_format`: the model family's (harmony when not given); `tokenizer`: the one training renders a chat
    template with (harmony needs none); `date`: data.conversation_date (harmony's `Current date:`; today's when
    None, as the server's unless it was pinned)."""
    from toolkit_train.families import harmony
    from toolkit_train.families.formats import HARMONY

    chat_format = chat_format or HARMONY
    today = harmony.conversation_date(date)
    problems = []
    rows = corpus(chat_format, tokenizer)
    if not rows:
        raise PromptDrift("the model's chat template renders none of the served-prompt check's conversations as "
                          "training does (each is refused: see toolkit/deploy/parity.py's corpus)")  # fmt: skip
    for name, row in rows.items():
        conversation = harmony.normalize(row, row["messages"], "medium")
        examples = chat_format.examples(conversation, tokenizer, today)
        for upto in generation_points(row["messages"]):
            partial = harmony.normalize(row, row["messages"][:upto], "medium", complete=False)
            expected = chat_format.prompt_ids(partial, tokenizer, today)
            turn = sum(
                bool(m["role"] == "assistant" and m.get("content") and not m.get("tool_calls"))
                for m in row["messages"][:upto]
            )
            trained = examples[turn].ids[: len(expected)]  # the turn's example begins with the prompt it answers
            reply: dict[str, Any] = send(
                {"model": model, "max_tokens": 1, "return_token_ids": True, **request(row, upto)}
            )
            served = reply.get("prompt_token_ids") or []
            if served != trained or expected != trained:
                problems.append(
                    f"{name} (turn {turn + 1}, after message {upto}): {_first_difference(served, trained, tokenizer)}"
                )
    return problems


def _first_difference(served: list[int], trained: list[int], tokenizer: Any = None) -> str:
    from toolkit_train.families import harmony

    at = next(
        (i for i, (x, y) in enumerate(zip(served, trained, strict=False)) if x != y), min(len(served), len(trained))
    )
    decode = tokenizer.decode if tokenizer is not None else harmony.encoding().decode

    def token(ids: list[int]) -> str:
        return f"{decode([ids[at]])!r} ({ids[at]})" if at < len(ids) else "the prompt's end"

    return (f"the served prompt differs from training's at token {at} of {len(trained)}: served {token(served)}, "
            f"trained {token(trained)}")  # fmt: skip


def check(
    send: Callable[[dict], dict],
    model: str,
    chat_format: ChatFormat | None = None,
    tokenizer: Any = None,
    date: datetime.date | None = None,
) -> None:
    """PromptDrift (one line: the first differing feature and token, and how many requests differ) unless the
    served prompts are the trained prompts for the whole corpus."""
    problems = drift(send, model, chat_format, tokenizer, date)
    if problems:
        more = f" (and {len(problems) - 1} more of the corpus's requests)" if len(problems) > 1 else ""
        raise PromptDrift(f"the served prompt is not the trained prompt: {problems[0]}{more}")
