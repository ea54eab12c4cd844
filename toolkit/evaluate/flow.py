"""`toolkit eval`'s flow (sdk.evaluate is its front door): which model is scored against which, on which rows,
through which servers; the report written and judged by the registry's gate. The scoring itself is this package's
(scoring.py, preference.py, report.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toolkit_train.layout import RunRecord

from toolkit.config import Config
from toolkit.targets.base import get_target


def evaluate(
    cfg: Config,
    target: str = "local",
    model_dir: str | Path | None = None,
    limit: int | None = None,
    max_tokens: int = 256,
    concurrency: int = 4,
    on_row: Callable[[str, Any, int], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    candidate_endpoint: str | None = None,
    tasks: str | Sequence[str] | None = None,
) -> dict[str, Any]:
    """sdk.evaluate on a loaded config (its docstring says what each argument does)."""
    from toolkit.deploy import DeployInputError
    from toolkit.deploy.local import model_dir as trained_dir
    from toolkit.evaluate import EvalInputError, as_trained, only_eval_of_its_run, require_held_out

    pairs = cfg.training.method_record.pairs  # held-out pairs, scored by likelihood (toolkit/evaluate/preference.py)
    if pairs and target == "endpoint":
        raise EvalInputError(
            "--target endpoint: scoring a preference-tuned run's held-out pairs through SageMaker endpoints is not "
            "built yet: use --target local (the base and the fine-tuned model served with vLLM here)"
        )
    run = None
    scored_run = None  # the remote run whose model this evaluation fetched
    if target == "local" and model_dir is None and not get_target(cfg.target).model_is_here:
        scored_run, model_dir = _fetched_run(cfg, on_status)
    if target == "local":  # the trained run's own held-out rows (its run.json), whatever this command's flags say
        with contextlib.suppress(DeployInputError):  # no trained model: said below, after what data.eval needs
            run = RunRecord.read(trained_dir(cfg, model_dir))
        cfg, note = as_trained(cfg, run)
        if note and on_status:
            on_status(note)
    require_held_out(cfg)
    if on_status and (unscored := unscored_rewards(cfg)):
        on_status(f"training.grpo.rewards {', '.join(unscored)}: toolkit eval does not score a user's reward (not "
                  "built); the report has the built-in metrics")  # fmt: skip
    if target == "endpoint" and not candidate_endpoint:
        raise EvalInputError("--target endpoint: name the endpoint serving the candidate (--candidate-endpoint)")
    if target not in ("local", "endpoint"):
        raise EvalInputError(f"--target {target}: toolkit eval generates through local or endpoint")
    with only_eval_of_its_run(cfg):  # a second eval of this run is refused before it clears the first's report
        return _evaluate(cfg, target, run, scored_run, model_dir, candidate_endpoint, limit, max_tokens, concurrency,
                         tasks, on_row, on_status)  # fmt: skip


def _evaluate(cfg: Config, target: str, run: RunRecord | None, scored_run: str | None,
              model_dir: str | Path | None, candidate_endpoint: str | None, limit: int | None, max_tokens: int,
              concurrency: int, tasks: Any, on_row: Any, on_status: Any) -> dict[str, Any]:  # fmt: skip
    """`evaluate` once its inputs are checked and the run's eval lock is held."""
    from toolkit.deploy.local import model_dir as trained_dir
    from toolkit.evaluate import SERVING, eval_dir, evaluate_endpoints, evaluate_local, scored_model
    from toolkit.evaluate.benchmarks import parse_tasks
    from toolkit.evaluate.report import build, clear, generated_scoring, write
    from toolkit.evaluate.scoring import metrics_asked

    pairs = cfg.training.method_record.pairs
    if target == "endpoint":
        assert candidate_endpoint is not None
        clear(eval_dir(cfg))
        results, scored = evaluate_endpoints(cfg, candidate_endpoint, limit, max_tokens, concurrency, on_row,
                                             on_status)  # fmt: skip
        report = build(results, baseline=SERVING, scored_model=scored, scoring=generated_scoring(metrics_asked(cfg)))
        _judge_by_gate(cfg, report)
        return {**report, "written": write(report, eval_dir(cfg))}
    directory = trained_dir(cfg, model_dir)
    names = parse_tasks(tasks if isinstance(tasks, str) or tasks is None else list(tasks))
    clear(eval_dir(cfg))
    from toolkit.evaluate import preference  # a DPO run's held-out pairs; an SFT run's rows are generated on

    serve_and_ask, scoring = ((preference.evaluate_local, preference.SCORING) if pairs else
                              (evaluate_local, generated_scoring(metrics_asked(cfg))))  # fmt: skip
    results = serve_and_ask(cfg, directory, limit, max_tokens, concurrency, on_row, on_status, names)
    report = build(results, scored_model=scored_model(cfg, directory, scored_run), scoring=scoring)
    _judge_by_gate(cfg, report)
    written = write(report, eval_dir(cfg), run)  # adds the run's validation loss to the report
    return {**report, "written": written}


def unscored_rewards(cfg: Config) -> list[str]:
    """A GRPO config's user rewards (`file.py:function`): the eval scores the built-in ones, not these."""
    from toolkit_train.methods.rewards import BUILTIN_REWARDS

    from toolkit.evaluate.scoring import rewarded

    return [name for name in rewarded(cfg) if name not in BUILTIN_REWARDS]


def _fetched_run(cfg: Config, on_status: Callable[[str], None] | None) -> tuple[str, Path]:
    """The newest completed run of a config trained elsewhere (a training job, a cluster) and its model on this
    machine, fetched once by its target: (the run's name, the directory)."""
    from toolkit.evaluate import EvalInputError

    training = get_target(cfg.target)
    newest = training.latest(cfg)
    if newest is None:
        raise EvalInputError(f"no completed {cfg.target} run of {cfg.name} found: train it with `toolkit train "
                             f"{cfg.name} --target {cfg.target}` first, or pass --model-dir")  # fmt: skip
    directory = training.fetch(cfg, newest)
    if on_status:
        on_status(f"evaluating {cfg.target} run {newest.name} (its model: {directory})")
    return newest.name, directory


def _judge_by_gate(cfg: Config, report: dict[str, Any]) -> None:
    """With registry.gate declared, the report says what `toolkit register` would make of it (report["gate"]), so
    a CI job can read the verdict before registering anything."""
    from toolkit.evaluate.gate import judge

    if cfg.registry.gate is not None:
        verdict = judge(cfg.registry.gate, report)
        report["gate"] = {"status": verdict.status, "reason": verdict.reason}
