"""GRPO on one GPU: plain TRL GRPOTrainer against the toolkit's trainer path (training.method grpo), same model shape,
same prompts, same reward, same sampling, in one run, behind a gate; and (--learn) the tiny-gpt-oss-grpo preset's
learning curve.

  trl      TRL's GRPOTrainer as its docs use it with LoRA: the base model (bf16, transformers' defaults: eager
           attention, grouped_mm experts, the experts dequantized to bf16), `peft_config` (LoRA r8/alpha16 on
           q/k/v/o), the prompts as text (TRL tokenizes them), one reward function. GRPOConfig's defaults (bf16,
           gradient checkpointing, lr 1e-6, loss dapo, temperature 1, sampling with transformers' generate) but for
           the batch size, steps, num_generations, max_completion_length and beta, which match the toolkit's.
  toolkit  entrypoints/toolkit_train as the entrypoint runs training.method grpo: train.load_dataset (the prompts
           rendered with harmony, as the server renders a request), load_for_training (model.experts mxfp4: the
           experts stay packed; attention auto = flex on GPU; gradient checkpointing auto) and build_trainer (its
           grpo_trainer: GRPOTrainer on the rendered prompt ids, the rewards of training.grpo.rewards).

Model: gpt-oss-20b's exact shape with fewer layers and random weights (bench/dpo_throughput.py's write_checkpoint: an
MXFP4 checkpoint with gpt-oss's tokenizer, offline); TRL's model holds the same weights with the experts dequantized.
Prompts: the bundled multilingual sample's 60 rows (entrypoints/toolkit_train/samples/multilingual-thinking.jsonl),
rendered by the toolkit (harmony); TRL gets that text and tokenizes it (checked: the same ids). Reward: one user
reward, `language_words.py:reasoning_in_language` (the share of the reasoning's common words that belong to the
language the row asks for; written beside the prompts: REWARD_SOURCE below); TRL gets the same function on its
decoded text. A random-weight model never samples an end token: every reply runs to max_completion_length.
tokens/s counts each step's prompt tokens (once per sampled reply: every reply's row holds its prompt) plus the
sampled tokens, median over the steps after the warmup; sampled_tokens_per_s the sampled ones alone; gen_s the
median seconds of each step's transformers.generate; peak memory is torch.cuda.max_memory_allocated per side.

Gate, first: the same shape with 2 layers, fp32 (TF32 off), one step of each side on the same prompts, the same
LoRA start (the toolkit's seeded init, lora_B drawn away from zero so that the KL reference matters) and the same
replies (generation replaced by fixed harmony replies, some cut short, so that the rewards and advantages vary):
loss within 1e-5 relative, KL within 1e-4 relative (or both under 1e-8), LoRA gradients within 1e-4 relative.
Run for the toolkit as built, and again with TRL's "ref" adapter copy removed (toolkit-no-ref), which tells whether
a mismatch is the KL reference alone (this bench found that copy: trainers.reference.base_as_reference now removes
it for GRPO as for DPO, so the two should agree).

--learn: the tiny-gpt-oss-grpo preset (toolkit.config.load_config; the preset's YAML merged here where the toolkit
package does not import) with per_device_batch_size 4, num_generations 8, --steps steps, rewards format_valid +
language_words.py:reasoning_in_language (lingua, the built-in reasoning_language's detector, is not installed on the
device), the prompts the bundled sample's rows; built as the entrypoint builds it (load_dataset, load_for_training,
build_trainer with the run's callbacks). builtin:tiny-gpt-oss is rebuilt on a machine without it from
.tiny/tiny-gpt-oss-delta.safetensors (made here by --pack-tiny from the cached build: the weights that pre-training
changed, the rest is the recipe's seeded init) into the toolkit's cache, checked against the build's sha256.
Per step, trainer.state.log_history: reward, each rewards/<name>/mean, kl; first-20 vs last-20 steps' means.

  python bench/grpo_throughput.py [--layers 4] [--batch 4] [--generations 8] [--completion 256] [--budget-s 470]
  python bench/grpo_throughput.py --tiny           # CPU smoke test (tiny layers)
  python bench/grpo_throughput.py --learn [--steps 200] [--budget-s 520]
  python bench/grpo_throughput.py --learn --tiny   # CPU smoke test of the learning curve (3 short steps)
  python bench/grpo_throughput.py --pack-tiny      # here: write .tiny/tiny-gpt-oss-delta.safetensors
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import random
import shutil
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

import dpo_throughput as dpo  # the model shape, its MXFP4 checkpoint, the plain model, the clock
import torch
from common import report
from dpo_throughput import clock, cuda, free, relative, sync

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
GATE = {"loss_rel": 1e-5, "kl_rel": 1e-4, "grad_rel": 1e-4}
SAMPLE = REPO / "entrypoints" / "toolkit_train" / "samples" / "multilingual-thinking.jsonl"
TINY_DELTA = REPO / ".tiny" / "tiny-gpt-oss-delta.safetensors"
REWARD_FILE = "language_words.py"
REWARD = f"{REWARD_FILE}:reasoning_in_language"
CONVERSATION_DATE = "2026-12-06"  # the tiny presets' (tiny_model.RECIPE)
REWARD_SOURCE = '''"""A reasoning-language reward without a language detector (lingua is not installed where this
runs): the share of the reasoning's common words (stopwords) that belong to the language the row asks for
(`reasoning_language`), against the five others. Words common to two of the lists count for none. 0 when the
reasoning has no such word; None where the row asks for no language of the six."""

import re

_WORDS = {
    "English": "the and is of to that it for with this what user asks answer are was be on as which so should "
    "question we because they",
    "French": "le les des est et une du dans pour qui avec pas sur au utilisateur demande je réponds ce sont ou aux "
    "cette donc elle",
    "German": "der die das und ist nicht ein eine mit den auf zu ich nutzer fragt es sich von im dem auch wird nach "
    "antworte",
    "Spanish": "el los las y del por con usuario pregunta se lo su como más al es pero muy está",
    "Italian": "il gli della di è non sono utente chiede rispondo nel alla delle questo anche per che",
    "Portuguese": "o os da do em não uma usuário ao dos das na mais pergunta é que com para está",
}
_LISTS = {language: set(words.split()) for language, words in _WORDS.items()}
STOPWORDS = {
    language: {w for w in words if sum(w in other for other in _LISTS.values()) == 1}
    for language, words in _LISTS.items()
}
_WORD = re.compile(r"[^\\W\\d_]+")


def language_share(text, wanted):
    if wanted not in STOPWORDS:
        return None
    words = _WORD.findall((text or "").lower())
    hits = {language: sum(w in found for w in words) for language, found in STOPWORDS.items()}
    total = sum(hits.values())
    return hits[wanted] / total if total else 0.0


def reasoning_in_language(prompts, completions, reasoning=None, reasoning_language=None, **columns):
    texts = reasoning if reasoning is not None else completions
    wanted = reasoning_language or [None] * len(texts)
    return [language_share(text, language) for text, language in zip(texts, wanted)]
'''


# ---------------------------------------------------------------------------------------------------------------------
# data and reward


def write_data(directory: Path) -> Path:
    """The prompts (the bundled sample's rows, as they are: `prompts` reads them) and the reward file beside them."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SAMPLE, directory / "prompts.jsonl")
    (directory / REWARD_FILE).write_text(REWARD_SOURCE)
    return directory


def reward_module(directory: Path):
    spec = importlib.util.spec_from_file_location("bench_language_words", directory / REWARD_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trl_reward(module):
    """The same reward for plain TRL, as a user of TRL writes it for gpt-oss: TRL hands the decoded reply with its
    special tokens skipped ("analysis<reasoning>assistantfinal<answer>"); the reasoning is what precedes the final
    channel."""

    def reasoning_in_language(prompts, completions, reasoning_language=None, **kwargs):
        reasoning = [text.partition("assistantfinal")[0].removeprefix("analysis") for text in completions]
        return module.reasoning_in_language(prompts=prompts, completions=completions, reasoning=reasoning,
                                            reasoning_language=reasoning_language)  # fmt: skip

    return reasoning_in_language


def fixed_replies(tokenizer, count: int, length: int, seed: int) -> list[list[int]]:
    """The gate's replies, well-formed harmony (analysis then final), each reasoning word drawn from the reward's lists
    of a language picked with reply-dependent weights (so the rewards vary within every group, whatever language its
    prompt asks for); every third one cut short."""
    namespace: dict = {}
    exec(REWARD_SOURCE, namespace)  # our own text, above
    stopwords = namespace["STOPWORDS"]
    languages = sorted(stopwords)
    rng = random.Random(seed)
    replies = []
    for index in range(count):
        weights = [rng.random() ** 3 for _ in languages]
        words = [rng.choice(sorted(stopwords[rng.choices(languages, weights)[0]])) for _ in range(rng.randint(6, 14))]
        text = (f"<|channel|>analysis<|message|>{' '.join(words).capitalize()}.<|end|><|start|>assistant<|channel|>"
                f"final<|message|>{' '.join(words[:4])}.<|return|>")  # fmt: skip
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length]
        if index % 3 == 2:
            ids = ids[: max(4, len(ids) * 2 // 3)]
        replies.append(ids)
    return replies


# ---------------------------------------------------------------------------------------------------------------------
# what each step did


class Capture:
    """Per training step: the prompt and sampled tokens, generate's seconds, the loss, and (gate) the batch, the
    metrics and the LoRA gradients. `fixed`: replies to return instead of sampling (the gate)."""

    def __init__(self, grads: bool, fixed: list[list[int]] | None = None):
        self.grads_wanted, self.fixed = grads, fixed
        self.tokens: list[tuple[int, int]] = []  # (prompt tokens over the replies' rows, sampled tokens)
        self.gen_s: list[float] = []
        self.losses: list[float] = []
        self.batches: list[dict] = []
        self.grads: dict = {}
        self.metrics: dict = {}
        self.adapters: list[str] = []
        self.trainable: int = 0

    def wrap(self, trainer_class: type) -> type:
        capture = self

        class Capturing(trainer_class):
            def _generate_single_turn(self, prompt_ids, *args, **kwargs):
                if capture.fixed is not None:
                    return [list(capture.fixed[i % len(capture.fixed)]) for i in range(len(prompt_ids))], None
                sync()
                started = time.perf_counter()
                out = super()._generate_single_turn(prompt_ids, *args, **kwargs)
                sync()
                capture.gen_s.append(time.perf_counter() - started)
                return out

            def _generate_and_score_completions(self, inputs):
                out = super()._generate_and_score_completions(inputs)
                prompts, replies = out["prompt_mask"], out["completion_mask"]
                capture.tokens.append((int(prompts.sum()), int(replies.sum())))
                if capture.grads_wanted:
                    rows = zip(out["prompt_ids"].cpu(), prompts.cpu(), strict=True)
                    sampled = zip(out["completion_ids"].cpu(), replies.cpu(), strict=True)
                    capture.batches.append({
                        "prompt_ids": [r[m.bool()].tolist() for r, m in rows],
                        "completion_ids": [r[m.bool()].tolist() for r, m in sampled],
                        "advantages": out["advantages"].detach().float().cpu().clone(),
                    })  # fmt: skip
                return out

            def training_step(self, model, inputs, num_items_in_batch=None):
                loss = super().training_step(model, inputs, num_items_in_batch)
                capture.losses.append(float(loss))
                if capture.grads_wanted:
                    capture.grads = {
                        n: p.grad.detach().float().cpu().clone()
                        for n, p in model.named_parameters()
                        if p.requires_grad and p.grad is not None
                    }
                    capture.metrics = {k: v[-1] for k, v in self._metrics["train"].items() if v}  # fmt: skip
                return loss

            def train(self, *args, **kwargs):
                unwrapped = self.model
                capture.adapters = list(getattr(unwrapped, "peft_config", {}))
                capture.trainable = sum(p.numel() for p in unwrapped.parameters() if p.requires_grad)
                return super().train(*args, **kwargs)

        return Capturing


# ---------------------------------------------------------------------------------------------------------------------
# the two sides


def trl_trainer(model, tokenizer, dataset, reward, out: Path, args, batch: int, steps: int, fp32: bool, capture,
                callbacks):  # fmt: skip
    from peft import LoraConfig
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    extra = {"bf16": False} if fp32 or not cuda() else {}  # GRPOConfig's default: bf16 (autocast)
    config = GRPOConfig(output_dir=str(out), per_device_train_batch_size=batch * args.generations, max_steps=steps,
                        num_generations=args.generations, max_completion_length=args.completion, beta=args.beta,
                        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
                        use_cpu=not cuda(), **extra)  # fmt: skip
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    trainer = capture.wrap(GRPOTrainer)(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                                        processing_class=tokenizer, peft_config=lora, callbacks=callbacks)  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # its dict per step, as the toolkit's trainer drops it
    return trainer


def toolkit_settings(checkpoint: Path, data_dir: Path, args, batch: int, steps: int, fp32: bool):
    from toolkit_train.settings import TrainSettings

    return TrainSettings.model_validate(
        {
            "model": {"id": str(checkpoint), "experts": "mxfp4", "dtype": "float32" if fp32 else "auto"},
            "data": {"source": str(data_dir), "format": "prompts", "max_length": 1024,
                     "conversation_date": CONVERSATION_DATE},
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": LORA_TARGETS},
            "training": {
                "method": "grpo",
                "grpo": {"num_generations": args.generations, "max_completion_length": args.completion,
                         "temperature": 1.0, "beta": args.beta, "rewards": [{"name": REWARD, "weight": 1.0}]},
                "max_steps": steps,
                "per_device_batch_size": batch,
                "save_steps": 0,
                "merge_adapter": False,
                "learning_rate": 1e-6,  # GRPOConfig's
            },
        }
    )  # fmt: skip


def paths_for(out: Path, data_dir: Path):
    from toolkit_train.layout import Paths

    # the data directory is the job's train channel (a user reward is read from beside the data)
    return Paths(root=out, model_dir=out / "model", checkpoints=out / "ckpt", train_channel=data_dir,
                 output_data=out / "output")  # fmt: skip


def prompts_of(settings, paths, tokenizer):
    """The toolkit's prompt rows exactly as the entrypoint loads them (train.load_dataset)."""
    from toolkit_train.train import load_dataset

    dataset, stats, _, _ = load_dataset(settings, paths, tokenizer)
    return dataset, stats


def toolkit_trainer(settings, paths, tokenizer, dataset, capture, callbacks, start: dict | None = None,
                    drop_ref: bool = False):  # fmt: skip
    """load_for_training + build_trainer, as the entrypoint builds them; (trainer, compiled layers).
    drop_ref: TRL's "ref" copy of the adapter deleted once built (what preference_trainer_class does for DPO)."""
    from toolkit_train.run.trainer import load_for_training
    from toolkit_train.trainers import build_trainer

    model, compiled, _ = load_for_training(settings)
    if start is not None:
        start.update(dpo.off_identity(model))
    trainer = build_trainer(settings, paths, model, tokenizer, dataset, callbacks=callbacks, subclass=capture.wrap)
    if drop_ref and "ref" in getattr(trainer.model, "peft_config", {}):
        trainer.model.delete_adapter("ref")
    return trainer, compiled


def trl_prompts(dataset):
    """TRL's rows: the toolkit's rendered prompt text (TRL tokenizes it) and the column the reward reads."""
    return dataset.select_columns(["prompt", "reasoning_language"])


def same_ids(tokenizer, dataset) -> bool:
    """TRL's tokenization of the text (GRPOTrainer._tokenize_prompts: processing_class(text=...)) equals the
    toolkit's ids."""
    ids = tokenizer(text=list(dataset["prompt"]))["input_ids"]
    return all(list(a) == list(b) for a, b in zip(ids, dataset["prompt_ids"], strict=True))


# ---------------------------------------------------------------------------------------------------------------------
# gate


def gate(args, scratch: Path, device: str, data_dir: Path) -> dict:
    """One step of each side in fp32 on a 2-layer model of the shape, same prompts, LoRA start and replies."""
    from toolkit_train.run.model import load_tokenizer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = dpo.shape(args.tiny, 2, "20b")
    checkpoint = scratch / "gate-model"
    packed = dpo.write_checkpoint(checkpoint, config, device)
    settings = toolkit_settings(checkpoint, data_dir, args, args.gate_prompts, 1, fp32=True)
    tokenizer = load_tokenizer(settings.model)
    paths = paths_for(scratch / "gate-toolkit", data_dir)
    dataset, _ = prompts_of(settings, paths, tokenizer)
    fixed = fixed_replies(tokenizer, args.gate_prompts * args.generations, args.completion, seed=3)
    module = reward_module(data_dir)

    sides: dict[str, Capture] = {}
    start: dict = {}
    for variant in ("toolkit", "toolkit-no-ref"):  # the toolkit first: its seeded LoRA init is TRL's start too
        capture = sides[variant] = Capture(grads=True, fixed=fixed)
        trainer, _ = toolkit_trainer(settings, paths_for(scratch / f"gate-{variant}", data_dir), tokenizer, dataset,
                                     capture, [], start if variant == "toolkit" else {},
                                     drop_ref=variant == "toolkit-no-ref")  # fmt: skip
        trainer.train()
        del trainer
        free()
    plain = dpo.plain_model(packed, config, device, torch.float32, "eager")  # fp32: grouped_mm is bf16-only
    del packed
    capture = sides["trl"] = Capture(grads=True, fixed=fixed)
    trl = trl_trainer(plain, tokenizer, trl_prompts(dataset), trl_reward(module), scratch / "gate-trl", args,
                      args.gate_prompts, 1, True, capture, [])  # fmt: skip
    with torch.no_grad():  # TRL's fresh adapter (peft's init) set to the toolkit's start
        params = dict(trl.model.named_parameters())
        assert set(start) == {n for n, p in params.items() if p.requires_grad}, "adapter names differ"
        for name, value in start.items():
            params[name].copy_(value)
    trl.train()
    del trl, plain
    free()

    theirs = sides["trl"]
    result: dict = {
        "model": f"{'tiny' if args.tiny else '20b'} shape, 2 layers, fp32 (TF32 off)",
        "prompts": args.gate_prompts,
        "replies": len(fixed),
        "bounds": GATE,
        "trl": {
            "loss": theirs.losses[0],
            "kl": theirs.metrics.get("kl"),
            "reward": theirs.metrics.get("reward"),
            "reward_std": theirs.metrics.get("reward_std"),
            "adapters": theirs.adapters,
            "trainable_params": theirs.trainable,
        },
    }
    for variant in ("toolkit", "toolkit-no-ref"):
        ours = sides[variant]
        same_batch = len(ours.batches) == len(theirs.batches) == 1 and all(
            ours.batches[0][k] == theirs.batches[0][k] for k in ("prompt_ids", "completion_ids")
        )
        kl_ours, kl_theirs = ours.metrics.get("kl", 0.0), theirs.metrics.get("kl", 0.0)
        kl_rel = (
            0.0 if max(abs(kl_ours), abs(kl_theirs)) < 1e-8 else abs(kl_ours - kl_theirs) / max(abs(kl_theirs), 1e-12)
        )
        grads = {n: relative(ours.grads[n], g) for n, g in theirs.grads.items() if n in ours.grads}
        row = {
            "same_batch": same_batch,
            "loss": ours.losses[0],
            "loss_rel_diff": abs(ours.losses[0] - theirs.losses[0]) / max(abs(theirs.losses[0]), 1e-12),
            "kl": kl_ours,
            "kl_rel_diff": kl_rel,
            "reward": ours.metrics.get("reward"),
            "reward_diff": abs((ours.metrics.get("reward") or 0) - (theirs.metrics.get("reward") or 0)),
            "advantages_max_diff": float((ours.batches[0]["advantages"] - theirs.batches[0]["advantages"]).abs().max())
            if same_batch else None,
            "lora_tensors": len(grads),
            "grad_keys_match": set(ours.grads) == set(theirs.grads),
            "extra_grad_keys": sorted(set(ours.grads) - set(theirs.grads))[:4],
            "grad_rel_err_max": max(grads.values()) if grads else None,
            "adapters": ours.adapters,
            "trainable_params": ours.trainable,
        }  # fmt: skip
        row["passed"] = bool(
            same_batch
            and row["grad_keys_match"]
            and row["loss_rel_diff"] <= GATE["loss_rel"]
            and kl_rel <= GATE["kl_rel"]
            and row["grad_rel_err_max"] is not None
            and row["grad_rel_err_max"] <= GATE["grad_rel"]
        )
        result[variant] = row
    result["passed"] = result["toolkit"]["passed"]
    torch.backends.cuda.matmul.allow_tf32 = True
    return result


# ---------------------------------------------------------------------------------------------------------------------
# throughput


def summary(capture: Capture, steps: list[float], warmup: int) -> dict:
    measured = list(range(warmup, min(len(steps), len(capture.tokens))))
    out: dict = {"steps_run": len(steps), "warmup_steps": warmup, "measured_steps": len(measured),
                 "step_s": [round(s, 3) for s in steps], "gen_s": [round(s, 3) for s in capture.gen_s],
                 "losses": [round(x, 5) for x in capture.losses]}  # fmt: skip
    if measured:
        out |= {
            "tokens_per_s": round(statistics.median(sum(capture.tokens[i]) / steps[i] for i in measured), 1),
            "sampled_tokens_per_s": round(statistics.median(capture.tokens[i][1] / steps[i] for i in measured), 1),
            "median_step_s": round(statistics.median(steps[i] for i in measured), 3),
            "median_gen_s": round(statistics.median(capture.gen_s[i] for i in measured if i < len(capture.gen_s)), 3)
            if len(capture.gen_s) > measured[0] else None,
            "tokens_per_step": {"prompt": capture.tokens[measured[0]][0], "sampled": capture.tokens[measured[0]][1]},
        }  # fmt: skip
        if out["median_gen_s"] is not None:
            out["gen_share"] = round(out["median_gen_s"] / out["median_step_s"], 3)
    if cuda():
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def progress(variant: str):
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        """A line per step (the output's tail shows how far a side got if the call is cut off)."""

        last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            print(f"[grpo] {variant} step {state.global_step}: {now - self.last:.2f} s", flush=True)
            self.last = now

    return Progress()


def throughput(args, scratch: Path, device: str, deadline: float, results: dict, write, data_dir: Path) -> None:
    from toolkit_train.run.model import load_tokenizer

    config = dpo.shape(args.tiny, args.layers, "20b")
    checkpoint = scratch / "model"
    started = time.perf_counter()
    packed = dpo.write_checkpoint(checkpoint, config, device)
    results["checkpoint_s"] = round(time.perf_counter() - started, 1)
    settings = toolkit_settings(checkpoint, data_dir, args, args.batch, args.steps, fp32=False)
    tokenizer = load_tokenizer(settings.model)
    paths = paths_for(scratch / "toolkit", data_dir)
    dataset, stats = prompts_of(settings, paths, tokenizer)
    results["prompts"] = {
        "rows": len(dataset),
        "tokens_mean": round(stats["tokens"] / max(len(dataset), 1), 1),
        "tokens_max": stats["tokens_max"],
        "trl_tokenizes_to_the_same_ids": same_ids(tokenizer, dataset),
    }
    module = reward_module(data_dir)
    for variant in args.variants:
        if time.perf_counter() > deadline - 20:
            results[variant] = {"error": "skipped: out of time budget"}
            continue
        share = (deadline - time.perf_counter()) / (2 if variant == "trl" and "toolkit" in args.variants else 1)
        # a GRPO step can take a minute: past its share a side stops once one step after the warmup was measured
        capture, timer = Capture(grads=False), clock(time.perf_counter() + share - 30, args.warmup + 1)
        held = 0.0
        trainer = plain = base = None
        if cuda():
            torch.cuda.reset_peak_memory_stats()
            held = round(torch.cuda.memory_allocated() / 2**30, 2)
        try:
            if variant == "trl":
                if packed is None:
                    raise RuntimeError("the packed model was released")
                plain = dpo.plain_model(packed, config, device, torch.bfloat16 if cuda() else torch.float32,
                                        "grouped_mm")  # fmt: skip
                packed = None
                free()
                hooks = [timer, progress(variant)]
                trainer = trl_trainer(plain, tokenizer, trl_prompts(dataset), trl_reward(module), scratch / "trl",
                                      args, args.batch, args.steps, False, capture, hooks)  # fmt: skip
                base = trainer.model.get_base_model()
                info = {
                    "attention": base.config._attn_implementation,
                    "experts": base.config._experts_implementation,
                    "gradient_checkpointing": trainer.args.gradient_checkpointing,
                    "bf16": trainer.args.bf16,
                }
            else:
                packed = None
                free()
                trainer, compiled = toolkit_trainer(
                    settings, paths, tokenizer, dataset, capture, [timer, progress(variant)]
                )
                base = trainer.model.get_base_model()
                info = {"attention": base.config._attn_implementation, "experts": "mxfp4 (packed)",
                        "gradient_checkpointing": trainer.args.gradient_checkpointing, "bf16": trainer.args.bf16,
                        "compiled_layers": compiled}  # fmt: skip
            info |= {"per_device_train_batch_size": trainer.args.per_device_train_batch_size,
                     "num_generations": trainer.args.num_generations,
                     "max_completion_length": trainer.args.max_completion_length, "beta": trainer.args.beta,
                     "learning_rate": trainer.args.learning_rate, "loss_type": trainer.args.loss_type}  # fmt: skip
            trainer.train()
            info |= {"adapters": capture.adapters, "trainable_params": capture.trainable}
            results[variant] = info | summary(capture, timer.steps(), args.warmup) | {"held_at_start_gib": held}
        except Exception as error:  # keep what the other side measured
            results[variant] = {"error": f"{type(error).__name__}: {error}"[:2000],
                                "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            if capture.tokens:
                results[variant] |= summary(capture, timer.steps(), args.warmup)
        print(f"[grpo] {variant}: {json.dumps({k: v for k, v in results[variant].items() if k != 'traceback'})}")
        trainer = plain = base = None  # every reference to this side's model goes before the next side's peak
        free()
        write()


# ---------------------------------------------------------------------------------------------------------------------
# the tiny model, shipped as what pre-training changed


def _state_sha(state: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def pack_tiny() -> None:
    """Here, from the cached build: the tensors pre-training changed (every layer's; the embedding rows it moved;
    the LM head's learned rows and the row all other tokens share), with the build's sha256."""
    from safetensors.torch import load_file, save_file
    from toolkit_train.builtin.tiny_model import _pretrained, build_tokenizer, tiny_gpt_oss_path

    built = load_file(str(tiny_gpt_oss_path() / "model.safetensors"))
    init = _pretrained(build_tokenizer(), pretrain=False).state_dict()
    embed, head = built["model.embed_tokens.weight"], built["lm_head.weight"]
    shared = head[-1]
    learned = (~(head == shared).all(1)).nonzero().flatten()
    moved = (~(embed == init["model.embed_tokens.weight"]).all(1)).nonzero().flatten()
    delta = {k: v for k, v in built.items() if k not in ("model.embed_tokens.weight", "lm_head.weight")}
    delta |= {"embed_rows": moved, "embed_values": embed[moved].clone(), "head_rows": learned,
              "head_values": head[learned].clone(), "head_shared": shared.clone()}  # fmt: skip
    TINY_DELTA.parent.mkdir(exist_ok=True)
    save_file(delta, str(TINY_DELTA), metadata={"sha256": _state_sha(built), "source": tiny_gpt_oss_path().name})
    print(f"[grpo] {TINY_DELTA}: {TINY_DELTA.stat().st_size / 2**20:.1f} MiB ({len(moved)} embedding rows, "
          f"{len(learned)} head rows), sha256 {_state_sha(built)[:16]}")  # fmt: skip


def ensure_tiny() -> dict:
    """builtin:tiny-gpt-oss in the toolkit's cache: there already, or rebuilt from the delta (seconds) where the
    delta travelled, else built by the toolkit (pre-training, minutes)."""
    from toolkit_train.builtin import tiny_model

    started = time.perf_counter()
    info: dict = {}

    def rebuild(out: Path) -> None:
        from safetensors.torch import load_file
        from transformers import GptOssForCausalLM

        delta_file = TINY_DELTA
        from safetensors import safe_open

        with safe_open(str(delta_file), "pt") as handle:
            expected = handle.metadata()["sha256"]
        delta = load_file(str(delta_file))
        tokenizer = tiny_model.build_tokenizer()
        model: GptOssForCausalLM = tiny_model._pretrained(tokenizer, pretrain=False)
        state = model.state_dict()
        with torch.no_grad():
            for name, tensor in state.items():
                if name in delta:
                    tensor.copy_(delta[name])
            state["model.embed_tokens.weight"][delta["embed_rows"]] = delta["embed_values"]
            state["lm_head.weight"][:] = delta["head_shared"]
            state["lm_head.weight"][delta["head_rows"]] = delta["head_values"]
        info["sha256_expected"], info["sha256_rebuilt"] = expected[:16], _state_sha(state)[:16]
        info["sha256_match"] = info["sha256_expected"] == info["sha256_rebuilt"]
        model.save_pretrained(out)
        tiny_model._save_generation_config(out, tokenizer)
        tokenizer.save_pretrained(out)

    if TINY_DELTA.exists():
        stem, recipe = "tiny-gpt-oss", [tiny_model.RECIPE, False]  # tiny_gpt_oss_path()'s key
        path = tiny_model.cached_build(stem, recipe, rebuild, "seconds (from .tiny)")
        info["how"] = "rebuilt from .tiny/tiny-gpt-oss-delta.safetensors" if "sha256_match" in info else "cached"
    else:
        path = tiny_model.tiny_gpt_oss_path()
        info["how"] = "cached or built by toolkit_train.builtin.tiny_model"
    info |= {"path": str(path), "seconds": round(time.perf_counter() - started, 1)}
    return info


# ---------------------------------------------------------------------------------------------------------------------
# learning curve


def _deep_merge(base: dict, top: dict) -> dict:
    merged = dict(base)
    for key, value in top.items():
        merged[key] = (
            _deep_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def preset_settings(name: str, changes: dict):
    """A preset's training settings (toolkit.config, as `toolkit train` hands them to the job) with `changes` merged."""
    from toolkit_train.settings import TrainSettings

    try:
        from toolkit.config import load_config

        settings = load_config(name).train_settings().model_dump(mode="json")
        how = "toolkit.config.load_config(...).train_settings()"
    except ImportError as error:  # the device: the toolkit package's other needs are absent; the preset's YAML
        import yaml

        def raw(preset: str) -> dict:
            loaded = yaml.safe_load((REPO / "toolkit" / "presets" / f"{preset}.yaml").read_text())
            base = loaded.pop("base", None)
            return _deep_merge(raw(base), loaded) if base else loaded

        merged = raw(name)
        settings = {k: v for k, v in merged.items() if k in TrainSettings.model_fields}
        how = f"the preset's YAML (and its base) merged here: toolkit.config did not import ({error})"
    return TrainSettings.model_validate(_deep_merge(settings, changes)), how


def learn(args, scratch: Path, results: dict, write, deadline: float) -> None:
    from toolkit_train.run.callbacks import callbacks
    from toolkit_train.run.model import load_tokenizer
    from transformers import TrainerCallback

    data_dir = write_data(scratch / "lang-data")
    results["tiny_model"] = ensure_tiny()
    print(f"[grpo] tiny model: {json.dumps(results['tiny_model'])}")
    changes = {
        "data": {"source": str(data_dir)},
        "training": {
            "max_steps": args.steps,
            "per_device_batch_size": args.batch,
            "save_steps": 0,
            "merge_adapter": False,
            "grpo": {"num_generations": args.generations,
                     "rewards": [{"name": "format_valid", "weight": 1.0}, {"name": REWARD, "weight": 1.0}]},
        },
    }  # fmt: skip
    if args.tiny:
        changes["training"]["grpo"]["max_completion_length"] = args.completion
    if args.attention:
        changes["model"] = {"attn_implementation": args.attention}
    settings, how = preset_settings("tiny-gpt-oss-grpo", changes)
    results["settings_from"] = how
    results["settings"] = settings.model_dump(mode="json")
    tokenizer = load_tokenizer(settings.model)
    paths = paths_for(scratch / "learn", data_dir)
    dataset, stats = prompts_of(settings, paths, tokenizer)
    results["prompts"] = {"train_rows": len(dataset), "tokens_max": stats["tokens_max"]}
    capture = Capture(grads=False)
    timer = clock(deadline, 40 if not args.tiny else 1)
    steps_seen: list[float] = []

    class Progress(TrainerCallback):
        def on_log(self, a, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                steps_seen.append(logs["reward"])
                if state.global_step % 10 == 0:
                    print(f"[grpo] step {state.global_step}: reward {logs['reward']:.3f} kl {logs.get('kl', 0):.4f}",
                          flush=True)  # fmt: skip

    trainer, compiled = toolkit_trainer(settings, paths, tokenizer, dataset, capture,
                                        [*callbacks(settings), timer, Progress()])  # fmt: skip
    base = trainer.model.get_base_model()
    results["setup"] = {"attention": base.config._attn_implementation,
                        "experts": getattr(base.config, "_experts_implementation", None),
                        "gradient_checkpointing": trainer.args.gradient_checkpointing, "bf16": trainer.args.bf16,
                        "compiled_layers": compiled,
                        "per_device_train_batch_size": trainer.args.per_device_train_batch_size,
                        "num_generations": trainer.args.num_generations,
                        "max_completion_length": trainer.args.max_completion_length, "beta": trainer.args.beta,
                        "learning_rate": trainer.args.learning_rate,
                        "lr_scheduler": str(trainer.args.lr_scheduler_type),
                        "temperature": trainer.args.temperature}  # fmt: skip
    if cuda():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    try:
        trainer.train()
    except Exception as error:
        results["error"] = f"{type(error).__name__}: {error}"[:2000]
        results["traceback"] = traceback.format_exc()[-4000:]
    results["train_s"] = round(time.perf_counter() - started, 1)
    results["adapters"], results["trainable_params"] = capture.adapters, capture.trainable
    keys = ("reward", "reward_std", "kl", "loss", "learning_rate", "completions/mean_length",
            "completions/clipped_ratio", "frac_reward_zero_std", "entropy")  # fmt: skip
    history = []
    for entry in trainer.state.log_history:
        if "reward" not in entry:
            continue
        row = {"step": entry.get("step")} | {k: entry[k] for k in keys if k in entry}
        row |= {k: v for k, v in entry.items() if k.startswith("rewards/") and k.endswith("/mean")}
        history.append({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()})
    results["history"] = history
    steps = timer.steps()
    results["steps_run"] = len(history)
    if steps:
        results["median_step_s"] = round(statistics.median(steps), 3)
        results["median_gen_s"] = round(statistics.median(capture.gen_s), 3) if capture.gen_s else None
    if cuda():
        results["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    window = min(20, len(history) // 2)
    if window:

        def mean(rows, key):
            values = [r[key] for r in rows if r.get(key) is not None]
            return round(statistics.fmean(values), 4) if values else None

        first, last = history[:window], history[-window:]
        names = ["reward", "kl", *sorted({k for r in history for k in r if k.startswith("rewards/")})]
        results["first_vs_last"] = {"window_steps": window} | {
            name: {"first": mean(first, name), "last": mean(last, name)} for name in names
        }
        r = results["first_vs_last"]["reward"]
        results["reward_rises"] = bool(r["first"] is not None and r["last"] is not None and r["last"] > r["first"])
    write()


# ---------------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny layers, short replies, few steps")
    parser.add_argument("--learn", action="store_true", help="the tiny-gpt-oss-grpo learning curve instead")
    parser.add_argument("--pack-tiny", action="store_true", help="write .tiny/tiny-gpt-oss-delta.safetensors here")
    parser.add_argument("--layers", type=int, default=4, help="layers of gpt-oss-20b's shape")
    parser.add_argument("--batch", type=int, default=4, help="prompts per step (both sides; x --generations replies)")
    parser.add_argument("--generations", type=int, default=8, help="replies sampled per prompt")
    parser.add_argument("--completion", type=int, default=256, help="max_completion_length")
    parser.add_argument("--beta", type=float, default=0.04, help="the KL term's weight (the toolkit's default)")
    parser.add_argument("--steps", type=int, default=10, help="at most this many steps per side (--learn: 200)")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the rates")
    parser.add_argument("--gate-prompts", type=int, default=2)
    parser.add_argument("--variants", default="trl,toolkit")
    parser.add_argument("--no-gate", action="store_true")
    parser.add_argument("--budget-s", type=float, default=470, help="stop measuring and write the JSON by then")
    parser.add_argument("--name", default=None)
    parser.add_argument(
        "--attention",
        default=None,
        help="--learn: model.attn_implementation (the preset's: auto; "
        "auto = flex_attention on a GPU, which inductor failed to compile at the tiny model's shape)",
    )
    args = parser.parse_args()
    if args.pack_tiny:
        pack_tiny()
        return
    args.variants = args.variants.split(",")
    if args.learn and "--steps" not in sys.argv:
        args.steps = 200
    if args.tiny:
        args.layers, args.warmup, args.gate_prompts = 2, 1, 2
        args.batch, args.generations, args.completion = 2, 4, 16
        args.steps = 3
    kind = "learning" if args.learn else "throughput"
    args.name = args.name or f"grpo_{kind}_{'tiny' if args.tiny else '1gpu'}"
    deadline = time.perf_counter() + args.budget_s
    device = "cuda" if cuda() else "cpu"
    results: dict = {
        "command": " ".join(["python", *sys.argv]),
        "device": torch.cuda.get_device_name(0) if cuda() else "cpu",
        "versions": {name: __import__(name).__version__ for name in ("torch", "transformers", "trl", "peft")},
    }
    if args.learn:
        results |= {"preset": "tiny-gpt-oss-grpo", "prompts_per_step": args.batch, "num_generations": args.generations}

        def write_learn() -> None:
            rows = []
            for name, values in results.get("first_vs_last", {}).items():
                if isinstance(values, dict):
                    rows.append({"metric": name, "first_steps_mean": values["first"],
                                 "last_steps_mean": values["last"]})  # fmt: skip
            rows.append({"metric": "steps", "first_steps_mean": results.get("steps_run"),
                         "last_steps_mean": f"{results.get('median_step_s')} s/step"})  # fmt: skip
            report(args.name, rows, results)

        with tempfile.TemporaryDirectory() as scratch:
            learn(args, Path(scratch), results, write_learn, deadline)
        print(f"[grpo] reward rises (first vs last {results.get('first_vs_last', {}).get('window_steps')} steps): "
              f"{results.get('reward_rises')}")  # fmt: skip
        return

    results |= {
        "shape": f"{'tiny' if args.tiny else 'gpt-oss-20b'} ({args.layers} layers), random weights",
        "prompts_per_step": args.batch,
        "num_generations": args.generations,
        "max_completion_length": args.completion,
        "beta": args.beta,
        "tokens_per_s_counts": "each step's prompt tokens (once per reply row) + sampled tokens, over the step's "
        "seconds (generate + scoring + the KL reference + forward/backward + optimizer)",
        "lora": "r8 alpha16 q/k/v/o, dropout 0",
        "reward": REWARD,
    }

    def write() -> None:
        rows = []
        for variant in args.variants:
            r = results.get(variant)
            if r is None:
                continue
            rows.append({"variant": variant, "s_per_step": r.get("median_step_s"), "gen_s": r.get("median_gen_s"),
                         "tokens_per_s": r.get("tokens_per_s"), "sampled_per_s": r.get("sampled_tokens_per_s"),
                         "peak_gib": r.get("peak_memory_gib"),
                         "steps": f"{r.get('measured_steps')}/{r.get('steps_run')}",
                         "error": (r.get("error") or "")[:60]})  # fmt: skip
        a, b = (results.get(v, {}).get("tokens_per_s") for v in ("trl", "toolkit"))
        results["ratio_toolkit_over_trl"] = round(b / a, 3) if a and b else None
        g = results.get("gate", {})
        for variant in ("toolkit", "toolkit-no-ref"):
            if variant in g and isinstance(g[variant], dict):
                v = g[variant]
                rows.append({"variant": f"gate {variant} vs trl", "s_per_step": f"loss rel {v['loss_rel_diff']:.2e}",
                             "gen_s": f"kl {v['kl']:.2e} vs {g['trl']['kl']:.2e}",
                             "tokens_per_s": f"grad rel {v['grad_rel_err_max']:.2e}"
                             if v["grad_rel_err_max"] is not None else "grad n/a",
                             "sampled_per_s": f"adapters {','.join(v['adapters'])}", "peak_gib": "",
                             "steps": "1", "error": "passed" if v["passed"] else "FAILED"})  # fmt: skip
        report(args.name, rows or [{"variant": "none"}], results)

    with tempfile.TemporaryDirectory() as scratch:
        data_dir = write_data(Path(scratch) / "lang-data")
        if not args.no_gate:
            started = time.perf_counter()
            try:
                results["gate"] = gate(args, Path(scratch), device, data_dir)
            except Exception as error:
                results["gate"] = {"passed": False, "error": f"{type(error).__name__}: {error}"[:2000],
                                   "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            results["gate"]["seconds"] = round(time.perf_counter() - started, 1)
            print(f"[grpo] gate: {json.dumps({k: v for k, v in results['gate'].items() if k != 'traceback'})}")
            free()
            write()
        throughput(args, Path(scratch), device, deadline, results, write, data_dir)
    print(f"[grpo] ratio toolkit/trl tokens/s: {results['ratio_toolkit_over_trl']}")


if __name__ == "__main__":
    main()
