"""Shared by the benchmarks: print a table and write the JSON result under bench/results/."""

from __future__ import annotations

import json
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def report(name: str, rows: list[dict], extra: dict | None = None) -> None:
    columns = list(rows[0]) if rows else []
    widths = [max(len(str(c)), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))
    RESULTS.mkdir(exist_ok=True)
    payload = {"benchmark": name, "machine": platform.node(), "rows": rows, **(extra or {})}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(f"-> {RESULTS / (name + '.json')}")
