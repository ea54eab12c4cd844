"""The rows of the toolkit_numbers task (lm-evaluation-harness `custom_dataset`), read from the JSONL beside this
file so the task runs offline from any working directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROWS = Path(__file__).with_name("toolkit_numbers.jsonl")


def load(**_: Any) -> dict[str, Any]:
    import datasets

    rows = [json.loads(line) for line in ROWS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}
