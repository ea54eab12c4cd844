"""`toolkit data prepare` throughput: validate + render harmony + tokenize a few thousand rows.

Baseline in the same run: TRL's own conversational tokenization of the same rows (apply_chat_template with
the assistant mask, one row at a time, as SFTTrainer does it). Run: python bench/data_prepare.py [rows]
"""

from __future__ import annotations

import sys
import time

from common import report
from toolkit_train.builtin.tiny_model import tiny_gpt_oss_path
from toolkit_train.data import load_rows, prepare, to_messages, training_chat_template
from toolkit_train.settings import SAMPLE_DATASET, DataSettings


def main(rows: int = 3000) -> None:
    import datasets
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt_oss_path())
    sample = load_rows(SAMPLE_DATASET)
    data = datasets.concatenate_datasets([sample] * (rows // len(sample) + 1)).select(range(rows))
    settings = DataSettings(source=SAMPLE_DATASET, max_length=2048)
    prepare(sample, tokenizer, settings)  # warm-up: imports (trl, torch) and template compilation

    start = time.perf_counter()
    out = prepare(data, tokenizer, settings)
    ours = time.perf_counter() - start
    tokens = sum(len(ids) for ids in out["input_ids"])

    template = training_chat_template(tokenizer)
    start = time.perf_counter()
    for row in data:
        tokenizer.apply_chat_template(
            to_messages(row, "multilingual-thinking"), chat_template=template, tokenize=True,
            return_dict=True, return_assistant_tokens_mask=True,
        )  # fmt: skip
    baseline = time.perf_counter() - start
    report(
        "data_prepare",
        [
            {
                "path": "toolkit prepare (validate+render+tokenize+mask)",
                "rows_per_s": round(rows / ours),
                "tokens_per_s": round(tokens / ours),
                "ratio": f"{baseline / ours:.2f}x",
            },
            {
                "path": "baseline: apply_chat_template per row",
                "rows_per_s": round(rows / baseline),
                "tokens_per_s": round(tokens / baseline),
                "ratio": "1.00x",
            },
        ],
        {"rows": rows, "tokens": tokens},
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
