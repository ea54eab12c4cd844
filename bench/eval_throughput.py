"""Speed of `toolkit eval`'s generation: held-out rows per second through one local vLLM server at a given
concurrency, against one request at a time (the baseline), in the same run.

One vLLM server, started as `toolkit eval` starts it (toolkit.evaluate._local_server: the serving container's entry
script) on the local training output. The rows are the config's held-out rows (data.eval), repeated to `--rows`
so every concurrency sees the same prompts; each pass runs toolkit.evaluate.generate, the function `toolkit eval`
calls, greedily with `--max-tokens`. Concurrencies are interleaved over `--rounds` so all see the same machine state.

Run (after `toolkit train tiny-gpt-oss-local --set data.eval.fraction=0.25`):
    python bench/eval_throughput.py [--config tiny-gpt-oss-local] [--rows 24] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common import report

from toolkit.config import load_config
from toolkit.deploy.client import ChatClient
from toolkit.deploy.local import model_dir
from toolkit.evaluate import _free_port, _local_server, eval_rows, generate

CONCURRENCIES = (1, 4, 8)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="tiny-gpt-oss-local")
    parser.add_argument("--set", action="append", default=["data.eval.fraction=0.25"], dest="overrides")
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    held = eval_rows(config)
    rows = (held * (args.rows // len(held) + 1))[: args.rows]
    rates: dict[int, list[float]] = {c: [] for c in CONCURRENCIES}
    failed: dict[int, int] = dict.fromkeys(CONCURRENCIES, 0)
    log = Path("runs") / config.name / "eval" / "bench-serve.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with _local_server(config, model_dir(config), _free_port(), log) as url:
        client = ChatClient.for_url(url, config.name)
        generate(client, rows[:4], args.max_tokens, 4)  # warm-up
        for _ in range(args.rounds):
            for concurrency in CONCURRENCIES:
                start = time.perf_counter()
                generated = generate(client, rows, args.max_tokens, concurrency)
                rates[concurrency].append(len(rows) / (time.perf_counter() - start))
                failed[concurrency] += sum(g.error is not None for g in generated)
    baseline = statistics.mean(rates[1])
    table = [
        {"concurrency": c, "rows_per_s": round(statistics.mean(rates[c]), 3),
         "vs_one_at_a_time": f"{statistics.mean(rates[c]) / baseline:.2f}x", "failed_rows": failed[c]}
        for c in CONCURRENCIES
    ]  # fmt: skip
    report("eval_throughput", table, {"rows": args.rows, "held_out_rows": len(held), "max_tokens": args.max_tokens,
                                      "rounds": args.rounds, "model": config.model.id})  # fmt: skip


if __name__ == "__main__":
    main()
