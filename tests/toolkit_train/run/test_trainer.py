"""What the trainer builder decides from the settings (toolkit_train/run/trainer.py)."""

from __future__ import annotations

import pytest
import torch
from toolkit_train.kernels import mxfp4
from toolkit_train.run import model as model_module
from toolkit_train.run import trainer

from toolkit.config import load_config

MXFP4 = ["model.id=builtin:tiny-gpt-oss-mxfp4", "model.experts=mxfp4", "lora.target_parameters=[]"]
BF16 = ["lora.target_parameters=[]"]


@pytest.mark.parametrize(
    ("overrides", "compiled"),
    [
        ([*MXFP4, "training.gradient_checkpointing=true"], True),  # the mxfp4-compiled-gate's case, recomputation
        ([*MXFP4, "training.gradient_checkpointing=false"], True),  # and without
        ([*MXFP4[:2], "training.gradient_checkpointing=true"], False),  # expert LoRA: no gate covers it
        ([*MXFP4, "training.packing=false"], False),  # unpacked micro-batches: shapes change every step
        ([*BF16, "training.gradient_checkpointing=false"], True),  # the bf16 gate's case
        ([*BF16, "training.gradient_checkpointing=true"], False),  # whole layers under recomputation: not gated
    ],
)
def test_compile_layers_auto_compiles_only_what_a_gate_checked(monkeypatch, overrides, compiled):
    """training.compile_layers: auto on a GPU (stood in for: this machine has none) turns compilation on exactly for
    the combinations the bench's correctness gates compare against eager gradients (docs/performance.md)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    settings = load_config("tiny-gpt-oss-local", overrides).train_settings()
    assert trainer.use_compiled_layers(settings) is compiled


@pytest.mark.parametrize("preset", ["tiny-qwen3-local", "tiny-qwen3-moe-local"])
def test_compile_layers_auto_leaves_a_family_no_gate_measured_eager(monkeypatch, preset):
    """The gates build gpt-oss models: Qwen3 (dense or MoE) in the gated combination stays eager unless asked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gated = ["training.gradient_checkpointing=false", "lora.target_parameters=[]"]
    assert trainer.use_compiled_layers(load_config(preset, gated).train_settings()) is False
    asked = load_config(preset, [*gated, "training.compile_layers=true"]).train_settings()
    assert trainer.use_compiled_layers(asked) is True


@pytest.mark.parametrize(("experts", "compiles"), [("mxfp4", "packed"), ("bf16", "whole")])
def test_packed_experts_compile_their_attention_and_router_not_the_whole_layer(monkeypatch, experts, compiles):
    """Whole layers with packed experts would put recomputation's checkpoint and a graph break at the experts'
    autograd function inside the compiled region: the packed path compiles the attention blocks and routers."""
    called = []
    monkeypatch.setattr(mxfp4, "compile_packed_layers", lambda model: called.append("packed") or 2)
    monkeypatch.setattr(model_module, "compile_decoder_layers", lambda model: called.append("whole") or 2)
    overrides = MXFP4 if experts == "mxfp4" else BF16
    settings = load_config("tiny-gpt-oss-local", overrides).train_settings()
    assert trainer.compile_layers_for_training(object(), settings) == 2
    assert called == [compiles]


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("tiny-gpt-oss-local", ["training.packing=false"]),  # SFT, TRL's collator
        ("tiny-gpt-oss-dpo", []),  # DPO: TRL pads the pairs (packed ones are padded in packing.pairs_packed)
        ("tiny-gpt-oss-grpo", []),  # GRPO: TRL pads the prompts before sampling and the replies after
    ],
)
def test_under_flex_attention_every_unpacked_sequence_is_padded_to_a_length_flex_compiles(preset, overrides):
    """Compiled flex_attention failed to lower at lengths 65-127 off a power of two (torch 2.11, H100: the tiny GRPO
    preset's learning row could not run with it); `auto` is flex on every GPU. TRL's collators pad to a multiple of
    packing.FLEX_LENGTH_MULTIPLE under flex, and not at all under eager (no padding computed for nothing)."""
    import trl
    from toolkit_train.kernels.packing import FLEX_LENGTH_MULTIPLE
    from toolkit_train.layout import Paths

    padded = {}
    for kernel in ("flex_attention", "eager"):
        settings = load_config(preset, [*overrides, f"model.attn_implementation={kernel}"]).train_settings()
        config_class = settings.training.method_record.trl_config
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(trl, config_class, lambda **kwargs: kwargs)
            padded[kernel] = trainer.trainer_args(settings, Paths(*[None] * 5)).get("pad_to_multiple_of")  # type: ignore[arg-type]
    assert padded == {"flex_attention": FLEX_LENGTH_MULTIPLE, "eager": None}
