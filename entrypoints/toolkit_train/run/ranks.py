"""Which process of the run this is, and the few things every rank does together (one log, one barrier)."""

from __future__ import annotations

import os


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def log(message: str) -> None:
    if rank() == 0:
        print(f"[toolkit] {message}", flush=True)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
