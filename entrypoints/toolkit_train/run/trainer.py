"""What every method's trainer is built with (toolkit_train/trainers/): the model loaded for training, TRL's
arguments from the settings, FSDP on CPU, the settings that decide the paths (packing, checkpointing, compiled
layers, rank-0 loading); the entrypoint's `train()` and the bench build from here, so what the bench measures is what
a run trains with."""

from __future__ import annotations

import os
from typing import Any

from ..layout import Paths
from ..settings import TrainSettings
from .ranks import log, rank


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
    return settings.training.distributed == "fsdp"


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
    """`auto`: only where the bench's gates compare compiled against reference gradients (bench/train_throughput.py):
    a GPU, ddp, packed fixed-width micro-batches, LoRA on modules (not on the experts), and either bf16 experts
    without recomputation (`gate`: whole layers compiled) or packed MXFP4 experts, recomputation or not
    (`mxfp4-compiled-gate`: attention blocks and routers compiled, `compile_layers_for_training`). The gates build
    gpt-oss models: another family (Qwen3) is compiled only when asked (`compile_layers: true`)."""
    import torch

    wanted = settings.training.compile_layers
    if wanted != "auto":
        return bool(wanted)
    gated = not settings.lora.target_parameters and settings.training.distributed == "ddp"
    gated = gated and settings.model.family.fused_experts  # gpt-oss's record: the family the gates measured
    by_experts = settings.model.experts == "mxfp4" or not use_checkpointing(settings)
    return torch.cuda.is_available() and gated and uses_packing(settings) and by_experts


def compile_layers_for_training(model: Any, settings: TrainSettings) -> int:
    """Compile what the settings' experts allow, and say so: with packed MXFP4 experts each layer's attention block
    and router (the packed experts keep their own autograd path; mxfp4.compile_packed_layers), else whole decoder
    layers. Returns how many layers."""
    from ..kernels.mxfp4 import compile_packed_layers
    from .model import compile_decoder_layers

    if settings.model.experts == "mxfp4":
        compiled, parts = compile_packed_layers(model), "the attention blocks and routers of "
    else:
        compiled, parts = compile_decoder_layers(model), ""
    log(f"compiling {parts}{compiled} decoder layers (torch.compile; the first steps are slower)")
    return compiled


def uses_packing(settings: TrainSettings) -> bool:
    """Packed micro-batches of rows: SFT's (DPO packs each micro-batch's pairs instead: packs_pairs)."""
    method = settings.training.method_record
    return settings.training.packing and not method.pairs and not method.samples


def packs_pairs(settings: TrainSettings) -> bool:
    """DPO with training.packing: the chosen and rejected replies of a micro-batch's pairs run as one packed row."""
    return settings.training.packing and settings.training.method_record.pairs


def trainer_args(settings: TrainSettings, paths: Paths):
    """The trainer's arguments: TRL's config class of training.method's record (SFTConfig; DPOConfig with the DPO
    loss), with the arguments the method adds."""
    import torch
    import trl

    from ..kernels.packing import FLEX_LENGTH_MULTIPLE
    from .model import attention_implementation, compute_dtype

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
    packed = uses_packing(settings)
    if packed:  # one packed row per micro-batch; our collator and loss; columns the model does not take
        extra.update(remove_unused_columns=False, dataset_kwargs={"skip_prepare_dataset": True})
    elif attention_implementation(settings.model) == "flex_attention":  # TRL's collators pad to a length flex compiles
        extra.update(pad_to_multiple_of=FLEX_LENGTH_MULTIPLE)
    method = t.method_record
    config_class: Any = getattr(trl, method.trl_config)
    extra.update(method.config_arguments(t))
    split = settings.data.eval if not method.samples else None  # GRPO has no validation loss
    if split is not None and split.steps:  # and always once at the end (train())
        extra.update(eval_strategy="steps", eval_steps=split.steps)
    if split is not None:  # step 0: the base model's validation loss (LoRA starts as the identity), for toolkit eval
        extra.update(eval_on_start=True)
    if not method.samples:  # what a labelled row is cut to, and its tokens counted (GRPO's are sampled)
        extra.update(max_length=settings.data.max_length, include_num_input_tokens_seen="non_padding")
    # GRPO's micro-batch holds replies: training.per_device_batch_size prompts, each's group of samples
    replies = t.grpo.num_generations if method.samples else 1
    return config_class(
        output_dir=str(paths.checkpoints),
        per_device_train_batch_size=1 if packed else t.per_device_batch_size * replies,
        per_device_eval_batch_size=1 if packed else t.per_device_batch_size * replies,
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
        ddp_find_unused_parameters=False,
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


def load_for_training(settings: TrainSettings) -> tuple[Any, int, bool]:
    """The base model with its LoRA adapter, ready to train: (model, decoder layers compiled, whether rank 0 alone
    read the weights and the other ranks receive them from it when FSDP shards the model)."""

    from .model import add_lora, give_trainable_storage, load_model
    from .moments import reached

    reached("load-model", settings)
    from_rank0 = loads_from_rank0(settings)
    reads = rank() == 0 or not from_rank0
    model = add_lora(load_model(settings.model, weights=reads), settings.lora, settings.training.seed)
    if not reads:
        give_trainable_storage(model)
    if from_rank0:
        log("FSDP: rank 0 read the base model; the other ranks built it on the meta device and receive their shards "
            "from rank 0")  # fmt: skip
    if rank() == 0:
        model.print_trainable_parameters()
    compiled = compile_layers_for_training(model, settings) if use_compiled_layers(settings) else 0
    reached("model-loaded", model)
    return model, compiled, from_rank0
