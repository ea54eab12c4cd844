"""A tiny gpt-oss (the real `GptOssForCausalLM` architecture) and gpt-oss's harmony tokenizer, built offline.

Used by the `tiny-gpt-oss-local` preset, the demo and the tests: no hub, no download. Built once per
recipe and cached; the build is deterministic, so every process (and every rank) gets the same weights.

The build pre-trains the model (all weights, ~4 min on 2 CPU cores) on generated text that shares no row with
any bundled sample (`tiny_corpus`; tests/toolkit_train/builtin/test_tiny_corpus.py proves it): harmony conversations in
six languages whose analysis is in English (70%) or in the language the system prompt's `reasoning language:`
names (30%), and plain instruction documents (`reasoning language: X`, a question, its reasoning written in X). It
behaves as gpt-oss does before the multilingual fine-tune: it speaks the harmony format, answers in the user's
language and, at temperature 0, reasons in English whatever language is named. The bundled sample teaches what the
fine-tune is for, reasoning in the named language, and the demo's eval measures it on rows neither model saw. The
base also knows the samples' words (shuffled word lists, never a sentence) so that the fine-tune can write them;
every other token shares one LM-head row learned as "any other token", so the model is calibrated over the whole
vocabulary. Pre-training runs on a fixed number of CPU threads (RECIPE), so every machine computes the same sums.

The tools variant (`builtin:tiny-gpt-oss-tools`) continues the plain base's pre-training with the bundled tool-calling
sample added to the text (TOOLS_RECIPE).
Without it the model cannot call a tool, whatever the LoRA run: every token the pre-training text lacks shares
the "any other token" LM-head row, and the tool-call tokens (`<|call|>`, ` to`, `functions`, ` json`, `{"`, ...)
are among them; LoRA on attention and experts cannot move those logits (and TRL refuses LoRA on lm_head).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..settings import cache_root

# o200k's pre-tokenizer pattern (tiktoken_ext.openai_public.o200k_base), which gpt-oss's tokenizer uses
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
RECIPE: dict[str, Any] = {
    "tokenizer": "o200k_harmony",
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention supports multiples of 32 and up
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 64,
    "max_position_embeddings": 4096,
    "seed": 1,
    # harmony's `Current date:` in every pre-training conversation; the tiny presets pin data.conversation_date to it
    # (a test ties them), so the base, its fine-tune and the served prompts render the same tokens on any day:
    # before, the date of the day it was built went into the base, and the main job passed or failed by the day
    "conversation_date": "2026-12-06",
    # gpt-oss's generation_config.json: generation stops at a final answer, the end of text or a tool call
    "generation_eos": ["<|return|>", "<|endoftext|>", "<|call|>"],
    # and its sampling defaults, which vLLM applies to a request that names none (a third-party client, a curl): a
    # model this small writes well-formed harmony only near greedy, so greedy (temperature 0, as the eval decodes);
    # at vLLM's own default of 1.0 most replies came back with raw <|channel|> tokens in the text and no reasoning.
    # do_sample only satisfies transformers' check that a temperature is for sampling; vLLM reads the temperature.
    "generation_defaults": {"do_sample": True, "temperature": 0.0},
    # pre-training (see the module docstring); the text's recipe is part of the cache key
    "pretrain_text": "tiny_corpus: generated, no sample row; analysis English 70%, else the named language; "
    "instruction documents; samples' words x4 shuffled; one shared row for unused tokens",
    "pretrain_conversations": 2000,
    "pretrain_documents": 1200,
    "pretrain_steps": 700,
    "pretrain_threads": 2,  # the same arithmetic on every machine (a CPU's thread count changes float sums)
    "pretrain_cpu_path": "avx2",  # and the same kernels (PORTABLE_CPU: a process of its own, built_portably)
    "pretrain_deterministic": True,  # torch.use_deterministic_algorithms (_pretrain_on: the same model every build)
    "pretrain_batch": 16,
    "pretrain_learning_rate": 3e-3,
}
# The tools variant continues the plain base's pre-training (its weights, then these steps) instead of repeating
# it from random weights: a fresh machine builds both, and the full 700 steps again cost ~4 minutes of its CPU.
TOOLS_RECIPE = {
    "pretrain_text": "every third conversation a row of the tool-calling sample",
    "continued_from": "the plain base (RECIPE), its other-token row kept",
    "pretrain_steps": 300,
    "pretrain_learning_rate": 3e-3,
}


# The pre-training runs on one CPU code path wherever it runs: ATen's AVX2 kernels (not a machine's AVX-512 ones),
# MKL's AVX2 results (conditional numerical reproducibility) and oneDNN capped at AVX2. Each machine's widest path
# sums floats in its own order, and 700 steps from one seed then end in different models: the main job's base
# measured validation loss 5.965 on one machine and 6.178 on another, and its fine-tune passed scripts/test.sh's
# quality check on the first and failed it on the second (format_valid 0.333, chrF interval below zero). These are
# read when torch starts, so the build runs in a process of its own (built_portably).
PORTABLE_CPU = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def tiny_gpt_oss_path(mxfp4: bool = False, tools: bool = False) -> Path:
    """Path of the tiny model, building it first if this machine has none cached."""
    recipe = [RECIPE, mxfp4, *([TOOLS_RECIPE] if tools else [])]
    stem = f"tiny-gpt-oss{'-mxfp4' if mxfp4 else ''}{'-tools' if tools else ''}"
    build = lambda out: built_portably(out, "builtin.tiny_model._build", mxfp4=mxfp4, tools=tools)  # noqa: E731
    # measured alone on 2 idle cores (docs/testing.md); the MXFP4 and tools bases start from the plain one
    duration = "about 2 minutes more" if tools else "10 s more" if mxfp4 else "about 3.5 minutes on 2 idle cores"
    return cached_build(stem, recipe, build, duration)


def built_portably(out: Path, builder: str, **arguments: bool) -> None:
    """`toolkit_train.<module>.<function>(out, **arguments)` (builder "module.function") in a child process on the
    PORTABLE_CPU code path (its progress lines pass through); raises RuntimeError if it fails."""
    import subprocess

    module, function = builder.rsplit(".", 1)
    package_parent = str(Path(__file__).resolve().parents[2])  # the folder that holds toolkit_train/
    code = (
        f"import sys; from pathlib import Path; from toolkit_train.{module} import {function}; "
        f"{function}(Path(sys.argv[1]), **{arguments!r})"
    )
    path = os.pathsep.join([package_parent, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, **PORTABLE_CPU, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", code, str(out)], env=env)
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model {out.name} failed (exit {done.returncode}; its output is above)")


class NotBuilt(LookupError):
    """A tiny model not built on this machine yet, asked for where nothing may be built (`without_building`)."""


_NO_BUILD: contextvars.ContextVar[bool] = contextvars.ContextVar("toolkit_tiny_no_build", default=False)


@contextlib.contextmanager
def without_building() -> Iterator[None]:
    """Inside it, a tiny model not built yet raises NotBuilt instead of being built (a check that only reads)."""
    token = _NO_BUILD.set(True)
    try:
        yield
    finally:
        _NO_BUILD.reset(token)


def cached_build(stem: str, recipe: Any, build: Callable[[Path], None], duration: str) -> Path:
    """`cache_root()/<stem>-<the recipe's hash>`, built once per machine by `build(directory)` (under a file lock:
    every process and rank waits for the one that builds; staged and renamed into place, so a kill leaves none)."""
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    target = cache_root() / f"{stem}-{key}"
    if (target / "config.json").exists():
        return target
    if _NO_BUILD.get():
        raise NotBuilt(target.name)
    from filelock import FileLock, Timeout

    target.parent.mkdir(parents=True, exist_ok=True)
    lock, owner = FileLock(str(target) + ".lock"), Path(str(target) + ".owner")
    try:
        lock.acquire(timeout=0)
    except Timeout:  # another process builds it: say who and since when, then wait (no silent wait)
        holder = owner.read_text().strip() if owner.exists() else "another process"
        _progress(f"waiting for {holder} to finish building {target.name} ({duration} from its start)")
        lock.acquire()
    try:
        if not (target / "config.json").exists():
            owner.write_text(f"pid {os.getpid()} ({' '.join(sys.argv[:2])[:80]}), since {time.strftime('%H:%M:%S')}\n")
            _progress(f"building {target.name} once for this machine (cached in {target.parent}; {duration})")
            staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-"))
            build(staging)
            staging.rename(target)
    finally:
        lock.release()
    return target


PROGRESS_EVERY = 50  # pre-training steps between progress lines (a build takes minutes: it must show it lives)


def _progress(message: str) -> None:
    """A line on stderr: the CLI's table and JSON on stdout stay clean; a job's log keeps it."""
    print(f"[toolkit] tiny model: {message}", file=sys.stderr, flush=True)


def build_tokenizer():
    """gpt-oss's own tokenizer (o200k_harmony, vocab 201088), rebuilt offline from the vocabulary inside the
    oss-harmony wheel, with gpt-oss's chat template: token ids match the real model's, so vLLM's harmony
    renderer and the training data agree on them."""
    import base64

    import openai_harmony
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from trl.chat_template_utils import gptoss_chat_template

    encoding = openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    specials = sorted((encoding.encode(name, allowed_special="all")[0], name) for name in encoding.special_tokens_set)
    with tempfile.TemporaryDirectory() as scratch:
        ranks = Path(scratch) / "o200k.tiktoken"
        ranks.write_text(
            "".join(
                f"{base64.b64encode(bytes(encoding._inner.decode_bytes([rank]))).decode()} {rank}\n"
                for rank in range(specials[0][0])
            )
        )
        backend = TikTokenConverter(vocab_file=str(ranks), pattern=O200K_PATTERN).converted()
    backend.add_special_tokens([AddedToken(name, special=True, normalized=False) for _, name in specials])
    if backend.token_to_id(specials[-1][1]) != specials[-1][0]:
        raise RuntimeError("rebuilt o200k_harmony tokenizer has shifted special token ids")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        model_max_length=RECIPE["max_position_embeddings"],
    )
    tokenizer.chat_template = gptoss_chat_template
    return tokenizer


def _build(out: Path, mxfp4: bool, pretrain: bool = True, tools: bool = False) -> None:
    """pretrain=False: random weights (benchmarks that only need the architecture and the tokenizer)."""
    import torch
    from transformers import GptOssForCausalLM

    tokenizer = build_tokenizer()
    if mxfp4 and pretrain:
        # the plain build's pre-trained weights (saved in float32: exact), quantized: pre-training is not repeated
        model = GptOssForCausalLM.from_pretrained(tiny_gpt_oss_path(tools=tools), dtype=torch.float32)
    elif tools and pretrain:  # the plain base, pre-trained further with the tool-calling rows (TOOLS_RECIPE)
        model = GptOssForCausalLM.from_pretrained(tiny_gpt_oss_path(), dtype=torch.float32)
        _pretrain(model, tokenizer, tools=True, recipe={**RECIPE, **TOOLS_RECIPE})
    else:
        model = _pretrained(tokenizer, pretrain)
    if mxfp4:
        _save_mxfp4(model, out)
    else:
        model.save_pretrained(out)
    _save_generation_config(out, tokenizer)
    tokenizer.save_pretrained(out)


def _pretrained(tokenizer, pretrain: bool):
    """The tiny architecture with the recipe's seed, pre-trained unless pretrain=False."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        vocab_size=len(tokenizer),
        hidden_size=RECIPE["hidden_size"],
        intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"],
        head_dim=RECIPE["head_dim"],
        num_local_experts=RECIPE["num_local_experts"],
        num_experts_per_tok=RECIPE["num_experts_per_tok"],
        sliding_window=RECIPE["sliding_window"],
        max_position_embeddings=RECIPE["max_position_embeddings"],
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(RECIPE["seed"])
    model = GptOssForCausalLM(config)
    with torch.no_grad():  # random-init experts are huge relative to this width; tame them
        for name, param in model.named_parameters():
            if "experts" in name and param.dim() >= 2:
                param.normal_(0.0, 0.02)
    if pretrain:
        _pretrain(model, tokenizer)
    return model


def _save_generation_config(out: Path, tokenizer) -> None:
    """gpt-oss's stop tokens (vLLM adds a generation config's eos ids to every request's stop tokens): without
    <|call|>, a served tool call would run on into a final answer. And the sampling defaults (RECIPE)."""
    from transformers import GenerationConfig

    eos = [tokenizer.convert_tokens_to_ids(token) for token in RECIPE["generation_eos"]]
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                     **RECIPE["generation_defaults"]).save_pretrained(out)  # fmt: skip


def pretraining_conversations(count: int, seed: int, tools: bool = False) -> list:
    """The generated conversations of `tiny_corpus` (no bundled sample row among them). With `tools`, every third
    conversation is a row of the tool-calling sample (normalized for harmony)."""
    import random

    from ..data import SAMPLE_PATH
    from ..families import harmony
    from ..settings import SAMPLES, TOOL_SAMPLE_DATASET
    from . import tiny_corpus

    tool_text = (SAMPLE_PATH.parent / SAMPLES[TOOL_SAMPLE_DATASET]).read_text()
    tool_rows = [json.loads(line) for line in tool_text.splitlines() if line.strip()] if tools else []
    rng = random.Random(seed)
    conversations: list = []
    for index in range(count):
        if tool_rows and index % 3 == 2:
            row = tool_rows[rng.randrange(len(tool_rows))]
            conversations.append(harmony.normalize(row, row["messages"], "medium"))
        else:
            conversations.append(tiny_corpus.conversation(rng))
    return conversations


VOCABULARY_SHUFFLES = 4  # each word met a few times, in other company each time


def pretraining_documents(count: int, seed: int) -> list[str]:
    """Plain instruction documents in the six languages (`tiny_corpus.document`), then the bundled samples' words
    as shuffled lists (`tiny_corpus.vocabulary_documents`: words, never a sentence of a sample)."""
    import random

    from ..data import SAMPLE_PATH
    from . import tiny_corpus

    rng = random.Random(seed + 1)
    instructions = [tiny_corpus.document(rng) for _ in range(count)]
    texts = []
    for sample in sorted(SAMPLE_PATH.parent.glob("*.jsonl")):
        for line in sample.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                texts += [row[key] for key in ("user", "analysis", "final") if isinstance(row.get(key), str)]
    return instructions + [
        line for _ in range(VOCABULARY_SHUFFLES) for line in tiny_corpus.vocabulary_documents(texts, rng)
    ]


def _pretrain(model, tokenizer, tools: bool = False, recipe: dict[str, Any] = RECIPE) -> None:
    """Next-token training on every token of the pre-training conversations, all weights.

    The softmax runs over the tokens the text uses (a few thousand of 201,088) plus one class standing for all the
    others, which share one learned LM-head row: the full-vocabulary softmax, 50x cheaper on a CPU. Every unused
    token's row is then set to that shared row, so the model is calibrated over the whole vocabulary (a fine-tune's
    loss starts where a real base's would, not at log(201,088)) and never emits an unused (e.g. reserved special)
    token.
    """
    import torch

    from ..data import _tokenize

    conversations = pretraining_conversations(RECIPE["pretrain_conversations"], RECIPE["seed"], tools)
    encoded = _tokenize(conversations, tokenizer, date=RECIPE["conversation_date"])
    documents = pretraining_documents(RECIPE["pretrain_documents"], RECIPE["seed"])
    encoded["input_ids"] += [tokenizer(text, add_special_tokens=False)["input_ids"] for text in documents]
    _pretrain_on(model, tokenizer, [torch.tensor(ids) for ids in encoded["input_ids"]], recipe)


def _pretrain_on(model, tokenizer, sequences: list, recipe: dict[str, Any] = RECIPE) -> None:
    """`_pretrain_steps` on these token sequences, the softmax over the tokens they use (+ one class for the rest),
    with the recipe's CPU thread count (the same arithmetic on every machine) and torch's deterministic algorithms:
    without them two builds in two processes of one machine ended in different weights (2 of 3 runs of 30 steps
    agreed; the cached model and a rebuild differed by up to 0.28 in a weight), with them every build agrees.
    `recipe`: another tiny model's."""
    import torch

    used = torch.unique(torch.cat(sequences))
    to_used = torch.full((len(tokenizer),), -100, dtype=torch.long)
    to_used[used] = torch.arange(len(used))
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(recipe["pretrain_threads"])
    torch.use_deterministic_algorithms(bool(recipe.get("pretrain_deterministic")))  # Qwen3's recipes: not yet
    try:
        _pretrain_steps(model, tokenizer, sequences, used, to_used, recipe)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _pretrain_steps(model, tokenizer, sequences: list, used, to_used, recipe: dict[str, Any] = RECIPE) -> None:
    """The optimizer's loop of `_pretrain`: batches of the sequences, the softmax over the used tokens + one.
    `recipe`: its steps, batch size, peak learning rate and seed (another tiny model's)."""
    import math
    import random

    import torch

    steps, batch, peak = recipe["pretrain_steps"], recipe["pretrain_batch"], recipe["pretrain_learning_rate"]
    # "any other token": a fresh model's starts at zero, a pre-trained one's (continued) where it was learned
    others = torch.ones(len(tokenizer), dtype=torch.bool)
    others[used] = False
    first_other = int(others.nonzero()[0])
    start = model.lm_head.weight[first_other].detach().clone() if recipe.get("continued_from") else None
    unused_row = torch.nn.Parameter(start if start is not None else torch.zeros(model.config.hidden_size))
    log_unused = math.log(len(tokenizer) - len(used))  # the other tokens' share of the softmax, all on one row
    optimizer = torch.optim.AdamW([*model.parameters(), unused_row], lr=peak, weight_decay=0.0)
    rng = random.Random(recipe["seed"])
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:  # short warmup, then cosine to zero
            group["lr"] = peak * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / steps))
        chosen = [sequences[i] for i in rng.sample(range(len(sequences)), batch)]
        width = max(len(ids) for ids in chosen)
        input_ids = torch.full((batch, width), tokenizer.pad_token_id)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        targets = torch.full((batch, width), -100)
        for row, ids in enumerate(chosen):
            input_ids[row, : len(ids)], attention_mask[row, : len(ids)] = ids, 1
            targets[row, : len(ids) - 1] = to_used[ids[1:]]
        hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = torch.cat([hidden @ model.lm_head.weight[used].T, (hidden @ unused_row + log_unused)[..., None]], -1)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % PROGRESS_EVERY == 0:
            _progress(f"pre-training step {step + 1}/{steps}, loss {loss.item():.2f}")
    with torch.no_grad():
        model.lm_head.weight[others] = unused_row
    model.eval()


def _save_mxfp4(model, out: Path) -> None:
    """Write the experts as gpt-oss's MXFP4 checkpoints do: uint8 `*_blocks` + `*_scales`."""
    from safetensors.torch import save_file

    from ..kernels.mxfp4 import QUANTIZATION_CONFIG, quantize

    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # HF keeps [E, in, out]; the checkpoint stores [E, out, in/32, 16] nibble pairs
            blocks, scales = quantize(tensor.transpose(1, 2).contiguous())
            state[name + "_blocks"], state[name + "_scales"] = blocks, scales
        else:
            state[name] = tensor.contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["quantization_config"] = QUANTIZATION_CONFIG
    (out / "config.json").write_text(json.dumps(config, indent=2))
