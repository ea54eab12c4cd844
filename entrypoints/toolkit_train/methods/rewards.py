"""GRPO's rewards (training.method grpo): each scores every sampled reply of a prompt's group, 0..1 for the built-ins,
None where it does not apply to the row (TRL leaves those out of the mean).

Built-ins, by name (training.grpo.rewards):
- format_valid: the reply is a well-formed answer of the model's family: it ended by itself (its end-of-message
  token, not the length limit), has an answer, has its reasoning apart where the model writes reasoning, shows no
  raw special token and no runaway repetition; the eval's format_valid asks the same of a served reply.
- reasoning_language: the reasoning is written in the language the prompt asks for ("reasoning language: X" in the
  system prompt, or the row's `reasoning_language`): the seeds' skill, detected as `toolkit eval` detects it.
- exact_match: the answer equals the row's reference (`answer`, else the closing assistant reply), case and
  surrounding space aside.
- regex_match: the answer contains a match of the row's reference read as a regular expression.
A user's reward is `file.py:function`: a file in the data.source directory (uploaded with the data), loaded in the
job; called as TRL calls reward functions, with the answers as `completions` and each row's columns besides.

This module imports nothing heavy at the top: the settings (settings.py) read its names.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

BUILTIN_REWARDS = ("format_valid", "reasoning_language", "exact_match", "regex_match")
USER_REWARD = re.compile(r"(?!/)(?!.*\.\.)[\w./-]+\.py:[A-Za-z_]\w*")  # file.py:function, inside the data directory
REASONING_LANGUAGE = re.compile(r"reasoning language:\s*([^\n]+)", re.IGNORECASE)
HARMONY_TOKEN = re.compile(r"<\|[a-z_]+\|>")
_ANALYSIS = re.compile(r"<\|channel\|>analysis<\|message\|>(.*?)(?=<\|end\|>|<\|start\|>|<\|channel\|>|$)", re.S)
_FINAL = re.compile(r"<\|channel\|>final<\|message\|>(.*?)(?=<\|return\|>|<\|end\|>|$)", re.S)

Reward = Callable[..., list[float | None]]


class RewardError(RuntimeError):
    """A user's reward function that cannot be loaded or returns what GRPO cannot use."""


@dataclass(frozen=True)
class Reply:
    reasoning: str
    content: str
    finished: bool  # it ended with an end-of-message token (else the length limit cut it)
    leaked: bool = False  # raw markup in its reasoning or answer


def parse_reply(ids: Sequence[int], tokenizer: Any, harmony: bool, end_ids: Sequence[int]) -> Reply:
    """A sampled reply's reasoning and answer: gpt-oss's analysis and final channels (harmony), or a chat template's
    <think> block and what follows it."""
    finished = bool(ids) and int(ids[-1]) in set(end_ids)
    if harmony:
        text = tokenizer.decode(list(ids), skip_special_tokens=False)
        analysis, final = _ANALYSIS.search(text), _FINAL.search(text)
        reasoning = analysis.group(1) if analysis else ""
        content = final.group(1) if final else ""
        return Reply(reasoning, content, finished, bool(HARMONY_TOKEN.search(reasoning + content)))
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    reasoning, closed, content = text.partition("</think>")
    if not closed:
        reasoning, content = "", text
    reasoning = reasoning.replace("<think>", "").strip()
    return Reply(reasoning, content.strip(), finished, "<think>" in content or "</think>" in content)


@cache
def _detector() -> Any:
    from lingua import LanguageDetectorBuilder

    return LanguageDetectorBuilder.from_all_languages().build()  # models load lazily, per language met


def language_matches(text: str, wanted: str | None) -> float | None:
    """1.0 when `text` is in the language named `wanted` (an English name: French, German...), 0.0 otherwise; None
    where nothing is asked or the detector does not know the language (`toolkit eval`'s reasoning_language too)."""
    from lingua import Language

    if not wanted:
        return None
    try:
        language = Language.from_str(wanted.strip())
    except ValueError:
        return None
    found = _detector().detect_language_of(text) if text.strip() else None
    return float(found == language)


def asked_language(messages: Sequence[dict[str, Any]]) -> str | None:
    """The reasoning language a prompt's system (or developer) message asks for, if any."""
    system = " ".join(str(m.get("content") or "") for m in messages if m.get("role") in ("system", "developer"))
    found = REASONING_LANGUAGE.search(system)
    return found.group(1).strip() if found else None


REPEATED_NGRAM = 4  # a reply whose most frequent word 4-gram fills this share of it is a runaway repetition
RUNAWAY_SHARE = 0.3


def runaway(text: str) -> bool:
    """A runaway repetition (`toolkit eval`'s format check and the format_valid reward alike)."""
    words = text.split()
    if len(words) < 4 * REPEATED_NGRAM:
        return False
    grams = [tuple(words[i : i + REPEATED_NGRAM]) for i in range(len(words) - REPEATED_NGRAM + 1)]
    most = max(grams.count(g) for g in set(grams))
    return most * REPEATED_NGRAM / len(words) >= RUNAWAY_SHARE


def format_valid(reply: Reply, writes_reasoning: bool) -> float:
    answered = bool(reply.content.strip())
    reasoned = bool(reply.reasoning.strip()) or not writes_reasoning
    repeated = runaway(reply.reasoning) or runaway(reply.content)
    return float(reply.finished and answered and reasoned and not reply.leaked and not repeated)


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def exact_match(reply: Reply, reference: str | None) -> float | None:
    return None if not reference else float(_normalized(reply.content) == _normalized(reference))


def regex_match(reply: Reply, pattern: str | None) -> float | None:
    if not pattern:
        return None
    try:
        return float(re.search(pattern, reply.content) is not None)
    except re.error:
        return float(_normalized(pattern) in _normalized(reply.content))  # not a pattern: the text itself


def load_user_reward(name: str, data_dir: Path) -> Callable[..., Any]:
    """`file.py:function` from the data directory: RewardError, one line, when it is missing or not a function."""
    file_name, _, function = name.rpartition(":")
    path = (data_dir / file_name).resolve()
    if not path.is_file() or data_dir.resolve() not in path.parents:
        raise RewardError(f"training.grpo.rewards {name}: no file {file_name} in the data directory {data_dir}: put "
                          "it beside the data (it is uploaded with it)")  # fmt: skip
    spec = importlib.util.spec_from_file_location(f"toolkit_reward_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise RewardError(f"training.grpo.rewards {name}: importing {path} failed: "
                          f"{type(exc).__name__}: {exc}") from None  # fmt: skip
    found = getattr(module, function, None)
    if not callable(found):
        raise RewardError(f"training.grpo.rewards {name}: {path} defines no function {function!r}")
    return found


def _checked(name: str, scores: Any, count: int) -> list[float | None]:
    """A user function's scores: one finite number (or None) per reply, else RewardError naming it."""
    if not isinstance(scores, (list, tuple)) or len(scores) != count:
        got = f"{len(scores)} values" if isinstance(scores, (list, tuple)) else type(scores).__name__
        raise RewardError(f"training.grpo.rewards {name}: returned {got} for {count} replies: return a list of one "
                          "float (or None) per completion")  # fmt: skip
    out: list[float | None] = []
    for score in scores:
        if score is None:
            out.append(None)
        elif isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score):
            out.append(float(score))
        else:
            raise RewardError(f"training.grpo.rewards {name}: returned {score!r}, not a finite number or None")
    return out


def reward_functions(
    names: Sequence[str], data_dir: Path | None, tokenizer: Any, harmony: bool, end_ids: Sequence[int],
    writes_reasoning: bool,
) -> list[Reward]:  # fmt: skip
    """TRL reward functions for training.grpo.rewards, in order (their weights go to GRPOConfig.reward_weights).
    Each parses the sampled ids itself (TRL's decoded completions drop harmony's channel tokens)."""

    def replies(completion_ids: Sequence[Sequence[int]]) -> list[Reply]:
        return [parse_reply(ids, tokenizer, harmony, end_ids) for ids in completion_ids]

    def builtin(name: str) -> Reward:
        def score(prompts, completions, completion_ids, **columns) -> list[float | None]:
            parsed = replies(completion_ids)
            if name == "format_valid":
                return [format_valid(reply, writes_reasoning) for reply in parsed]
            if name == "reasoning_language":
                wanted = columns.get("reasoning_language") or [None] * len(parsed)
                return [language_matches(r.reasoning, w) for r, w in zip(parsed, wanted, strict=True)]
            reference = columns.get("answer") or [None] * len(parsed)
            match = exact_match if name == "exact_match" else regex_match
            return [match(r, a) for r, a in zip(parsed, reference, strict=True)]

        score.__name__ = name  # TRL logs rewards/<__name__>/mean
        return score

    def user(name: str) -> Reward:
        if data_dir is None:
            raise RewardError(f"training.grpo.rewards {name}: a user reward lives beside the data, and data.source "
                              "is no directory here (a bundled sample or a hub dataset)")  # fmt: skip
        function = load_user_reward(name, data_dir)

        def score(prompts, completions, completion_ids, **columns) -> list[float | None]:
            parsed = replies(completion_ids)
            answers = [reply.content for reply in parsed]
            reasoning = [reply.reasoning for reply in parsed]
            shown = {k: v for k, v in columns.items() if k not in ("trainer_state", "log_extra", "log_metric")}
            try:
                scores = function(prompts=prompts, completions=answers, reasoning=reasoning, **shown)
            except Exception as exc:
                raise RewardError(f"training.grpo.rewards {name} raised {type(exc).__name__}: {exc}") from exc
            return _checked(name, scores, len(parsed))

        score.__name__ = name.rpartition(":")[2]
        return score

    return [builtin(name) if name in BUILTIN_REWARDS else user(name) for name in names]
