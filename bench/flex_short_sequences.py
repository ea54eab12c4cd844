"""Which sequence lengths a compiled flex_attention (the GPU's `auto` attention for gpt-oss) lowers for: the
tiny GRPO preset's ~100-token prompts failed in inductor (NoValidChoicesError) on an H100 with torch 2.11. GQA with
4 query and 2 key/value heads, a causal block mask over a padding mask, batch 32, bf16; each length compiled afresh.

  python bench/flex_short_sequences.py [--head-dims 32,64] [--lengths 16,64,100,127,128,129,200,357] [--grad]
"""

from __future__ import annotations

import argparse

import torch
from common import report


def compiles(length: int, head_dim: int, grad: bool) -> str:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    batch, query_heads, kv_heads = 32, 4, 2
    shape = {"device": "cuda", "dtype": torch.bfloat16, "requires_grad": grad}
    q = torch.randn(batch, query_heads, length, head_dim, **shape)
    k, v = (torch.randn(batch, kv_heads, length, head_dim, **shape) for _ in range(2))
    kept = torch.ones(batch, length, dtype=torch.bool, device="cuda")
    kept[:, :5] = False  # left padding, as a batch of prompts has

    def causal_unpadded(b, h, q_index, kv_index):
        return (q_index >= kv_index) & kept[b, kv_index]

    mask = create_block_mask(causal_unpadded, batch, None, length, length, device="cuda")
    try:
        out = torch.compile(flex_attention)(q, k, v, block_mask=mask, enable_gqa=True)
        if grad:
            out.sum().backward()
    except Exception as error:  # the finding is the error's kind, per length
        return f"{type(error).__name__}: {str(error)[:120]}"
    return "compiled"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dims", default="32,64")
    parser.add_argument("--lengths", default="16,64,100,103,127,128,129,200,256,357")
    parser.add_argument("--grad", action="store_true", help="run the backward too")
    args = parser.parse_args()
    rows = [{"head_dim": d, "length": n, "result": compiles(n, d, args.grad)}
            for d in map(int, args.head_dims.split(",")) for n in map(int, args.lengths.split(","))]  # fmt: skip
    report("flex_short_sequences", rows, {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                                          "grad": args.grad})  # fmt: skip


if __name__ == "__main__":
    main()
