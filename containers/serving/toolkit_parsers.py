"""vLLM tool-call parsers the serving image registers (`--tool-parser-plugin`, loaded by vLLM's OpenAI server).

`toolkit_hermes`: vLLM 0.32's hermes parser (Qwen3's JSON calls in <tool_call>) with a streamed reply equal to the
whole one. Whole, vLLM passes the tool parser the text after the reasoning parser, which drops a second `</think>`
the model writes after its reasoning ended (the Qwen3 parser's "absorb duplicate </think>" transition); streamed,
once the reasoning has ended the tool parser gets the raw text, and the `</think>` came through as answer text
(seen with the official openai client on the tiny Qwen3 at temperature 1: seeds 4, 5 and 7 of 8). This parser
drops it from what it is given, so both paths give the same answer.
"""

from __future__ import annotations

from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

THINK_END = "</think>"


@ToolParserManager.register_module("toolkit_hermes")
class ToolkitHermesToolParser(Hermes2ProToolParser):
    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, *args, **kwargs):  # type: ignore[no-untyped-def]
        if THINK_END in current_text:
            previous_text = previous_text.replace(THINK_END, "")
            current_text = current_text.replace(THINK_END, "")
            delta_text = delta_text.replace(THINK_END, "")
        return super().extract_tool_calls_streaming(previous_text, current_text, delta_text, *args, **kwargs)
