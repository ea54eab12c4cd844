"""FSDP loads the base model once: rank 0 reads it, the other ranks build it on the meta device and receive their
shards from rank 0 (trainer.loads_from_rank0, model.empty_model). Measured for real: two ranks under torchrun on
CPU (gloo, FSDP2), each rank's host memory as it reports it when training begins, and whether it ever mapped a
checkpoint file (its /proc/<pid>/maps, read while it runs); compared in the same test with the path where every
rank reads the model (the entrypoint's tests-only switch), which must train the same first step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from fsdp_load_memory import build, train_once
from toolkit_train.run.model import load_model, model_signature
from toolkit_train.settings import TINY_GPT_OSS, TINY_GPT_OSS_MXFP4, ModelSettings


@pytest.mark.parametrize("model_id", [TINY_GPT_OSS, TINY_GPT_OSS_MXFP4])
def test_the_meta_built_model_is_the_loaded_one_without_its_weights(model_id):
    """The tensors FSDP pairs up in its broadcast, in order; and the rotary frequencies, which no checkpoint holds
    and FSDP does not broadcast, computed as from_pretrained computes them (an MXFP4 checkpoint: dequantized
    experts on both sides)."""
    settings = ModelSettings(id=model_id, dtype="float32")
    loaded = load_model(settings)
    empty = load_model(settings, weights=False)
    assert model_signature(empty) == model_signature(loaded)
    assert all(p.is_meta for p in empty.parameters())
    buffers = dict(loaded.named_buffers())
    built = dict(empty.named_buffers())
    assert {name for name, _ in empty.named_non_persistent_buffers()} == {
        "model.rotary_emb.inv_freq",
        "model.rotary_emb.original_inv_freq",
    }
    for name, _ in empty.named_non_persistent_buffers():
        assert not built[name].is_meta and torch.equal(built[name], buffers[name]), name


def test_a_meta_built_rank_gives_the_optimizer_one_distinct_tensor_per_trainable_parameter():
    """accelerate points an optimizer built before FSDP2 sharding at the shards by each parameter's data_ptr(): on
    a meta-built rank every LoRA weight would share 0 and all map to one shard (the others never trained; the
    sharded checkpoint save then fails). The LoRA weights get storage; the frozen base stays on meta."""
    from toolkit_train.run.model import add_lora, give_trainable_storage
    from toolkit_train.run.trainer import check_optimizer_covers_trainable
    from toolkit_train.settings import LoraSettings

    model = add_lora(load_model(ModelSettings(id=TINY_GPT_OSS, dtype="float32"), weights=False), LoraSettings(), 0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and {p.data_ptr() for p in trainable} == {0}  # what accelerate's mapping would collapse
    assert give_trainable_storage(model) == len(trainable)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len({p.data_ptr() for p in trainable}) == len(trainable) and 0 not in {p.data_ptr() for p in trainable}
    assert all(p.is_meta for p in model.parameters() if not p.requires_grad)
    check_optimizer_covers_trainable(model, torch.optim.AdamW(trainable))
    collapsed = torch.optim.AdamW([trainable[-1]])  # what the collapsed mapping leaves
    with pytest.raises(RuntimeError, match=f"optimizer holds 1 of the {len(trainable)} trainable parameters"):
        check_optimizer_covers_trainable(model, collapsed)


@pytest.mark.integration
def test_fsdp_rank0_reads_the_model_and_the_others_receive_their_shards(tmp_path):
    model_dir = tmp_path / "model"
    checkpoint_bytes = build(model_dir)
    in_memory_gib = 2 * checkpoint_bytes / 2**30  # trained in fp32 on CPU
    before = train_once(tmp_path, model_dir, 2, every_rank=True, name="every-rank")
    after = train_once(tmp_path, model_dir, 2, every_rank=False, name="rank0")

    # the probe sees a rank that reads the checkpoint (every rank, before); now only rank 0 ever maps it
    assert [r for r, seen in before["ranks"].items() if seen["mapped_checkpoint"]] == [0, 1]
    assert [r for r, seen in after["ranks"].items() if seen["mapped_checkpoint"]] == [0]
    assert "FSDP: rank 0 read the base model" in after["stdout"]

    # host memory when training begins: rank 1 no longer holds a loaded copy of the model
    loaded = {name: [seen["loaded_gib"] for seen in run["ranks"].values()] for name, run in
              (("before", before), ("after", after))}  # fmt: skip
    assert loaded["before"][1] - loaded["after"][1] > 0.6 * in_memory_gib, loaded
    assert sum(loaded["before"]) - sum(loaded["after"]) > 0.6 * in_memory_gib, loaded

    # the same first step: rank 1's shards are rank 0's weights, its rotary frequencies the same
    assert after["losses"] == before["losses"] and len(after["losses"]) == 1
    assert after["adapter"].keys() == before["adapter"].keys()
    for name, tensor in before["adapter"].items():
        assert torch.equal(after["adapter"][name], tensor), name
