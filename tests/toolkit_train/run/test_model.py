"""toolkit_train/run/model.py: LoRA's input cast under autocast (#48's lever), on CPU's bf16 autocast."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")


class _Attention(torch.nn.Module):
    """Projections named as gpt-oss's, bf16 like a loaded base model."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(64, 64)
        self.o_proj = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.o_proj(torch.relu(self.q_proj(x)))


def _lora(skip: bool):
    from toolkit_train.run.model import skip_input_casts_under_autocast

    torch.manual_seed(0)
    base = _Attention().to(torch.bfloat16)
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "o_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base, config)  # adapters upcast to fp32, as in training
    return skip_input_casts_under_autocast(model) if skip else model


def _loss_and_grads(model, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().square().mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    return loss.detach(), grads


def _copies(model, x) -> int:
    """Dtype conversions of activation size in one forward + backward (adapter weights are smaller)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and args[0].numel() >= x.numel():
                Count.n += 1
            return out

    with Count():
        _loss_and_grads(model, x)
    return Count.n


def test_lora_under_autocast_skips_the_input_round_trip_with_the_same_loss_and_gradients():
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    peft_loss, peft_grads = _loss_and_grads(_lora(skip=False), x)
    loss, grads = _loss_and_grads(_lora(skip=True), x)
    assert torch.equal(loss, peft_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, peft_grads, strict=True))
    assert _copies(_lora(skip=True), x) < _copies(_lora(skip=False), x)


def test_lora_without_autocast_still_casts_its_input():
    """bf16 activations and fp32 adapters meet in fp32, as peft does: no dtype error outside autocast (merges,
    generation)."""
    model = _lora(skip=True)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert model(x).dtype == torch.bfloat16


def _tiny_gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_local_experts=2,
                          num_experts_per_tok=1, layer_types=["full_attention"])  # fmt: skip
    return GptOssForCausalLM(config)


def test_add_lora_and_load_adapter_install_it(tmp_path):
    from toolkit_train.run.model import add_lora, load_adapter
    from toolkit_train.settings import LoraSettings

    model = add_lora(_tiny_gpt_oss(), LoraSettings(r=8, alpha=16), seed=0)
    layers = [m for m in model.modules() if isinstance(m, peft.tuners.lora.Linear)]
    assert layers and all("_cast_input_dtype" in vars(m) for m in layers)
    model.save_pretrained(tmp_path)
    loaded = load_adapter(_tiny_gpt_oss(), tmp_path)
    layers = [m for m in loaded.modules() if isinstance(m, peft.tuners.lora.Linear)]
    assert layers and all("_cast_input_dtype" in vars(m) for m in layers)
