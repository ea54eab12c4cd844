"""Serving a chat-template family for real (issue 47), dense and MoE: the tiny Qwen3 and tiny Qwen3-MoE presets'
fine-tunes (the session's shared runs; the MoE one with expert LoRA, merged),
served by `toolkit deploy --target local` as a user runs it (the CLI in its own process: real vLLM with the family's
reasoning and tool-call parsers, the prompt-parity check through the model's own chat template), asked through the
official openai client and `toolkit invoke`; a served template that renders otherwise than training is caught.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import toolkit
from tests.runs import deploy_until_serving, free_port
from toolkit.cli import app
from toolkit.deploy.client import messages_for, reply_problems

pytestmark = pytest.mark.integration
# one of the bundled sample's questions (held out or not, the tiny Qwen3 answers in its template's shape)
QUESTION = messages_for("Wie viele Minuten hat ein Tag?", reasoning_language="French")


@pytest.fixture(scope="module", params=["qwen3_job_run", "qwen3_moe_job_run"], ids=["dense", "moe"])
def deployed(request, tmp_path_factory):
    """`toolkit deploy tiny-qwen3[-moe]-local --target local` in its own process until it says it serves (its
    prompt-parity check passed); (config, url, what it printed, its working directory). Interrupted (Ctrl-C) at the
    end (tests/runs.py: deploy_until_serving)."""
    cfg, model = request.getfixturevalue(request.param)
    port = free_port()
    cwd = tmp_path_factory.mktemp("qwen3-deploy")
    arguments = [cfg.name, "--target", "local", "--model-dir", str(model), "--port", str(port)]
    with deploy_until_serving(arguments, cwd) as shown:
        yield cfg, f"http://127.0.0.1:{port}", shown, cwd


def test_deploy_serves_it_with_the_familys_parsers_after_the_prompt_check(deployed):
    """The served model is the merged fine-tune, with vLLM's Qwen3 reasoning parser and hermes tool-call parser (what
    its Qwen3 template renders; hermes as the serving image's own version, toolkit_parsers.py), and deploy checked
    the served prompts and the parsed replies first."""
    cfg, _, shown, cwd = deployed
    assert "checking that vLLM renders prompts as training did" in shown, shown
    assert "checking that vLLM's parsers split the model's replies" in shown, shown  # the parse probe passed
    log = (cwd / "runs" / cfg.name / "serve.log").read_text()
    command = next(line for line in log.splitlines() if line.startswith("serve: vllm serve ")).split()
    assert command[3].endswith("/model/merged"), command
    served = json.loads((Path(command[3]) / "config.json").read_text())["model_type"]
    assert served == cfg.model.family.model_type, (served, cfg.model.family.name)  # qwen3 / qwen3_moe
    for flag, value in (("--reasoning-parser", "qwen3"), ("--tool-call-parser", "toolkit_hermes")):
        assert command[command.index(flag) + 1] == value, command
    assert "--enable-auto-tool-choice" in command
    dry = CliRunner().invoke(app, ["deploy", cfg.name, "--target", "local", "--model-dir", command[3].removesuffix(
        "/merged"), "--port", command[command.index("--port") + 1], "--dry-run"])  # fmt: skip
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["vllm_command"] == command[1:]  # the dry run shows the parsers that ran


def test_the_official_openai_client_gets_the_reasoning_apart_from_the_answer(deployed):
    """Qwen3's shape (<think> reasoning </think> answer <|im_end|>) comes back parsed: the reasoning in its own field,
    the answer without tags, ended by the model itself (greedy: the pre-trained tiny base writes the shape)."""
    import openai

    cfg, url, *_ = deployed
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    completion = client.chat.completions.create(model=cfg.name, messages=QUESTION, max_tokens=200, temperature=0)
    message = completion.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning") or (message.model_extra or {}).get("reasoning_content")
    assert reasoning and message.content, message
    assert completion.choices[0].finish_reason == "stop", completion
    assert "<think>" not in message.content + reasoning and "</think>" not in message.content + reasoning


def test_toolkit_invoke_shows_reasoning_and_answer_apart(deployed):
    cfg, url, *_ = deployed
    result = CliRunner().invoke(app, ["invoke", cfg.name, "Wie viele Minuten hat ein Tag?", "--reasoning-language",
                                      "French", "--url", url, "--temperature", "0", "--max-tokens", "200",
                                      "--no-stream", "--check"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "reasoning:" in result.output and "<think>" not in result.output, result.output


def test_the_served_prompt_is_the_trained_prompt_and_a_drifted_template_is_caught(deployed):
    """The parity corpus (tools, tool results, multi-turn, reasoning, the developer prompt as system) renders in
    the running vLLM exactly as training's template rendering. A request whose template renders otherwise (Qwen3's
    `enable_thinking: false`, which writes an empty <think> into the prompt: a model served so is asked in a shape
    it was not trained on) is drift, named by its first differing token."""
    from toolkit.deploy.parity import drift

    cfg, url, *_ = deployed
    assert toolkit.sdk.prompt_drift(cfg, url) == []
    client = toolkit.sdk.chat_client(cfg, url=url)
    chat_format, tokenizer = toolkit.sdk.trained_rendering(cfg)  # type: ignore[misc]

    def without_thinking(body: dict) -> dict:
        return client.send({**body, "chat_template_kwargs": {"enable_thinking": False}})

    problems = drift(without_thinking, client.model, chat_format, tokenizer)
    assert problems, "a prompt with an empty <think> block passed as training's"
    assert all("differs from training's at token" in p and "served '<think>'" in p for p in problems), problems


def test_a_reply_with_tools_is_parsed_by_the_familys_tool_parser(deployed):
    """A request with tools renders them in the template (<tools>) and the reply comes back parsed: a call in
    tool_calls or an answer, never raw <tool_call> markup in the text."""
    cfg, url, *_ = deployed
    client = toolkit.sdk.chat_client(cfg, url=url)
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
    reply = client.chat(QUESTION, max_tokens=200, temperature=0.0, tools=[weather])
    assert reply.finish_reason in ("stop", "tool_calls"), reply
    assert not [p for p in reply_problems(reply) if "tags" in p or "special tokens" in p], reply
    assert reply.tool_calls or reply.content.strip(), reply


def test_the_parse_probe_passes_the_served_model_and_names_the_setting_when_the_reasoning_is_left_in_the_text(deployed):
    """Deploy's parse probe (toolkit/deploy/probe.py) finds the served replies split. The same server asked with
    Qwen3's `enable_thinking: false` (vLLM's Qwen3 parser then reads no reasoning: as a model served without a
    reasoning parser) returns the dense model's <think> block as text (greedy: it writes one after the template's
    empty block; the MoE fine-tune answers without one), and the probe names the setting in one line."""
    from toolkit.deploy import probe

    cfg, url, *_ = deployed
    client = toolkit.sdk.chat_client(cfg, url=url)
    assert probe.parse_problems(client.send, client.model) == []
    if cfg.model.family.model_type != "qwen3":
        return

    def parser_off(body: dict) -> dict:
        return client.send({**body, "chat_template_kwargs": {"enable_thinking": False}})

    with pytest.raises(probe.ParsedWrong) as refused:
        probe.check(parser_off, client.model)
    message = str(refused.value)
    assert "\n" not in message and "<think>" in message, message
    assert message.count("set serving.vllm_args: {reasoning-parser: qwen3} (a <think> block)") == 1, message


def test_a_request_without_temperature_gets_the_tiny_models_greedy_default(deployed):
    """A client that sends no temperature gets the model's generation_config.json (greedy on the tiny Qwen3s, as on
    the tiny gpt-oss), not vLLM's 1.0, under which a model this small wrote <tool_call> into its answer."""
    import openai

    cfg, url, *_ = deployed
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")

    def ask(**extra) -> dict:
        reply = client.chat.completions.create(model=cfg.name, messages=QUESTION, max_tokens=48, **extra)
        return reply.choices[0].message.model_dump()

    greedy = ask(temperature=0)
    assert ask() == greedy and ask() == greedy


def test_a_stop_sequence_ends_the_reply_at_its_first_occurrence_and_is_left_out_of_the_text(deployed):
    """vLLM's semantics for a chat-template family, as docs/serving.md states them (gpt-oss's differ: there the
    string stays in the text): matched over the whole generation, the reasoning included; the reply ends at the
    first match, which is left out (as OpenAI does); `stop_reason` names it. A match in the reasoning: no answer."""
    import openai

    cfg, url, *_ = deployed
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")

    def ask(**extra):
        reply = client.chat.completions.create(model=cfg.name, messages=QUESTION, max_tokens=96, temperature=0,
                                               **extra).choices[0]  # fmt: skip
        return reply, reply.message.model_dump()

    _, free = ask()
    reasoning, answer = free["reasoning"], free["content"]
    assert reasoning and answer, free
    words = [word.strip(".,") for word in reasoning.split()]
    in_reasoning = next(w for w in words[len(words) // 2 :] if len(w) >= 4 and reasoning.count(w) == 1)
    stopped, message = ask(stop=[in_reasoning])
    assert (stopped.finish_reason, stopped.model_extra.get("stop_reason")) == ("stop", in_reasoning)
    assert message["reasoning"] == reasoning[: reasoning.index(in_reasoning)] and not message["content"]
    in_answer = next(word.strip(".,") for word in answer.split() if word.strip(".,") not in reasoning)
    stopped, message = ask(stop=[in_answer])
    assert stopped.finish_reason == "stop" and message["reasoning"] == reasoning
    assert message["content"] == answer[: answer.index(in_answer)]


def test_a_streamed_reply_is_the_whole_reply_with_and_without_tools(deployed):
    """With the official openai client, sampled (temperature 1, seeded): streamed and whole replies give the same
    reasoning, answer and tool calls, with tools and without. vLLM 0.32 streamed a second </think> the model writes
    (after its reasoning ended) as answer text, which the whole reply drops: through hermes (tools; the image's own
    toolkit_hermes drops it) and through the plain answer path (no tools; serve.py's drop_repeated_reasoning_end).
    The dense fine-tune writes such a second </think> for some of these seeds (its raw completion shows it), so the
    comparison covers that case."""
    import openai

    cfg, url, *_ = deployed
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
    weather_question = [{"role": "system", "content": "Answer in French."},
                        {"role": "user", "content": "What is the weather in Paris right now?"}]  # fmt: skip
    _, tokenizer = toolkit.sdk.trained_rendering(cfg)  # type: ignore[misc]
    # (tools, messages, max_tokens): where the dense fine-tune wrote a second </think> for some seeds of 0-7
    for tools, messages, max_tokens in (([weather], weather_question, 60), (None, QUESTION, 200)):
        prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        second_think_end = 0
        for seed in range(8):
            ask = {"model": cfg.name, "messages": messages, "max_tokens": max_tokens, "temperature": 1.0,
                   "seed": seed, **({"tools": tools} if tools else {})}  # fmt: skip
            whole = client.chat.completions.create(**ask).choices[0].message
            reasoning, content, calls = "", "", []
            for chunk in client.chat.completions.create(stream=True, **ask):
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta is not None:
                    reasoning += getattr(delta, "reasoning", None) or ""
                    content += delta.content or ""
                    calls += [c.function.name for c in delta.tool_calls or [] if c.function and c.function.name]
            streamed = (reasoning, content, calls)
            expected = (whole.reasoning or "", whole.content or "",  # type: ignore[attr-defined]
                        [call.function.name for call in whole.tool_calls or []])  # fmt: skip
            assert streamed == expected, (bool(tools), seed)
            raw = client.completions.create(model=cfg.name, prompt=prompt, max_tokens=max_tokens, temperature=1.0,
                                            seed=seed)  # fmt: skip
            second_think_end += raw.choices[0].text.count("</think>") >= 2
        if cfg.model.family.model_type == "qwen3":
            assert second_think_end, f"no seed wrote a second </think> (tools: {bool(tools)}): the case is not covered"
