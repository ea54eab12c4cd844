"""Deploy's parse probe, beside the prompt-parity check: a served reply must come back split as the model writes it
(reasoning apart, the answer as text, tool calls as calls). A family spans variants that write differently (Qwen3
thinks in <think>; Qwen3-Instruct-2507 never opens one; Qwen3-Coder writes its tool calls as XML), and a vLLM parser
that does not fit shows in the reply: every reply taken as reasoning with no answer, or the template's tags left in
the text. The probe asks twice (a question; the same with a tool), greedy, and names the `serving.vllm_args` setting
that fits what it saw (`ParsedWrong`, exit 1). It runs for the families trained through a chat template; harmony's
parsers are gpt-oss's own (a tiny gpt-oss writing raw headers into an answer is the model, not the parser).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from toolkit_train.families import QWEN3_VLLM  # the parsers of the <think> / <tool_call> family

from toolkit.deploy import Refused
from toolkit.deploy.client import ChatReply, reply_from
from toolkit.deploy.parity import WEATHER

MAX_TOKENS = 256  # a reasoning block and an answer on the tiny models; a cut-off reply is judged by its tags only
PROBES = (
    {"messages": [{"role": "user", "content": "What is 12 times 3? Answer in one sentence."}]},
    {"messages": [{"role": "user", "content": "What is the weather in Paris right now?"}], "tools": [WEATHER]},
)
# a template's tags left in a parsed reply's text -> the vLLM flag whose parser should have taken them apart, the
# value to set (a vLLM 0.32 parser name, pasteable) and what that parser reads
LEFT_IN_TEXT = (
    (re.compile(r"</?think>"), "reasoning-parser", QWEN3_VLLM["--reasoning-parser"], "a <think> block"),
    (re.compile(r"<function=[^>\n]*>"), "tool-call-parser", "qwen3_coder", "XML <function=...> calls"),
    (re.compile(r"</?tool_call>"), "tool-call-parser", "hermes", "JSON in <tool_call>; qwen3_coder reads XML"),
)


class ParsedWrong(Refused):
    """A served reply did not come back split as the model wrote it (exit 1): the message names the setting."""


def parser_problems(reply: ChatReply) -> dict[str, str]:
    """What in one parsed reply shows a parser that does not fit the model's output, by the flag to set."""
    problems: dict[str, str] = {}
    text = reply.reasoning + reply.content
    for tags, flag, value, reads in LEFT_IN_TEXT:
        found = sorted(set(tags.findall(text)))
        if found and flag not in problems:
            problems[flag] = (f"the reply shows {' '.join(found)} as text: set serving.vllm_args: "
                              f"{{{flag}: {value}}} ({reads})")  # fmt: skip
    whole_as_reasoning = reply.finish_reason == "stop" and reply.reasoning.strip() and not reply.content.strip()
    if whole_as_reasoning and not reply.tool_calls and "reasoning-parser" not in problems:
        problems["reasoning-parser"] = (
            "the whole reply came back as reasoning, with no answer: the model writes no reasoning block the "
            "reasoning parser waits for; set serving.vllm_args: {reasoning-parser: false}"
        )
    return problems


def parse_problems(send: Callable[[dict], dict], model: str, tools: bool = True) -> list[str]:
    """What the probe's replies show, one line per setting (none: every reply came back split). `tools`: the model
    is served with a tool-call parser (vLLM refuses a request with tools otherwise: the tool probe is not sent)."""
    problems: dict[str, str] = {}
    for probe in PROBES if tools else [p for p in PROBES if "tools" not in p]:
        body = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0, **probe}
        for flag, problem in parser_problems(reply_from(send(body))).items():
            problems.setdefault(flag, problem)
    return list(problems.values())


def check(send: Callable[[dict], dict], model: str, tools: bool = True) -> None:
    """Raise `ParsedWrong` naming the setting when a probe reply is not split as the model wrote it."""
    problems = parse_problems(send, model, tools)
    if problems:
        raise ParsedWrong("the served replies are not split as the model writes them: " + "; ".join(problems))
