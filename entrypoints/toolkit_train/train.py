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
import errno
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (every job's entry script): import it as its package, toolkit_train
    # the package's parent (the staged code) replaces the package's own folder, whose modules are no top-level names
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    __package__ = "toolkit_train"
    __import__(__package__)

from .layout import RUN_RECORD, Paths, RunTree, data_source, eval_source, write_json_atomically
from .run import checkpoints, trained
from .run.moments import reached
from .run.ranks import barrier, log, rank
from .run.trainer import load_for_training, report_to_mlflow
from .settings import (
    AWS_REGION_ENV,
    FAILED_PREFIX,
    HF_TOKEN_SECRET_ENV,
    TORCHRUN_SHUTDOWN_ENV,
    TrainSettings,
    failure_elsewhere,
    from_hyperparameters,
)
from .trainers import build_trainer

EXIT_INTERRUPTED = 143  # 128 + SIGTERM: stopped on request, checkpoint saved


def read_settings(paths: Paths) -> TrainSettings:
    if not paths.hyperparameters.exists():
        raise FileNotFoundError(f"no hyperparameters at {paths.hyperparameters}")
    return from_hyperparameters(json.loads(paths.hyperparameters.read_text()))


def load_dataset(settings: TrainSettings, paths: Paths, tokenizer):
    """(training rows, their stats, held-out rows or None, their stats): tokenized, held-out rows set apart first."""
    from .data import PrepareReport, chat_format_of, load_rows, prepare, prompt_dataset, split_rows
    from .run import prepared

    source = data_source(settings, paths)
    made = prepared.check(Path(source), settings.data, settings.model)
    if made is not None:  # say which: a prepared dataset is trained on as it was sealed, from its own source
        log(f"data {source}: a prepared dataset, complete, prepared from {made.get('source')} with these settings")
    rows, held_out = split_rows(load_rows(source, settings.data.split), settings.data, eval_source(settings, paths))
    report = PrepareReport()
    chat_format = chat_format_of(settings.model)
    if settings.training.method_record.samples:  # GRPO: prompts; the held-out ones are `toolkit eval`'s, no loss
        prompts = prompt_dataset(rows, tokenizer, settings.data, report, chat_format)
        stats = report.summary()
        referenced = sum(answer is not None for answer in prompts["answer"])
        log(f"data {source}: {stats['rows_out']} prompts, {stats['tokens']} tokens (max {stats['tokens_max']}); "
            f"skipped {stats['bad_rows_skipped']} bad, dropped {stats['overlong_dropped']} over "
            f"{settings.data.max_length}; {referenced} with a reference answer")  # fmt: skip
        return prompts, stats, None, None
    dataset = prepare(rows, tokenizer, settings.data, report, chat_format)
    stats = report.summary()
    log(
        f"data {source}: {stats['rows_out']} rows, {stats['tokens']} tokens "
        f"(median {stats['tokens_median']}, max {stats['tokens_max']}); skipped {stats['bad_rows_skipped']} bad, "
        f"dropped {stats['overlong_dropped']} / truncated {stats['overlong_truncated']} over {settings.data.max_length}"
    )
    if held_out is None:
        return dataset, stats, None, None
    eval_report = PrepareReport()
    eval_dataset = prepare(held_out, tokenizer, settings.data, eval_report, chat_format)
    eval_stats = eval_report.summary()
    log(f"held out for validation: {eval_stats['rows_out']} rows, {eval_stats['tokens']} tokens (never trained on)")
    return dataset, stats, eval_dataset, eval_stats


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
    """Write a directory under a temporary name and rename it: `out` is either absent or complete. A disk that
    fills meanwhile is said as `out` running out of space (the writers' wrappers lose the file name: safetensors
    reports the run directory's parent, or nothing)."""
    partial = partial_dir(out)
    try:
        write(partial)
    except Exception as exc:
        if _disk_full(exc, partial):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out)) from exc
        raise
    publish(partial, out)


def _disk_full(exc: BaseException, written: Path) -> bool:
    return _enospc(exc) is not None or _nearly_full(written.parent)


def _enospc(exc: BaseException) -> OSError | None:
    """The out-of-space error behind an exception, through the libraries' wrappers (their causes and contexts)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _nearly_full(where: Path) -> bool:
    """A disk with under 16 MiB free: what a failure wrapped beyond recognition there most likely met."""
    with contextlib.suppress(OSError):
        return where.exists() and shutil.disk_usage(where).free < 16 * 2**20
    return False


def finish_from_checkpoint(settings: TrainSettings, paths: Paths, checkpoint: Path, data_stats: dict) -> int:
    """Training finished before the last run ended (killed after the last step, during the adapter save or the
    merge): write the adapter from the final checkpoint and merge, training nothing."""
    step, _ = checkpoints.completed_steps(checkpoint)
    log(f"training already finished at step {step} ({checkpoint.name}); writing the adapter and merge only")
    if rank() != 0:
        return 0
    from .run.model import load_tokenizer

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
    reached("before-merge")
    if settings.training.merge_adapter:
        write_whole(paths.model_dir / "merged", lambda out: merge(settings, adapter_dir, out, tokenizer))
    family = settings.model.family  # what the run was rendered as: the family and its chat format
    summary = {**summary, "family": family.name, "chat_format": family.chat_format}
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
    from .run.callbacks import callbacks
    from .run.model import load_tokenizer

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
    model, compiled, from_rank0 = load_for_training(settings)
    hooks = callbacks(settings) + ([report_to_mlflow(settings, paths)] if settings.training.mlflow else [])
    trainer = build_trainer(settings, paths, model, tokenizer, dataset, eval_dataset, hooks)
    if from_rank0:
        check_same_model(model)
    KEEP_UNTIL_EXIT.append(trainer)
    if resume:
        log(f"resuming from {resume}")
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    peak_gb = peak_gpu_memory_gb()
    if peak_gb is not None:
        log(f"peak GPU memory: {peak_gb} GB (rank {rank()})")
    if stop_requested(hooks):
        return stopped_here(paths, trainer.state.global_step)
    if settings.training.distributed == "ddp":
        check_ranks_agree(model)
    what_trained = check_what_trained(settings, paths, hooks, model, compiled)  # every rank; before anything is saved
    final_eval = trainer.evaluate() if eval_dataset is not None else {}  # every rank takes part
    if not save_adapter(trainer, tokenizer, paths.model_dir / "adapter"):
        return 0  # ranks other than 0: rank 0 writes the rest
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


def stop_requested(hooks: list) -> bool:
    """SIGTERM arrived during training (callbacks.SaveOnSigterm saved a checkpoint and ended it)."""
    from .run.callbacks import SaveOnSigterm

    return any(isinstance(hook, SaveOnSigterm) and hook.requested for hook in hooks)


def stopped_here(paths: Paths, step: int) -> int:
    log(f"stopped by SIGTERM at step {step}; checkpoint saved, rerun to resume")
    if rank() == 0:  # what a later `toolkit jobs status` reads (the exit code is gone by then)
        paths.failure.parent.mkdir(parents=True, exist_ok=True)
        RunTree(paths.root).stopped.write_text(f"stopped at step {step}\n")
    leave_process_group()
    return EXIT_INTERRUPTED


def save_adapter(trainer, tokenizer, adapter_dir: Path) -> bool:
    """The trained adapter (with the tokenizer), published whole under adapter_dir by rank 0 once every rank has
    left the process group; True on rank 0 (which goes on to merge and record the run)."""
    if trainer.is_fsdp_enabled:  # checkpoints stay sharded (fast); the adapter is gathered whole for rank 0
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    unfinished = partial_dir(adapter_dir) if rank() == 0 else adapter_dir
    trainer.save_model(str(unfinished))  # writes on rank 0 only
    leave_process_group()
    if rank() != 0:
        return False
    tokenizer.save_pretrained(unfinished)
    publish(unfinished, adapter_dir)
    return True


class NothingTrained(RuntimeError):
    """A configured adapter group that no gradient reached: the run would save it as it started."""


def check_what_trained(settings: TrainSettings, paths: Paths, hooks: list, model, compiled: int) -> dict[str, Any]:
    """What trained (toolkit_train/run/trained.py), logged and returned for run.json; NothingTrained naming each
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


def check_same_model(model) -> None:
    """Rank 0's loaded model and the others' meta-built ones must be the same tensors in the same order before
    FSDP pairs them up in its broadcast; a mismatch would fill shards with another tensor's bytes, or hang."""
    import hashlib

    import torch.distributed as dist

    from .run.model import model_signature

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
    from .run.model import load_adapter, load_model, save_merged

    base = load_model(settings.model, device_map="cpu")
    model = load_adapter(base, adapter_dir)
    save_merged(model, tokenizer, out)
    reached("merge-written")  # not yet under its name


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
    import torch

    if not torch.cuda.is_available():  # CPU runs (the demo): one config, one model (see tiny_model._pretrain_on)
        torch.use_deterministic_algorithms(True)  # the job's process only: in-process callers keep their own
        # ... without its debugging aid, NaN-filling every torch.empty: it touches each buffer's pages (FSDP rank 0's
        # broadcast buffers: +0.23 GiB resident on the tiny model), and no result reads uninitialized memory
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        load_hf_token()
        settings = read_settings(paths)
        return train(settings, paths)
    except Exception as exc:
        from .data import DataError  # loaded by then: the data is read before training

        reason = failure_reason(exc, paths)
        if not isinstance(exc, DataError):  # bad data is said in one line (the reason); anything else, with its trace
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
    full = _enospc(exc)
    if full is not None:
        return str(full.filename or paths.root)
    return next((str(where) for where in (paths.checkpoints, paths.model_dir) if _nearly_full(where)), None)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: see KEEP_UNTIL_EXIT
