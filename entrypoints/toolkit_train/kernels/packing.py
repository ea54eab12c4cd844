"""The fast training path: packed micro-batches with real document masks, and a loss that skips the prompt.

- Rows are packed (first-fit decreasing) into micro-batches of at most `token_budget` tokens: no padding,
  and one GPU launch covers many rows instead of one.
- Packed rows never attend to each other: the attention masks are built per document, for every layer
  type (gpt-oss alternates sliding-window and full attention). transformers' own gpt-oss path ignores
  position_ids when it builds masks, so packing without these masks would leak attention across rows.
- The loss runs the 201k-vocabulary head only on positions whose next token is trained (the assistant's
  answer), in chunks that are recomputed in the backward pass: full fp32 logits never exist.
The objective is the recipe's: token-mean cross-entropy over assistant tokens (+ the router's
load-balancing loss with the model's own coefficient, as TRL adds it; the validation loss is the cross-entropy alone).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from ..data import IGNORE_INDEX

LOSS_CHUNK = 2048  # positions per lm_head chunk: 2048 x 201k x 4 bytes = 1.6 GB of transient fp32 logits
# Compiled flex_attention with a block mask failed to lower (inductor's NoValidChoicesError; torch 2.11 on an H100) at
# sequence lengths between 64 and 128 that are not a power of two: 100, 103, 127 failed; 16, 64, 128, 129, 200, 256,
# 357 compiled (bench/flex_short_sequences.py, docs/grpo.md). Under flex every sequence is padded to a multiple of this.
FLEX_LENGTH_MULTIPLE = 128


def flex_length(length: int) -> int:
    """The length a sequence of `length` tokens is padded to under flex_attention."""
    return -(-length // FLEX_LENGTH_MULTIPLE) * FLEX_LENGTH_MULTIPLE


def pack(lengths: list[int], token_budget: int, seed: int) -> list[list[int]]:
    """Row indices grouped into bins of at most `token_budget` tokens (first-fit decreasing), shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for index in order:
        size = lengths[index]
        if size > token_budget:
            raise ValueError(f"row {index} has {size} tokens, more than the micro-batch budget {token_budget}")
        for b, free in enumerate(room):
            if size <= free:
                bins[b].append(index)
                room[b] -= size
                break
        else:
            bins.append([index])
            room.append(token_budget - size)
    random.Random(seed).shuffle(bins)
    return bins


def packed_dataset(dataset, token_budget: int, seed: int):
    """One row per micro-batch: concatenated input_ids/labels, restarting position_ids, document ids."""
    import datasets

    ids, labels = dataset["input_ids"], dataset["labels"]
    rows: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": [], "document_ids": []}
    for group in pack([len(x) for x in ids], token_budget, seed):
        packed: dict[str, list] = {key: [] for key in rows}
        for doc, index in enumerate(group):
            n = len(ids[index])
            packed["input_ids"] += ids[index]
            # the first token of a document is never a target: it must not be predicted from the previous one
            packed["labels"] += [IGNORE_INDEX, *labels[index][1:]]
            packed["position_ids"] += list(range(n))
            packed["document_ids"] += [doc] * n
        for key in rows:
            rows[key].append(packed[key])
    return datasets.Dataset.from_dict(rows)


def collate(features: list[dict[str, Any]], pad_to: int | None = None) -> dict[str, Any]:
    """Micro-batches of packed rows, right-padded to `pad_to` or the longest (document id -1 marks padding).

    A fixed width keeps tensor shapes static, so compiled attention kernels are built once, not per batch.
    """
    import torch

    width = pad_to or max(len(f["input_ids"]) for f in features)

    def column(key: str, fill: int):
        return torch.tensor([f[key] + [fill] * (width - len(f[key])) for f in features], dtype=torch.long)

    return {
        "input_ids": column("input_ids", 0),
        "labels": column("labels", IGNORE_INDEX),
        "position_ids": column("position_ids", 0),
        "document_ids": column("document_ids", -1),
    }


def attention_masks(config, document_ids, implementation: str) -> Any:
    """Masks causal, same document, and within the sliding window where a layer has one: per layer type (a dict,
    which the models whose layers differ take, e.g. gpt-oss), or the one mask where every layer attends alike (a
    4-D mask passes through every model's mask creation as it is; Qwen3-MoE takes no dict)."""
    import torch

    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    length = document_ids.shape[1]
    masks: dict[str, Any] = {}
    for layer_type in types:
        span = window if layer_type == "sliding_attention" else None
        if implementation == "flex_attention":
            masks[layer_type] = _block_mask(document_ids, span)
        else:
            q = torch.arange(length, device=document_ids.device)
            allowed = (q[None, :] <= q[:, None])[None] & (document_ids[:, :, None] == document_ids[:, None, :])
            allowed &= (document_ids >= 0)[:, :, None]
            if span is not None:
                allowed &= (q[:, None] - q[None, :] < span)[None]
            additive = torch.zeros(allowed.shape, dtype=torch.float32, device=document_ids.device)
            additive.masked_fill_(~allowed, torch.finfo(torch.float32).min)
            masks[layer_type] = additive[:, None]
    return masks if len(masks) > 1 else next(iter(masks.values()))


def _block_mask(document_ids, span: int | None):
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q, kv):
        keep = (kv <= q) & (document_ids[b, q] == document_ids[b, kv]) & (document_ids[b, q] >= 0)
        if span is not None:
            keep = keep & (q - kv < span)
        return keep

    batch, length = document_ids.shape
    # compiled: eager, create_block_mask evaluates mask_mod on every (q, kv) pair ([L, L] tensors, several per call:
    # ~0.1 s a step and GiBs of transients at DPO's 5k-token packed rows); compiled, it runs as one fused kernel
    return create_block_mask(mask_mod, batch, None, length, length, device=document_ids.device, _compile=True)


class RouterLogits:
    """Collects each MoE router's logits during the trainer's forward (for the load-balancing loss) via hooks.

    Only inside `recording()`: gradient checkpointing re-runs every layer's forward during backward, and a router
    output kept from such a re-run holds that layer's recomputed activations alive until the next step. Kept,
    they cost ~2.7 MB per token on the gpt-oss-120b shape (82.9 -> 93.8 GB from 4k to 8k-token micro-batches).
    """

    def __init__(self, model) -> None:
        self.logits: list[Any] = []
        self.active = False
        # the router class and the output index the architecture itself records router logits from (transformers'
        # `_can_record_outputs`: gpt-oss's mlp.router, Qwen3-MoE's mlp.gate, ...)
        recorder = type(model)._can_record_outputs["router_logits"]
        self.index = recorder.index
        self.handles = [
            module.register_forward_hook(self._keep)
            for module in model.modules()
            if isinstance(module, recorder.target_class)
        ]

    def _keep(self, module, inputs, output) -> None:
        if self.active:
            self.logits.append(output[self.index] if isinstance(output, tuple) else output)

    @contextmanager
    def recording(self) -> Iterator[None]:
        self.logits, self.active = [], True
        try:
            yield
        finally:
            self.active = False

    def pop(self) -> list[Any]:
        taken, self.logits = self.logits, []
        return taken


def load_balancing_loss(causal_lm, router_logits: tuple):
    """The architecture's own load-balancing loss (its modeling module's `load_balancing_loss_func`, with the expert
    counts its causal LM reads from its config) over the router logits of a packed forward: every token is real."""
    import sys

    modeling = sys.modules[type(causal_lm).__module__]
    return modeling.load_balancing_loss_func(router_logits, causal_lm.num_experts, causal_lm.num_experts_per_tok, None)


def chunked_cross_entropy(hidden, labels, weight, chunk: int = LOSS_CHUNK):
    """Sum of token cross-entropies over trained positions, never holding more than one chunk of logits.

    `hidden` [B, T, H] are the final hidden states, `labels` [B, T] unshifted targets. Returns (sum, count).
    """
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    targets = labels[:, 1:].reshape(-1)
    states = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    keep = targets != IGNORE_INDEX
    states, targets = states[keep], targets[keep]

    def piece(h, t):
        return F.cross_entropy((h @ weight.T).float(), t, reduction="sum")

    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, targets.numel(), chunk):
        h, t = states[start : start + chunk], targets[start : start + chunk]
        total = total + checkpoint(piece, h, t, use_reentrant=False)
    return total, targets.numel()


class HiddenStates:
    """Keeps the decoder's final hidden states from a forward made through the (DDP-wrapped) model."""

    def __init__(self, decoder) -> None:
        self.value = None
        decoder.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output) -> None:
        self.value = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]


def packed_trainer_class():
    """SFTTrainer whose loss is computed the packed way (masks per document, chunked head)."""
    from trl import SFTTrainer

    class PackedSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            causal_lm = self.accelerator.unwrap_model(model).get_base_model()
            if not hasattr(self, "_hidden"):
                self._hidden = HiddenStates(causal_lm.get_decoder())
                self._routers = RouterLogits(causal_lm) if self.router_aux_loss_coef else None
            masks = attention_masks(causal_lm.config, inputs["document_ids"], causal_lm.config._attn_implementation)
            with self._routers.recording() if self._routers is not None else nullcontext():
                model(
                    input_ids=inputs["input_ids"],
                    position_ids=inputs["position_ids"],
                    attention_mask=masks,
                    logits_to_keep=1,  # the head runs in chunked_cross_entropy, on trained positions only
                    output_router_logits=False,  # the router hooks collect them; the model would misread our masks
                    use_cache=False,
                )
            total, count = chunked_cross_entropy(self._hidden.value, inputs["labels"], causal_lm.lm_head.weight)
            loss = total / (num_items_in_batch if num_items_in_batch is not None else max(count, 1))
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes  # DDP averages gradients; the token count is global
            if self._routers is not None and not model.training:
                self._routers.pop()  # validation loss is the language-modelling loss alone
            elif self._routers is not None:
                aux = load_balancing_loss(causal_lm, tuple(self._routers.pop()))
                loss = loss + self.router_aux_loss_coef * aux / self.args.gradient_accumulation_steps
            return loss

    return PackedSFTTrainer


@contextmanager
def pairs_packed(backbone, config) -> Iterator[None]:
    """DPO's padded batch ([chosen..., rejected...] rows, right-padded) runs through the decoder as one packed row.

    TRL's DPO loss reads per-row log-probabilities from the padded layout, so the packing happens around the decoder
    alone: its input loses the padding (each row a document: positions restart, masks per document, as SFT's packed
    micro-batches), its output (final hidden states, router logits) is put back in the padded layout, zeros at the
    padding, before TRL's head scores the completion tokens. Every call inside (the policy's forward and the
    reference's, adapter off) is packed; gradient checkpointing re-runs layers, never the decoder's hooks."""
    import torch

    layouts: list[Any] = []
    implementation = config._attn_implementation

    def pack(module, args, kwargs):
        real = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids")
        if ids is None or real is None or real.dim() != 2:
            layouts.append(None)
            return None  # not a padded batch of token ids: left as it is
        real = real.bool()
        rows = torch.arange(real.shape[0], device=real.device)[:, None].expand_as(real)
        documents, ids, positions = rows[real][None], ids[real][None], (real.cumsum(1) - 1)[real][None]
        if implementation == "flex_attention":  # a padding document (-1, masked off) up to a length flex compiles
            tail = flex_length(ids.shape[1]) - ids.shape[1]
            documents = torch.nn.functional.pad(documents, (0, tail), value=-1)
            ids, positions = (torch.nn.functional.pad(t, (0, tail)) for t in (ids, positions))
        kwargs = {**kwargs, "input_ids": ids, "position_ids": positions}
        kwargs["attention_mask"] = attention_masks(config, documents, implementation)
        layouts.append(real)
        return args, kwargs

    def unpack(module, args, kwargs, output):
        real = layouts.pop()
        if real is None:
            return output
        hidden = output.last_hidden_state
        output.last_hidden_state = hidden.new_zeros((*real.shape, hidden.shape[-1])).masked_scatter(
            real[..., None], hidden[0]
        )  # the packed row's first tokens, in order: a flex padding tail is left out
        if getattr(output, "router_logits", None) is not None:  # per layer [tokens, experts] -> [rows x width, ...]
            flat = real.reshape(-1, 1)
            output.router_logits = tuple(
                logits.new_zeros((flat.shape[0], logits.shape[-1])).masked_scatter(
                    flat, logits.reshape(-1, logits.shape[-1])
                )
                for logits in output.router_logits
            )
        return output

    handles = [
        backbone.register_forward_pre_hook(pack, with_kwargs=True),
        backbone.register_forward_hook(unpack, with_kwargs=True),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
