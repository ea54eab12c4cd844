"""Standard benchmarks: lm-evaluation-harness tasks run against the served model's OpenAI-compatible chat route.

`toolkit eval CONFIG --tasks NAME[,NAME]` runs the named tasks against the same local vLLM server the held-out
eval starts, once for the base and once for the fine-tuned model, and the report gets a section per task.

- Harness: `lm_eval` (the `eval` extra pins its version: LM_EVAL_VERSION), imported only when tasks are asked
  for. Its `local-chat-completions` model posts each prompt as chat messages (`apply_chat_template`) to
  `<server>/v1/chat/completions`, so the server's own chat template (harmony, for gpt-oss) renders it and the
  harness scores the reply's `content`: the final channel, the reasoning apart.
- Tasks: the harness's own (offline only if their data sets are on this machine) and the toolkit's, under
  BUNDLED_TASKS (`include_path`); `toolkit_numbers` is a small one written for the project. Names are checked
  before any server starts: the toolkit's directory first (quick), the harness's whole index only for names it
  does not hold.
- Paired: the harness logs every sample; the report pairs base and fine-tuned per document and bootstraps the
  mean difference, as for the held-out rows.
"""

from __future__ import annotations

import logging
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.errors import Failed
from toolkit.evaluate import EvalInputError
from toolkit.evaluate.intervals import bootstrap_interval
from toolkit.resources import HERE as RESOURCES

LM_EVAL_VERSION = "0.4.13"  # the `eval` extra pins lm_eval[api] to this one (tests/toolkit/test_benchmarks.py)
BUNDLED_TASKS = RESOURCES / "lm_eval_tasks"
MODEL_TYPE = "local-chat-completions"


class BenchmarkInputError(EvalInputError):
    """A task name the harness does not know, or no harness installed."""


class BenchmarkFailed(Failed):
    """The harness ran but could not evaluate (a task's data set missing offline, the server gone)."""


@dataclass
class TaskResult:
    task: str
    metrics: dict[str, float]  # "exact_match,first-number" -> value (the harness's keys: metric,filter)
    stderr: dict[str, float]
    rows: int
    per_doc: dict[str, dict[int, float]] = field(default_factory=dict)  # metric key -> doc id -> score
    samples: list[dict[str, Any]] = field(default_factory=list)  # the first replies, for the report


def parse_tasks(value: str | list[str] | None) -> list[str]:
    """ "a,b" (or a list of such) -> ["a", "b"]; duplicates dropped, order kept."""
    if not value:
        return []
    parts = value if isinstance(value, list) else [value]
    names = [name.strip() for part in parts for name in part.split(",") if name.strip()]
    return list(dict.fromkeys(names))


def _harness() -> Any:
    try:
        import lm_eval
    except ImportError:
        raise BenchmarkInputError(
            f"--tasks: lm-evaluation-harness is not installed: pip install 'lm_eval[api]=={LM_EVAL_VERSION}' "
            "(the toolkit's eval extra: pip install -e '.[eval]')"
        ) from None
    return lm_eval


def task_manager(tasks: list[str], include: list[Path] | None = None) -> Any:
    """A harness TaskManager that knows every name in `tasks`, or one line naming those that do not exist.

    The bundled directory is indexed first (a second); the harness's own index (thousands of task files, ~20 s
    here) only when a name is not found there."""
    _harness()
    from lm_eval.tasks import TaskManager

    paths = [str(p) for p in [BUNDLED_TASKS, *(include or [])]]
    with _quiet():
        manager = TaskManager(include_path=paths, include_defaults=False)
        if set(manager.match_tasks(tasks)) != set(tasks):
            manager = TaskManager(include_path=paths)
    unknown = [name for name in tasks if name not in set(manager.match_tasks(tasks))]
    if unknown:
        bundled = ", ".join(sorted(p.name for p in BUNDLED_TASKS.iterdir() if p.is_dir()))
        raise BenchmarkInputError(
            f"--tasks: no lm-evaluation-harness task named {', '.join(unknown)}: the toolkit bundles {bundled}; "
            "`python -m lm_eval ls tasks` lists the harness's own"
        )
    return manager


def harness_arguments(
    url: str, model: str, tasks: list[str], limit: int | None, concurrency: int, max_tokens: int
) -> dict[str, Any]:
    """lm_eval.simple_evaluate's arguments (all but the task manager) for the server at `url` serving `model`."""
    return {
        "model": MODEL_TYPE,
        "model_args": {
            "base_url": url.rstrip("/") + "/v1/chat/completions",
            "model": model,  # the server's served model name
            "num_concurrent": concurrency,
            "max_retries": 2,
            "tokenizer_backend": None,  # the server applies the chat template; nothing is tokenised here
            "tokenized_requests": False,
            "max_gen_toks": max_tokens,
            "timeout": 300,
        },
        "tasks": tasks,
        "apply_chat_template": True,  # prompts go as chat messages, the model's own template renders them
        "num_fewshot": None,  # each task's own
        "limit": limit,
        "log_samples": True,  # per-document scores: the paired difference in the report
        "bootstrap_iters": 1000,
        "gen_kwargs": {"max_gen_toks": max_tokens},
    }


@contextmanager
def _quiet():
    """The harness logs every step at INFO and warns about normal things (no tokenizer, a custom data set)."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def run(manager: Any, arguments: dict[str, Any]) -> list[TaskResult]:
    """Run the tasks through the harness against the server; one TaskResult per task."""
    lm_eval = _harness()
    try:
        with _quiet():
            results = lm_eval.simple_evaluate(**arguments, task_manager=manager)
    except Exception as exc:  # the harness raises whatever its data loaders or HTTP client raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise BenchmarkFailed(f"lm-evaluation-harness failed on {', '.join(arguments['tasks'])}: "
                              f"{type(exc).__name__}: {first}") from None  # fmt: skip
    if results is None:
        raise BenchmarkFailed("lm-evaluation-harness returned no results")
    return summarise(results)


def summarise(results: dict[str, Any]) -> list[TaskResult]:
    """The harness's results dict -> one TaskResult per task (metric keys as the harness writes them)."""
    out = []
    for task, values in results["results"].items():
        metrics = {k: float(v) for k, v in values.items() if "," in k and "_stderr," not in k and _number(v)}
        stderr = {k.replace("_stderr,", ","): float(v) for k, v in values.items() if "_stderr," in k and _number(v)}
        samples = results.get("samples", {}).get(task, [])
        per_doc: dict[str, dict[int, float]] = {}
        for sample in samples:
            for metric in sample.get("metrics", []):
                if _number(sample.get(metric)):
                    per_doc.setdefault(f"{metric},{sample['filter']}", {})[sample["doc_id"]] = float(sample[metric])
        rows = results.get("n-samples", {}).get(task, {}).get("effective", len({s["doc_id"] for s in samples}))
        shown = [{"doc": s["doc_id"], "target": s["target"], "reply": _first_reply(s)[:300],
                  "scored": str(s["filtered_resps"][0])[:60]} for s in samples[:3]]  # fmt: skip
        out.append(TaskResult(task, metrics, stderr, int(rows), per_doc, shown))
    return out


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value  # not NaN


def _first_reply(sample: dict[str, Any]) -> str:
    resps = sample.get("resps") or [[""]]
    first = resps[0][0] if resps[0] else ""
    return first if isinstance(first, str) else str(first)


def compare(by_model: dict[str, list[TaskResult]], baseline: str, candidate: str) -> dict[str, Any]:
    """Per task and metric: both models' scores, the paired per-document difference and its bootstrap CI."""
    tasks: dict[str, Any] = {}
    base = {r.task: r for r in by_model.get(baseline, [])}
    tuned = {r.task: r for r in by_model.get(candidate, [])}
    for name in dict.fromkeys([*base, *tuned]):
        b, c = base.get(name), tuned.get(name)
        metrics = {}
        for key in dict.fromkeys([*(b.metrics if b else {}), *(c.metrics if c else {})]):
            docs_b = b.per_doc.get(key, {}) if b else {}
            docs_c = c.per_doc.get(key, {}) if c else {}
            differences = [docs_c[d] - docs_b[d] for d in sorted(docs_b.keys() & docs_c.keys())]
            interval = bootstrap_interval(differences)
            metrics[key] = {
                baseline: b.metrics.get(key) if b else None,
                candidate: c.metrics.get(key) if c else None,
                f"{baseline}_stderr": b.stderr.get(key) if b else None,
                f"{candidate}_stderr": c.stderr.get(key) if c else None,
                "paired_rows": len(differences),
                "difference": statistics.fmean(differences) if differences else None,
                "ci95": list(interval) if interval else None,
            }
        tasks[name] = {
            "rows": {label: r.rows for label, r in ((baseline, b), (candidate, c)) if r is not None},
            "metrics": metrics,
            "samples": {label: r.samples for label, r in ((baseline, b), (candidate, c)) if r is not None},
        }
    return tasks
