"""training.method dpo computes TRL's DPO, unchanged (#46): one step of the toolkit's trainer (trainer.py's
preference_trainer_class, built by build_trainer with trainer_args, as the entrypoint builds it) gives the loss and
LoRA gradients of plain TRL DPOTrainer configured the standard TRL way, a separate frozen reference model (a deep
copy of the base, no adapter), on the same harmony-rendered pair of the bundled preference sample: CPU, fp32, the
tiny gpt-oss (its MXFP4 checkpoint, cached once per machine), dequantized at load and with its experts kept packed.
Measured: the loss, the rewards and every LoRA gradient bitwise equal (bounds: the loss 1e-8 of the summed
log-probabilities it comes from, the rest 1e-5 relative); with training.packing (the default) within fp32 rounding
(the test's docstring).

The adapter starts away from the identity (lora_B non-zero, the same on both sides): with a fresh adapter
(lora_B = 0) the policy is the base, and a reference that carries the adapter (TRL's frozen "ref" copy of it, which
trainer.py deletes) would give the same loss: the test could not tell them apart. Here the rewards, beta times the
policy's log-ratio to the reference, are asserted far from 0 (what that copy would give) and equal to TRL's.

Mutations tried, each failing this test in both cases: trainer.py keeping TRL's "ref" copy as the reference
(REFERENCE_COPY renamed, so delete_adapter never runs): the loss becomes log 2 plus the router's loss, the rewards 0
(and the assertion that only the trained adapter is left fails first); trainer_args dropping `beta=` (TRL's default,
0.1, against 0.25 here): the loss and the rewards differ.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from toolkit_train.data import load_rows, prepare
from toolkit_train.kernels.mxfp4 import Mxfp4Experts
from toolkit_train.layout import Paths
from toolkit_train.run.model import add_lora, load_model, load_tokenizer

from toolkit.config import load_config

TINY_MXFP4 = "builtin:tiny-gpt-oss-mxfp4"  # one cached checkpoint: dequantized at load (bf16 experts) or kept packed
BETA = 0.25  # not TRL's default (0.1): a trainer that dropped the configured beta would not match


@dataclass
class Step:
    loss: float
    batch: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]
    metrics: dict[str, float]  # what TRL logs of the step: rewards/* (beta x the log-ratios to the reference), logps/*


def capturing(trainer_class: type) -> type:
    """The trainer class, keeping what its (one) training step computed: the batch it was given, the loss, and each
    trainable parameter's gradient after the backward (before clipping and the optimizer)."""

    class Capturing(trainer_class):
        step: Step

        def training_step(self, model: Any, inputs: dict, num_items_in_batch: Any = None) -> torch.Tensor:
            batch = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            loss = super().training_step(model, inputs, num_items_in_batch)
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
            metrics = {k: v[-1] for k, v in self._metrics["train"].items() if k.startswith(("rewards/", "logps/"))}
            self.step = Step(float(loss), batch, grads, metrics)
            return loss

    return Capturing


def settings_for(experts: str, packing: bool = True):
    """The tiny-gpt-oss-dpo preset (its loss, DPO's sigmoid), one step of one pair, fp32, beta BETA; no held-out
    pairs (the preset's data.eval would have the trainer score them before its first step: not what is compared)."""
    overrides = [f"model.id={TINY_MXFP4}", f"model.experts={experts}", "model.dtype=float32", "data.eval=null",
                 "training.max_steps=1", "training.per_device_batch_size=1", f"training.dpo.beta={BETA}",
                 f"training.packing={str(packing).lower()}"]  # fmt: skip
    settings = load_config("tiny-gpt-oss-dpo", overrides).train_settings()
    assert settings.lora.dropout == 0.0 and settings.training.gradient_accumulation_steps == 1
    return settings


@pytest.fixture(scope="module")
def pairs():
    """(tokenizer, one pair): the preset's pairs (builtin:preference-sample) through the toolkit's data path
    (data.prepare: harmony), and of them the one with the fewest reply tokens (TRL scores the replies' tokens against
    the 201k-token vocabulary: on CPU that is most of a step's time)."""
    settings = settings_for("bf16")
    tokenizer = load_tokenizer(settings.model)
    pairs = prepare(load_rows(settings.data.source), tokenizer, settings.data)
    replies = [len(c) + len(r) for c, r in zip(pairs["chosen_ids"], pairs["rejected_ids"], strict=True)]
    return tokenizer, pairs.select([replies.index(min(replies))])


def start_off_identity(model) -> dict[str, torch.Tensor]:
    """lora_B drawn (seeded per tensor, so both sides get the same); the adapter's weights, for comparison."""
    for name, parameter in sorted(model.named_parameters()):
        if "lora_B" in name:
            with torch.no_grad():
                parameter.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(7))
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def toolkit_step(settings, tokenizer, dataset, root: Path) -> tuple[Step, Any]:
    from toolkit_train.run.trainer import load_for_training
    from toolkit_train.trainers import build_trainer

    model, _, _ = load_for_training(settings)
    start = start_off_identity(model)
    paths = Paths(root=root, model_dir=root / "model", checkpoints=root / "ckpt", train_channel=root, output_data=root)
    trainer = build_trainer(settings, paths, model, tokenizer, dataset, subclass=capturing)
    trainer.train()
    return trainer.step, (trainer, start)


def trl_step(settings, tokenizer, dataset, root: Path) -> tuple[Step, Any]:
    """Plain TRL: DPOTrainer itself, the reference a deep copy of the base (no adapter), the pairs as text that its
    own preparation tokenizes (non-conversational: TRL's chat-template rendering is not harmony's)."""
    import datasets
    from trl import DPOConfig, DPOTrainer

    base = load_model(settings.model)
    reference = copy.deepcopy(base).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    model = add_lora(base, settings.lora, settings.training.seed)  # the toolkit's LoRA init: its seed, its targets
    start = start_off_identity(model)
    ids = dataset.to_dict()
    text = datasets.Dataset.from_dict(
        {column.removesuffix("_ids"): tokenizer.batch_decode(ids[column]) for column in ids}
    )
    t = settings.training
    args = DPOConfig(
        output_dir=str(root),
        beta=t.dpo.beta,
        loss_type=[t.dpo.loss_type],
        per_device_train_batch_size=t.per_device_batch_size,
        max_length=settings.data.max_length,
        max_steps=1,
        learning_rate=t.learning_rate,
        seed=t.seed,
        data_seed=t.seed,
        use_cpu=True,
        bf16=False,  # TRL's configs default to bf16 autocast (on CPU too): fp32 here, as the toolkit runs on CPU
        gradient_checkpointing=False,  # TRL's default is on; the preset's is off (the same values, recomputed)
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    trainer = capturing(DPOTrainer)(
        model=model, ref_model=reference, args=args, train_dataset=text, processing_class=tokenizer
    )
    trainer.train()
    return trainer.step, (trainer, start)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm()) if b.norm() > 0 else float(a.norm())


@pytest.fixture
def plain_trl_scoring(monkeypatch):
    """TRL as it ships on CPU: every position scored against the 201k-token vocabulary, then the prompt's zeroed.
    The toolkit's trainer scores the completions alone, as TRL does on CUDA (trainer.py score_trained_positions_only,
    process-wide once it ran): this puts TRL's own choice back for the TRL side's step."""
    import trl.kernels.chunked_logprob
    import trl.trainer.utils

    return lambda: monkeypatch.setattr(trl.trainer.utils, "_use_triton", trl.kernels.chunked_logprob._use_triton)


@pytest.mark.parametrize(("experts", "packing"), [("bf16", False), ("bf16", True), ("mxfp4", True)])
def test_one_dpo_step_equals_trl_dpo_trainer_with_a_frozen_copy_of_the_base_as_reference(
    experts, packing, pairs, tmp_path, plain_trl_scoring, capsys
):
    """Packed (training.packing, the default): the pair's chosen and rejected replies run as one row without the
    padding TRL's batch has (the replies differ in length); TRL's side is padded, as it ships. Equal within fp32
    rounding, not bitwise: the attention's sums run over other lengths (unpacked: bitwise). The loss's rounding is
    bounded against the sums it is computed from, not against itself: the DPO loss is a function of beta x
    differences of summed log-probabilities (here -273 and -198 against a loss of 0.44), and fp32 rounds those sums
    (measured, packed, tiny base tiny-gpt-oss-31e2de448fb9: loss 5.5e-6 absolute = 1.2e-5 of the loss but 4.6e-8 of
    beta x the summed log-probabilities; the base before it: 3.1e-6 of the loss). Mutation tried: one document for
    all the replies (the rejected reply attends to the chosen one): the rewards differ by 3.7e-2, failing."""
    tokenizer, dataset = pairs
    settings = settings_for(experts, packing)
    bound = (
        {"loss": 2e-7, "rewards": 1e-5, "grads": 2e-5} if packing else {"loss": 1e-8, "rewards": 1e-5, "grads": 1e-5}
    )
    ours, (trainer, start) = toolkit_step(settings, tokenizer, dataset, tmp_path / "toolkit")
    layout = "each micro-batch's replies packed in one row, no padding" if packing else "(unpacked)"
    assert layout in capsys.readouterr().out
    plain_trl_scoring()
    theirs, (trl_trainer, trl_start) = trl_step(settings, tokenizer, dataset, tmp_path / "trl")

    # the same model, adapter and tokens on both sides
    packed = any(isinstance(m, Mxfp4Experts) for m in trainer.model.modules())
    assert packed == (experts == "mxfp4") == any(isinstance(m, Mxfp4Experts) for m in trl_trainer.model.modules())
    assert start.keys() == trl_start.keys() and all(torch.equal(start[k], trl_start[k]) for k in start)
    assert any(".experts." in k for k in start)  # expert LoRA (the preset's target_parameters) on both sides
    for column in dataset.column_names:  # TRL tokenized the text back to the harmony-rendered ids
        assert list(trl_trainer.train_dataset[column]) == list(dataset[column]), column
    assert ours.batch.keys() == theirs.batch.keys()
    assert all(torch.equal(ours.batch[k], theirs.batch[k]) for k in ours.batch)
    assert list(trainer.model.peft_config) == ["default"]  # TRL's "ref" copy is gone: the reference is the base

    # the reference matters: with TRL's "ref" copy of this adapter as the reference, the rewards would be 0 (the DPO
    # term log 2); here they are the policy's log-ratios against the base, and TRL's
    for key in ("rewards/chosen", "rewards/rejected"):
        assert abs(theirs.metrics[key]) > 1e-2, theirs.metrics
        assert abs(ours.metrics[key] - theirs.metrics[key]) <= bound["rewards"] * abs(theirs.metrics[key]), (
            key,
            ours.metrics,
            theirs.metrics,
        )

    # the loss (its bound: of the summed log-probabilities it is computed from) and every LoRA gradient
    summed = BETA * (abs(theirs.metrics["logps/chosen"]) + abs(theirs.metrics["logps/rejected"]))
    assert abs(ours.loss - theirs.loss) <= bound["loss"] * max(summed, abs(theirs.loss)), (ours.loss, theirs.loss)
    assert ours.grads.keys() == theirs.grads.keys() and len(ours.grads) == len(start)
    assert min(float(g.norm()) for g in theirs.grads.values()) > 0  # every LoRA tensor gets a gradient
    errors = {name: relative(ours.grads[name], grad) for name, grad in theirs.grads.items()}
    assert max(errors.values()) < bound["grads"], sorted(errors.items(), key=lambda e: -e[1])[:3]
