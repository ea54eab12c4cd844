"""Latency and throughput added by the toolkit's serving layer, against vLLM's own OpenAI route on the same server.

One vLLM server, started through the toolkit's entry script (containers/serving/serve.py) on the local training
output. Baseline: raw HTTP POSTs to vLLM's `/v1/chat/completions`. Toolkit: the toolkit's chat client posting to
the SageMaker hosting route `/invocations` (what an endpoint receives). Same body, interleaved in rounds so
both see the same machine state; p50/p99 latency and requests/s at 1, 8 and 32 concurrent requests.

Run (after `bash scripts/demo.sh` or `toolkit train tiny-gpt-oss-local`):
    python bench/serving_latency.py [--config tiny-gpt-oss-local] [--requests 64] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from common import report

from toolkit.config import load_config
from toolkit.deploy.client import ChatClient, messages_for
from toolkit.deploy.local import LocalServer, model_dir

MESSAGES = messages_for("Wie viele Planeten hat unser Sonnensystem?", reasoning_language="French")


def raw_vllm(url: str, model: str, max_tokens: int):
    body = json.dumps({"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}).encode()

    def call() -> None:
        request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=300) as response:
            json.loads(response.read())

    return call


def toolkit_client(url: str, model: str, max_tokens: int):
    client = ChatClient.for_url(url, model)
    return lambda: client.chat(MESSAGES, max_tokens=max_tokens, temperature=0)


def measure(call, concurrency: int, requests: int) -> tuple[list[float], float]:
    def timed(_: int) -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(timed, range(requests)))
    return latencies, requests / (time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="tiny-gpt-oss-local")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    config = load_config(args.config)
    rows = []
    with LocalServer(config, model_dir(config), port=18080) as server:
        server.wait_ready(timeout=900)
        paths = {"vllm /v1/chat/completions": raw_vllm(server.url, config.name, args.max_tokens),
                 "toolkit client /invocations": toolkit_client(server.url, config.name, args.max_tokens)}  # fmt: skip
        for call in paths.values():  # warm-up
            measure(call, 4, 8)
        for concurrency in (1, 8, 32):
            samples: dict[str, list[float]] = {name: [] for name in paths}
            rates: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(args.rounds):
                for name, call in paths.items():
                    latencies, rate = measure(call, concurrency, args.requests)
                    samples[name] += latencies
                    rates[name].append(rate)
            base = "vllm /v1/chat/completions"
            for name in paths:
                p50, p99 = percentile(samples[name], 0.5), percentile(samples[name], 0.99)
                rows.append({
                    "concurrency": concurrency, "path": name, "p50_ms": round(p50 * 1000, 1),
                    "p99_ms": round(p99 * 1000, 1), "requests_per_s": round(statistics.mean(rates[name]), 2),
                    "p50_vs_vllm": f"{p50 / percentile(samples[base], 0.5):.3f}x",
                    "throughput_vs_vllm": f"{statistics.mean(rates[name]) / statistics.mean(rates[base]):.3f}x",
                })  # fmt: skip
    report("serving_latency", rows, {"requests": args.requests, "max_tokens": args.max_tokens,
                                     "rounds": args.rounds, "model": config.model.id})  # fmt: skip


if __name__ == "__main__":
    main()
