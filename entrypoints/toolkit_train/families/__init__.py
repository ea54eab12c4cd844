"""Model families: what the toolkit knows about an architecture, one record each, so that the code asks a
record's fields instead of branching on a model's name.

A model belongs to a family by its `config.json` `model_type` where one is on this machine (a checkpoint
directory, or a hub id downloaded before, in the Hugging Face cache), else, for a hub id (or a path not here), by
the family's marker in its name; every other causal LM is the generic family, which constrains
nothing the toolkit cannot check: it trains through the model's own chat template (a tokenizer without one is
refused when the data is prepared) and is served without reasoning or tool parsers. Adding an architecture means
adding a record here (tests/toolkit_train/families/test_families.py runs every field of every record through the
code that reads it, and fails when a name check appears outside this module).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class ModelFamily:
    name: str
    # how training renders its conversations (families/formats.py): harmony (openai_harmony, parity-checked when
    # served) or template (the tokenizer's own chat template); None: no format is known to render it, and training
    # it is refused
    chat_format: Literal["harmony", "template"] | None = None
    model_type: str | None = None  # config.json's model_type
    id_marker: str | None = None  # a hub id naming the family contains this (lower case)
    # a hub id with the marker that names another architecture anyway (a regex on the lower-case id)
    id_excludes: str | None = None
    id_requires: str | None = None  # what a hub id with the marker must also have to be this family (a regex)
    example_id: str | None = None  # a real hub id of the family (the tests' and the docs' example)
    lora_modules: tuple[str, ...] | None = None  # its LoRA-able module names; None: not checked
    expert_parameters: tuple[str, ...] = ()  # its 3-D MoE expert parameters (lora.target_parameters)
    # peft reads lora.target_modules: all-linear on it as transformers v4's linear layers: the router and every
    # expert too (peft's MoE conversion), so the toolkit asks for the modules by name instead
    all_linear_reaches_experts: bool = False
    attention_kernels: tuple[str, ...] | None = None  # the kernels it runs correctly with; None: any
    attention_reason: str = ""  # why the others are refused, said to the user
    decoder_layer: str | None = None  # the decoder layer class: FSDP wraps each one
    fused_experts: bool = False  # the toolkit's fused MoE experts apply (toolkit_train/kernels/moe.py)
    packed_mxfp4: bool = False  # its MXFP4 checkpoints can keep the experts packed (model.experts: mxfp4)
    lora_serving_needs_gpu: bool = False  # vLLM's LoRA kernels for its layers (MoE) exist only on a GPU
    # vLLM 0.32 loads an adapter with expert LoRA (lora.target_parameters, or all-linear through peft's MoE
    # conversion) for it; False: its MoE layer there takes 2-D expert weights and refuses the 3-D expert adapter
    # (the way around needs an engine flag and a per-request setting that neither --lora-modules nor SageMaker's
    # adapter registration sends), so only the merged model serves such a fine-tune
    serves_expert_adapters: bool = True
    # vLLM flags it is served with by default; containers/serving/serve.py holds the image's copy (no toolkit
    # code runs in the serving image) and a test ties the two. A template family's model is served with the
    # parsers its own chat template calls for where the template is at hand (serve.py's template_parsers: a Qwen3
    # variant that never opens <think> gets no reasoning parser; Coder's XML tool calls, qwen3_coder); these are
    # the fallback (a base component's adapters arrive at run time)
    vllm_defaults: dict[str, str | None] = field(default_factory=dict)

    def holds(self, model_id: str) -> bool:
        """A checkpoint directory here is what its config.json says (a Qwen3-MoE copy named qwen3-... is not dense
        Qwen3); any other id, by the family's marker in its name."""
        here = local_model_type(model_id)
        if here is not None and self.model_type is not None:
            return here == self.model_type
        named = model_id.lower()
        if self.id_excludes and re.search(self.id_excludes, named):
            return False
        if self.id_requires and not re.search(self.id_requires, named):
            return False
        return bool(self.id_marker and self.id_marker in named)


GPT_OSS = ModelFamily(
    name="gpt-oss",
    chat_format="harmony",
    model_type="gpt_oss",
    id_marker="gpt-oss",
    example_id="openai/gpt-oss-20b",
    lora_modules=("q_proj", "k_proj", "v_proj", "o_proj", "embed_tokens", "lm_head"),
    expert_parameters=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
    attention_kernels=("eager", "flex_attention"),
    attention_reason="gpt-oss uses attention sinks, which sdpa does not support",
    decoder_layer="GptOssDecoderLayer",
    fused_experts=True,
    packed_mxfp4=True,
    lora_serving_needs_gpu=True,
    vllm_defaults={
        "--reasoning-parser": "openai_gptoss",
        "--tool-call-parser": "openai",
        "--enable-auto-tool-choice": None,
    },
)
# Qwen3-MoE hub ids carry dense Qwen3's marker too, and name their active parameters (Qwen3-30B-A3B,
# Qwen3-235B-A22B, Qwen3-Coder-30B-A3B-Instruct) or say "moe"
QWEN3_MOE_IDS = r"-a\d+(\.\d+)?b\b|-moe\b"
# Other architectures whose hub ids carry the marker too: vision-language (Qwen3-VL, config qwen3_vl[_moe]), Qwen3-Next
# (qwen3_next: hybrid attention), Qwen3-Omni: neither record holds them (they are not guessed as dense or MoE Qwen3)
OTHER_QWEN3_IDS = r"qwen3-?(vl|next|omni)\b"
# vLLM 0.32's parsers for Qwen3's template: the reasoning in <think>, tool calls as JSON in <tool_call> (hermes)
QWEN3_VLLM = {"--reasoning-parser": "qwen3", "--tool-call-parser": "hermes", "--enable-auto-tool-choice": None}
QWEN3 = ModelFamily(
    name="qwen3",
    chat_format="template",
    model_type="qwen3",
    id_marker="qwen3",
    id_excludes=f"{QWEN3_MOE_IDS}|{OTHER_QWEN3_IDS}",
    example_id="Qwen/Qwen3-8B",
    lora_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    decoder_layer="Qwen3DecoderLayer",
    vllm_defaults=QWEN3_VLLM,
)  # dense Qwen3 (Qwen3-0.6B ... Qwen3-32B)
QWEN3_MOE = ModelFamily(
    name="qwen3-moe",
    chat_format="template",  # Qwen3's chat template
    model_type="qwen3_moe",
    id_marker="qwen3",
    id_excludes=OTHER_QWEN3_IDS,
    id_requires=QWEN3_MOE_IDS,
    example_id="Qwen/Qwen3-30B-A3B",
    # attention projections; every layer's MLP is the sparse block (the router `mlp.gate` is no Linear)
    lora_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
    expert_parameters=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),  # [E, 2I, H] and [E, H, I]
    all_linear_reaches_experts=True,  # peft 0.21: the router's weight, gate_up_proj at 2r, down_proj
    decoder_layer="Qwen3MoeDecoderLayer",
    lora_serving_needs_gpu=True,
    serves_expert_adapters=False,
    vllm_defaults=QWEN3_VLLM,
)  # Qwen3-30B-A3B, Qwen3-235B-A22B: transformers' experts (the fused and packed paths are gpt-oss's, measured there)
# Any other causal LM (Llama, Mistral, Gemma, Phi, ...): rendered with its own chat template, the trained tokens
# diffed from it (formats.ChatTemplate) and checked against what vLLM serves at deploy; no parsers by default
GENERIC = ModelFamily(name="causal LM", chat_format="template")
FAMILIES = (GPT_OSS, QWEN3, QWEN3_MOE)  # every family but the generic one


def local_model_type(model_id: str) -> str | None:
    """`model_type` of a checkpoint on this machine: a directory's config.json, or a hub id's in the Hugging Face
    cache (a model downloaded before: read offline, never fetched); None for anything else, and for paths that exist
    only where the job runs (e.g. a cluster's /fsx)."""
    try:
        return json.loads(model_file(model_id, "config.json").read_text()).get("model_type")  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError):
        return None


def has_chat_template(model_id: str) -> bool | None:
    """Whether a model on this machine (a directory, or a hub id in the cache) ships a chat template (its
    chat_template.jinja, or tokenizer_config.json's chat_template); None where it cannot be told here."""
    if model_file(model_id, "chat_template.jinja") is not None:
        return True
    config = model_file(model_id, "tokenizer_config.json")
    if config is None:
        return None
    try:
        return bool(json.loads(config.read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return None


def model_file(model_id: str, name: str) -> Path | None:
    """A model's file on this machine: in its directory, or a hub id's in the Hugging Face cache; None if not here."""
    here = Path(model_id).expanduser() / name
    return here if here.is_file() else _cached_hub_file(model_id, name)


def _cached_hub_file(model_id: str, name: str) -> Path | None:
    """A hub model's file in the local Hugging Face cache (its main revision), if it was downloaded."""
    if model_id.count("/") != 1 or ":" in model_id:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache  # not in `pip install .` without extras: name-only then
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(model_id, name)
    except Exception:  # not a valid repo id: the name decides
        return None
    return Path(found) if isinstance(found, str) else None


def family_of(model_id: str) -> ModelFamily:
    """The family a model id belongs to (the generic one when none claims it)."""
    return next((family for family in FAMILIES if family.holds(model_id)), GENERIC)


def known_family(model_id: str, is_path: bool) -> ModelFamily | None:
    """As family_of, but None where it cannot be told here: a directory that exists only where the job runs."""
    family = family_of(model_id)
    if family is GENERIC and is_path and local_model_type(model_id) is None:
        return None
    return family
