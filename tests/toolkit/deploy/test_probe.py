"""Deploy's parse probe on replies as vLLM 0.32's parsers return them (tests/containers/test_serve.py runs those
parser classes on each Qwen3 variant's reply: with the family's old defaults, Instruct-2507's whole reply comes back
as reasoning and Coder's XML call as text). The served path: test_serving_chat_template.py."""

from __future__ import annotations

import pytest

from toolkit.deploy.client import ChatReply
from toolkit.deploy.probe import ParsedWrong, check, parser_problems

CALL = [{"id": "c", "name": "get_weather", "arguments": '{"city": "Paris"}'}]


def reply(content: str = "", reasoning: str = "", finish: str = "stop", calls: list | None = None) -> ChatReply:
    return ChatReply(content, reasoning, finish, {}, "m", calls or [])


@pytest.mark.parametrize(
    "parsed",
    [
        reply("\n\nIt is raining.", "\nIt rains there.\n"),  # Qwen3: reasoning apart
        reply("It is raining."),  # Instruct-2507 with no reasoning parser
        reply("", "", "tool_calls", CALL),  # a call, parsed
        reply("", "It rains there and it goes on", "length"),  # cut off inside its reasoning: no verdict
    ],
)
def test_a_reply_split_as_the_model_wrote_it_passes(parsed):
    assert parser_problems(parsed) == {}


@pytest.mark.parametrize(
    "parsed, says",
    [
        (reply("", "It is raining."), "{reasoning-parser: false}"),  # Instruct-2507 under the qwen3 parser
        (reply("<think>\nIt rains.\n</think>\n\nIt is raining."), "{reasoning-parser: qwen3} ("),  # no parser
        (reply("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
               "</tool_call>"), "{tool-call-parser: qwen3_coder} ("),  # Coder's XML under hermes
        (reply('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'), "{tool-call-parser: hermes} ("),
    ],
)  # fmt: skip
def test_a_reply_a_parser_did_not_take_apart_names_the_setting(parsed, says):
    problems = list(parser_problems(parsed).values())
    assert len(problems) == 1 and says in problems[0], problems


def test_the_probe_asks_greedily_with_and_without_a_tool_and_refuses_in_one_line():
    asked: list[dict] = []

    def send(body: dict) -> dict:
        asked.append(body)
        return {"choices": [{"message": {"content": None, "reasoning": "All of it."}, "finish_reason": "stop"}]}

    with pytest.raises(ParsedWrong) as refused:
        check(send, "bot")
    assert [bool(body.get("tools")) for body in asked] == [False, True]
    assert all(body["temperature"] == 0 and body["model"] == "bot" for body in asked)
    message = str(refused.value)
    assert "\n" not in message and message.count("reasoning-parser: false") == 1, message
