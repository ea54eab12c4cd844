"""`toolkit eval`: generate on the held-out rows (data.eval) through the real serving path and score the fine-tuned
model against the base model in the same run.

- Rows: the rows data.eval holds out (the same rows the training run never saw; entrypoints/data.split_rows),
  each split into the prompt (every message before the last assistant turn), the reference answer and the
  requested reasoning language (a `reasoning language: X` system line, as the sample has).
- Generation: a thread pool of chat requests (greedy: temperature 0) against each served model; a row that fails
  to generate is counted and named, never fatal.
- Scores (toolkit/evaluate/scoring.py): ROUGE-L and chrF of the final channel against the reference; whether the
  analysis channel is in the requested language; format validity (both channels, no special tokens, stop reached,
  no runaway repetition).
- Benchmarks (toolkit/evaluate/benchmarks.py, `tasks`): lm-evaluation-harness tasks against the same server, for
  each model, after its held-out rows.
- Report (toolkit/evaluate/report.py): base vs fine-tuned per metric with the paired difference and a bootstrap
  confidence interval; report.json, report.md and chart PNGs under runs/<name>/eval/.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit_train.layout import RUN_RECORD, RunRecord

from toolkit.config import Config
from toolkit.errors import BadInput


class EvalInputError(BadInput):
    """What `toolkit eval` cannot run on: no held-out rows, no trained model."""


@dataclass
class EvalRow:
    place: str  # where the row came from ("multilingual-thinking.jsonl line 7", or "row 3")
    messages: list[dict]  # the prompt: everything before the answer to score
    reference: str  # "" where the row has none (the metrics against it do not apply)
    reasoning_language: str | None  # None: not scored (none asked, or a model trained without reasoning)
    reasoning: bool = True  # the model writes reasoning apart from its answer (Config.writes_reasoning)


@dataclass
class Generated:
    row: EvalRow
    content: str = ""
    reasoning: str = ""
    finish_reason: str = ""
    error: str | None = None  # why it did not generate (the server's reply, a timeout)
    tool_calls: list[dict] = field(default_factory=list)  # a tool call answers too: the reply is scored as one


@dataclass
class ModelResult:
    label: str  # "base" or "fine-tuned"
    served: str  # what was served (a directory, an adapter name)
    generated: list[Any] = field(default_factory=list)  # a Generated per row (a DPO run's: preference.ScoredPair)
    seconds: float = 0.0
    benchmarks: list[Any] = field(default_factory=list)  # benchmarks.TaskResult per task asked for
    benchmark_seconds: float = 0.0


def require_held_out(config: Config) -> None:
    if config.data.eval is None:
        raise EvalInputError(
            "data.eval is not set: hold rows out for evaluation (data.eval.fraction: 0.2, or data.eval.source), "
            "train with it, then run toolkit eval"
        )


SPLIT_SETTINGS = ("split", "skip_bad_rows", "eval")  # data settings that decide which rows a run held out


def as_trained(config: Config, run: RunRecord | None) -> tuple[Config, str | None]:
    """The config with the data settings that decided the run's held-out rows taken from its own record (run.json's
    settings.data), so that eval scores rows the run never trained on whatever this command's flags say; and a
    note naming what differed (None when nothing did, or when there is no record)."""
    recorded = run.data_settings if run is not None else {}
    current = config.data.model_dump(mode="json")
    changed = {key: recorded[key] for key in SPLIT_SETTINGS if key in recorded and recorded[key] != current.get(key)}
    if not changed:
        return config, None
    data = type(config.data).model_validate({**current, **changed})
    said = ", ".join(f"data.{key}: {json.dumps(value)}" for key, value in changed.items())
    note = f"scoring the rows the run held out as it was trained ({said}), not as this command's settings say"
    return config.model_copy(update={"data": data}), note


def held_out(config: Config, read: Callable[[dict], Any]) -> list[tuple[str, Any]]:
    """(where, read(row)) for each row data.eval holds out; a row `read` refuses (ValueError) is one line naming it."""
    from toolkit_train.data import load_rows, split_rows

    require_held_out(config)
    _, held = split_rows(load_rows(config.data.source, config.data.split), config.data)
    places = getattr(held, "places", None)
    out = []
    for index, row in enumerate(held):
        where = places[index] if places else f"held-out row {index}"
        try:
            out.append((where, read(row)))
        except ValueError as exc:
            raise EvalInputError(f"{where}: not a valid {config.data.format!r} row ({exc})") from None
    return out


def eval_rows(config: Config, limit: int | None = None) -> list[EvalRow]:
    """The rows data.eval holds out, as prompts with their reference answers."""
    from toolkit_train.data import prompt_and_reference, to_messages
    from toolkit_train.methods.rewards import asked_language

    rows = []
    for where, messages in held_out(config, lambda row: to_messages(row, config.data.format)):
        asked, reference = prompt_and_reference(messages)  # a GRPO prompt may come without a reference answer
        language = asked_language(asked) if config.writes_reasoning else None
        prompt = [{"role": m["role"], "content": m["content"]} for m in asked]
        rows.append(EvalRow(where, prompt, reference or "", language, config.writes_reasoning))
    return rows[:limit] if limit else rows


def generate(
    client: Any,
    rows: list[EvalRow],
    max_tokens: int,
    concurrency: int,
    on_row: Callable[[Generated, int], None] | None = None,
) -> list[Generated]:
    """Every row through `client.chat`, `concurrency` requests at a time; failures are kept with their reason."""

    def one(row: EvalRow) -> Generated:
        try:
            reply = client.chat(row.messages, max_tokens=max_tokens, temperature=0.0)
        except Exception as exc:  # a failed row is counted and named in the report, not fatal
            return Generated(row, error=failure(exc))
        return Generated(row, reply.content, reply.reasoning, reply.finish_reason, tool_calls=reply.tool_calls)

    return each_row(rows, one, concurrency, on_row)


def failure(exc: Exception) -> str:
    """Why a row failed, in one line (the report names it)."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def each_row(
    rows: list[Any], one: Callable[[Any], Any], concurrency: int, on_row: Callable[[Any, int], None] | None
) -> list[Any]:
    """`one(row)` for every row, `concurrency` at a time, in the rows' order; `on_row` hears of each as it finishes
    with the number of rows (a progress bar's total)."""
    results: dict[int, Any] = {}
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = {pool.submit(one, row): i for i, row in enumerate(rows)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            if on_row:
                on_row(results[futures[future]], len(rows))
    return [results[i] for i in range(len(rows))]


@contextmanager
def _local_server(config: Config, model: Path, log: Path) -> Iterator[str]:
    """vLLM serving `model` on serving.eval_port (a taken one is refused in one line naming it), else a free port."""
    from toolkit.deploy.local import LocalServer

    port = config.serving.eval_port or _free_port()
    with LocalServer(config, model, port=port, log=log, port_setting="serving.eval_port") as server:
        server.wait_ready(timeout=900)
        yield server.url


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def served_models(config: Config, model_dir: Path | None = None) -> list[tuple[str, Path]]:
    """(label, directory) of the base model and the fine-tuned (merged) one, as the local server serves them.

    vLLM could serve both from one server (the base plus the adapter, --enable-lora), but not on a CPU for gpt-oss
    (its MoE-LoRA path needs a GPU), so the local route serves the base, then the merged model, one server each."""
    from toolkit_train.run.model import resolve_model_path

    from toolkit.deploy.local import model_dir as trained_dir

    trained = trained_dir(config, model_dir)
    base = Path(resolve_model_path(config.model))
    if not (base / "config.json").is_file():
        raise EvalInputError(
            f"model.id: {config.model.id} is not a model directory on this machine, which the local server needs "
            "to serve the base model: download it and point model.id at the directory"
        )
    return [("base", base), ("fine-tuned", trained)]


@contextmanager
def only_eval_of_its_run(config: Config) -> Iterator[None]:
    """Held while an eval of this config runs (an OS lock on runs/<name>/eval.lock, released when the process ends,
    however it ends). A second eval of the same run is refused before it touches anything (the first one's
    report files, its servers), naming the process that runs the first."""
    import fcntl
    import os

    lock_path = eval_dir(config).with_name("eval.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise EvalInputError(
                f"an eval of {config.name} is already running (process {holder}): wait for it to finish (its report "
                f"goes to {eval_dir(config)}), or stop it with Ctrl-C where it runs; nothing was changed"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def eval_dir(config: Config) -> Path:
    """Where `toolkit eval` writes its report (runs/<name>/eval/) and `toolkit register` looks for it."""
    from toolkit.config.targets import run_home

    return run_home(config.name) / "eval"


def scored_model(config: Config, model_dir: Path, training_job: str | None = None) -> dict[str, Any]:
    """Which trained model a report scores: its directory and the digest of its run.json (the same bytes whether
    the run is local or a training job's model downloaded from S3), so `toolkit register` can tell whether the
    report belongs to the job it registers."""
    from toolkit import digest

    record = model_dir / RUN_RECORD
    return {
        "config": config.name,
        "model": str(model_dir),
        "run_digest": digest.of_files(record) if record.is_file() else None,
        "training_job": training_job,
    }


OnRow = Callable[[str, Any, int], None]  # a model's label, the row it finished (Generated, ScoredPair), the row count


def _labelled(on_row: OnRow | None, label: str) -> Callable[[Generated, int], None] | None:
    return None if on_row is None else lambda generated, total: on_row(label, generated, total)


Ask = Callable[[Any, Callable[[Any, int], None] | None], list[Any]]  # one served model's client -> its rows' results


def evaluate_local(
    config: Config,
    model_dir: Path | None = None,
    limit: int | None = None,
    max_tokens: int = 256,
    concurrency: int = 4,
    on_row: OnRow | None = None,
    on_status: Callable[[str], None] | None = None,
    tasks: list[str] | None = None,
    ask: Ask | None = None,
) -> list[ModelResult]:
    """Serve the base and the fine-tuned model with vLLM on this machine, one after the other, and generate on the
    held-out rows; with `ask`, ask each model that instead (a DPO run's pairs: toolkit/evaluate/preference.py). With
    `tasks`, run those lm-evaluation-harness tasks against each server too (names checked first)."""
    from toolkit.deploy.client import ChatClient

    if ask is None:
        rows = eval_rows(config, limit)  # checked before any server starts

        def ask(client: Any, heard: Callable[[Any, int], None] | None) -> list[Any]:
            return generate(client, rows, max_tokens, concurrency, heard)

    manager = None
    if tasks:
        from toolkit.evaluate import benchmarks

        manager = benchmarks.task_manager(tasks)  # an unknown name stops here, before any server starts
    results = []
    served = served_models(config, model_dir)
    if config.serving.eval_port:  # a taken port is said before anything says it starts
        from toolkit.deploy.local import refuse_busy_port

        refuse_busy_port(config.serving.eval_port, "serving.eval_port")
    for label, directory in served:
        log = eval_dir(config) / f"serve-{label}.log"
        if on_status:
            on_status(f"starting vLLM for the {label} model ({directory})")
        with _local_server(config, directory, log) as url:
            client = ChatClient.for_url(url, config.name)
            started = time.monotonic()
            answers = ask(client, _labelled(on_row, label))
            result = ModelResult(label, str(directory), answers, round(time.monotonic() - started, 2))
            if tasks:
                if on_status:
                    on_status(f"lm-evaluation-harness: {', '.join(tasks)} on the {label} model")
                started = time.monotonic()
                arguments = benchmarks.harness_arguments(url, config.name, tasks, limit, concurrency, max_tokens)
                result.benchmarks = benchmarks.run(manager, arguments)
                result.benchmark_seconds = round(time.monotonic() - started, 2)
            results.append(result)
    return results


SERVING = "serving"  # the baseline's label when it is what the config's endpoint serves now


def endpoint_model(config: Config, name: str, sagemaker: Any) -> dict[str, Any]:
    """Which trained model an endpoint serves (`scored_model`'s shape): the registered version's training job
    (a model made from a package), or the job whose model prefix (<output>/<job>/output/model/) it serves."""
    endpoint = sagemaker.describe_endpoint(EndpointName=name)
    variant = sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])[
        "ProductionVariants"
    ][0]
    container = sagemaker.describe_model(ModelName=variant["ModelName"])["PrimaryContainer"]
    package = container.get("ModelPackageName")
    if package:
        served = package
        metadata = sagemaker.describe_model_package(ModelPackageName=package).get("CustomerMetadataProperties", {})
        job = metadata.get("training_job")
    else:
        served = container.get("ModelDataSource", {}).get("S3DataSource", {}).get("S3Uri") or container.get(
            "ModelDataUrl", ""
        )
        found = re.search(r"/([^/]+)/output/model", served)
        job = found.group(1) if found else None
    return {"config": config.name, "model": f"endpoint {name} ({served})", "run_digest": None, "training_job": job}


def evaluate_endpoints(
    config: Config,
    candidate: str,
    limit: int | None = None,
    max_tokens: int = 256,
    concurrency: int = 4,
    on_row: OnRow | None = None,
    on_status: Callable[[str], None] | None = None,
) -> tuple[list[ModelResult], dict[str, Any]]:
    """Generate through SageMaker (sagemaker-runtime InvokeEndpoint, the OpenAI chat body): the baseline is what the
    config's endpoint serves now, the candidate what endpoint `candidate` serves (e.g. a staging endpoint deployed
    with `--model-package N --allow-unapproved`). Returns the results and which model the candidate is."""
    from toolkit import aws
    from toolkit.deploy.client import ChatClient
    from toolkit.deploy.endpoint import endpoint_name

    if config.serving.weights == "adapter":
        raise EvalInputError("--target endpoint: serving.weights: adapter is not evaluated through endpoints yet")
    rows = eval_rows(config, limit)
    sagemaker, runtime = aws.client(config.aws, "sagemaker"), aws.client(config.aws, "sagemaker-runtime")
    serving = endpoint_name(config)
    for name in (serving, candidate):
        status = _endpoint_status(sagemaker, name)
        if status != "InService":
            raise EvalInputError(f"endpoint {name} is {status or 'not there'}: eval needs both endpoints InService")
    scored = endpoint_model(config, candidate, sagemaker)
    results = []
    for label, name in ((SERVING, serving), ("fine-tuned", candidate)):
        if on_status:
            on_status(f"generating through endpoint {name} ({label})")
        client = ChatClient.for_endpoint(name, runtime, config.name)
        started = time.monotonic()
        generated = generate(client, rows, max_tokens, concurrency, _labelled(on_row, label))
        results.append(ModelResult(label, f"endpoint {name}", generated, round(time.monotonic() - started, 2)))
    return results, scored


def _endpoint_status(sagemaker: Any, name: str) -> str | None:
    from botocore.exceptions import ClientError

    from toolkit import aws

    try:
        return sagemaker.describe_endpoint(EndpointName=name)["EndpointStatus"]
    except ClientError as exc:
        if aws.is_missing(exc):
            return None
        raise
