"""model.experts: mxfp4 -- gpt-oss experts kept packed and dequantized per layer on the fly -- computes exactly what
the dequantized-at-load model computes, trains through the real entrypoint, and merges back to the checkpoint's own
MXFP4 form. CPU here (eager dequantization); the GPU bench's mxfp4 gate checks the compiled kernel."""

from __future__ import annotations

import json

import pytest
import torch
from toolkit_train import mxfp4
from toolkit_train.model import add_lora, load_model, resolve_model_path
from toolkit_train.settings import LoraSettings, ModelSettings

from tests.toolkit_train.helpers import lay_out, losses, run_entrypoint

TINY_MXFP4 = "builtin:tiny-gpt-oss-mxfp4"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantization_equals_transformers_reference(dtype):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 8, 4, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(100, 140, (3, 8, 4), dtype=torch.uint8, generator=generator)
    reference = convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # [E, in, out]
    assert torch.equal(mxfp4.dequantize(blocks, scales, dtype).transpose(1, 2), reference)


def _loss_logits_grads(settings: ModelSettings, ids: torch.Tensor, checkpointing: bool = False):
    model = add_lora(load_model(settings), LoraSettings(dropout=0.0), seed=0)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.05, generator=torch.Generator().manual_seed(7))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    return out.loss.detach(), out.logits.detach(), grads, model


def test_packed_experts_give_the_dequantized_models_logits_and_lora_gradients():
    ids = torch.randint(0, 1000, (2, 40), generator=torch.Generator().manual_seed(3))
    loss, logits, grads, model = _loss_logits_grads(ModelSettings(id=TINY_MXFP4, dtype="float32", experts="mxfp4"), ids)
    ref_loss, ref_logits, ref_grads, ref_model = _loss_logits_grads(ModelSettings(id=TINY_MXFP4, dtype="float32"), ids)
    assert isinstance(model.get_base_model().model.layers[0].mlp.experts, mxfp4.Mxfp4Experts)
    assert torch.equal(loss, ref_loss) and torch.equal(logits, ref_logits)
    assert grads.keys() == ref_grads.keys() and all(torch.equal(grads[n], ref_grads[n]) for n in grads)

    def expert_bytes(m):
        weights = [t for k, t in m.state_dict().items() if ".experts." in k and "_bias" not in k]
        return sum(t.numel() * t.element_size() for t in weights)

    # expert weights: 4.25 bits each against bf16's 16 (fp32 here: 32) -- what lets gpt-oss-120b fit one GPU
    assert expert_bytes(ref_model) / expert_bytes(model) > 7


@pytest.mark.parametrize(("checkpointing", "expected"), [(True, 8), (False, 8)])
def test_backward_reuses_the_weights_a_recomputed_forward_just_dequantized(monkeypatch, checkpointing, expected):
    """Tiny model: 2 layers x 2 projections. With recomputation each layer's backward follows its recomputed
    forward: 4 (forward) + 4 (recompute) + 0 (backward). Without: 4 + 4 (the first forward keeps nothing)."""
    calls = []
    real = mxfp4.dequantize
    monkeypatch.setattr(mxfp4, "dequantize", lambda *a: calls.append(1) or real(*a))
    ids = torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(1))
    _loss_logits_grads(ModelSettings(id=TINY_MXFP4, dtype="float32", experts="mxfp4"), ids, checkpointing)
    assert len(calls) == expected
    assert not mxfp4._LAST_FORWARD  # nothing held once backward is done


@pytest.mark.parametrize("checkpointing", [True, False])
def test_a_layer_dequantizes_only_after_other_layers_weights_are_dropped(monkeypatch, checkpointing):
    """What bounds 120b's peak memory: while a layer dequantizes a projection, the only other dequantized weights
    alive are its own other projection's (gate_up's while down is decoded), never the previous layer's too."""
    held_while_decoding = []
    real = mxfp4.dequantize

    def counting(*args):
        held_while_decoding.append(len(mxfp4._LAST_FORWARD))
        return real(*args)

    monkeypatch.setattr(mxfp4, "dequantize", counting)
    ids = torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(1))
    _loss_logits_grads(ModelSettings(id=TINY_MXFP4, dtype="float32", experts="mxfp4"), ids, checkpointing)
    assert held_while_decoding and max(held_while_decoding) <= 1


@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_first_forward_keeps_no_dequantized_weights_into_the_loss(checkpointing):
    """120b's step peaks in the loss, after the last layer: dequantized weights held there are 6.4 GB more."""
    model = add_lora(load_model(ModelSettings(id=TINY_MXFP4, dtype="float32", experts="mxfp4")), LoraSettings(), 0)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=ids, labels=ids)
    assert out.loss.requires_grad and not mxfp4._LAST_FORWARD


def test_entrypoint_trains_packed_experts_and_merges_them_as_mxfp4(tmp_path):
    from peft import PeftModel
    from safetensors import safe_open
    from toolkit_train.tiny_model import tiny_gpt_oss_path
    from transformers import AutoModelForCausalLM, Mxfp4Config

    overrides = [f"model.id={TINY_MXFP4}", "model.experts=mxfp4", "lora.target_parameters=[]", "training.max_steps=3"]
    root = lay_out(tmp_path, overrides)
    result = run_entrypoint(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(losses(result.stdout)) == 3

    merged = root / "model" / "merged"
    assert json.loads((merged / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"
    with safe_open(str(merged / "model.safetensors"), "pt") as tensors:
        blocks = tensors.get_tensor("model.layers.0.mlp.experts.gate_up_proj_blocks")
        assert blocks.dtype == torch.uint8 and "model.layers.0.mlp.experts.gate_up_proj" not in tensors.keys()  # noqa: SIM118
    # what transformers (and so vLLM's loader) reads from it: the base's experts with the trained attention LoRA
    base = AutoModelForCausalLM.from_pretrained(
        tiny_gpt_oss_path(mxfp4=True), dtype=torch.float32, quantization_config=Mxfp4Config(dequantize=True)
    )
    ids = torch.tensor([[5, 17, 42, 99, 7, 300]])
    with torch.no_grad():
        expected = PeftModel.from_pretrained(base, root / "model" / "adapter").eval()(input_ids=ids).logits
        reloaded = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)


def test_packed_experts_on_an_unquantized_checkpoint_fail_with_what_to_do(tmp_path, tiny_model_path):
    root = lay_out(tmp_path, [f"model.id={tiny_model_path}", "model.experts=mxfp4", "lora.target_parameters=[]"])
    result = run_entrypoint(root)
    assert result.returncode == 1
    assert "model.experts: mxfp4 needs an MXFP4 checkpoint" in result.stderr
    assert "set model.experts: bf16" in (root / "output" / "failure").read_text()


MEASURE_LOAD = """
import sys, threading, time, torch, safetensors.torch
from transformers import AutoConfig, AutoModelForCausalLM, Mxfp4Config
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.integrations import mxfp4
from toolkit_train.mxfp4 import load_packed

def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

peak, done = [anon_kib()], []
def sample():
    while not done:
        peak.append(anon_kib()); time.sleep(0.002)
threading.Thread(target=sample, daemon=True).start()
before = anon_kib()
if sys.argv[2] == "packed":
    model = load_packed(sys.argv[1], torch.bfloat16, "cpu", "eager")
else:
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16,
                                                 quantization_config=Mxfp4Config(dequantize=True))
done.append(1); peak.append(anon_kib())  # the loaded state itself, however the sampler was scheduled
held = sum(t.numel() * t.element_size() for t in model.state_dict().values()) // 1024
print(max(peak) - before, held)
"""


def test_packed_loading_holds_one_copy_of_the_packed_model(tmp_path):
    """Host memory while loading a shape-scaled gpt-oss MXFP4 checkpoint (8 layers, 32 experts, ~60 MB packed,
    ~230 MB in bf16), measured as peak anonymous memory in a fresh process. On CPU the model itself lives in host
    memory, so a streaming load peaks at about the model's packed size; on a GPU those bytes go to the device and
    a rank's host memory is one tensor at a time. transformers' dequantizing load needs the bf16 experts."""
    import subprocess
    import sys

    from toolkit_train.tiny_model import _save_mxfp4
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(hidden_size=512, intermediate_size=512, num_hidden_layers=8, num_attention_heads=8,
                          num_key_value_heads=2, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                          vocab_size=2048, tie_word_embeddings=False)  # fmt: skip
    checkpoint = tmp_path / "gpt-oss-scaled"
    checkpoint.mkdir()
    _save_mxfp4(GptOssForCausalLM(config).to(torch.bfloat16), checkpoint)
    measured = {}
    for way in ("packed", "dequantized"):
        done = subprocess.run([sys.executable, "-c", MEASURE_LOAD, str(checkpoint), way], capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        peak_kib, held_kib = map(int, done.stdout.split()[-2:])
        measured[way] = (peak_kib, held_kib)
    print("peak / held KiB:", measured)  # shown with pytest -s
    (packed_peak, packed_held), (bf16_peak, bf16_held) = measured["packed"], measured["dequantized"]
    assert bf16_held > 3 * packed_held  # the experts: 4.25 bits against 16
    assert packed_peak < 1.2 * packed_held + 8 * 1024, measured  # no second copy, no bf16 experts on the way
    assert bf16_peak > 2.5 * packed_peak, measured


def test_a_local_checkpoint_is_recognised_by_its_config_not_its_name(tmp_path):
    """A copy of a gpt-oss checkpoint on FSx or a local disk need not be named gpt-oss: its config.json decides.
    A path that is not on this machine (a cluster's /fsx) is left to the job's load; another architecture here is
    refused with what to do."""
    from pydantic import ValidationError
    from toolkit_train.settings import TrainSettings

    def settings(model_id: str) -> TrainSettings:
        return TrainSettings.model_validate(
            {"model": {"id": model_id, "experts": "mxfp4", "dtype": "float32"},
             "data": {"source": "builtin:multilingual-thinking-sample"}, "lora": {"target_parameters": []}}
        )  # fmt: skip

    base = tmp_path / "base"
    base.symlink_to(resolve_model_path(ModelSettings(id=TINY_MXFP4)))
    local = settings(str(base))
    assert local.model.is_gpt_oss
    experts = load_model(local.model).model.layers[0].mlp.experts
    assert isinstance(experts, mxfp4.Mxfp4Experts)
    assert settings("/fsx/models/base").model.id == "/fsx/models/base"  # not here: checked where the job runs
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValidationError, match="model.experts: mxfp4 is for gpt-oss MXFP4 checkpoints"):
        settings(str(other))
