"""`toolkit eval` on a preference-tuned run (training.method dpo): the held-out pairs scored by each served model.

- Pairs: the pairs data.eval holds out (entrypoints/data.split_rows, as for SFT rows), checked and rendered by
  training's own code (toolkit_train.data: `to_pair`, then the tokens DPO trains on): the prompt as vLLM renders the
  request (through `<|start|>assistant`), each reply's tokens after it (analysis and final channel, through
  `<|return|>`). They are rendered once, so both models score the same tokens.
- Scoring: one completion request per pair and model to the same vLLM server eval starts for SFT rows (SageMaker's
  /invocations route; vLLM takes a body without `messages` as a /v1/completions request): the two token-id prompts
  (the prompt followed by either reply), `prompt_logprobs: 0` (vLLM's extra: each prompt token's log-probability
  given the tokens before it: the model's raw log-probabilities, vLLM's default logprobs_mode) and one generated
  token, which is ignored. A reply's log-likelihood is the sum over its own tokens; nothing is generated or sampled,
  so the scores do not depend on temperature or max_tokens. They are the served model's, in the dtype it is served
  in (bfloat16 for the tiny model on CPU: within ~2 nats of float32 transformers per ~100-token reply).
- Per pair: preference_accuracy 1 when the chosen reply is the more likely one (strictly), else 0; the margin, the
  chosen reply's log-likelihood minus the rejected one's (nats, unbounded). A pair the server refuses (longer than
  serving.max_model_len, say) is counted and named, never fatal, as a row that fails to generate is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the module, not its function: evaluate_local is looked up at each call (a name bound here at import would keep
# whatever stood there then: a test's stand-in, in CI, once broke a later test on the same worker)
from toolkit import evaluate as local_eval
from toolkit.config import Config
from toolkit.config.metrics import EVAL_METRICS, PREFERENCE_ACCURACY
from toolkit.evaluate import OnRow, each_row, failure, held_out
from toolkit.evaluate.report import Scoring

MARGIN = "log_likelihood_margin"  # reported, not gated: nats, unbounded (the gate's metrics are 0..1: EVAL_METRICS)
DESCRIBES = {
    PREFERENCE_ACCURACY: EVAL_METRICS[PREFERENCE_ACCURACY],
    MARGIN: "mean log-likelihood of the chosen reply minus the rejected one's (nats, not 0..1)",
}


@dataclass
class PairRow:
    place: str  # where the pair came from ("pairs.jsonl line 7", or "held-out row 3")
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]


@dataclass
class ScoredPair:
    row: PairRow
    chosen: float | None = None  # log-likelihood of the chosen reply's tokens after the prompt (nats)
    rejected: float | None = None
    error: str | None = None  # why it was not scored (the server's reply, a timeout)


def pair_rows(config: Config, limit: int | None = None) -> list[PairRow]:
    """The pairs data.eval holds out, rendered as training renders them."""
    from toolkit_train.data import chat_format_of, to_conversation, tokenize_pairs
    from toolkit_train.families.formats import rendering
    from toolkit_train.run.model import load_tokenizer

    checked = held_out(
        config, lambda row: to_conversation(row, "preference", config.data.reasoning_effort, config.data.reasoning)
    )
    if limit:
        checked = checked[:limit]
    # the family's format (harmony, or the model's own chat template with its tokenizer); chat_format_of says why not
    found = rendering(config.model.family, lambda: load_tokenizer(config.model))
    chat_format, tokenizer = found if found is not None else (chat_format_of(config.model), None)
    # training's rendering: one date for every pair
    tokens = tokenize_pairs([pair for _, pair in checked], chat_format, tokenizer)
    columns = zip(tokens["prompt_ids"], tokens["chosen_ids"], tokens["rejected_ids"], strict=True)
    return [PairRow(where, *ids) for (where, _), ids in zip(checked, columns, strict=True)]


def reply_log_likelihoods(send: Callable[[dict], dict], model: str, row: PairRow) -> tuple[float, float]:
    """(chosen, rejected): each reply's summed log-probability after the prompt, from one completion request."""
    prompts = [row.prompt_ids + row.chosen_ids, row.prompt_ids + row.rejected_ids]
    body = {"model": model, "prompt": prompts, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    choices = sorted(send(body).get("choices") or [], key=lambda choice: choice.get("index", 0))
    if len(choices) != 2:
        raise ValueError(f"the server answered {len(choices)} choices for 2 prompts")
    return _summed(choices[0], prompts[0], len(row.prompt_ids)), _summed(choices[1], prompts[1], len(row.prompt_ids))


def _summed(choice: dict, ids: list[int], start: int) -> float:
    """The sum of the log-probabilities of ids[start:], each given the tokens before it (vLLM's prompt_logprobs:
    per position None for the first token, else {token id: {logprob, rank, decoded_token}} holding that token's)."""
    logprobs = choice.get("prompt_logprobs")
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        got = len(logprobs) if isinstance(logprobs, list) else "none"
        raise ValueError(f"prompt_logprobs has {got} positions for a prompt of {len(ids)} tokens")
    total = 0.0
    for position in range(start, len(ids)):
        entry = (logprobs[position] or {}).get(str(ids[position]))
        if entry is None:
            raise ValueError(f"prompt_logprobs has no log-probability for token {ids[position]} at {position}")
        total += float(entry["logprob"])
    return total


def score_pairs(
    client: Any,
    rows: list[PairRow],
    concurrency: int,
    on_row: Callable[[ScoredPair, int], None] | None = None,
) -> list[ScoredPair]:
    """Every pair through the server, `concurrency` requests at a time; failures are kept with their reason."""

    def one(row: PairRow) -> ScoredPair:
        try:
            chosen, rejected = reply_log_likelihoods(client.send, client.model, row)
        except Exception as exc:  # a pair that failed is counted and named in the report, not fatal
            return ScoredPair(row, error=failure(exc))
        return ScoredPair(row, chosen, rejected)

    return each_row(rows, one, concurrency, on_row)


def score(scored: ScoredPair) -> dict[str, float | None]:
    """The metrics of one pair; a pair that failed scores None everywhere (counted apart)."""
    if scored.error is not None or scored.chosen is None or scored.rejected is None:
        return dict.fromkeys(DESCRIBES)
    return {PREFERENCE_ACCURACY: float(scored.chosen > scored.rejected), MARGIN: scored.chosen - scored.rejected}


def details(scored: ScoredPair) -> dict[str, float | None]:
    """A pair's two log-likelihoods, kept beside its scores in the report's rows."""
    return {"chosen_log_likelihood": scored.chosen, "rejected_log_likelihood": scored.rejected}


def add_reward_accuracy(report: dict[str, Any]) -> None:
    """DPO's implicit reward accuracy with the base as the reference: the share of pairs (scored by both) on which
    the fine-tuned model's margin is above the base's, i.e. the fine-tune raised the chosen reply's log-likelihood
    more than the rejected one's (what TRL logs as rewards/accuracies, here on held-out pairs)."""
    rows = report["rows"]
    base, tuned = rows.get(report["baseline"]), rows.get(report["candidate"])
    if base is None or tuned is None:
        return
    both = [(b[MARGIN], c[MARGIN]) for b, c in zip(base, tuned, strict=True)
            if b[MARGIN] is not None and c[MARGIN] is not None]  # fmt: skip
    raised = sum(1 for b, c in both if c > b)
    report["reward_accuracy"] = {
        "describes": "the fine-tuned model's log-likelihood margin above the base's (DPO's implicit reward, the base "
        "as reference)",
        "pairs": len(both),
        "raised": raised,
        "share": raised / len(both) if both else None,
    }


# nothing is generated: there is no reply whose format to check
SCORING = Scoring(DESCRIBES, score, details, problems=lambda _: [], details=details, summarize=add_reward_accuracy)


def evaluate_local(
    config: Config,
    model_dir: Path | None = None,
    limit: int | None = None,
    max_tokens: int = 256,
    concurrency: int = 4,
    on_row: OnRow | None = None,
    on_status: Callable[[str], None] | None = None,
    tasks: list[str] | None = None,
) -> list[Any]:
    """The base and the fine-tuned model served with vLLM on this machine in turn, as for SFT rows
    (toolkit.evaluate.evaluate_local), each asked for the held-out pairs' likelihoods; with `tasks`,
    lm-evaluation-harness tasks too (`max_tokens` is theirs: scoring a pair generates nothing)."""
    rows = pair_rows(config, limit)  # checked before any server starts

    def ask(client: Any, heard: Callable[[ScoredPair, int], None] | None) -> list[ScoredPair]:
        return score_pairs(client, rows, concurrency, heard)

    return local_eval.evaluate_local(
        config, model_dir, limit, max_tokens, concurrency, on_row, on_status, tasks, ask=ask
    )
