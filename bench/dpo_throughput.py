"""DPO training throughput on one GPU (#46): plain TRL DPOTrainer with its defaults against the toolkit's trainer path,
same model shape, same pairs, in one run, behind a correctness gate.

  trl      TRL's DPOTrainer as its docs use it with LoRA: the base model (bf16, transformers' defaults: eager
           attention, grouped_mm experts, the experts dequantized to bf16) and `peft_config` (LoRA r8/alpha16 on
           q/k/v/o), no ref_model: the reference is the base with the adapter disabled. DPOConfig's defaults
           (bf16, gradient checkpointing, max_length 1024, beta 0.1, sigmoid loss) but for the batch size and steps.
           (Handed a PeftModel instead, TRL 1.16 adds a frozen "ref" copy of the adapter as the reference:
           toolkit_train/trainers/dpo.py, preference_trainer_class.)
  toolkit  entrypoints/toolkit_train/run/trainer.py as the entrypoint runs training.method dpo: load_for_training
           (model.experts mxfp4: the experts stay packed; attention auto = flex on GPU; gradient checkpointing auto;
           compile_layers auto, which compiles nothing for DPO; training.packing: each step's replies one packed row,
           no padding) and build_trainer (its
           PreferenceTrainer: DPOTrainer on the pairs' token ids, reference = the base with the adapter off).

Model: gpt-oss-20b's exact shape with random weights (bench/train_throughput.py's build_packed_model: random e2m1
codes and scales), written once as an MXFP4 checkpoint with gpt-oss's tokenizer (offline) for the toolkit to load;
TRL's model holds the same weights with the experts dequantized. Pairs: synthetic text of whole-word tokens (fixed
seed; prompt ~200 tokens, chosen and rejected ~400 each), tokenized by TRL; the toolkit gets TRL's token ids, so both
sides train on identical batches. tokens/s counts prompt + chosen + rejected tokens of a step's pairs (the prompt
once; `processed_tokens_per_s` counts it twice, as the concatenated forward does), median over the steps after the
warmup; peak memory is torch.cuda.max_memory_allocated over each side's training.

Gate, first: the same shape with 2 layers, fp32 (TF32 off), one step of each side on the same pairs and the same LoRA
start (the toolkit's seeded init, lora_B drawn away from zero so that the reference matters): loss within 1e-5
relative, rewards within 1e-4 relative (reported), LoRA gradients within 1e-4 relative (reported).

  python bench/dpo_throughput.py [--layers N] [--batch B] [--steps S] [--budget-s 470]
  python bench/dpo_throughput.py --tiny          # CPU smoke test of this script (tiny layers)
  python bench/dpo_throughput.py --variants toolkit-unpacked,toolkit --no-gate --name dpo_throughput_1gpu_packing
                                                 # the packing lever alone: the toolkit with training.packing off/on
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "entrypoints"))  # the training package, from a checkout
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch
import train_throughput as tt
from common import report

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
GATE = {"loss_rel": 1e-5, "rewards_rel": 1e-4, "grad_rel": 1e-4}


def cuda() -> bool:
    return torch.cuda.is_available()


def sync() -> None:
    if cuda():
        torch.cuda.synchronize()


def shape(tiny: bool, layers: int | None, size: str):
    config = tt.gpt_oss_config(tiny, layers=layers, size=size)
    config.vocab_size = 201088  # gpt-oss's tokenizer (the tiny shape's 1024 would not hold its ids)
    return config


def write_checkpoint(out: Path, config, device: str):
    """The packed model (random weights), saved as a gpt-oss MXFP4 checkpoint with gpt-oss's tokenizer; returns it."""
    from safetensors.torch import save_file
    from toolkit_train.builtin.tiny_model import build_tokenizer
    from toolkit_train.kernels.mxfp4 import QUANTIZATION_CONFIG

    packed = tt.build_packed_model(config, device, "eager")
    state = {key: value.detach().cpu().contiguous() for key, value in packed.state_dict().items()}
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    del state
    saved = config.__class__.from_dict(config.to_dict())
    saved.quantization_config = QUANTIZATION_CONFIG
    saved.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    return packed


def plain_model(packed, config, device: str, dtype, experts: str):
    """transformers' GptOssForCausalLM with the packed model's weights, experts dequantized; eager attention."""
    from toolkit_train.kernels.mxfp4 import Mxfp4Experts

    model = tt.build_model(config.__class__.from_dict(config.to_dict()), device, dtype, "eager", experts)
    state = {k: v for k, v in packed.state_dict().items() if "_blocks" not in k and "_scales" not in k}
    missing = model.load_state_dict(state, strict=False).missing_keys
    assert all(".experts." in k for k in missing), missing
    for mine, theirs in zip(model.model.layers, packed.model.layers, strict=True):
        source = theirs.mlp.experts
        assert isinstance(source, Mxfp4Experts)
        with torch.no_grad():
            mine.mlp.experts.gate_up_proj.copy_(source.dequantized("gate_up_proj", dtype))
            mine.mlp.experts.down_proj.copy_(source.dequantized("down_proj", dtype))
    return model.to(dtype)


def synthetic_pairs(tokenizer, n: int, prompt: int, reply: int, seed: int, sigma: float = 0.0):
    """Text pairs of whole-word tokens (" word": one token each, so the lengths land near the targets).
    `sigma` > 0: each prompt, chosen and rejected length is the target x exp(N(0, sigma)), clipped to [1/8, 1.5] x
    the target (so prompt + reply stays under DPOConfig's max_length 1024 at the default targets): varied-length
    pairs, where padding to a batch's longest costs the unpacked path. The lengths come from a generator of their
    own, so sigma 0 draws exactly the words it drew before."""
    import datasets

    words = []
    for token in range(1000, 60000):
        text = tokenizer.decode([token])
        if len(text) > 3 and text[0] == " " and text[1:].isascii() and text[1:].isalpha() and text[1:].islower():
            words.append(text)
    rng = random.Random(seed)

    def sample(k: int) -> str:
        return "".join(rng.choice(words) for _ in range(k))

    lengths = random.Random(seed + 1000)

    def length(target: int) -> int:
        if sigma <= 0:
            return target
        drawn = round(target * math.exp(lengths.gauss(0.0, sigma)))
        return max(max(1, target // 8), min(int(target * 1.5), drawn))

    rows = [{"prompt": sample(length(prompt)), "chosen": sample(length(reply)), "rejected": sample(length(reply))}
            for _ in range(n)]  # fmt: skip
    return datasets.Dataset.from_list(rows)


class Capture:
    """Per training step: the pairs' tokens, the loss, and (gate) the metrics and LoRA gradients."""

    def __init__(self, grads: bool):
        self.grads_wanted = grads
        self.tokens: list[tuple[int, int]] = []  # (prompt + chosen + rejected, tokens through the forward)
        self.losses: list[float] = []
        self.batches: list[dict] = []
        self.grads: dict = {}
        self.metrics: dict = {}

    def wrap(self, trainer_class: type) -> type:
        capture = self

        class Capturing(trainer_class):
            def training_step(self, model, inputs, num_items_in_batch=None):
                attention, completion = inputs["attention_mask"], inputs["completion_mask"]
                processed, replies = int(attention.sum()), int((attention * completion).sum())
                capture.tokens.append((replies + (processed - replies) // 2, processed))
                if capture.grads_wanted:
                    tensors = {k: v.detach().cpu().clone() for k, v in inputs.items() if torch.is_tensor(v)}
                    capture.batches.append(tensors)
                loss = super().training_step(model, inputs, num_items_in_batch)
                capture.losses.append(float(loss))
                if capture.grads_wanted:
                    capture.grads = {n: p.grad.detach().float().cpu().clone()
                                     for n, p in model.named_parameters() if p.requires_grad}  # fmt: skip
                    capture.metrics = {k: v[-1] for k, v in self._metrics["train"].items() if k.startswith("rewards/")}
                return loss

        return Capturing


def clock(deadline: float, least_steps: int):
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        """Step end times (device synchronized); stops training past the deadline once `least_steps` ran."""

        def __init__(self):
            self.start, self.ends = 0.0, []

        def on_train_begin(self, args, state, control, **kwargs):
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.ends.append(time.perf_counter())
            if time.perf_counter() > deadline and len(self.ends) >= least_steps:
                control.should_training_stop = True

        def steps(self) -> list[float]:
            edges = [self.start, *self.ends]
            return [b - a for a, b in itertools.pairwise(edges)]

    return Clock()


def trl_trainer(model, tokenizer, dataset, out: Path, batch: int, steps: int, fp32: bool, capture, callbacks):
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    extra = {"bf16": False} if fp32 or not cuda() else {}  # DPOConfig's default: bf16 (autocast), on CPU too
    args = DPOConfig(output_dir=str(out), per_device_train_batch_size=batch, max_steps=steps, report_to="none",
                     save_strategy="no", logging_steps=1, disable_tqdm=True, use_cpu=not cuda(), **extra)  # fmt: skip
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    return capture.wrap(DPOTrainer)(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                                    peft_config=lora, callbacks=callbacks)  # fmt: skip


def toolkit_settings(checkpoint: Path, batch: int, steps: int, fp32: bool):
    from toolkit_train.settings import TrainSettings

    return TrainSettings.model_validate(
        {
            "model": {"id": str(checkpoint), "experts": "mxfp4", "dtype": "float32" if fp32 else "auto"},
            "data": {"source": "builtin:preference-sample", "format": "preference", "max_length": 1024},
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": LORA_TARGETS},
            "training": {
                "method": "dpo",
                "max_steps": steps,
                "per_device_batch_size": batch,
                "save_steps": 0,
                "merge_adapter": False,
                "learning_rate": 1e-6,
            },
        }
    )


def toolkit_trainer(settings, tokenizer, ids, out: Path, capture, callbacks, start: dict | None = None):
    """load_for_training + build_trainer, as the entrypoint builds them; (trainer, compiled layers)."""
    from toolkit_train.layout import Paths
    from toolkit_train.run.trainer import load_for_training
    from toolkit_train.trainers import build_trainer

    model, compiled, _ = load_for_training(settings)
    if start is not None:
        start.update(off_identity(model))
    paths = Paths(root=out, model_dir=out / "model", checkpoints=out / "ckpt", train_channel=out, output_data=out)
    trainer = build_trainer(settings, paths, model, tokenizer, ids, callbacks=callbacks, subclass=capture.wrap)
    return trainer, compiled


def off_identity(model) -> dict:
    """lora_B drawn (seeded per tensor): the policy differs from the base, so the reference matters."""
    for name, parameter in sorted(model.named_parameters()):
        if "lora_B" in name:
            with torch.no_grad():
                drawn = torch.empty(parameter.shape).normal_(0.0, 0.05, generator=torch.Generator().manual_seed(7))
                parameter.copy_(drawn)  # drawn on the CPU: the same values whichever device holds the model
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def relative(a, b) -> float:
    return float((a - b).norm() / b.norm()) if b.norm() > 0 else float(a.norm())


def free() -> None:
    gc.collect()
    if cuda():
        torch.cuda.empty_cache()


def gate(args, scratch: Path, device: str) -> dict:
    """One step of each side in fp32 on a 2-layer model of the shape, same pairs, same LoRA start."""
    from toolkit_train.run.model import load_tokenizer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = shape(args.tiny, 2, args.size)
    checkpoint = scratch / "gate-model"
    packed = write_checkpoint(checkpoint, config, device)
    settings = toolkit_settings(checkpoint, args.gate_pairs, 1, fp32=True)
    tokenizer = load_tokenizer(settings.model)
    text = synthetic_pairs(tokenizer, args.gate_pairs, args.prompt // 2, args.reply // 2, seed=1)

    # the toolkit first: its seeded LoRA init (off the identity) is TRL's start too
    start: dict = {}
    ours = Capture(grads=True)
    plain = plain_model(packed, config, device, torch.float32, "eager")  # fp32: grouped_mm is bf16-only
    del packed
    theirs = Capture(grads=True)
    trl = trl_trainer(plain, tokenizer, text, scratch / "gate-trl", args.gate_pairs, 1, True, theirs, [])
    ids = trl.train_dataset.select_columns(["prompt_ids", "chosen_ids", "rejected_ids"])
    toolkit, _ = toolkit_trainer(settings, tokenizer, ids, scratch / "gate-toolkit", ours, [], start)
    with torch.no_grad():  # TRL's fresh adapter (peft's init) set to the toolkit's start
        theirs_params = dict(trl.model.named_parameters())
        assert set(start) == {n for n, p in theirs_params.items() if p.requires_grad}, "adapter names differ"
        for name, value in start.items():
            theirs_params[name].copy_(value)
    toolkit.train()
    del toolkit
    free()
    trl.train()
    del trl, plain
    free()
    same_batch = len(ours.batches) == len(theirs.batches) == 1 and all(
        torch.equal(ours.batches[0][k], theirs.batches[0][k]) for k in theirs.batches[0]
    )
    loss_rel = abs(ours.losses[0] - theirs.losses[0]) / abs(theirs.losses[0])
    rewards = {k: abs(ours.metrics[k] - v) / max(abs(v), 1e-12) for k, v in theirs.metrics.items()
               if k in ("rewards/chosen", "rewards/rejected")}  # fmt: skip
    grads = {n: relative(ours.grads[n], g) for n, g in theirs.grads.items()}
    result = {
        "model": f"{'tiny' if args.tiny else args.size} shape, 2 layers, fp32 (TF32 off)",
        "pairs": args.gate_pairs,
        "same_batch": same_batch,
        "loss_toolkit": ours.losses[0],
        "loss_trl": theirs.losses[0],
        "loss_rel_diff": loss_rel,
        "rewards_toolkit": ours.metrics,
        "rewards_trl": theirs.metrics,
        "rewards_rel_diff_max": max(rewards.values()),
        "lora_tensors": len(grads),
        "grad_rel_err_max": max(grads.values()),
        "bounds": GATE,
    }
    result["passed"] = bool(
        same_batch
        and ours.grads.keys() == theirs.grads.keys()
        and loss_rel <= GATE["loss_rel"]
        and result["rewards_rel_diff_max"] <= GATE["rewards_rel"]
        and result["grad_rel_err_max"] <= GATE["grad_rel"]
        and min(abs(v) for v in theirs.metrics.values() if v) > 0
    )
    torch.backends.cuda.matmul.allow_tf32 = True
    return result


def summary(capture: Capture, steps: list[float], warmup: int) -> dict:
    measured = list(range(warmup, min(len(steps), len(capture.tokens))))
    out: dict = {"steps_run": len(steps), "warmup_steps": warmup, "measured_steps": len(measured),
                 "step_s": [round(s, 3) for s in steps], "losses": [round(x, 5) for x in capture.losses]}  # fmt: skip
    if measured:
        pair_rates = [capture.tokens[i][0] / steps[i] for i in measured]
        processed = [capture.tokens[i][1] / steps[i] for i in measured]
        out |= {"tokens_per_s": round(statistics.median(pair_rates), 1),
                "processed_tokens_per_s": round(statistics.median(processed), 1),
                "median_step_s": round(statistics.median(steps[i] for i in measured), 3),
                # all measured steps' tokens over their summed time (with varied lengths steps differ in size)
                "mean_tokens_per_s": round(sum(capture.tokens[i][0] for i in measured)
                                           / sum(steps[i] for i in measured), 1),
                "pair_tokens_per_step": capture.tokens[measured[0]][0]}  # fmt: skip
    if cuda():
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def throughput(args, scratch: Path, device: str, deadline: float, results: dict, write) -> None:
    from toolkit_train.run.model import load_tokenizer

    config = shape(args.tiny, args.layers, args.size)
    checkpoint = scratch / "model"
    started = time.perf_counter()
    packed = write_checkpoint(checkpoint, config, device)
    results["checkpoint_s"] = round(time.perf_counter() - started, 1)
    settings = toolkit_settings(checkpoint, args.batch, args.steps, fp32=False)
    tokenizer = load_tokenizer(settings.model)
    text = synthetic_pairs(tokenizer, args.batch * args.steps, args.prompt, args.reply, seed=0, sigma=args.length_sigma)
    ids = None
    # each side gets half of what is left for its steps (TRL first: it tokenizes the pairs for both)
    for variant in args.variants:
        if time.perf_counter() > deadline - 20:
            results[variant] = {"error": "skipped: out of time budget"}
            continue
        share = (deadline - time.perf_counter()) / (2 if variant == "trl" and "toolkit" in args.variants else 1)
        capture, timer = Capture(grads=False), clock(time.perf_counter() + share - 30, args.warmup + 2)
        held = 0.0
        if cuda():
            torch.cuda.reset_peak_memory_stats()
            held = round(torch.cuda.memory_allocated() / 2**30, 2)  # what earlier variants left: 0 when all freed
        try:
            if variant == "trl":
                if packed is None:
                    raise RuntimeError("the packed model was released")
                plain = plain_model(packed, config, device, torch.bfloat16 if cuda() else torch.float32, "grouped_mm")
                packed = None
                free()
                trainer = trl_trainer(plain, tokenizer, text, scratch / "trl", args.batch, args.steps, False,
                                      capture, [timer])  # fmt: skip
                ids = trainer.train_dataset.select_columns(["prompt_ids", "chosen_ids", "rejected_ids"])
                base = trainer.model.get_base_model()
                info = {"attention": base.config._attn_implementation,
                        "experts": base.config._experts_implementation,
                        "gradient_checkpointing": trainer.args.gradient_checkpointing, "bf16": trainer.args.bf16,
                        "adapters": list(trainer.model.peft_config)}  # fmt: skip
            else:
                packed = None
                free()
                if ids is None:  # TRL's tokenization without its trainer (--variants toolkit)
                    from trl import DPOConfig, DPOTrainer

                    ids = DPOTrainer._prepare_dataset(
                        type("T", (), {"_tokenizer": tokenizer, "_is_vision_dataset": False})(),
                        text, tokenizer, DPOConfig(output_dir=str(scratch / "tok"), use_cpu=not cuda()), "train",
                    ).select_columns(["prompt_ids", "chosen_ids", "rejected_ids"])  # fmt: skip
                chosen = settings  # toolkit-unpacked: the same, training.packing off (TRL's padded batches)
                if variant == "toolkit-unpacked":
                    training = settings.training.model_copy(update={"packing": False})
                    chosen = settings.model_copy(update={"training": training})
                trainer, compiled = toolkit_trainer(chosen, tokenizer, ids, scratch / variant, capture, [timer])
                base = trainer.model.get_base_model()
                info = {"attention": base.config._attn_implementation, "experts": "mxfp4 (packed)",
                        "gradient_checkpointing": trainer.args.gradient_checkpointing, "bf16": trainer.args.bf16,
                        "compiled_layers": compiled, "adapters": list(trainer.model.peft_config),
                        "packing": chosen.training.packing}  # fmt: skip
            trainer.train()
            results[variant] = info | summary(capture, timer.steps(), args.warmup) | {"held_at_start_gib": held}
        except Exception as error:  # keep what the other side measured
            results[variant] = {"error": f"{type(error).__name__}: {error}"[:2000],
                                "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            if capture.tokens:
                results[variant] |= summary(capture, timer.steps(), args.warmup)
        print(f"[dpo] {variant}: {json.dumps({k: v for k, v in results[variant].items() if k != 'traceback'})}")
        # every reference to this variant's model goes (`base` kept a whole model alive: the next variant's peak
        # memory counted it, 6.9 GiB at 12 layers, whichever variant ran second)
        trainer = plain = base = None
        free()
        write()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny layers, a few short pairs")
    parser.add_argument("--size", choices=["20b", "120b"], default="20b")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers of the shape (default: all)")
    parser.add_argument("--batch", type=int, default=4, help="pairs per step (both sides)")
    parser.add_argument("--steps", type=int, default=12, help="at most this many steps per side")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the rates")
    parser.add_argument("--prompt", type=int, default=200, help="prompt tokens (about)")
    parser.add_argument("--reply", type=int, default=400, help="chosen and rejected tokens each (about)")
    parser.add_argument("--gate-pairs", type=int, default=2)
    parser.add_argument("--length-sigma", type=float, default=0.0,
                        help="varied lengths: each the target x exp(N(0, sigma)), clipped (0: fixed)")  # fmt: skip
    parser.add_argument("--variants", default="trl,toolkit")
    parser.add_argument("--no-gate", action="store_true")
    parser.add_argument("--budget-s", type=float, default=470, help="stop measuring and write the JSON by then")
    parser.add_argument("--name", default="dpo_throughput_1gpu")
    args = parser.parse_args()
    args.variants = args.variants.split(",")
    if args.tiny:
        args.layers, args.batch, args.steps, args.warmup, args.prompt, args.reply = 2, 2, 3, 1, 16, 32
        args.name = args.name if args.name != "dpo_throughput_1gpu" else "dpo_throughput_tiny"
    if args.size == "120b" and "trl" in args.variants:
        print("[dpo] 120b: TRL's bf16 model (~240 GB) cannot fit one GPU; toolkit only")
        args.variants = [v for v in args.variants if v != "trl"]
    deadline = time.perf_counter() + args.budget_s
    device = "cuda" if cuda() else "cpu"
    results: dict = {
        "command": " ".join(["python", *sys.argv]),
        "device": torch.cuda.get_device_name(0) if cuda() else "cpu",
        "shape": f"{'tiny' if args.tiny else 'gpt-oss-' + args.size} ({args.layers or 'all'} layers), random weights",
        "pairs_per_step": args.batch,
        "target_lengths": {"prompt": args.prompt, "chosen": args.reply, "rejected": args.reply},
        "length_sigma": args.length_sigma,
        "tokens_per_s_counts": "prompt + chosen + rejected tokens of a step's pairs (the prompt once); "
        "processed_tokens_per_s counts the prompt twice (chosen and rejected rows)",
        "lora": "r8 alpha16 q/k/v/o, dropout 0",
        "versions": {name: __import__(name).__version__ for name in ("torch", "transformers", "trl", "peft")},
    }

    def write() -> None:
        rows = []
        for variant in args.variants:
            r = results.get(variant)
            if r is None:
                continue
            rows.append({"variant": variant, "tokens_per_s": r.get("tokens_per_s"),
                         "median_step_s": r.get("median_step_s"), "peak_gib": r.get("peak_memory_gib"),
                         "steps": f"{r.get('measured_steps')}/{r.get('steps_run')}",
                         "error": (r.get("error") or "")[:60]})  # fmt: skip
        a, b = (results.get(v, {}).get("tokens_per_s") for v in ("trl", "toolkit"))
        results["ratio_toolkit_over_trl"] = round(b / a, 3) if a and b else None
        u = results.get("toolkit-unpacked", {}).get("tokens_per_s")
        if u and b:  # the packing lever alone
            results["ratio_packed_over_unpacked"] = round(b / u, 3)
            um, bm = (results.get(v, {}).get("mean_tokens_per_s") for v in ("toolkit-unpacked", "toolkit"))
            if um and bm:
                results["ratio_packed_over_unpacked_mean"] = round(bm / um, 3)
        g = results.get("gate", {})
        if "loss_rel_diff" in g:
            rows.append({"variant": "gate (2 layers fp32)", "tokens_per_s": f"loss rel {g['loss_rel_diff']:.2e}",
                         "median_step_s": f"grad rel {g['grad_rel_err_max']:.2e}",
                         "peak_gib": f"rewards rel {g['rewards_rel_diff_max']:.2e}", "steps": "1",
                         "error": "passed" if g["passed"] else "FAILED"})  # fmt: skip
        report(args.name, rows or [{"variant": "none"}], results)

    with tempfile.TemporaryDirectory() as scratch:
        if not args.no_gate:
            started = time.perf_counter()
            try:
                results["gate"] = gate(args, Path(scratch), device)
            except Exception as error:
                results["gate"] = {"passed": False, "error": f"{type(error).__name__}: {error}"[:2000],
                                   "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            results["gate"]["seconds"] = round(time.perf_counter() - started, 1)
            print(f"[dpo] gate: {json.dumps({k: v for k, v in results['gate'].items() if k != 'traceback'})}")
            free()
            write()
        throughput(args, Path(scratch), device, deadline, results, write)
    print(f"[dpo] ratio toolkit/trl tokens/s: {results['ratio_toolkit_over_trl']}")


if __name__ == "__main__":
    main()
