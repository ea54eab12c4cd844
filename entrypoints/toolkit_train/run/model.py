"""Model side of training: load the base model (MXFP4 dequantized for gpt-oss), add LoRA, export."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..settings import (
    BUILTIN_MODELS,
    TINY_GENERIC,
    TINY_GPT_OSS_MXFP4,
    TINY_GPT_OSS_TOOLS,
    TINY_QWEN3,
    TINY_QWEN3_MOE,
    LoraSettings,
    ModelSettings,
)


def resolve_model_path(settings: ModelSettings) -> str:
    """Hub id or local path; builtin models are built (once, cached) on the spot."""
    if settings.id in (TINY_QWEN3, TINY_QWEN3_MOE):
        from ..builtin.tiny_qwen3 import tiny_qwen3_path

        return str(tiny_qwen3_path(moe=settings.id == TINY_QWEN3_MOE))
    if settings.id in TINY_GENERIC:
        from ..builtin.tiny_generic import tiny_generic_path

        return str(tiny_generic_path(settings.id))
    if settings.id in BUILTIN_MODELS:
        from ..builtin.tiny_model import tiny_gpt_oss_path

        return str(tiny_gpt_oss_path(mxfp4=settings.id == TINY_GPT_OSS_MXFP4, tools=settings.id == TINY_GPT_OSS_TOOLS))
    missing = settings.missing_here()
    if missing:
        raise ValueError(missing)
    return str(Path(settings.id).expanduser()) if settings.is_path else settings.id


def compute_dtype(settings: ModelSettings):
    import torch

    if settings.dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, settings.dtype)


def is_mxfp4_checkpoint(path: str, revision: str | None = None) -> bool:
    """True for checkpoints stored in MXFP4 (openai/gpt-oss-*): their experts must be dequantized."""
    from transformers import AutoConfig

    quant = getattr(AutoConfig.from_pretrained(path, revision=revision), "quantization_config", None) or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    return str(method).lower().endswith("mxfp4")


def attention_implementation(settings: ModelSettings) -> str:
    import torch

    if settings.attn_implementation == "auto":
        return "flex_attention" if torch.cuda.is_available() else "eager"
    return settings.attn_implementation


def load_tokenizer(settings: ModelSettings):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(settings), revision=settings.revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(settings: ModelSettings, device_map: str | dict | None = None, *, weights: bool = True):
    """The base model in the compute dtype; MXFP4 experts are dequantized so LoRA can train on them, or kept
    packed (`model.experts: mxfp4`). weights=False: the architecture alone, no checkpoint file read
    (`empty_model`)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(settings)
    if settings.experts == "mxfp4":
        return load_packed_model(settings, path)
    kwargs = _build_kwargs(settings)
    if not weights:
        return empty_model(settings, path, kwargs)
    kwargs["revision"] = settings.revision
    if device_map is not None:
        kwargs["device_map"] = device_map
    if settings.dequantize_mxfp4 and is_mxfp4_checkpoint(path, settings.revision):
        from transformers.utils.quantization_config import Mxfp4Config

        kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.config.use_cache = False  # training: the KV cache only costs memory
    return model


def _build_kwargs(settings: ModelSettings) -> dict:
    kwargs: dict = {"dtype": compute_dtype(settings), "attn_implementation": attention_implementation(settings)}
    if settings.family.fused_experts:
        from ..kernels.moe import register

        register()
        kwargs["experts_implementation"] = settings.experts_implementation
    return kwargs


def give_trainable_storage(model) -> int:
    """Give a meta-built model's trainable parameters (the LoRA weights: small) CPU storage; the frozen base stays
    on meta. Why: the Trainer builds the optimizer before FSDP2 shards the model, and accelerate's _prepare_fsdp2
    then maps each optimizer parameter to its shard by `data_ptr()`, which is 0 for every meta tensor: all of them
    would map to one shard, the other LoRA shards of that rank never step and its optimizer state lacks them (the
    sharded checkpoint save fails). Their values do not matter: FSDP broadcasts rank 0's into the shards.
    Returns how many parameters it gave storage to."""
    import torch

    given = 0
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.requires_grad and param.is_meta:
                real = torch.nn.Parameter(torch.zeros_like(param, device="cpu"), requires_grad=True)
                module.register_parameter(name, real)
                given += 1
    return given


def empty_model(settings: ModelSettings, path: str, kwargs: dict):
    """The model `load_model` would load, built on the meta device from the checkpoint's config alone: no weight
    file is read and no host memory is taken for the weights. For the FSDP ranks that receive their shards from
    rank 0 (train.reads_checkpoint): accelerate's `cpu_ram_efficient_loading` shards the meta model and broadcasts
    rank 0's tensors into the shards. What no checkpoint holds and FSDP does not broadcast, the non-persistent
    buffers (gpt-oss's rotary inv_freq), would stay on meta: they are given CPU storage and computed by transformers'
    own initializer for their modules (`_init_weights`, the way from_pretrained fills them after its meta build)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, revision=settings.revision)
    quantized = getattr(config, "quantization_config", None) is not None
    if quantized and settings.dequantize_mxfp4 and is_mxfp4_checkpoint(path, settings.revision):
        del config.quantization_config  # rank 0 dequantizes the experts: plain bf16 experts, as built here
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    owners: set[str] = set()
    for name, buffer in list(model.named_non_persistent_buffers()):
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner).register_buffer(leaf, torch.empty_like(buffer, device="cpu"), persistent=False)
        owners.add(owner)
    with torch.no_grad():
        for owner in sorted(owners):
            model._init_weights(model.get_submodule(owner))
    left = sorted(name for name, buffer in model.named_non_persistent_buffers() if buffer.is_meta)
    if left:
        raise RuntimeError(f"non-persistent buffers left on the meta device: {', '.join(left[:3])}")
    model.config.use_cache = False
    return model


def model_signature(model) -> list[tuple[str, tuple[int, ...], str]]:
    """Every state_dict entry in order, with shape and dtype: what FSDP's rank-0 broadcast pairs tensor by tensor
    (a rank whose model differs would receive another tensor's bytes, or hang)."""
    return [(name, tuple(t.shape), str(t.dtype)) for name, t in model.state_dict().items()]


def load_packed_model(settings: ModelSettings, path: str):
    """gpt-oss with MXFP4 experts kept packed, streamed to this process's GPU (CPU without one)."""
    import os

    import torch

    from ..kernels.mxfp4 import load_packed

    if not is_mxfp4_checkpoint(path, settings.revision):
        raise ValueError(
            f"model.experts: mxfp4 needs an MXFP4 checkpoint (openai/gpt-oss-*); {settings.id} stores its experts "
            "unquantized: set model.experts: bf16"
        )
    local = Path(path) if Path(path).is_dir() else _snapshot(path, settings.revision)
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if torch.cuda.is_available() else "cpu"
    model = load_packed(str(local), compute_dtype(settings), device, attention_implementation(settings))
    model.config.use_cache = False
    return model


def _snapshot(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, revision=revision, allow_patterns=["*.json", "*.safetensors"]))


def compile_decoder_layers(model) -> int:
    """torch.compile every decoder layer in place (the LoRA-wrapped projections inside it too); returns how many.
    Layer by layer, not the whole model: each layer compiles once and is reused, and graph breaks stay local."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = base.model.layers
    for layer in layers:
        layer.compile()
    return len(layers)


def lora_config(settings: LoraSettings):
    from peft import LoraConfig

    rank_pattern, alpha_pattern = settings.rank_patterns()
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        target_parameters=settings.target_parameters or None,
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        task_type="CAUSAL_LM",
        bias="none",
    )


def add_lora(model, settings: LoraSettings, seed: int):
    """Wrap with PEFT; seeded so every rank (and every resume) starts from the same adapter."""
    from peft import get_peft_model
    from transformers import set_seed

    set_seed(seed)
    config = lora_config(settings)
    with packed_experts_as_targets(model, config):
        return skip_input_casts_under_autocast(get_peft_model(model, config))


def load_adapter(base, adapter_dir: Path | str):
    """A saved adapter on its base model (packed MXFP4 experts too)."""
    from peft import PeftConfig, PeftModel

    config = PeftConfig.from_pretrained(str(adapter_dir))
    with packed_experts_as_targets(base, config):
        return skip_input_casts_under_autocast(PeftModel.from_pretrained(base, str(adapter_dir), config=config))


def skip_input_casts_under_autocast(peft_model):
    """peft casts each LoRA layer's input to the adapter's dtype (fp32) before lora_A; under bf16 autocast lora_A
    casts it straight back, so the bf16 -> fp32 -> bf16 round trip (exact) only costs two copies of the activations
    per projection, forward and backward: ~90 ms of a 2.0 s 120b step (measured: docs/performance.md, #48). Under
    autocast this skips it: the same values reach the same kernels (with lora.dropout > 0 the mask is drawn on the
    bf16 input instead: the same distribution, not the same draw). Without autocast peft's cast runs as before (a
    bf16 input and fp32 weights must meet in one dtype). bench/train_throughput.py's -peft-cast variants undo it
    by removing the instance attribute set here. Returns the model."""
    import torch
    from peft.tuners.lora import Linear

    for module in peft_model.modules():
        if isinstance(module, Linear):
            peft_cast = module._cast_input_dtype

            def cast(x, dtype, peft_cast=peft_cast):
                return x if torch.is_autocast_enabled(x.device.type) else peft_cast(x, dtype)

            vars(module)["_cast_input_dtype"] = cast  # this instance only: peft's class is left as it is
    return peft_model


@contextlib.contextmanager
def packed_experts_as_targets(model, config):
    """Expert LoRA on packed MXFP4 experts: peft wraps them with kernels/mxfp4_lora.py's PackedExpertLora."""
    from ..kernels.mxfp4 import Mxfp4Experts

    if not config.target_parameters or not any(isinstance(m, Mxfp4Experts) for m in model.modules()):
        yield
        return
    from ..kernels.mxfp4_lora import register, targets_visible

    register(config)
    with targets_visible(model):
        yield


def save_merged(peft_model, tokenizer, out: Path) -> None:
    """Merge the adapter into the base weights and save plain safetensors that reload as-is.

    `save_original_format=False`: a model loaded through MXFP4 dequantization would otherwise write
    bf16 experts under the MXFP4 names, which transformers silently re-initialises on reload.
    """
    from ..kernels.mxfp4 import Mxfp4Experts

    merged = peft_model.merge_and_unload()
    packed = any(isinstance(module, Mxfp4Experts) for module in merged.modules())
    if packed:
        from ..kernels.mxfp4_lora import merge_report

        for name, seen in merge_report(merged).items():  # what requantizing the merged experts cost (README)
            print(f"[toolkit] merged expert LoRA into MXFP4 {name}: requantization kept >= {seen['kept_min']:.1%} "
                  f"of the update (error <= {seen['error_max']:.1%} of it); serve the adapter to keep all of it",
                  flush=True)  # fmt: skip
    if not packed and getattr(merged.config, "quantization_config", None) is not None:
        del merged.config.quantization_config  # the experts were dequantized: saved as bf16
    merged.config.use_cache = True
    # packed experts (model.experts: mxfp4) are saved as they were loaded: MXFP4 blocks + scales, config unchanged
    merged.save_pretrained(out, safe_serialization=True, save_original_format=False)
    tokenizer.save_pretrained(out)
