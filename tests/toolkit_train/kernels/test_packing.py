"""The fast path trains the same objective: packed rows see only themselves; loss and LoRA gradients match
the recipe's unpacked path on the same rows."""

from __future__ import annotations

import pytest
import torch
from toolkit_train.data import IGNORE_INDEX
from toolkit_train.kernels.packing import attention_masks, chunked_cross_entropy, collate, pack, packed_dataset


@pytest.fixture(scope="module")
def model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation="eager")
    return loaded.eval()


def documents(lengths, vocab=1000, seed=0):
    generator = torch.Generator().manual_seed(seed)
    docs = []
    for n in lengths:
        ids = torch.randint(10, vocab, (n,), generator=generator).tolist()
        labels = [IGNORE_INDEX] * (n // 3) + ids[n // 3 :]  # a prompt, then the trained answer
        docs.append({"input_ids": ids, "labels": labels})
    return docs


def test_first_fit_decreasing_respects_the_budget():
    lengths = [700, 300, 650, 100, 350, 780, 20]
    bins = pack(lengths, 1000, seed=1)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 1000 for b in bins)
    assert len(bins) == 3  # 2900 tokens: the fewest bins possible
    with pytest.raises(ValueError, match="more than the micro-batch budget"):
        pack([1200], 1000, seed=1)


@pytest.fixture(scope="module")
def qwen3_moe(tiny_qwen3_moe_path):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tiny_qwen3_moe_path, dtype=torch.float32, attn_implementation="eager")
    return loaded.eval()


@pytest.mark.parametrize("which", ["model", "qwen3_moe"], ids=["gpt-oss", "qwen3-moe"])
def test_packed_rows_never_attend_to_each_other(which, request):
    """gpt-oss takes a mask per layer type (the second document is longer than its sliding window, 64: both types
    are exercised); Qwen3-MoE, whose layers attend alike, takes the one mask."""
    model = request.getfixturevalue(which)
    docs = documents([40, 150, 77])
    import datasets

    packed = packed_dataset(datasets.Dataset.from_list(docs), token_budget=400, seed=0)
    assert len(packed) == 1
    batch = collate([packed[0]])
    masks = attention_masks(model.config, batch["document_ids"], "eager")
    with torch.no_grad():
        together = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=masks).logits
        offset = 0
        for doc_index in batch["document_ids"][0].unique_consecutive().tolist():
            n = int((batch["document_ids"][0] == doc_index).sum())
            ids = batch["input_ids"][:, offset : offset + n]
            alone = model(input_ids=ids).logits
            torch.testing.assert_close(together[:, offset : offset + n], alone, rtol=1e-5, atol=1e-5)
            offset += n


def test_position_ids_alone_would_leak(model):
    """Why the masks exist: transformers' gpt-oss path ignores position_ids when building its mask."""
    batch = collate([{"input_ids": [5] * 30 + [6] * 30, "labels": [0] * 60,
                      "position_ids": list(range(30)) * 2, "document_ids": [0] * 30 + [1] * 30}])  # fmt: skip
    with torch.no_grad():
        leaked = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[:, 30:]
        alone = model(input_ids=batch["input_ids"][:, 30:]).logits
    assert not torch.allclose(leaked, alone, atol=1e-4)


def test_loss_and_lora_gradients_match_the_recipe_path(tiny_model_path, tmp_path):
    import datasets
    from toolkit_train.kernels.packing import packed_trainer_class
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation="eager")
    lora = LoraSettings(dropout=0, target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    model = add_lora(base, lora, seed=0)
    for name, param in model.named_parameters():  # LoRA B starts at zero: make the adapter non-trivial
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    docs = documents([90, 33, 140], seed=3)
    packed = packed_dataset(datasets.Dataset.from_list(docs), token_budget=512, seed=0)
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", router_aux_loss_coef=0.0,
                     remove_unused_columns=False, dataset_kwargs={"skip_prepare_dataset": True})  # fmt: skip
    trainer = packed_trainer_class()(model=model, args=args, train_dataset=packed, data_collator=collate)
    trained = sum(sum(1 for t in d["labels"][1:] if t != IGNORE_INDEX) for d in docs)

    model.zero_grad()
    fast = trainer.compute_loss(model, collate([packed[0]]), num_items_in_batch=trained)
    fast.backward()
    fast_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    model.zero_grad()
    recipe = 0.0
    for doc in docs:  # the recipe: one row per forward, HF's own loss (mean over the row's trained tokens)
        n = sum(1 for t in doc["labels"][1:] if t != IGNORE_INDEX)
        out = model(input_ids=torch.tensor([doc["input_ids"]]), labels=torch.tensor([doc["labels"]]))
        (out.loss * n / trained).backward()
        recipe += out.loss.item() * n / trained
    assert float(fast) == pytest.approx(recipe, rel=1e-5)
    for name, param in model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(fast_grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert any("experts" in n for n in fast_grads) and any("q_proj" in n for n in fast_grads)


def test_chunked_loss_equals_full_logits_loss():
    torch.manual_seed(0)
    hidden = torch.randn(2, 50, 16, requires_grad=True)
    weight = torch.randn(300, 16)
    labels = torch.randint(0, 300, (2, 50))
    labels[:, :20] = IGNORE_INDEX
    total, count = chunked_cross_entropy(hidden, labels, weight, chunk=7)
    logits = hidden[:, :-1] @ weight.T
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 300), labels[:, 1:].reshape(-1), reduction="sum")
    assert count == int((labels[:, 1:] != IGNORE_INDEX).sum())
    torch.testing.assert_close(total, expected)
    (grad_chunked,) = torch.autograd.grad(total, hidden)
    (grad_full,) = torch.autograd.grad(expected, hidden)
    torch.testing.assert_close(grad_chunked, grad_full)


def test_router_loss_under_checkpointing_keeps_nothing_from_the_recomputation(tiny_model_path, tmp_path):
    """The load-balancing loss collects router logits with hooks; the backward pass's recomputation (gradient
    checkpointing) runs those hooks again. Kept, those logits hold every layer's recomputed activations until the
    next step (on the 120b shape ~2.7 MB per token). The loss and gradients must equal the run without
    checkpointing, and nothing recorded may be left after backward."""
    import datasets
    from toolkit_train.kernels.packing import packed_trainer_class
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation="eager")
    model = add_lora(base, LoraSettings(dropout=0), seed=0)
    docs = documents([90, 33, 140], seed=3)
    packed = packed_dataset(datasets.Dataset.from_list(docs), token_budget=512, seed=0)
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", router_aux_loss_coef=0.5,
                     remove_unused_columns=False, dataset_kwargs={"skip_prepare_dataset": True})  # fmt: skip
    trainer = packed_trainer_class()(model=model, args=args, train_dataset=packed, data_collator=collate)
    model.train()
    results = []
    for checkpointing in (False, True):
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.zero_grad()
        loss = trainer.compute_loss(model, collate([packed[0]]))
        loss.backward()
        assert trainer._routers.logits == [], "router logits recorded outside the trainer's forward"
        results.append((float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
    (plain_loss, plain_grads), (checkpointed_loss, checkpointed_grads) = results
    assert checkpointed_loss == pytest.approx(plain_loss, rel=1e-6)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(checkpointed_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("builtin", ["tiny_model_path", "tiny_qwen3_moe_path"], ids=["gpt-oss", "qwen3-moe"])
def test_the_load_balancing_loss_is_the_architectures_own(builtin, request, tmp_path):
    """The packed trainer adds the MoE architecture's own load-balancing loss (the router class and loss function
    transformers records for it: gpt-oss's mlp.router, Qwen3-MoE's mlp.gate): on one packed document, what the
    coefficient adds is exactly the auxiliary loss the model's own forward returns for that document."""
    import datasets
    from toolkit_train.kernels.packing import packed_trainer_class
    from toolkit_train.run.model import add_lora
    from toolkit_train.settings import LoraSettings
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig

    base = AutoModelForCausalLM.from_pretrained(
        request.getfixturevalue(builtin), dtype=torch.float32, attn_implementation="eager"
    )
    model = add_lora(base, LoraSettings(dropout=0), seed=0)
    docs = documents([120], seed=5)
    packed = packed_dataset(datasets.Dataset.from_list(docs), token_budget=256, seed=0)
    model.train()
    losses = {}
    for coef in (0.0, 0.5):
        args = SFTConfig(output_dir=str(tmp_path / str(coef)), use_cpu=True, report_to="none",
                         router_aux_loss_coef=coef, remove_unused_columns=False,
                         dataset_kwargs={"skip_prepare_dataset": True})  # fmt: skip
        trainer = packed_trainer_class()(model=model, args=args, train_dataset=packed, data_collator=collate)
        with torch.no_grad():
            losses[coef] = float(trainer.compute_loss(model, collate([packed[0]])))
        assert (trainer._routers is None) == (coef == 0.0)
    with torch.no_grad():
        own = model(input_ids=torch.tensor([docs[0]["input_ids"]]), output_router_logits=True).aux_loss
    assert float(own) > 0
    assert (losses[0.5] - losses[0.0]) / 0.5 == pytest.approx(float(own), rel=1e-4)


def test_flex_lengths_are_multiples_of_128_never_shorter():
    from toolkit_train.kernels.packing import flex_length

    assert [flex_length(n) for n in (1, 100, 127, 128, 129, 357)] == [128, 128, 128, 128, 256, 384]


def test_dpos_packed_row_under_flex_ends_in_a_masked_padding_document_and_unpacks_as_under_eager(monkeypatch):
    """DPO's pairs run through the decoder as one packed row (packing.pairs_packed): under flex_attention the row is
    padded to a length flex compiles, with document id -1 (masked off); what comes back in the padded layout is the
    same as without the tail. The block mask's compile (13 s on this CPU) is replaced by a recorder: the row's
    layout is what is tested, not flex."""
    from types import SimpleNamespace

    from toolkit_train.kernels import packing

    seen: dict = {}
    monkeypatch.setattr(packing, "_block_mask", lambda documents, span: seen.setdefault("documents", documents))

    class Decoder(torch.nn.Module):  # each token's output: a function of its id and position alone
        def forward(self, input_ids=None, attention_mask=None, position_ids=None):
            seen["length"] = input_ids.shape[1]
            hidden = torch.stack([input_ids.float(), position_ids.float()], dim=-1)
            return SimpleNamespace(last_hidden_state=hidden, router_logits=(hidden[0] * 2,))

    ids = torch.randint(5, 100, (2, 60))
    real = torch.ones(2, 60, dtype=torch.long)
    real[0, 25:] = 0  # two rows of 25 and 60 real tokens: 85 packed
    outputs = {}
    for kernel in ("flex_attention", "eager"):
        config = SimpleNamespace(_attn_implementation=kernel, sliding_window=None, layer_types=None)
        decoder = Decoder()
        with packing.pairs_packed(decoder, config):
            outputs[kernel] = decoder(input_ids=ids, attention_mask=real)
        if kernel == "flex_attention":
            assert seen["length"] == 128
            assert seen["documents"][0, :85].tolist() == [0] * 25 + [1] * 60
            assert seen["documents"][0, 85:].tolist() == [-1] * 43
        else:
            assert seen["length"] == 85
    flex, eager = outputs["flex_attention"], outputs["eager"]
    assert torch.equal(flex.last_hidden_state, eager.last_hidden_state)
    assert torch.equal(flex.router_logits[0], eager.router_logits[0])
    assert torch.equal(eager.last_hidden_state[0, :25, 0], ids[0, :25].float())  # the real tokens, in place
