"""bench/memory_peak.py's replay (docs/performance.md's 120b memory findings rest on it); recording needs CUDA, so the
allocator's trace here is written by hand in its format (torch.cuda.memory._snapshot()["device_traces"])."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from memory_peak import live_at_peak


def event(action: str, addr: int, size: int) -> dict:
    return {"action": action, "addr": addr, "size": size}


def test_reports_what_was_alive_at_the_highest_point_not_at_the_end():
    trace = [
        event("alloc", 1, 4_000_000_000),  # a layer's weights, freed before the end
        event("alloc", 2, 1_000_000_000),
        event("free_requested", 1, 4_000_000_000),  # not yet freed: still counts
        event("free_completed", 1, 4_000_000_000),
        event("free_completed", 99, 3_000_000_000),  # allocated before recording began
        event("alloc", 3, 2_000_000_000),
    ]
    report = live_at_peak(trace, before=60_000_000_000)
    assert report["peak_gb"] == 65.0  # 60 + 4 + 1 GB, before anything was freed
    rows = {row["allocated_at"]: row for row in report["rows"]}
    assert rows["4,000.0 MB each"]["tensors"] == 1 and rows["1,000.0 MB each"]["tensors"] == 1
    assert "2,000.0 MB each" not in rows  # allocated after the peak
    assert rows["before the step (weights, adapter, optimizer state, ...)"]["gb"] == 60.0
