"""Tiny causal LMs that no family record claims, each with its own model's chat template, built offline: the generic
chat-template path's test models (`builtin:tiny-llama`, `builtin:tiny-gemma`).

- tiny-llama: the real `LlamaForCausalLM` (2 layers) with Llama 3's chat template (Meta-Llama-3-8B-Instruct's:
  header tokens, `<|eot_id|>` ends a turn), no reasoning field and no tools;
- tiny-gemma: the real `GemmaForCausalLM` (2 layers, tied embeddings) with Gemma 3's chat template (the system
  prompt folded into the first user turn, the assistant's role written `model`, roles must alternate: a tool
  message is refused by the template itself), no reasoning field and no tools.

Neither template carries `{% generation %}` markers, so the trained tokens are diffed from the template
(formats.ChatTemplate). Their tokenizers are tiny Qwen3's byte-level BPE (tiny_qwen3.build_tokenizer) with each
model's own special tokens; pre-trained as tiny Qwen3 is on tiny_corpus's conversations, without the reasoning (which
the templates cannot render), so what the fine-tune on the multilingual sample teaches is its answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .tiny_model import cached_build
from .tiny_qwen3 import RECIPE as QWEN3_RECIPE

TEMPLATES = Path(__file__).parent / "templates"
MODELS: dict[str, dict[str, Any]] = {
    "tiny-llama": {
        "architecture": "LlamaForCausalLM",
        "special": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",  # Llama 3 Instruct's: a turn's end is what generation stops at
        "pad": "<|end_of_text|>",
        "stops": ["<|eot_id|>", "<|end_of_text|>"],
        "tie_word_embeddings": False,
        "template": (TEMPLATES / "tiny-llama.jinja").read_text().rstrip("\n"),
    },
    "tiny-gemma": {
        "architecture": "GemmaForCausalLM",
        "special": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        "bos": "<bos>",
        "eos": "<end_of_turn>",  # the turn's end (Gemma's generation_config stops there and at <eos>)
        "pad": "<pad>",
        "stops": ["<end_of_turn>", "<eos>"],
        "tie_word_embeddings": True,
        "template": (TEMPLATES / "tiny-gemma.jinja").read_text().rstrip("\n"),
    },
}
# tiny Qwen3's sizes, seed, sampling defaults and pre-training; the tokenizer and template are each model's
SIZES = {key: value for key, value in QWEN3_RECIPE.items() if key not in ("template",)}


def recipe(name: str) -> dict[str, Any]:
    return {**SIZES, **MODELS[name], "pretrain_text": "tiny_corpus conversations in this template, no reasoning"}


def tiny_generic_path(builtin_id: str) -> Path:
    """Path of `builtin:<name>` (tiny-llama or tiny-gemma), building it first if this machine has none cached."""
    name = builtin_id.removeprefix("builtin:")
    return cached_build(name, recipe(name), lambda out: _build(out, recipe(name)), "about 20 s on 2 idle cores")


def build_tokenizer(spec: dict[str, Any]):
    from .tiny_qwen3 import build_tokenizer as qwen3_tokenizer

    return qwen3_tokenizer(special=tuple(spec["special"]), added=(), eos=spec["eos"], pad=spec["pad"],
                           bos=spec["bos"], template=spec["template"])  # fmt: skip


def _build(out: Path, spec: dict[str, Any]) -> None:
    import torch
    import transformers
    from transformers import GenerationConfig

    from .tiny_qwen3 import _pretrain, sized_config

    tokenizer = build_tokenizer(spec)
    config_class = getattr(transformers, spec["architecture"].replace("ForCausalLM", "Config"))
    config = sized_config(config_class, spec, tokenizer, bos_token_id=tokenizer.bos_token_id,
                          tie_word_embeddings=spec["tie_word_embeddings"])  # fmt: skip
    torch.manual_seed(spec["seed"])
    model = getattr(transformers, spec["architecture"])(config)
    _pretrain(model, tokenizer, spec, reasoning=False)
    model.save_pretrained(out)
    stops = [tokenizer.convert_tokens_to_ids(token) for token in spec["stops"]]
    GenerationConfig(eos_token_id=stops, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                     **spec["generation_defaults"]).save_pretrained(out)  # fmt: skip
    tokenizer.save_pretrained(out)
