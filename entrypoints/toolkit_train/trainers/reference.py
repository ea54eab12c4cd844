"""What DPO's and GRPO's trainers share: the reference is the base with the adapter off (TRL's own "ref" copy of
the adapter removed), and log-probabilities scored on the trained positions only."""

from __future__ import annotations

from typing import Any

REFERENCE_COPY = "ref"  # the adapter TRL's DPOTrainer adds to a model that comes to it with one


def score_trained_positions_only() -> None:
    """TRL's chunked log-probabilities score only the completion positions on CUDA, but every position elsewhere (so
    that a compiler such as Neuron's sees one tile shape per batch), then zero the rest: on CPU, with gpt-oss's
    201k-token vocabulary, that is most of a DPO step (the tiny model's prompts are ~3/4 of its tokens). Nothing is
    compiled on CPU here, and each position's log-probability is its own row's, so scoring the completions alone
    gives the same values (tests/toolkit_train/methods/test_dpo_parity.py compares against plain TRL). Patched on the
    name TRL's DPO and GRPO log-probabilities read (trl.trainer.utils, TRL 1.16); TRL's kernels keep their own
    choice of kernel."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None or getattr(original, "toolkit_cpu", False):
        return  # another TRL, or patched already

    def compact(device: Any) -> bool:
        return device.type == "cpu" or original(device)

    compact.toolkit_cpu = True  # type: ignore[attr-defined]
    trl_utils._use_triton = compact


def base_as_reference(trainer_class: Any) -> Any:
    """A TRL trainer whose reference is the base with the adapter switched off (DPO's, and GRPO's KL term). TRL 1.16,
    handed a model that is a PEFT model already (model.add_lora: seeded, packed MXFP4 experts), takes it for one
    re-training an existing adapter and adds a frozen copy of it, "ref", as the reference: the fresh adapter's copy
    (lora_B = 0), the base's outputs computed through a second set of LoRA layers, saved into every checkpoint and
    into model/adapter (a `ref/` folder beside the adapter) and, on resume, loaded back from the checkpoint. It is
    deleted here, once TRL made it: without it TRL's reference forward runs under `disable_adapter()`
    (trl.trainer.utils.use_adapter(model, None)), the base itself, the same on a resumed run as on the first
    (tests/toolkit_train/methods/test_dpo.py and test_grpo.py: the resumed run equals the uninterrupted one)."""

    class BaseAsReference(trainer_class):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            from ..run.model import packed_experts_as_targets

            given: Any = kwargs["model"]
            # TRL adds its "ref" copy through peft, which finds packed MXFP4 experts' targets only while they show
            # (without it, expert LoRA on packed experts fails here: ModuleDict has no attribute 'ref')
            with packed_experts_as_targets(given, given.peft_config["default"]):
                super().__init__(*args, **kwargs)
            model: Any = self.model  # the PeftModel (wrapped by accelerate only once training starts)
            adapters = getattr(model, "peft_config", {})
            if REFERENCE_COPY in adapters and len(adapters) > 1:
                model.delete_adapter(REFERENCE_COPY)  # frozen, never active: the trained one is untouched

    return BaseAsReference
