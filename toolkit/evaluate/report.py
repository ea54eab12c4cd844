"""The eval report: base vs fine-tuned per metric, paired difference with a bootstrap confidence interval, failed
rows named; written as report.json, report.md and PNG charts (matplotlib, imported only here)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.config.metrics import EVAL_METRICS, PREFERENCE_ACCURACY
from toolkit.evaluate.intervals import bootstrap_interval
from toolkit.evaluate.scoring import ALWAYS, Metric, format_problems, score

if TYPE_CHECKING:
    from toolkit_train.layout import RunRecord
from toolkit.files import write_atomically

REPORT_FILE = "report.json"  # what `toolkit register` reads (and attaches to the model package)


@dataclass(frozen=True)
class Scoring:
    """How a report reads one kind of answer: generated replies (a supervised fine-tune's held-out rows) or scored
    pairs (a preference-tuned run's: toolkit/evaluate/preference.py)."""

    describes: dict[str, str]  # metric -> what it measures
    score: Callable[[Any], dict[str, float | None]]  # one answer's metrics (None: not scored)
    sample: Callable[[Any], dict[str, Any]]  # what a model's first answers show
    problems: Callable[[Any], list[str]]  # what is wrong with an answer's format ([]: nothing, or nothing to check)
    details: Callable[[Any], dict[str, Any]] = lambda _: {}  # what each row keeps beside its scores
    summarize: Callable[[dict[str, Any]], None] | None = None  # adds its own sections to the built report


def _generated_sample(g: Any) -> dict[str, Any]:
    return {"reasoning": g.reasoning[:300], "answer": g.content[:300]}


def generated_scoring(metrics: tuple[Metric, ...] = ALWAYS) -> Scoring:
    """Generated replies scored on these metrics (scoring.metrics_asked: a config's)."""
    return Scoring({m.name: m.describes for m in metrics}, partial(score, metrics=metrics), _generated_sample,
                   format_problems)  # fmt: skip


GENERATED = generated_scoring()


def build(
    results: list[Any],
    baseline: str = "base",
    candidate: str = "fine-tuned",
    scored_model: dict[str, Any] | None = None,
    scoring: Scoring = GENERATED,
) -> dict[str, Any]:
    """The report as data: per model its per-row scores, per metric both means and the paired difference.
    `scored_model`: which trained model the candidate is (`toolkit.evaluate.scored_model`): `toolkit register` attaches
    the report only to that model's package."""
    by_label = {r.label: r for r in results}
    scored = {label: [scoring.score(g) for g in r.generated] for label, r in by_label.items()}
    models = {}
    for label, result in by_label.items():
        rows = len(result.generated)
        models[label] = {
            "served": result.served,
            "rows": rows,
            "failed": [{"row": g.row.place, "error": g.error} for g in result.generated if g.error is not None],
            "seconds": result.seconds,
            "rows_per_second": round(rows / result.seconds, 3) if result.seconds else None,
            "format_problems": {
                g.row.place: scoring.problems(g) for g in result.generated if g.error is None and scoring.problems(g)
            },
            "samples": [{"row": g.row.place, **scoring.sample(g)} for g in result.generated[:3]],
        }
    report = {"baseline": baseline, "candidate": candidate, "scored_model": scored_model,
              "metrics": compare(scoring.describes, scored, baseline, candidate), "models": models,
              "rows": {label: [{"row": g.row.place, **s, **scoring.details(g)}
                               for g, s in zip(by_label[label].generated, scored[label], strict=True)]
                       for label in by_label}}  # fmt: skip
    if any(getattr(r, "benchmarks", None) for r in results):  # lm-evaluation-harness tasks (--tasks)
        from toolkit.evaluate.benchmarks import compare as compare_tasks

        report["benchmarks"] = compare_tasks({r.label: r.benchmarks for r in results}, baseline, candidate)
        for label, result in by_label.items():
            models[label]["benchmark_seconds"] = result.benchmark_seconds
    if scoring.summarize:
        scoring.summarize(report)
    return report


def compare(
    describes: dict[str, str], scored: dict[str, list[dict[str, Any]]], baseline: str, candidate: str
) -> dict[str, dict[str, Any]]:
    """Per metric (name -> what it measures): both models' means over the rows both scored, the mean paired
    difference and its bootstrap interval."""
    metrics = {}
    for name, description in describes.items():
        pairs: list[tuple[float, float]] = [
            (b[name], c[name])
            for b, c in zip(scored.get(baseline, []), scored.get(candidate, []), strict=True)
            if b[name] is not None and c[name] is not None
        ]
        differences = [c - b for b, c in pairs]
        interval = bootstrap_interval(differences)
        metrics[name] = {
            "describes": description,
            "rows": len(pairs),
            baseline: statistics.fmean(b for b, _ in pairs) if pairs else None,
            candidate: statistics.fmean(c for _, c in pairs) if pairs else None,
            "difference": statistics.fmean(differences) if pairs else None,
            "ci95": list(interval) if interval else None,
        }
    return metrics


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown(report: dict[str, Any], validation: dict[str, float | None] | None = None) -> str:
    base, tuned = report["baseline"], report["candidate"]
    lines = [f"| metric | rows | {base} | {tuned} | difference | 95% CI (bootstrap) |", "|---|---|---|---|---|---|"]
    for name, m in report["metrics"].items():
        ci = f"[{m['ci95'][0]:+.3f}, {m['ci95'][1]:+.3f}]" if m["ci95"] else "-"
        diff = "-" if m["difference"] is None else f"{m['difference']:+.3f}"
        lines.append(f"| {name} | {m['rows']} | {_num(m[base])} | {_num(m[tuned])} | {diff} | {ci} |")
    after = (validation or {}).get("eval_loss")
    if validation and after is not None:  # lower is better; base: step 0 of training
        before = validation.get("base_eval_loss")
        diff = "-" if before is None else f"{after - before:+.3f}"
        loss = "validation DPO loss" if _is_preference(report) else "validation loss"
        lines.append(f"| {loss} (lower is better) | {validation.get('rows', '-')} | {_num(before)} | "
                     f"{after:.3f} | {diff} | - |")  # fmt: skip
    rewarded = report.get("reward_accuracy")
    if rewarded and rewarded["pairs"]:
        lines.append(f"\nreward accuracy (DPO's implicit reward, {base} as reference): the {tuned} model's margin is "
                     f"above the {base} model's on {rewarded['raised']} of {rewarded['pairs']} pairs")  # fmt: skip
    for task, section in (report.get("benchmarks") or {}).items():
        lines += _benchmark_table(task, section, base, tuned)
    for label, model in report["models"].items():
        if model["failed"]:
            names = ", ".join(f["row"] for f in model["failed"])
            what = "pairs failed to score" if _is_preference(report) else "rows failed to generate"
            lines.append(f"\n{label}: {len(model['failed'])} of {model['rows']} {what}: {names}")
    return "\n".join(lines) + "\n"


def _is_preference(report: dict[str, Any]) -> bool:
    """A report of held-out pairs (a preference-tuned run): its validation loss is training's DPO loss."""
    return PREFERENCE_ACCURACY in report["metrics"]


def _benchmark_table(task: str, section: dict[str, Any], base: str, tuned: str) -> list[str]:
    """One lm-evaluation-harness task: per metric (metric,filter as the harness names them) both models, their
    standard errors and the paired per-document difference."""
    rows = section["rows"]
    counts = " / ".join(f"{label} {n}" for label, n in rows.items())
    lines = [f"\nlm-evaluation-harness task {task} ({counts} rows):\n",
             f"| metric | {base} | {tuned} | difference | 95% CI (bootstrap) |", "|---|---|---|---|---|"]  # fmt: skip
    for name, m in section["metrics"].items():
        ci = f"[{m['ci95'][0]:+.3f}, {m['ci95'][1]:+.3f}]" if m["ci95"] else "-"
        diff = "-" if m["difference"] is None else f"{m['difference']:+.3f}"
        cells = [_with_stderr(m[base], m[f"{base}_stderr"]), _with_stderr(m[tuned], m[f"{tuned}_stderr"])]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {diff} | {ci} |")
    return lines


def _with_stderr(value: float | None, stderr: float | None) -> str:
    return _num(value) + (f" ± {stderr:.3f}" if value is not None and stderr is not None else "")


def write(report: dict[str, Any], out: Path, run: RunRecord | None = None) -> dict[str, str]:
    """report.json, report.md, metrics.png and (from the training run's log) loss.png; returns what was written."""
    out.mkdir(parents=True, exist_ok=True)
    validation = None
    if run is not None:
        validation = {
            "eval_loss": run.loss("eval_loss"),
            "base_eval_loss": base_eval_loss(run.log_history),
            "rows": run.held_out_rows,
        }
        report["validation"] = validation  # the returned report shows it too
    written = {"markdown": out / "report.md", "chart": out / "metrics.png"}
    write_atomically(written["markdown"], markdown(report, validation))
    _chart(report, written["chart"])
    if run is not None and run.log_history:
        written["curves"] = out / "loss.png"
        loss_curves(run.log_history, written["curves"])
    # report.json last and whole: its presence is what says "this evaluation finished" to `toolkit register`
    written["json"] = out / REPORT_FILE
    write_atomically(written["json"], json.dumps(report, indent=2, default=str))
    return {k: str(v) for k, v in written.items()}


def clear(out: Path) -> None:
    """Before an evaluation generates anything: the previous report goes, so an evaluation that fails or is
    interrupted leaves no report beside its own server logs that `toolkit register` would attach as current."""
    for name in (REPORT_FILE, "report.md", "metrics.png", "loss.png"):
        (out / name).unlink(missing_ok=True)


def base_eval_loss(log_history: list[dict[str, Any]]) -> float | None:
    """The validation loss training measured before its first step (eval_on_start): the base model's, since LoRA
    starts as the identity. None for a run that did not measure it."""
    return next((e["eval_loss"] for e in log_history if e.get("step") == 0 and "eval_loss" in e), None)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _chart(report: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    names = [name for name in report["metrics"] if name in EVAL_METRICS]  # the 0..1 ones (a DPO run's margin: nats)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.38
    for offset, label in ((-width / 2, report["baseline"]), (width / 2, report["candidate"])):
        values = [report["metrics"][n][label] or 0 for n in names]
        ax.bar([i + offset for i in range(len(names))], values, width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1)
    ax.set_title(f"held-out rows: {report['baseline']} vs {report['candidate']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def loss_curves(log_history: list[dict[str, Any]], path: Path) -> None:
    """Training loss and validation loss against the step, from the Trainer's log history (run.json)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("loss", "training loss"), ("eval_loss", "validation loss")):
        points = [(e["step"], e[key]) for e in log_history if key in e and "step" in e]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o" if key == "eval_loss" else None, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
