"""The CLI: thin, instant, and exit code 2 with one clear message on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.config import load_config, preset_names
from toolkit.config.loader import read_source

runner = CliRunner()
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("argv", [["config", "validate", "gpt-oss-20b-lora"], ["--help"], ["plan", "--help"]])
def test_help_and_validate_import_no_heavy_library(argv):
    probe = (
        f"import sys, runpy; sys.argv = ['toolkit', *{argv!r}];\n"
        "try:\n runpy.run_module('toolkit.cli', run_name='__main__')\n"
        "except SystemExit: pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'sagemaker', 'boto3', 'datasets') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "ok gpt-oss-20b-lora" in result.stdout or "Usage" in result.stdout
    assert "HEAVY []" in result.stdout


def test_version_is_the_installed_packages():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"toolkit {version('toolkit')}"


def test_validate_ok_and_bad(tmp_path):
    assert runner.invoke(app, ["config", "validate", "tiny-gpt-oss-local"]).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: tiny-gpt-oss-local\nlora:\n  rnak: 4\n")
    result = runner.invoke(app, ["config", "validate", str(bad)])
    assert result.exit_code == 2
    assert "lora.rnak: unknown key" in result.output
    assert str(bad) in result.output


def test_bad_input_exit_codes(tmp_path):
    syntax = tmp_path / "syntax.yaml"
    syntax.write_text("name: [unclosed\n")
    for args in (
        ["config", "validate", str(tmp_path / "missing.yaml")],
        ["config", "validate", str(syntax)],
        ["config", "show", "tiny-gpt-oss-local", "--set", "training.max_steps=zero"],
        ["train", "tiny-gpt-oss-local", "--target", "hyperpod"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "error:" in result.output


def test_a_refused_value_is_echoed_as_written():
    """Values are text: rich's emoji codes (":b:" is one) must not turn a config value into a picture."""
    result = runner.invoke(app, ["config", "validate", "tiny-gpt-oss-local", "--set", "name=x:b:y"])
    assert result.exit_code == 2 and "(got 'x:b:y')" in result.output, result.output


def test_show_prints_the_resolved_config_with_overrides():
    result = runner.invoke(app, ["config", "show", "gpt-oss-20b-lora", "--set", "lora.r=32"])
    assert result.exit_code == 0
    shown = yaml.safe_load(result.stdout)
    assert shown["lora"]["r"] == 32
    assert shown["training_job"]["instance_type"] == "ml.p5.48xlarge"


def test_show_says_what_one_optimizer_step_averages_over_on_the_target():
    """The Databricks recipe's 16 rows per step (1 row x 2 accumulation x 8 GPUs) against the packed path's tokens."""
    result = runner.invoke(app, ["config", "show", "gpt-oss-20b-lora", "--set", "target=training-job"])
    assert result.exit_code == 0 and yaml.safe_load(result.stdout)["target"] == "training-job"  # still YAML
    comments = [line for line in result.stdout.splitlines() if line.startswith("# ")]
    assert comments[0] == "# 8 GPU process(es) x 2 micro-batch(es) per optimizer step"
    assert "up to 196,608 tokens per optimizer step (12,288 per micro-batch)" in comments[1]
    assert "it would be 16 rows" in comments[1] and comments[2] == "# loss on: assistant tokens"
    # the preset's token budget does nothing unpacked: unset with it (refused otherwise: test_applicability)
    unpacked = runner.invoke(app, ["config", "show", "gpt-oss-20b-lora", "--set", "training.packing=false",
                                   "--set", "training.tokens_per_micro_batch=null"])  # fmt: skip
    assert "# unpacked: 2 rows per optimizer step, up to 4,096 tokens" in unpacked.stdout  # local: 1 GPU


def test_schema_is_json_schema_for_the_files_users_write():
    """An editor validates the raw file, as written: `base:`, keys a base supplies left out, ${ENV} values."""
    result = runner.invoke(app, ["config", "schema"])
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for source in [*preset_names(), *map(str, EXAMPLES)]:
        raw = yaml.safe_load(read_source(source)[1])
        assert not list(validator.iter_errors(raw)), source
    validator.validate(load_config("gpt-oss-120b-lora").model_dump(mode="json", exclude_none=True))
    assert validator.is_valid({"base": "tiny-gpt-oss-local", "training": {"max_steps": "${STEPS}"}})
    for broken in (
        {"base": "tiny-gpt-oss-local", "lora": {"rnak": 1}},  # unknown key
        {"base": "tiny-gpt-oss-local", "training": {"max_steps": "many"}},  # wrong type
        {"base": "tiny-gpt-oss-local", "training": {"lr_scheduler": "cosinus"}},  # not a choice
        {"lora": {"r": 8}},  # no base, and the required keys missing
    ):
        assert not validator.is_valid(broken), broken


def test_dry_run_local_launches_nothing(tmp_path):
    out_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", "tiny-gpt-oss-local", "--dry-run", "--set", f"local.output_dir={out_dir}"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["hyperparameters"]["lora.r"] == str(load_config("tiny-gpt-oss-local").lora.r)  # the preset's
    assert not out_dir.exists()


def test_invoke_of_a_local_config_asks_this_machine_not_aws(monkeypatch):
    """Without --target, a config whose training target is local is invoked on this machine's server (here: none
    listens), never on a SageMaker endpoint that would need credentials."""
    import socket

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    result = runner.invoke(app, ["invoke", "tiny-gpt-oss-local", "Hallo", "--set", f"serving.local_port={closed}"])
    assert result.exit_code == 2, result.output
    assert f"cannot reach http://127.0.0.1:{closed}/invocations" in " ".join(result.stderr.split()), result.output
    assert "credentials" not in result.output


def test_unbuilt_target_says_so_plainly(monkeypatch):
    import pytest

    from toolkit.config.targets import TargetSettings
    from toolkit.targets import base

    class Future(TargetSettings, target="future", section="future", module="toolkit.targets.future"):
        pass

    from toolkit.config.targets import TARGET_SETTINGS

    # registered by the class statement; set again through monkeypatch, which removes it after the test
    monkeypatch.setitem(TARGET_SETTINGS, "future", TARGET_SETTINGS.pop("future"))
    with pytest.raises(base.TargetError, match="target 'future' is not built yet"):
        base.get_target("future")
    with pytest.raises(base.TargetError, match="unknown target 'cloud'; choose one of: local"):
        base.get_target("cloud")


def _serve_in_thread(handler):
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_invoke_shows_a_streamed_reply_as_it_arrives_and_its_tool_calls_whole():
    """The SDK puts the deltas together (ReplyAssembler): reasoning on stderr and the answer on stdout, each up to
    its first raw harmony token, model text never read as markup, a tool call's pieces shown as one line at the end,
    and --check judges the whole reply."""
    from http.server import BaseHTTPRequestHandler

    deltas = [{"reasoning_content": "Let me "}, {"reasoning_content": "think [b]x[/b] :b:."}, {"content": "The answer"},
              {"content": " is 42."}, {"content": "<|return|> held back"},
              {"tool_calls": [{"index": 0, "function": {"name": "get_weather", "arguments": '{"ci'}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}]  # fmt: skip
    events = [{"choices": [{"delta": delta, "finish_reason": None}]} for delta in deltas]
    events.append({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    stream = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            assert json.loads(self.rfile.read(int(self.headers["Content-Length"])))["stream"] is True
            self.send_response(200)
            self.end_headers()
            for start in range(0, len(stream), 5):  # events split anywhere
                self.wfile.write(stream[start : start + 5])
                self.wfile.flush()

        def log_message(self, *args):
            pass

    server = _serve_in_thread(Handler)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = runner.invoke(app, ["invoke", "tiny-gpt-oss-local", "Weather?", "--url", url, "--check"])
    finally:
        server.shutdown()
    assert result.exit_code == 1, result.output  # --check: the whole reply holds a special token
    assert result.stdout == '\nanswer: The answer is 42.\ntool call: get_weather {"city": "Paris"}\n'
    assert result.stderr == (
        "reasoning: Let me think [b]x[/b] :b:.the reply holds raw harmony markup (<|return|>): not shown as text "
        "from there on; --json shows the reply as the server sent it\nerror: the reply shows special tokens: "
        "<|return|>\n"
    )


FAKE_VLLM = """
import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"choices": [{"message": {"content": "x"}, "finish_reason": "length"}],
                           "prompt_token_ids": [1, 2, 3, 4]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)

HTTPServer(("127.0.0.1", int(os.environ["SM_VLLM_PORT"])), Handler).serve_forever()
"""


def test_local_deploy_refuses_a_served_prompt_that_is_not_the_trained_one_and_stops_the_server(tmp_path):
    """vLLM stood in for by a server that renders every prompt wrong: `deploy --target local` starts it, finds the
    drift, stops it and exits 1 with the refusal, never saying it serves (LocalServer.serve, the SDK's life cycle)."""
    import shlex
    import socket

    fake = tmp_path / "fake_vllm.py"
    fake.write_text(FAKE_VLLM)
    python = tmp_path / "python"  # `-c` probes (has vLLM? a GPU?) pass; serve.py runs the fake
    python.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exit 0; fi\nexec {shlex.quote(sys.executable)} {fake}\n')
    python.chmod(0o755)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "deploy", "tiny-gpt-oss-local", "--target", "local", "--model-dir",
         str(tmp_path / "model"), "--port", str(port), "--set", f"serving.local_python={python}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    said = " ".join(result.stderr.split())
    assert result.returncode == 1, result.stderr
    assert "error: the served prompt is not the trained prompt: tools, a tool result, developer prompt" in said
    assert said.endswith("Serve with the pinned vLLM (scripts/env.sh, the serving image) or retrain with this "
                         "toolkit's rendering"), said  # fmt: skip
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert not (tmp_path / "runs" / "tiny-gpt-oss-local" / "serve.pid").exists()  # stopped: its record removed
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more


def test_a_streamed_reply_with_no_answer_ends_its_reasoning_line_before_the_error():
    """Found by an adversarial try: `invoke --check` on a streamed reply that never opened an answer printed
    `...reasoning.error: the reply has no answer` on one line (and a cut-off twice, as a note and as the error)."""
    from http.server import BaseHTTPRequestHandler

    events = [{"choices": [{"delta": {"reasoning_content": "Thinking it over."}, "finish_reason": None}]},
              {"choices": [{"delta": {}, "finish_reason": "length"}]}]  # fmt: skip
    stream = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(stream)

        def log_message(self, *args):
            pass

    server = _serve_in_thread(Handler)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = CliRunner().invoke(app, ["invoke", "tiny-qwen3-local", "Why?", "--url", url, "--max-tokens", "5",
                                          "--check"])  # fmt: skip
    finally:
        server.shutdown()
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == "reasoning: Thinking it over.", result.stderr
    assert lines[1].startswith("error: the reply was cut off at --max-tokens 5"), result.stderr
    assert result.stderr.count("cut off") == 1 and "has no answer" in result.stderr, result.stderr
    assert "analysis channel" not in result.stderr and "final channel" not in result.stderr  # Qwen3: no channels
