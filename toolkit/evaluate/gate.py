"""The promotion gate: `toolkit eval`'s report (runs/<name>/eval/report.json) judged by the config's
`registry.gate`, as the approval status of the model package `toolkit register` writes, with one line saying why.

Passes -> Approved; fails -> Rejected; no report -> PendingManualApproval (a person decides). A report scores one
trained model (`scored_model`: its run.json digest): attached to another job's package it would approve a model
nobody evaluated, so that is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.errors import BadInput
from toolkit.evaluate.scoring import FORMAT_VALID

if TYPE_CHECKING:
    from toolkit.config.models import GateSettings

APPROVED, REJECTED, PENDING = "Approved", "Rejected", "PendingManualApproval"


class ReportError(BadInput):
    """An eval report that cannot be read, or that scored another model than the one being registered."""


@dataclass
class Verdict:
    status: str  # the model package's ModelApprovalStatus
    reason: str  # one line: what the gate compared and how it came out


def load_report(path: Path, explicit: bool) -> dict[str, Any] | None:
    """The report at `path`; None when the default path has none (an explicit --report must exist)."""
    if not path.is_file():
        if explicit:
            raise ReportError(f"--report {path}: no such file: pass the report.json `toolkit eval` wrote")
        return None
    try:
        report = json.loads(path.read_text())
    except ValueError as exc:
        raise ReportError(f"{path}: not JSON ({exc}): write it again with toolkit eval") from None
    if not isinstance(report, dict) or not isinstance(report.get("metrics"), dict) or "candidate" not in report:
        raise ReportError(f"{path}: not an eval report (no metrics and candidate): write it with toolkit eval")
    return report


def check_scored(report: dict[str, Any], path: Path, job_name: str, job_run_digest: str | None) -> None:
    """The report must have scored this job's model: by the job's name, or by its run.json's digest."""
    scored = report.get("scored_model") or {}
    if scored.get("training_job") == job_name:
        return
    if job_run_digest and scored.get("run_digest") == job_run_digest:
        return
    what = scored.get("model") or "a model it does not name"
    theirs = scored.get("run_digest") or "none recorded"
    ours = job_run_digest or "not readable: the job wrote no uncompressed run.json"
    raise ReportError(
        f"{path} scored {what} (run.json digest {theirs}), not training job {job_name} (run.json digest {ours}): "
        "evaluate this job's model (toolkit eval CONFIG --model-dir DIR, DIR holding its run.json), or pass "
        "--report with that report"
    )


def judge(gate: GateSettings | None, report: dict[str, Any] | None) -> Verdict:
    """The approval status the gate gives the report, and why (one line)."""
    if report is None:
        return Verdict(PENDING, "no eval report: PendingManualApproval (run toolkit eval, then register again)")
    if gate is None:
        return Verdict(PENDING, "no gate declared (registry.gate): PendingManualApproval, the report is attached")
    base, tuned = report["baseline"], report["candidate"]
    metric = report["metrics"].get(gate.metric) or {}
    if metric.get("difference") is None:
        return Verdict(REJECTED, f"gate failed: the report scored no row on {gate.metric}")
    rows = metric["rows"]
    difference, margin = metric["difference"], gate.min_margin
    checks = [(difference >= margin, f"{gate.metric} {tuned} {metric[tuned]:.3f} vs {base} {metric[base]:.3f} "
               f"on {rows} rows: {difference:+.3f} {_vs(difference >= margin)} margin {margin:+.3f}")]  # fmt: skip
    if gate.require_ci:
        interval = metric.get("ci95")
        low = interval[0] if interval else None
        shown = "none (fewer than two rows)" if low is None else f"{low:+.3f}"
        # strictly above: an interval that reaches the margin (e.g. [+0.000, +0.000], nothing changed) does not rule
        # out that the fine-tune did no better than it
        above = low is not None and low > margin
        checks.append((above, f"95% CI lower bound {shown} {'>' if above else '<='} {margin:+.3f}"))
    if gate.min_format_valid is not None:
        scored = report.get("rows", {}).get(tuned, [])
        valid = sum(1 for row in scored if row.get(FORMAT_VALID) == 1)  # a row that failed to generate: not valid
        share = valid / len(scored) if scored else 0.0
        ok = share >= gate.min_format_valid
        checks.append((ok, f"format valid {valid}/{len(scored)} = {share:.2f} {_vs(ok)} {gate.min_format_valid:.2f}"))
    passed = all(ok for ok, _ in checks)
    return Verdict(APPROVED if passed else REJECTED, ("gate passed: " if passed else "gate failed: ")
                   + "; ".join(text for _, text in checks))  # fmt: skip


def _vs(ok: bool) -> str:
    return ">=" if ok else "<"


def key_numbers(report: dict[str, Any], gate: GateSettings | None) -> dict[str, str]:
    """The report's numbers a model package shows at a glance (CustomerMetadataProperties), most important first:
    the gate's metric, then the others; the whole report is attached as ModelMetrics."""
    base, tuned = report["baseline"], report["candidate"]
    names = list(report["metrics"])
    if gate is not None and gate.metric in names:
        names.remove(gate.metric)
        names.insert(0, gate.metric)
    numbers = {}
    for name in names:
        metric = report["metrics"][name]
        for label, value in ((tuned, metric.get(tuned)), (base, metric.get(base)),
                             ("difference", metric.get("difference"))):  # fmt: skip
            if value is not None:
                numbers[f"eval:{name}:{label}"] = f"{value:.4f}"
        if metric.get("ci95"):
            numbers[f"eval:{name}:ci95_low"] = f"{metric['ci95'][0]:.4f}"
            numbers[f"eval:{name}:ci95_high"] = f"{metric['ci95'][1]:.4f}"
        numbers[f"eval:{name}:rows"] = str(metric.get("rows", 0))
    return numbers
