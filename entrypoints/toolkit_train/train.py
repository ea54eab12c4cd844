"""The training entrypoint: the one script every target runs (SageMaker, HyperPod EKS/Slurm, local).

It follows SageMaker's container contract, with every root overridable so HyperPod runs it on /fsx:
  settings     <root>/input/config/hyperparameters.json   (flattened TrainSettings, see settings.py)
  data         $SM_CHANNEL_TRAIN or <root>/input/data/train (else data.source when readable here)
  model        $SM_MODEL_DIR or <root>/model                (adapter/, merged/, run.json)
  checkpoints  $TOOLKIT_CHECKPOINT_DIR or <root>/checkpoints (SageMaker syncs it with S3)
  failure      <root>/output/failure                        (why it failed; exit code 1)
<root> is $TOOLKIT_ML_ROOT or /opt/ml. Under torchrun only rank 0 writes artifacts. A run resumes from
the newest *complete* checkpoint (checkpoints.py: sealed after every file is on disk; incomplete ones are named,
set aside and skipped); SIGTERM saves a checkpoint and exits (spot interruption, preemption). A run whose training
finished is not trained again: a rerun finishes only what came after (the adapter, the merge), and a rerun of a
completed run does nothing. The adapter and the merged model appear under their names only once whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (every job's entry script): import it as its package, toolkit_train
    # the package's parent (the staged code) replaces the package's own folder, whose modules are no top-level names
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    __package__ = "toolkit_train"
    __import__(__package__)

from . import checkpoints, trained
from .faults import (
    BATCH_LOG_ENV,
    FAULT_POINT_ENV,
    FSDP_EVERY_RANK_LOADS_ENV,
    fault_point,
    starve_for_test,
    with_batch_log,
    with_fault_points,
)
from .layout import DEFAULT_ML_ROOT, ML_ROOT_ENV, RUN_RECORD, RunTree, write_json_atomically
from .ranks import barrier, log, rank
from .settings import (
    AWS_REGION_ENV,
    FAILED_PREFIX,
    HF_TOKEN_SECRET_ENV,
    TORCHRUN_SHUTDOWN_ENV,
    TrainSettings,
    failure_elsewhere,
    from_hyperparameters,
)

EXIT_INTERRUPTED = 143  # 128 + SIGTERM: stopped on request, checkpoint saved


@dataclass(frozen=True)
class Paths:
    root: Path
    model_dir: Path
    checkpoints: Path
    train_channel: Path
    output_data: Path

    @classmethod
    def from_env(cls) -> Paths:
        env = os.environ
        root = Path(env.get(ML_ROOT_ENV, DEFAULT_ML_ROOT))
        return cls(
            root=root,
            model_dir=Path(env.get("SM_MODEL_DIR", root / "model")),
            checkpoints=Path(env.get("TOOLKIT_CHECKPOINT_DIR", root / "checkpoints")),
            train_channel=Path(env.get("SM_CHANNEL_TRAIN", root / "input" / "data" / "train")),
            output_data=Path(env.get("SM_OUTPUT_DATA_DIR", root / "output" / "data")),
        )

    @property
    def hyperparameters(self) -> Path:
        return RunTree(self.root).hyperparameters

    @property
    def failure(self) -> Path:
        return RunTree(self.root).failure


def with_fsdp_on_cpu(trainer_class: Any) -> Any:
    """accelerate 1.15 turns FSDP on only for accelerator devices: on CPU its state stays MULTI_CPU, drops the FSDP
    plugin and wraps the model in DDP, so `training.distributed: fsdp` silently trained as DDP on a CPU run (the
    tests). FSDP2 itself shards and trains on CPU over gloo: here the accelerator's state is switched to FSDP with
    the plugin the Trainer built from the config, as accelerate's own state does on a GPU, before anything is
    prepared (in PartialState's shared state too: every later AcceleratorState() copies its distributed_type).
    Once prepared, on every device, the optimizer is checked to hold each trainable parameter's shard."""

    class FsdpOnCpu(trainer_class):
        def create_accelerator_and_postprocess(self) -> None:
            from accelerate import PartialState
            from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

            super().create_accelerator_and_postprocess()
            state = self.accelerator.state
            if state.distributed_type == DistributedType.MULTI_CPU and self.args.fsdp_plugin_args is not None:
                PartialState().distributed_type = DistributedType.FSDP
                state.distributed_type = DistributedType.FSDP
                state.fsdp_plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
                self.is_fsdp_enabled = True

        def _prepare_for_training(self, *args: Any, **kwargs: Any) -> Any:
            prepared = super()._prepare_for_training(*args, **kwargs)
            check_optimizer_covers_trainable(self.model, self.optimizer)
            return prepared

    return FsdpOnCpu


def read_settings(paths: Paths) -> TrainSettings:
    if not paths.hyperparameters.exists():
        raise FileNotFoundError(f"no hyperparameters at {paths.hyperparameters}")
    return from_hyperparameters(json.loads(paths.hyperparameters.read_text()))


def data_source(settings: TrainSettings, paths: Paths) -> str:
    if paths.train_channel.exists():
        return str(paths.train_channel)
    source = settings.data.source
    if source.startswith("builtin:") or Path(source).exists() or ("://" not in source and not source.startswith("/")):
        return source
    raise FileNotFoundError(
        f"data channel 'train' not found at {paths.train_channel}, and data.source {source!r} "
        "cannot be read from inside the job: pass it as the 'train' channel"
    )


def eval_source(settings: TrainSettings, paths: Paths) -> str | None:
    """Where the job reads data.eval.source: its 'eval' channel when it has one, else the source itself."""
    split = settings.data.eval
    if split is None or split.source is None:
        return None
    channel = Path(os.environ.get("SM_CHANNEL_EVAL", paths.root / "input" / "data" / "eval"))
    return str(channel) if channel.exists() else split.source


def load_dataset(settings: TrainSettings, paths: Paths, tokenizer):
    """(training rows, their stats, held-out rows or None, their stats): tokenized, held-out rows set apart first."""
    from . import prepared
    from .data import PrepareReport, load_rows, prepare, split_rows

    source = data_source(settings, paths)
    made = prepared.check(Path(source), settings.data, settings.model)
    if made is not None:  # say which: a prepared dataset is trained on as it was sealed, from its own source
        log(f"data {source}: a prepared dataset, complete, prepared from {made.get('source')} with these settings")
    rows, held_out = split_rows(load_rows(source, settings.data.split), settings.data, eval_source(settings, paths))
    report = PrepareReport()
    dataset = prepare(rows, tokenizer, settings.data, report)
    stats = report.summary()
    log(
        f"data {source}: {stats['rows_out']} rows, {stats['tokens']} tokens "
        f"(median {stats['tokens_median']}, max {stats['tokens_max']}); skipped {stats['bad_rows_skipped']} bad, "
        f"dropped {stats['overlong_dropped']} / truncated {stats['overlong_truncated']} over {settings.data.max_length}"
    )
    if held_out is None:
        return dataset, stats, None, None
    eval_report = PrepareReport()
    eval_dataset = prepare(held_out, tokenizer, settings.data, eval_report)
    eval_stats = eval_report.summary()
    log(f"held out for validation: {eval_stats['rows_out']} rows, {eval_stats['tokens']} tokens (never trained on)")
    return dataset, stats, eval_dataset, eval_stats


def loads_from_rank0(settings: TrainSettings) -> bool:
    """FSDP: rank 0 alone reads the base model; every other rank builds it on the meta device (model.empty_model,
    no weight file read, no host memory for the weights) and receives its shards from rank 0 when accelerate
    prepares the model (`cpu_ram_efficient_loading`: FSDP2's fsdp2_load_full_state_dict broadcasts rank 0's
    tensors over the world group into each rank's shards; FSDP1's `sync_module_states` did the same). gpt-oss-120b
    with bf16 experts is ~218 GiB on the host: read by every rank it was 8x that on one p5 node, now 1x on the
    first node and none on the others (what another node's rank read would be thrown away: the broadcast's source
    is the global rank 0). transformers' own switch for this (FSDP_CPU_RAM_EFFICIENT_LOADING, is_fsdp_enabled())
    is not enough in 5.24: from_pretrained still reads and materializes every checkpoint tensor on every rank
    (modeling_utils._load_pretrained_model has no FSDP branch); it only stops non-zero local ranks from
    initializing what they will receive."""
    return settings.training.distributed == "fsdp" and not os.environ.get(FSDP_EVERY_RANK_LOADS_ENV)


def use_checkpointing(settings: TrainSettings) -> bool:
    """`auto`, measured on gpt-oss-20b at 8k-token micro-batches: 92 GB without recomputation, 60 GB with."""
    import torch

    wanted = settings.training.gradient_checkpointing
    if wanted != "auto":
        return bool(wanted)
    if not torch.cuda.is_available():
        return False
    if settings.training.distributed == "fsdp":
        return True
    return torch.cuda.get_device_properties(0).total_memory < 100 * 2**30


def use_compiled_layers(settings: TrainSettings) -> bool:
    """`auto`: only where the bench's gate compares compiled against reference gradients (bench/train_throughput.py):
    a GPU, ddp, packed fixed-width micro-batches, no recomputation, LoRA on modules (not on the experts), experts
    in bf16."""
    import torch

    wanted = settings.training.compile_layers
    if wanted != "auto":
        return bool(wanted)
    t = settings.training
    gated = not settings.lora.target_parameters and settings.model.experts == "bf16" and t.distributed == "ddp"
    return torch.cuda.is_available() and gated and t.packing and not use_checkpointing(settings)


def sft_config(settings: TrainSettings, paths: Paths):
    import torch
    from trl import SFTConfig

    from .model import compute_dtype

    t = settings.training
    on_gpu = torch.cuda.is_available()
    bf16 = on_gpu and compute_dtype(settings.model) == torch.bfloat16
    extra: dict = {}
    if t.lr_scheduler == "cosine_with_min_lr":
        extra["lr_scheduler_kwargs"] = {"min_lr_rate": t.min_lr_rate}
    if t.distributed == "fsdp":
        extra["fsdp"] = f"{t.fsdp_sharding} auto_wrap"
        extra["fsdp_config"] = {
            "transformer_layer_cls_to_wrap": [layer] if (layer := settings.model.family.decoder_layer) else None,
            "use_orig_params": True,
            "activation_checkpointing": use_checkpointing(settings),
            "state_dict_type": "SHARDED_STATE_DICT",
            "cpu_ram_efficient_loading": loads_from_rank0(settings),  # ranks other than 0 hold a meta model
        }
    if t.packing:  # one packed row per micro-batch; our collator and loss; columns the model does not take
        extra.update(remove_unused_columns=False, dataset_kwargs={"skip_prepare_dataset": True})
    split = settings.data.eval
    if split is not None and split.steps:  # and always once at the end (train())
        extra.update(eval_strategy="steps", eval_steps=split.steps)
    if split is not None:  # step 0: the base model's validation loss (LoRA starts as the identity), for toolkit eval
        extra.update(eval_on_start=True)
    return SFTConfig(
        output_dir=str(paths.checkpoints),
        per_device_train_batch_size=1 if t.packing else t.per_device_batch_size,
        per_device_eval_batch_size=1 if t.packing else t.per_device_batch_size,
        prediction_loss_only=True,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        learning_rate=t.learning_rate,
        num_train_epochs=t.num_epochs,
        max_steps=t.max_steps or -1,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_ratio,  # transformers 5: a value below 1 is a ratio of the total steps
        weight_decay=t.weight_decay,
        adam_beta2=t.adam_beta2,
        max_grad_norm=t.max_grad_norm,
        gradient_checkpointing=use_checkpointing(settings) and t.distributed != "fsdp",
        gradient_checkpointing_kwargs={"use_reentrant": False},
        seed=t.seed,
        data_seed=t.seed,
        save_strategy="steps" if t.save_steps else "no",
        save_steps=t.save_steps or 500,
        save_total_limit=None,  # retention counts complete checkpoints only: Sealed.on_save (checkpoints.prune)
        logging_steps=t.logging_steps,
        report_to=list(t.report_to) or "none",
        bf16=bf16,
        use_cpu=not on_gpu,
        max_length=settings.data.max_length,
        ddp_find_unused_parameters=False,
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=True,
        dataloader_drop_last=False,
        **extra,
    )


def report_to_mlflow(settings: TrainSettings, paths: Paths):
    """Point transformers' MLflow callback (it reads these variables) at the configured server; a resumed job
    (spot restart, a rerun without --fresh) continues the same MLflow run, whose id is kept with the checkpoints."""
    import importlib.util

    from transformers import TrainerCallback

    tracking = settings.training.mlflow
    assert tracking is not None
    if importlib.util.find_spec("mlflow") is None:
        raise RuntimeError(
            "training.report_to lists mlflow but mlflow is not installed in this environment: "
            "pip install -r entrypoints/toolkit_train/requirements-mlflow.txt (jobs install it themselves)"
        )
    os.environ["MLFLOW_TRACKING_URI"] = tracking.tracking_uri
    os.environ["MLFLOW_EXPERIMENT_NAME"] = tracking.experiment
    run_id_file, where = (
        paths.checkpoints / "mlflow-run-id",
        f"experiment {tracking.experiment!r} at {tracking.tracking_uri}",
    )
    if run_id_file.exists():
        os.environ["MLFLOW_RUN_ID"] = run_id_file.read_text().strip()

    class KeepRunId(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):  # after MLflowCallback started the run
            import mlflow

            active = mlflow.active_run()
            if state.is_world_process_zero and active is not None:
                run_id_file.parent.mkdir(parents=True, exist_ok=True)
                run_id_file.write_text(active.info.run_id)
                log(f"MLflow run {active.info.run_id} in {where}")

    return KeepRunId()


def batch_semantics(settings: TrainSettings, rows: int, micro_batches: int) -> str:
    """Packing changes how many rows one optimizer step averages over: say so, next to what the unpacked
    recipe would do, so that a learning rate or step count taken from it can be rescaled knowingly."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    accumulation = settings.training.gradient_accumulation_steps
    packed = rows / max(micro_batches, 1) * accumulation * world
    unpacked = settings.training.per_device_batch_size * accumulation * world
    return (
        f"an optimizer step averages ~{packed:.0f} rows ({accumulation} packed micro-batch(es) x {world} rank(s)); "
        f"unpacked (training.packing: false, the recipes) it would average {unpacked}, with {packed / unpacked:.1f}x "
        f"as many steps per epoch; loss on: {settings.data.loss_on} tokens"
    )


def resume_point(paths: Paths) -> Path | None:
    """The newest complete checkpoint; newer incomplete or unreadable ones are named, set aside (renamed, not
    deleted: a later save of their step must not write over them) and skipped."""
    resume, skipped = checkpoints.newest_complete(paths.checkpoints)
    for item in skipped:
        log(f"skipping {paths.checkpoints / item.path.name}: {item.reason}")
    if skipped and rank() == 0:  # other ranks scanning meanwhile skip a renamed one all the same
        for moved in checkpoints.set_aside(skipped):
            log(f"set aside as {moved} (delete it once you no longer need it)")
    return resume


def already_completed(settings: TrainSettings, paths: Paths) -> bool:
    """run.json is written last, after the adapter and the merge: present with these settings = nothing to do."""
    record = paths.model_dir / RUN_RECORD
    try:
        return json.loads(record.read_text())["settings"] == settings.model_dump(mode="json")
    except (OSError, ValueError, KeyError):
        return False


def finished_training(settings: TrainSettings, checkpoint: Path | None) -> bool:
    """Training as these settings ask for it ended at this checkpoint (transformers would train one step past
    max_steps when resumed there). A longer run asked for later (more steps or epochs) is not finished."""
    if checkpoint is None:
        return False
    step, total = checkpoints.completed_steps(checkpoint)
    if settings.training.max_steps:
        return step >= settings.training.max_steps
    recorded_epochs = json.loads((checkpoint / "trainer_state.json").read_text()).get("num_train_epochs")
    return recorded_epochs == settings.training.num_epochs and total > 0 and step >= total


def partial_dir(out: Path) -> Path:
    """Where a directory is written before it appears under its name (a kill leaves only this behind)."""
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    return partial


def publish(partial: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


def write_whole(out: Path, write) -> None:
    """Write a directory under a temporary name and rename it: `out` is either absent or complete."""
    partial = partial_dir(out)
    write(partial)
    publish(partial, out)


def finish_from_checkpoint(settings: TrainSettings, paths: Paths, checkpoint: Path, data_stats: dict) -> int:
    """Training finished before the last run ended (killed after the last step, during the adapter save or the
    merge): write the adapter from the final checkpoint and merge, training nothing."""
    step, _ = checkpoints.completed_steps(checkpoint)
    log(f"training already finished at step {step} ({checkpoint.name}); writing the adapter and merge only")
    if rank() != 0:
        return 0
    from .model import load_tokenizer

    tokenizer = load_tokenizer(settings.model)

    def copy_adapter(out: Path) -> None:
        out.mkdir(parents=True)
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy2(checkpoint / name, out / name)
        tokenizer.save_pretrained(out)

    adapter_dir = paths.model_dir / "adapter"
    if (checkpoint / "adapter_model.safetensors").exists():
        write_whole(adapter_dir, copy_adapter)
    elif not (adapter_dir / "adapter_model.safetensors").exists():  # published whole after the last step, or not
        raise RuntimeError(
            f"{checkpoint} holds sharded FSDP state and no whole adapter, and {adapter_dir} was not written: "
            "run again with --fresh to train again"
        )
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    summary = {
        "settings": settings.model_dump(mode="json"),
        "data": data_stats,
        "global_step": step,
        "train_loss": None,  # the Trainer's average over the run is not kept in checkpoints
        "log_history": state.get("log_history", []),
        "finished_from": checkpoint.name,
    }
    return write_outputs(settings, paths, tokenizer, summary)


def write_outputs(settings: TrainSettings, paths: Paths, tokenizer, summary: dict) -> int:
    """After the adapter: the merged model, then run.json (last: its presence says the run is complete)."""
    adapter_dir = paths.model_dir / "adapter"
    fault_point("before-merge")
    if settings.training.merge_adapter:
        write_whole(paths.model_dir / "merged", lambda out: merge(settings, adapter_dir, out, tokenizer))
    write_json_atomically(paths.model_dir / RUN_RECORD, summary)  # a kill mid-write leaves no torn "complete"
    log(f"adapter: {adapter_dir}")
    if settings.training.merge_adapter:
        log(f"merged model: {paths.model_dir / 'merged'}")
    return 0


# The trainer (model, accelerator, DDP reducer) lives until the process ends with os._exit: once the process
# group is gone, the C++ destructors of its gloo/NCCL state can block forever (seen on a two-node Slurm job,
# after the model was written), and torchrun then waits on that rank until its exit barrier times out.
KEEP_UNTIL_EXIT: list = []


def train(settings: TrainSettings, paths: Paths) -> int:
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTTrainer

    from .model import (
        add_lora,
        attention_implementation,
        compile_decoder_layers,
        give_trainable_storage,
        load_model,
        load_tokenizer,
    )

    started = time.monotonic()
    if already_completed(settings, paths):
        log(f"this run is already complete ({paths.model_dir / RUN_RECORD}): nothing to train; --fresh starts over")
        return 0
    tokenizer = load_tokenizer(settings.model)
    dataset, data_stats, eval_dataset, eval_stats = load_dataset(settings, paths, tokenizer)
    if eval_stats is not None:
        data_stats = {**data_stats, "eval": eval_stats}
    resume = resume_point(paths)
    if finished_training(settings, resume):
        assert resume is not None
        return finish_from_checkpoint(settings, paths, resume, data_stats)
    from_rank0 = loads_from_rank0(settings)
    reads = rank() == 0 or not from_rank0
    model = add_lora(load_model(settings.model, weights=reads), settings.lora, settings.training.seed)
    if not reads:
        give_trainable_storage(model)
    if from_rank0:
        log("FSDP: rank 0 read the base model; the other ranks built it on the meta device and receive their shards "
            "from rank 0")  # fmt: skip
    fault_point("model-loaded")
    if rank() == 0:
        model.print_trainable_parameters()
    compiled = compile_decoder_layers(model) if use_compiled_layers(settings) else 0
    if compiled:
        log(f"compiling {compiled} decoder layers (torch.compile; the first steps are slower)")
    starve_for_test(model)
    from .callbacks import SaveOnSigterm, callbacks

    hooks = callbacks(settings)
    if settings.training.mlflow is not None:
        hooks.append(report_to_mlflow(settings, paths))
    trainer_class, extra = SFTTrainer, dict[str, Any]()
    if settings.training.packing:
        from .packing import collate, packed_dataset, packed_trainer_class

        budget = settings.micro_batch_tokens()
        dataset = packed_dataset(dataset, budget, settings.training.seed)
        if eval_dataset is not None:
            eval_dataset = packed_dataset(eval_dataset, budget, settings.training.seed)
        log(f"packed {data_stats['rows_out']} rows into {len(dataset)} micro-batches of <= {budget} tokens")
        log(batch_semantics(settings, data_stats["rows_out"], len(dataset)))
        fixed = budget if attention_implementation(settings.model) == "flex_attention" else None
        trainer_class, extra = packed_trainer_class(), {"data_collator": partial(collate, pad_to=fixed)}
    if settings.training.distributed == "fsdp":
        trainer_class = with_fsdp_on_cpu(trainer_class)
    if os.environ.get(FAULT_POINT_ENV):
        trainer_class = with_fault_points(trainer_class)
    if os.environ.get(BATCH_LOG_ENV):
        trainer_class = with_batch_log(trainer_class, Path(os.environ[BATCH_LOG_ENV]))
    trainer = trainer_class(
        model=model,
        args=sft_config(settings, paths),
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        callbacks=hooks,
        **extra,
    )
    trainer.remove_callback(PrinterCallback)  # our Metrics lines replace its raw dict dumps
    if from_rank0:
        check_same_model(model)
    KEEP_UNTIL_EXIT.append(trainer)
    if resume:
        log(f"resuming from {resume}")
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    peak_gb = peak_gpu_memory_gb()
    if peak_gb is not None:
        log(f"peak GPU memory: {peak_gb} GB (rank {rank()})")
    if any(isinstance(hook, SaveOnSigterm) and hook.requested for hook in hooks):
        log(f"stopped by SIGTERM at step {trainer.state.global_step}; checkpoint saved, rerun to resume")
        if rank() == 0:  # what a later `toolkit jobs status` reads (the exit code is gone by then)
            paths.failure.parent.mkdir(parents=True, exist_ok=True)
            RunTree(paths.root).stopped.write_text(f"stopped at step {trainer.state.global_step}\n")
        leave_process_group()
        return EXIT_INTERRUPTED
    if settings.training.distributed == "ddp":
        check_ranks_agree(model)
    what_trained = check_what_trained(settings, paths, hooks, model, compiled)  # every rank; before anything is saved
    final_eval = trainer.evaluate() if eval_dataset is not None else {}  # every rank takes part
    adapter_dir = paths.model_dir / "adapter"
    if trainer.is_fsdp_enabled:  # checkpoints stay sharded (fast); the adapter is gathered whole for rank 0
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    unfinished = partial_dir(adapter_dir) if rank() == 0 else adapter_dir
    trainer.save_model(str(unfinished))  # writes on rank 0 only
    leave_process_group()
    if rank() != 0:
        return 0
    tokenizer.save_pretrained(unfinished)
    publish(unfinished, adapter_dir)
    summary = {
        "settings": settings.model_dump(mode="json"),
        "data": data_stats,
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,
        "eval_loss": final_eval.get("eval_loss"),
        "log_history": trainer.state.log_history,
        "seconds": round(time.monotonic() - started, 1),
        "peak_gpu_memory_gb": peak_gb,
        "trained": what_trained,
    }
    del trainer, model
    return write_outputs(settings, paths, tokenizer, summary)


class NothingTrained(RuntimeError):
    """A configured adapter group that no gradient reached: the run would save it as it started."""


def check_what_trained(settings: TrainSettings, paths: Paths, hooks: list, model, compiled: int) -> dict[str, Any]:
    """What trained (toolkit_train/trained.py), logged and returned for run.json; NothingTrained naming each
    group no gradient reached (exit 1 through main's failure record), before the adapter is saved or merged. This
    session's checkpoints are set aside then: the same command must not finish the run from them unchecked."""
    measure = next(hook.measure for hook in hooks if hasattr(hook, "measure"))
    if measure is None:  # no optimizer step ran in this session
        return {}
    summary = {**measure.summary(), "paths": trained.paths_that_ran(model, settings, compiled)}
    log(trained.line(summary, summary["paths"]))
    starved = trained.starved(summary)
    if starved:
        if rank() == 0:
            found = paths.checkpoints.glob("checkpoint-*") if paths.checkpoints.is_dir() else []
            ours = [c for c in found if (checkpoints.step_of(c) or 0) > measure.first_step]
            checkpoints.set_aside([checkpoints.Skipped(c, "trained with an adapter group no gradient reached")
                                   for c in ours])  # fmt: skip
        barrier()
        raise NothingTrained(
            f"{'; '.join(starved)} received no gradient in {summary['optimizer_steps']} optimizer steps: the "
            "adapter would be saved as it started, so nothing was saved or merged. Check lora.target_modules / "
            "lora.target_parameters against the model's modules and model.experts_implementation"
        )
    return summary


def peak_gpu_memory_gb() -> float | None:
    """The most memory this rank's tensors held on its GPU during training (what decides which GPU a run fits)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 1e9, 1)


def leave_process_group() -> None:
    """End the collective part on every rank together: a rank that exits while another still uses the group
    can abort in gloo's teardown, and torchrun then kills the rank that is still writing the model."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def check_optimizer_covers_trainable(model, optimizer) -> None:
    """After FSDP wrapped the model, the optimizer must hold each trainable parameter once: accelerate re-points an
    optimizer built before sharding at the shards, and a mapping that collapses (meta tensors share one data_ptr:
    model.give_trainable_storage) would leave LoRA shards that never step, silently."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    if held != trainable:
        raise RuntimeError(
            f"rank {rank()}: the optimizer holds {len(held & trainable)} of the {len(trainable)} trainable parameters "
            f"after FSDP wrapped the model ({len(held - trainable)} others): their shards would not be trained"
        )


def check_same_model(model) -> None:
    """Rank 0's loaded model and the others' meta-built ones must be the same tensors in the same order before
    FSDP pairs them up in its broadcast; a mismatch would fill shards with another tensor's bytes, or hang."""
    import hashlib

    import torch.distributed as dist

    from .model import model_signature

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    mine = hashlib.sha256(repr(model_signature(model)).encode()).hexdigest()
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, mine)
    differ = [r for r, sig in enumerate(seen) if sig != seen[0]]
    if differ:
        raise RuntimeError(
            f"rank(s) {differ} built a model whose tensors differ from the one rank 0 loaded (names, shapes or "
            "dtypes): FSDP cannot broadcast rank 0's weights into them"
        )


def check_ranks_agree(model) -> None:
    """DDP keeps replicas identical; prove it, because a silent divergence would ship rank 0's half-model."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    trainable = [p.detach().float() for p in model.parameters() if p.requires_grad]
    local = torch.stack([t.sum() for t in trainable] + [t.abs().sum() for t in trainable]).double()
    local = local.to("cuda" if torch.cuda.is_available() else "cpu")
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    if any(not torch.allclose(g, gathered[0], rtol=1e-6, atol=1e-8) for g in gathered[1:]):
        raise RuntimeError("ranks disagree on the adapter weights after training")
    log(f"ranks agree on the adapter weights ({dist.get_world_size()} processes, checksum {local.sum():.6e})")


def merge(settings: TrainSettings, adapter_dir: Path, out: Path, tokenizer) -> None:
    """Reload the base on CPU and merge the saved adapter: the same path for DDP and FSDP runs."""
    from .model import load_adapter, load_model, save_merged

    base = load_model(settings.model, device_map="cpu")
    model = load_adapter(base, adapter_dir)
    save_merged(model, tokenizer, out)
    fault_point("merge")  # written, not yet under its name


def relaunch_under_torchrun() -> None:
    """Started by SageMaker without a launcher on a multi-GPU or multi-host job: become torchrun."""
    if "LOCAL_RANK" in os.environ:
        return
    gpus = int(os.environ.get("SM_NUM_GPUS", "0"))
    hosts = json.loads(os.environ.get("SM_HOSTS", "[]"))
    if gpus <= 1 and len(hosts) <= 1:
        return
    current = os.environ.get("SM_CURRENT_HOST", hosts[0] if hosts else "")
    command = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={max(gpus, 1)}", f"--nnodes={max(len(hosts), 1)}",
        f"--node-rank={hosts.index(current) if current in hosts else 0}",
        f"--master-addr={hosts[0] if hosts else '127.0.0.1'}", "--master-port=29500",
        str(Path(__file__).resolve()),
    ]  # fmt: skip
    os.environ.update(TORCHRUN_SHUTDOWN_ENV)  # the ranks' stop window (settings.STOP_WINDOW_SECONDS)
    os.execv(sys.executable, command)


def load_hf_token() -> None:
    """The Hugging Face token from the Secrets Manager secret the job names, read with the job's own role and kept
    in this process's memory (the hub client reads HF_TOKEN): it never travels in the job's request, its
    environment as SageMaker shows it, or a log. The secret holds the token, or JSON with an HF_TOKEN key."""
    secret = os.environ.get(HF_TOKEN_SECRET_ENV)
    if not secret or os.environ.get("HF_TOKEN"):
        return
    import boto3

    region = os.environ.get(AWS_REGION_ENV) or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ValueError(
            f"{HF_TOKEN_SECRET_ENV} names secret {secret} but {AWS_REGION_ENV} names no region to read it in"
        )
    client = boto3.client("secretsmanager", region_name=region)
    value = client.get_secret_value(SecretId=secret)["SecretString"].strip()
    if value.startswith("{"):
        value = json.loads(value).get("HF_TOKEN") or json.loads(value).get("token") or ""
    if not value:
        raise ValueError(f"secret {secret} holds no token (a string, or JSON with an HF_TOKEN key)")
    os.environ["HF_TOKEN"] = value
    log(f"Hugging Face token read from secret {secret}")


def main() -> int:
    relaunch_under_torchrun()
    paths = Paths.from_env()
    try:
        load_hf_token()
        settings = read_settings(paths)
        return train(settings, paths)
    except Exception as exc:
        reason = failure_reason(exc, paths)
        traceback.print_exc()
        record_failure(paths, reason)
        print(f"{FAILED_PREFIX}{reason}", file=sys.stderr, flush=True)
        return 1


def record_failure(paths: Paths, reason: str) -> None:
    """What `toolkit jobs status` reads later: whole or absent; where the run's own disk is full, kept elsewhere
    (settings.failure_elsewhere) so that status does not take the run for killed."""
    for record in (paths.failure, failure_elsewhere(paths.root)):
        partial = record.with_name(f"{record.name}.partial")
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(reason + "\n")
            partial.replace(record)
            return
        except OSError:
            with contextlib.suppress(OSError):
                partial.unlink()


def failure_reason(exc: BaseException, paths: Paths) -> str:
    """One line: a full disk says where and what to do (torch and safetensors wrap the OSError in their own)."""
    full = out_of_space(exc, paths)
    if full is None:
        return f"{type(exc).__name__}: {exc}"
    return (
        f"out of disk space writing {full}: free space on that disk, or point the run at a larger one "
        "(local.output_dir for a local run), then run the same command again: it resumes from the newest "
        "complete checkpoint"
    )


def out_of_space(exc: BaseException, paths: Paths) -> str | None:
    """The path whose write ran out of space, when that is what failed."""
    import errno

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return str(seen.filename or paths.root)
        seen = seen.__cause__ or seen.__context__
    for where in (paths.checkpoints, paths.model_dir):
        with contextlib.suppress(OSError):
            if where.exists() and shutil.disk_usage(where).free < 16 * 2**20:  # wrapped beyond recognition
                return str(where)
    return None


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: see KEEP_UNTIL_EXIT
