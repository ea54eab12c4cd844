"""`toolkit eval --tasks`: lm-evaluation-harness, without vLLM.

The harness itself runs for real (the pinned lm_eval, the bundled toolkit_numbers task, its filter and metric,
its `local-chat-completions` HTTP client). What stands in for vLLM is a small OpenAI-compatible chat server on
loopback that answers from the task's own rows and records what it was sent: it shows the arguments the toolkit
builds reach the server as chat messages, and that the report pairs the two models per document. The real path,
vLLM serving the tiny gpt-oss, is tests/toolkit/test_evaluate.py (integration).
"""

from __future__ import annotations

import json
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.evaluate import benchmarks
from toolkit.evaluate.report import markdown

REPO = Path(__file__).resolve().parents[2]
ROWS = [json.loads(line) for line in (benchmarks.BUNDLED_TASKS / "toolkit_numbers" / "toolkit_numbers.jsonl")
        .read_text().splitlines()]  # fmt: skip
ANSWERS = {row["question"]: row["answer"] for row in ROWS}


def test_the_eval_extra_pins_the_harness_version_the_code_is_written_for():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["eval"]
    assert f"lm_eval[api]=={benchmarks.LM_EVAL_VERSION}" in extra
    assert version("lm_eval") == benchmarks.LM_EVAL_VERSION


def test_task_names_are_parsed_like_the_harness_cli():
    assert benchmarks.parse_tasks("toolkit_numbers, gsm8k,,toolkit_numbers") == ["toolkit_numbers", "gsm8k"]
    assert benchmarks.parse_tasks(["a,b", "c"]) == ["a", "b", "c"] and benchmarks.parse_tasks(None) == []


def test_the_arguments_build_the_harness_chat_model_for_the_served_url():
    from lm_eval.api.registry import get_model

    arguments = benchmarks.harness_arguments("http://127.0.0.1:8123/", "tiny", ["toolkit_numbers"], 5, 3, 96)
    assert arguments["model"] == "local-chat-completions" and arguments["apply_chat_template"] is True
    assert arguments["tasks"] == ["toolkit_numbers"] and arguments["limit"] == 5 and arguments["log_samples"]
    # the harness's own class accepts every model argument (a renamed one in another version fails here)
    lm = get_model(arguments["model"])(**arguments["model_args"])
    assert lm.base_url == "http://127.0.0.1:8123/v1/chat/completions" and lm.model == "tiny"
    assert lm._concurrent == 3 and lm._max_gen_toks == 96 and lm.tokenizer is None


class ChatServer:
    """An OpenAI-compatible chat route on loopback answering the task's questions: right for every question when
    `right` is "all", else only for even-numbered rows. Keeps every request body it got."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.right = "all"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                question = body["messages"][-1]["content"]
                index = next(i for i, row in enumerate(ROWS) if row["question"] == question)
                right = outer.right == "all" or index % 2 == 0
                content = f"It is {ANSWERS[question]}." if right else "It is 0."
                reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                              "reasoning_content": "thinking"},
                                      "finish_reason": "stop"}]}  # fmt: skip
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def chat_server():
    server = ChatServer()
    yield server
    server.server.shutdown()


def test_the_harness_scores_both_models_and_the_report_pairs_them(chat_server):
    manager = benchmarks.task_manager(["toolkit_numbers"])
    by_model = {}
    for label, right in (("base", "even"), ("fine-tuned", "all")):
        chat_server.right, chat_server.bodies[:] = right, []
        arguments = benchmarks.harness_arguments(chat_server.url, "served", ["toolkit_numbers"], 6, 2, 40)
        by_model[label] = benchmarks.run(manager, arguments)
        assert len(chat_server.bodies) == 6
        for body in chat_server.bodies:  # the prompt went as chat messages, the task's question as the user's turn
            assert body["model"] == "served" and body["max_tokens"] == 40 and body["stop"] == []
            assert body["messages"][-1]["role"] == "user" and body["messages"][-1]["content"] in ANSWERS
    (base,), (tuned,) = by_model["base"], by_model["fine-tuned"]
    key = "exact_match,first-number"
    assert base.rows == tuned.rows == 6
    assert base.metrics[key] == pytest.approx(0.5) and tuned.metrics[key] == pytest.approx(1.0)
    assert base.per_doc[key] == {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0, 5: 0.0}

    section = benchmarks.compare(by_model, "base", "fine-tuned")["toolkit_numbers"]
    metric = section["metrics"][key]
    assert metric["difference"] == pytest.approx(0.5) and metric["paired_rows"] == 6
    assert 0 < metric["ci95"][0] <= 0.5 <= metric["ci95"][1] <= 1
    assert section["rows"] == {"base": 6, "fine-tuned": 6}
    report = {"baseline": "base", "candidate": "fine-tuned", "metrics": {}, "models": {},
              "benchmarks": {"toolkit_numbers": section}}  # fmt: skip
    table = markdown(report)
    assert "lm-evaluation-harness task toolkit_numbers (base 6 / fine-tuned 6 rows)" in table
    assert "| exact_match,first-number | 0.500 ± " in table and "| +0.500 |" in table


@pytest.mark.integration  # the harness indexes its thousands of task files (~20 s) before it says a name is not there
def test_an_unknown_task_is_one_line_and_exit_2_before_any_server_starts(tmp_path, monkeypatch):
    from toolkit.deploy import local

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started for a task that does not exist")

    monkeypatch.setattr(local.LocalServer, "start", no_server)
    model = tmp_path / "run" / "model"
    (model / "merged").mkdir(parents=True)
    (model / "merged" / "config.json").write_text("{}")  # a trained run's layout: nothing is loaded from it
    monkeypatch.chdir(tmp_path)
    args = ["eval", "tiny-gpt-oss-local", "--set", f"local.output_dir={tmp_path}/run", "--set",
            "data.eval.fraction=0.25", "--tasks", "toolkit_numbers,no_such_task_anywhere"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "no_such_task_anywhere" in lines[0] and "toolkit_numbers" in lines[0], lines
    assert "Traceback" not in result.output
