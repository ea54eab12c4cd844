"""A tiny dense Qwen3 (the real `Qwen3ForCausalLM`, 2 layers) with a small byte-level BPE and a Qwen3 chat template,
built offline: the chat-template family's counterpart of the tiny gpt-oss (`builtin:tiny-qwen3`).

No hub: the tokenizer is trained here with the `tokenizers` library on the bundled samples' text (byte-level, so
any text encodes), with Qwen's special tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) and its added tags
(`<think>`, `<tool_call>`, `<tool_response>`, ...). Its chat template is Qwen3's own (reasoning in `<think>`, the
reasoning of turns before the last user message dropped, tools in `<tools>`, calls in `<tool_call>`) with
`{% generation %}` markers around what the assistant generates (from its `<think>` through `<|im_end|>`), so the
trained tokens are the template's own assistant mask.

Pre-trained like the tiny gpt-oss (builtin/tiny_model.py, seeded, fixed CPU threads: every machine builds the
same weights), on the same generated conversations (`tiny_corpus`: no bundled sample row among them, the reasoning
in English most of the time whatever the system prompt asks), rendered with this template: it writes Qwen3's shape
(`<think>` reasoning `</think>` answer `<|im_end|>`), which the served model's reasoning parser takes apart, and a
fine-tune on the multilingual sample has a skill to teach (reasoning in the language the system prompt names).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .tiny_model import cached_build

RECIPE: dict[str, Any] = {
    "tokenizer": "byte-level BPE on the bundled samples' text",
    "vocab_size": 2048,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention supports multiples of 32 and up
    "max_position_embeddings": 4096,
    "seed": 0,
    "template": 1,  # the template's version (CHAT_TEMPLATE): a change rebuilds the model
    # the sampling a request without its own gets (generation_config.json, which vLLM applies): greedy, as the tiny
    # gpt-oss's and as the eval decodes; at vLLM's own 1.0 a model this small writes tags into its answer
    "generation_defaults": {"do_sample": True, "temperature": 0.0},
    # pre-training on tiny_corpus's conversations (tiny_model.pretraining_conversations), every token, all weights
    "pretrain_text": "tiny_corpus conversations in this template",
    "pretrain_conversations": 1000,
    "pretrain_steps": 300,
    "pretrain_threads": 2,  # the same arithmetic on every machine (a CPU's thread count changes float sums)
    "pretrain_batch": 16,
    "pretrain_learning_rate": 3e-3,
}
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# Qwen2/3's pre-tokenizer pattern (their tokenizer.json)
QWEN_PATTERN = "|".join([
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)""",
    r"""[^\r\n\p{L}\p{N}]?\p{L}+""",
    r"""\p{N}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])  # fmt: skip

# Qwen3's chat template (Qwen3-8B's tokenizer_config.json), with {% generation %} markers around the assistant's
# generated text: the served prompt (add_generation_prompt) is Qwen3's, and the mask is exactly what it generates
CHAT_TEMPLATE = (Path(__file__).parent / "templates" / "tiny-qwen3.jinja").read_text().rstrip("\n")


# The tiny Qwen3-MoE (`builtin:tiny-qwen3-moe`): the same tokenizer, template, sizes and pre-training, with the real
# `Qwen3MoeForCausalLM`'s sparse MLP in every layer (a top-2-of-4 router `mlp.gate`, 3-D experts
# `mlp.experts.gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I]): the MoE chat-template family's test model
MOE_CONFIG: dict[str, Any] = {  # what Qwen3MoeConfig takes beyond the dense recipe's sizes
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "decoder_sparse_step": 1,  # every layer sparse, as Qwen3-30B-A3B
}
MOE_RECIPE: dict[str, Any] = {**RECIPE, "architecture": "Qwen3MoeForCausalLM", **MOE_CONFIG}


def tiny_qwen3_path(moe: bool = False) -> Path:
    """Path of the tiny Qwen3 (the MoE one with `moe`), building it first if this machine has none cached."""
    if moe:
        return cached_build("tiny-qwen3-moe", [MOE_RECIPE, CHAT_TEMPLATE], _build_moe, "about 20 s on 2 idle cores")
    return cached_build("tiny-qwen3", [RECIPE, CHAT_TEMPLATE], _build, "about 20 s on 2 idle cores")


def sample_texts() -> list[str]:
    """Every string of every bundled sample row (the tokenizer's training text)."""
    from ..data import SAMPLE_PATH

    def strings(value: Any) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, dict):
            return [s for item in value.values() for s in strings(item)]
        if isinstance(value, list):
            return [s for item in value for s in strings(item)]
        return []

    texts = []
    for sample in sorted(SAMPLE_PATH.parent.glob("*.jsonl")):
        for line in sample.read_text().splitlines():
            if line.strip():
                texts += strings(json.loads(line))
    return texts


def build_tokenizer(
    special: tuple[str, ...] = SPECIAL,
    added: tuple[str, ...] = ADDED,
    eos: str = "<|im_end|>",
    pad: str = "<|endoftext|>",
    bos: str | None = None,
    template: str = CHAT_TEMPLATE,
):
    """The byte-level BPE trained on the bundled samples' text with these special tokens (Qwen3's by default; the
    tiny generic models give their own: tiny_generic.py) and chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"],
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(sample_texts(), trainer=trainer)
    backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in added])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=eos,
        pad_token=pad,
        bos_token=bos,
        model_max_length=RECIPE["max_position_embeddings"],
    )
    tokenizer.chat_template = template
    return tokenizer


def _build(out: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _build_with(out, RECIPE, Qwen3Config, Qwen3ForCausalLM, {})


def _build_moe(out: Path) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    _build_with(out, MOE_RECIPE, Qwen3MoeConfig, Qwen3MoeForCausalLM, MOE_CONFIG)


def sized_config(config_class, recipe: dict[str, Any], tokenizer, **fields: Any):
    """A tiny model's config: the recipe's sizes, the tokenizer's vocabulary and pad/eos ids, and `fields`."""
    return config_class(
        vocab_size=len(tokenizer),
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_hidden_layers=recipe["num_hidden_layers"],
        num_attention_heads=recipe["num_attention_heads"],
        num_key_value_heads=recipe["num_key_value_heads"],
        head_dim=recipe["head_dim"],
        max_position_embeddings=recipe["max_position_embeddings"],
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **fields,
    )


def _build_with(out: Path, recipe: dict[str, Any], config_class, model_class, extra: dict[str, Any]) -> None:
    import torch
    from transformers import GenerationConfig

    tokenizer = build_tokenizer()
    config = sized_config(config_class, recipe, tokenizer, bos_token_id=None, tie_word_embeddings=False, **extra)
    torch.manual_seed(recipe["seed"])
    model = model_class(config)
    _pretrain(model, tokenizer, recipe)
    model.save_pretrained(out)
    eos = [tokenizer.convert_tokens_to_ids(token) for token in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                     **recipe["generation_defaults"]).save_pretrained(out)  # fmt: skip
    tokenizer.save_pretrained(out)


def _pretrain(model, tokenizer, recipe: dict[str, Any], reasoning: bool = True) -> None:
    """Next-token training on every token of tiny_corpus's conversations rendered with the chat template (the tiny
    gpt-oss's loop: `tiny_model._pretrain_on`); without `reasoning`, the conversations' reasoning left out (a
    template that has no field for it)."""
    import torch

    from ..data import without_reasoning
    from ..families.formats import CHAT_TEMPLATE as TEMPLATE_FORMAT
    from .tiny_model import _pretrain_on, _progress, pretraining_conversations

    _progress(f"pre-training the tiny {model.config.model_type} ({recipe['pretrain_steps']} steps)")
    conversations = pretraining_conversations(recipe["pretrain_conversations"], recipe["seed"])
    if not reasoning:
        conversations = [without_reasoning({"messages": c})["messages"] for c in conversations]
    sequences = [
        torch.tensor(tokenizer.apply_chat_template(TEMPLATE_FORMAT.messages({"messages": c}, tokenizer),
                                                   tokenize=True, return_dict=True)["input_ids"])
        for c in conversations
    ]  # fmt: skip
    _pretrain_on(model, tokenizer, sequences, recipe)
