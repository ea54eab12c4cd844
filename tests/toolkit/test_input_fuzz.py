"""A bounded fuzz over the config loader and the row validators (issue #67: no input file, `--set` value or data row
may make a command print a traceback). Seeded random mutations of valid inputs; the loader may only accept or raise
ConfigError (one line per problem, exit 2 through the CLI), a row check may only accept or raise ValueError (a bad
row, named with its line by `prepare`), reading a JSON Lines file only DataError or rows. Any other exception
escaping is a failure, shown with the input that caused it. Seeded: a failure reproduces; under 20 s on 2 cores."""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path

from tests.toolkit.test_applicability import _fields
from toolkit.config import Config, ConfigError, load_config
from toolkit.config.loader import read_source

SEED = 67
BUDGET_S = 20
TOKENS = [
    ".inf", "-.inf", ".nan", "-1", "0", "1e999", "~", "''", "' '", "[a]", "{[b]: 1}", "{a: 1}", "[[]]", "{}", "[]",
    "!!binary aGk=", "!!set {a}", "!!timestamp 2024-01-01", "&x 1", "*x", "*missing", "2024-01-01", "true", "\t",
    "\x00", "\x07", "é", "\ufeff", "\u2028", "${NOPE}", "${HOME:-x}", "hf_" + "a" * 34, "x" * 300, "s3://", "s3://b/",
    "builtin:x", "::", "- a", "{", "]", "? [x]\n: 1", "%TAG ! !x", "!!python/object/apply:os.system ['true']",
    "<<: *x", "---", "...", "|", ">-", "#", '"\\x"', "'", "0x1f", "0o7", "1_000", "+.5", "NaN", "null",
    "!!int x", "!!float y", "!!timestamp x", "!!str [a]",
]  # fmt: skip
VALUES = [None, 0, -1, 1.5, float("nan"), float("inf"), "", " ", "\n", "x", [], {}, [None], [[]], {"a": None},
          {"role": "user"}, {"role": "assistant", "content": " "}, {"role": "tool", "tool_call_id": "c"}, True,
          "a" * 50, {"type": "function", "function": {"name": 1}}, [{"id": "c", "function": {}}]]  # fmt: skip


def _mutate_text(rng: random.Random, text: str) -> bytes:
    lines = text.splitlines(keepends=True) or ["\n"]
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        i = rng.randrange(len(lines))
        if op == 0:  # a value replaced
            key = lines[i].split(":", 1)[0] if ":" in lines[i] else lines[i].rstrip("\n")
            lines[i] = f"{key}: {rng.choice(TOKENS)}\n"
        elif op == 1:  # a token inserted anywhere
            at = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:at] + rng.choice(TOKENS) + lines[i][at:]
        elif op == 2:
            lines.insert(i, lines[rng.randrange(len(lines))])  # a line written twice
        elif op == 3 and len(lines) > 1:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 4:
            lines[i] = "\t" + lines[i].lstrip(" ")
        elif op == 5:
            del lines[i]
            lines = lines or ["\n"]
        else:
            lines.insert(i, f"{rng.choice(TOKENS)}: {rng.choice(TOKENS)}\n")
    data = "".join(lines).encode("utf-8", errors="surrogatepass")
    if rng.random() < 0.2:  # a byte of another encoding, or another encoding altogether
        at = rng.randrange(len(data) + 1)
        data = data[:at] + bytes([rng.randrange(128, 256)]) + data[at:]
    if rng.random() < 0.05:
        data = "".join(lines).encode(rng.choice(["utf-16", "utf-16-le", "utf-32", "latin-1"]), errors="replace")
    return data


def _loads(source, overrides=()) -> str:
    try:
        load_config(source, list(overrides))
        return "ok"
    except ConfigError as exc:
        assert str(exc).strip(), "an empty message"
        return "refused"


def _row_samples() -> dict[str, list[dict]]:
    from toolkit_train.data import SAMPLE_PATH

    def first(name: str, count: int = 2) -> list[dict]:
        lines = (SAMPLE_PATH.parent / name).read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()][:count]

    return {"multilingual-thinking": first("multilingual-thinking.jsonl"), "messages": first("tool-calling.jsonl"),
            "preference": first("preference.jsonl")}  # fmt: skip


def _nodes(node, path=()):
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _nodes(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _nodes(value, (*path, index))


def _mutate_row(rng: random.Random, row: dict) -> dict:
    row = copy.deepcopy(row)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(list(_nodes(row)))
        if not path:
            continue
        *parents, last = path
        parent = row
        for step in parents:
            parent = parent[step]
        op = rng.randrange(3)
        if op == 0:
            parent[last] = copy.deepcopy(rng.choice(VALUES))
        elif op == 1:
            del parent[last]
        elif isinstance(parent, dict):
            parent[rng.choice(["role", "content", "tool_calls", "reasoning", "tools", "chosen", "messages", "x"])] = (
                copy.deepcopy(rng.choice(VALUES))
            )
    return row


def test_the_loader_and_the_row_checks_raise_only_their_own_errors(tmp_path: Path):
    from toolkit_train.data import FORMATS, DataError, read_json_rows, to_conversation

    rng = random.Random(SEED)
    start = time.monotonic()
    outcomes: dict[str, int] = {}

    def count(kind: str) -> None:
        outcomes[kind] = outcomes.get(kind, 0) + 1

    # 1. config files: a preset's text mutated (values, tokens, tabs, duplicate and swapped lines, bytes)
    text = read_source("tiny-gpt-oss-local")[1]
    for n in range(400):
        data = _mutate_text(rng, text)
        (tmp_path / "job.yaml").write_bytes(data)
        try:
            count(_loads(tmp_path / "job.yaml"))
        except Exception as exc:
            raise AssertionError(f"file mutation {n}: {type(exc).__name__}: {exc}\n{data!r}") from exc

    # 2. --set values: every setting's path (and broken paths) with odd YAML values
    paths = [path for path, _, _ in _fields(Config)] + ["", ".", "lora..r", "lora.r.x", "serving.vllm_args.x", "base"]
    for n in range(400):
        item = f"{rng.choice(paths)}={rng.choice(TOKENS)}"
        if rng.random() < 0.3:
            item = f"{rng.choice(paths)}={{{rng.choice(TOKENS)}: {rng.choice(TOKENS)}}}"
        try:
            count(_loads("tiny-gpt-oss-local", [item]))
        except Exception as exc:
            raise AssertionError(f"--set mutation {n}: {type(exc).__name__}: {exc}\n{item!r}") from exc

    # 3. rows: valid rows of each format with values replaced, keys deleted or added, read as every format
    samples = _row_samples()
    for n in range(1000):
        row = _mutate_row(rng, rng.choice(samples[rng.choice(list(samples))]))
        for fmt in FORMATS:
            try:
                to_conversation(row, fmt)
                count("row ok")
            except ValueError:
                count("row refused")
            except Exception as exc:
                raise AssertionError(f"row mutation {n} as {fmt}: {type(exc).__name__}: {exc}\n{row!r}") from exc

    # 4. JSON Lines files: a row's line with bytes changed
    for n in range(150):
        line = bytearray(json.dumps(rng.choice(samples["messages"])).encode())
        for _ in range(rng.randint(1, 4)):
            line[rng.randrange(len(line))] = rng.randrange(256)
        (tmp_path / "rows.jsonl").write_bytes(bytes(line) + b"\n")
        try:
            for row in read_json_rows(tmp_path / "rows.jsonl", [tmp_path / "rows.jsonl"]):
                to_conversation(row, "messages")
        except (DataError, ValueError):
            count("line refused")
        except Exception as exc:
            raise AssertionError(f"line mutation {n}: {type(exc).__name__}: {exc}\n{bytes(line)!r}") from exc

    elapsed = time.monotonic() - start
    assert outcomes.get("refused", 0) > 100 and outcomes.get("ok", 0) > 10, outcomes  # the mutations reach both ways
    assert outcomes.get("row refused", 0) > 100 and outcomes.get("row ok", 0) > 10, outcomes
    assert elapsed < BUDGET_S, f"the fuzz took {elapsed:.1f} s, over its {BUDGET_S} s budget"
