"""Two architectures that no family record claims, end to end as a user runs them (issue 66): the tiny-llama-local
and tiny-gemma-local presets (LlamaForCausalLM with Llama 3's chat template, GemmaForCausalLM with Gemma 3's; built
offline) trained by `toolkit train --target local`, served by `toolkit deploy --target local` (real vLLM, no
reasoning or tool parsers, the served-prompt check through each model's own template and the parse probe), asked
through the official openai client and `toolkit invoke --check`, and scored by `toolkit eval`. Each command is the
CLI in its own process, in one working directory per model, as the README has users type them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import deploy_until_serving, free_port, serving_python

pytestmark = pytest.mark.integration
STEPS = "training.max_steps=10"  # the preset's 30 prove no more of the path; the run is scored, not judged by skill
QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How many days are in a week?"}]
TEMPLATE_TOKENS = ("<|eot_id|>", "<|start_header_id|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>")


def toolkit(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOOLKIT_SERVE_PYTHON": serving_python()}
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module", params=["tiny-llama-local", "tiny-gemma-local"], ids=["llama", "gemma"])
def trained(request, tmp_path_factory) -> tuple[str, Path]:
    """(preset, working directory) after `toolkit train <preset> --target local` there."""
    preset, cwd = request.param, tmp_path_factory.mktemp(request.param)
    result = toolkit(cwd, "train", preset, "--target", "local", "--set", STEPS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (cwd / "runs" / preset / "model" / "merged" / "config.json").is_file()
    return preset, cwd


@pytest.fixture(scope="module")
def deployed(trained):
    """`toolkit deploy <preset> --target local` running until it says it serves; (preset, cwd, url, its output).
    Interrupted (Ctrl-C) at the end (tests/runs.py: deploy_until_serving)."""
    preset, cwd = trained
    port = free_port()
    env = {**os.environ, "TOOLKIT_SERVE_PYTHON": serving_python()}
    with deploy_until_serving([preset, "--target", "local", "--port", str(port)], cwd, env) as shown:
        yield preset, cwd, f"http://127.0.0.1:{port}", shown


def test_deploy_checks_the_served_prompts_and_serves_without_parsers(deployed):
    """The merged fine-tune of a record-less architecture, served with no reasoning or tool-call parser (nothing in
    its template for one to read), after the served-prompt check through its own template and the parse probe."""
    preset, cwd, _, shown = deployed
    assert "checking that vLLM renders prompts as training did" in shown, shown
    assert "checking that vLLM's parsers split the model's replies" in shown, shown
    log = (cwd / "runs" / preset / "serve.log").read_text()
    command = next(line for line in log.splitlines() if line.startswith("serve: vllm serve ")).split()
    assert command[3].endswith("/model/merged"), command
    served = json.loads((Path(command[3]) / "config.json").read_text())["model_type"]
    assert served == preset.removeprefix("tiny-").removesuffix("-local"), served  # llama / gemma: no record's type
    assert not {"--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice"} & set(command), command
    port = deployed[2].rsplit(":", 1)[1]
    dry = toolkit(cwd, "deploy", preset, "--target", "local", "--port", port, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert json.loads(dry.stdout)["vllm_command"] == command[1:]  # the dry run shows the command that ran


def test_the_official_openai_client_gets_the_same_answer_streamed_and_whole(deployed):
    """No `temperature` in the request: the model's generation config (greedy) decides, so streamed equals whole;
    the answer is text with no template tokens, no reasoning, and the model ended it itself."""
    import openai

    _, _, url, _ = deployed
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    model = client.models.list().data[0].id
    whole = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=64)  # type: ignore[arg-type]
    message = whole.choices[0].message
    assert message.content and message.content.strip(), whole
    assert not getattr(message, "reasoning_content", None) and not getattr(message, "reasoning", None), message
    assert not any(token in message.content for token in TEMPLATE_TOKENS), message.content
    streamed = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=64,  # type: ignore[arg-type]
                                              stream=True)  # fmt: skip
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert text == message.content


def test_invoke_check_accepts_an_answer_without_reasoning(deployed):
    """`toolkit invoke --check`: the model was trained without reasoning (data.reasoning: drop), so an answer alone
    is well-formed; exit 0, the answer printed."""
    preset, cwd, url, _ = deployed
    result = toolkit(cwd, "invoke", preset, "How many days are in a week?", "--url", url, "--check", "--no-stream",
                     "--temperature", "0")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("answer: ") and result.stdout.strip() != "answer:", result.stdout
    assert "Traceback" not in result.stderr


def test_eval_on_a_taken_port_is_refused_in_one_line_before_any_server_starts(trained):
    """serving.eval_port another process listens on: exit 2, one line naming the setting; no vLLM started, no
    report written or cleared."""
    import socket

    preset, cwd = trained
    report = cwd / "runs" / preset / "eval" / "report.json"
    before = report.stat().st_mtime_ns if report.exists() else None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = toolkit(cwd, "eval", preset, "--set", f"serving.eval_port={port}", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert f"port {port} (serving.eval_port): another process listens there" in output, output
    assert "Traceback" not in output and "starting vLLM" not in output
    assert (report.stat().st_mtime_ns if report.exists() else None) == before  # no report written or cleared


def test_eval_scores_base_and_fine_tuned_on_the_held_out_rows(trained):
    """`toolkit eval` on a fixed port (serving.eval_port: each model served there in turn): both models served by
    vLLM, the held-out rows generated and scored; the reasoning language is not scored (the model writes none), the
    answers are, and format validity asks for an answer alone."""
    preset, cwd = trained
    port = free_port()
    result = toolkit(cwd, "eval", preset, "--limit", "6", "--json", "--set", f"serving.eval_port={port}")
    assert result.returncode == 0, result.stdout + result.stderr
    for label in ("base", "fine-tuned"):
        log = (cwd / "runs" / preset / "eval" / f"serve-{label}.log").read_text()
        assert f"--port {port}" in log, log[:2000]
    report = json.loads((cwd / "runs" / preset / "eval" / "report.json").read_text())
    metrics = report["metrics"]
    assert metrics["reasoning_language"]["rows"] == 0, metrics["reasoning_language"]
    for name in ("chrF", "format_valid"):
        assert metrics[name]["rows"] == 6, metrics[name]
    assert metrics["format_valid"]["base"] > 0 and metrics["format_valid"]["fine-tuned"] > 0, metrics
