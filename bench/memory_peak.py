"""What is alive at a training step's memory peak, by where it was allocated.

`python bench/train_throughput.py --variants 120b-mxfp4-8k-gc --memory-peak` records the CUDA allocator's events
during the last step (torch.cuda.memory._record_memory_history), replays them to the moment the most memory was
allocated, and reports the tensors alive then grouped by size (shapes tell them apart: one 120b layer's
dequantized gate_up is 4.25 GB, its down 2.12 GB), plus what was already allocated when the step began (weights,
adapter, optimizer state) as one row. Without stacks: recording Python stacks made the loss's cross_entropy fail
(torch 2.11, "returned NULL without setting an exception").
"""

from __future__ import annotations

from collections import defaultdict

import torch

MAX_EVENTS = 1_000_000


def start() -> int:
    """Begin recording; returns the bytes allocated before it (not in the trace)."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=MAX_EVENTS, context=None)
    return torch.cuda.memory_allocated()


def stop(before: int, top: int = 12) -> dict:
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    return live_at_peak(trace, before, top)


def live_at_peak(trace: list[dict], before: int, top: int = 12) -> dict:
    """Replays alloc / free_completed events from `before` bytes; the blocks alive at the highest point, grouped."""
    total, peak, peak_index = before, before, -1
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            total += event["size"]
        elif event["action"] == "free_completed":
            total -= event["size"]
        if total > peak:
            peak, peak_index = total, index
    live: dict[int, dict] = {}
    for event in trace[: peak_index + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)  # a block from before the step is freed: it leaves `before`
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in live.values():
        group = groups[f"{event['size'] / 1e6:,.1f} MB each"]
        group[0] += event["size"]
        group[1] += 1
    in_step = sum(size for size, _ in groups.values())
    rows = [{"allocated_at": "before the step (weights, adapter, optimizer state, ...)", "gb": (peak - in_step) / 1e9,
             "tensors": ""}]  # fmt: skip
    ranked = sorted(groups.items(), key=lambda item: -item[1][0])
    rows += [{"allocated_at": key, "gb": size / 1e9, "tensors": count} for key, (size, count) in ranked[:top]]
    rest = sum(size for _, (size, _) in ranked[top:])
    rows.append({"allocated_at": "(the rest)", "gb": rest / 1e9, "tensors": sum(c for _, (_, c) in ranked[top:])})
    for row in rows:
        row["gb"] = round(row["gb"], 2)
    return {"peak_gb": round(peak / 1e9, 2), "events": len(trace), "rows": rows}
