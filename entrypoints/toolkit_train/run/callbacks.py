"""The trainer's callbacks: the metric lines, the checkpoint on SIGTERM, sealing and retention, the host memory
peak, what trained. Imported once training starts (transformers is heavy)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from ..settings import STOP_WINDOW_SECONDS, TrainSettings
from . import checkpoints, trained
from .metrics import format_metrics
from .moments import reached
from .ranks import barrier, log, rank

HOST_PEAK_PREFIX = "[toolkit] host memory peak: "  # every rank's, when training begins (HostMemory)


class Metrics(TrainerCallback):
    """One parseable line per log: the regexes in toolkit's metric definitions read these."""

    def __init__(self) -> None:
        self.last = (time.monotonic(), 0)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "eval_loss" in logs:
            print(format_metrics(state.global_step, state.max_steps, {"eval_loss": logs["eval_loss"]}), flush=True)
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        now, tokens = time.monotonic(), state.num_input_tokens_seen
        rate = (tokens - self.last[1]) / max(now - self.last[0], 1e-9)
        self.last = (now, tokens)
        memory = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
        values = {
            "loss": logs["loss"],
            "learning_rate": logs.get("learning_rate", 0),
            "grad_norm": logs.get("grad_norm", 0),
            "tokens_per_second": rate,
            "gpu_memory_gib": memory,
            **{name: logs[name] for name in ("reward", "kl") if name in logs},  # GRPO's
        }
        print(format_metrics(state.global_step, state.max_steps, values), flush=True)


class SaveOnSigterm(TrainerCallback):
    """SIGTERM (spot interruption, scancel, pod eviction): finish the step, checkpoint, stop."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._request)

    def _request(self, signum, frame) -> None:
        self.requested = True

    def on_step_end(self, args, state, control, **kwargs):
        if self._anyone_requested():
            self.requested = True
            control.should_save = True
            control.should_training_stop = True

    def _anyone_requested(self) -> bool:
        """Ranks see the signal at different steps; agree, or one saves while another trains on."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        flag = torch.tensor([int(self.requested)], device="cuda" if torch.cuda.is_available() else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


class Sealed(TrainerCallback):
    """After each save: seal the checkpoint (it counts from now on), then apply the retention limit."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.save_started = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):  # callbacks run in order: after SaveOnSigterm's
        if control.should_save:
            self.save_started = time.monotonic()

    def on_save(self, args, state, control, **kwargs):
        barrier()  # every rank's files (its RNG state, its shards) are written
        reached(f"before-seal-{state.global_step}")  # every file written, the checkpoint not yet counted
        if state.is_world_process_zero:
            saved = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            checkpoints.seal(saved)
            size = sum(p.stat().st_size for p in saved.rglob("*") if p.is_file()) / 1e6
            seconds = time.monotonic() - self.save_started
            log(f"{saved.name}: {size:.0f} MB saved and sealed in {seconds:.1f} s (the stop window is "
                f"{STOP_WINDOW_SECONDS} s)")  # fmt: skip
            for old in checkpoints.prune(Path(args.output_dir), self.keep):
                log(f"removed {old.name} (training.save_total_limit)")
        barrier()


class HostMemory(TrainerCallback):
    """Each rank's host memory peak once the model is loaded, sharded and resumed (the model reaches every rank
    before training begins): what decides whether a node's RAM holds the load (trainer.loads_from_rank0)."""

    def on_train_begin(self, args, state, control, **kwargs):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        world = os.environ.get("WORLD_SIZE", "1")
        print(f"{HOST_PEAK_PREFIX}{peak:.3f} GiB (rank {rank()} of {world}, model loaded and prepared)", flush=True)


class WhatTrained(TrainerCallback):
    """trained.Measure over the run: started once the model is prepared, fed before each optimizer step."""

    def __init__(self, sharded: bool) -> None:
        self.sharded = sharded
        self.measure: trained.Measure | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.measure = trained.Measure(model, sharded=self.sharded)
        self.measure.first_step = state.global_step  # a resumed run measures from its checkpoint

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.measure is not None:
            self.measure.gradient()


def callbacks(settings: TrainSettings) -> list[TrainerCallback]:
    """The callbacks of a run, in the order they must run (Sealed after SaveOnSigterm: it reads its save)."""
    return [
        Metrics(),
        SaveOnSigterm(),
        Sealed(settings.training.save_total_limit),
        HostMemory(),
        WhatTrained(sharded=settings.training.distributed == "fsdp"),
    ]
