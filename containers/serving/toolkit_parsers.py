"""vLLM tool-call parsers the serving image registers (`--tool-parser-plugin`, loaded by vLLM's OpenAI server).

`toolkit_hermes`: vLLM 0.32's hermes parser (Qwen3's JSON calls in <tool_call>) with a streamed reply equal to the
whole one. Whole, vLLM passes the tool parser the text after the reasoning parser, which drops a second `</think>`
the model writes after its reasoning ended (the Qwen3 parser's "absorb duplicate </think>" transition); streamed,
once the reasoning has ended the tool parser gets the raw text, and the `</think>` came through as answer text
(seen with the official openai client on the tiny Qwen3 at temperature 1: seeds 4, 5 and 7 of 8). This parser
drops it from what it is given, so both paths give the same answer; `drop_repeated_reasoning_end` does the same for
a request without tools.
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


def drop_repeated_reasoning_end() -> None:
    """The same for a request without tools, whose text after the reasoning no tool parser sees: vLLM 0.32's
    streaming parser passes it through as answer text, a second `</think>` included, while the whole reply's
    reasoning parser drops it. serve.py calls this in the API server's process before vLLM starts: every streamed
    answer delta after the reasoning ended loses the reasoning parser's own end marker, as the whole reply does."""
    from vllm.parser.abstract_parser import DelegatingParser

    original = DelegatingParser.parse_delta
    if getattr(original, "toolkit_patched", False):
        return

    def parse_delta(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        ended_before = self._stream_state.reasoning_ended
        delta = original(self, *args, **kwargs)
        end = self._reasoning_parser.reasoning_end_str if self._reasoning_parser is not None else None
        if ended_before and end and delta is not None and delta.content and end in delta.content:
            delta.content = delta.content.replace(end, "")
        return delta

    parse_delta.toolkit_patched = True  # type: ignore[attr-defined]
    DelegatingParser.parse_delta = parse_delta  # type: ignore[method-assign]
