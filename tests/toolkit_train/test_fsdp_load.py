"""FSDP loads the base model once: rank 0 reads it, the other ranks build it on the meta device and receive their
shards from rank 0 (train.loads_from_rank0, model.empty_model). Measured for real: two ranks under torchrun on
CPU (gloo, FSDP2), each rank's host memory as it reports it when training begins, and whether it ever mapped a
checkpoint file (its /proc/<pid>/maps, read while it runs); compared in the same test with the path where every
rank reads the model (the entrypoint's tests-only switch), which must train the same first step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from fsdp_load_memory import build, train_once
from toolkit_train.model import load_model, model_signature
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
