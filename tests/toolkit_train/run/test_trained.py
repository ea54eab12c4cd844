"""What trained: every run records which adapter groups received gradients and moved, and which paths ran; a group
no gradient reached fails the run, naming it, before anything is saved or merged (silent MoE-LoRA failures: expert
adapters never updated). Real training of the tiny gpt-oss through the entrypoint; the missing gradient is injected
(tests/faults: no_gradient), as a kernel whose backward skips the adapter would leave it."""

from __future__ import annotations

import json
import subprocess

import pytest
from toolkit_train.run.trained import group_of

from tests import faults
from tests.toolkit_train.helpers import ENTRYPOINT, entrypoint_env, lay_out

pytestmark = pytest.mark.integration  # trains for real
TINY_MXFP4 = "builtin:tiny-gpt-oss-mxfp4"
EXPERT_LORA = ["lora.target_parameters=[mlp.experts.gate_up_proj, mlp.experts.down_proj]", "training.max_steps=2"]


def run(root, starve: str | None = None) -> subprocess.CompletedProcess:
    env = faults.env(entrypoint_env(root), no_gradient=starve)
    return subprocess.run(faults.command(ENTRYPOINT), env=env, capture_output=True, text=True, timeout=600)


def test_parameters_are_grouped_by_what_they_adapt_and_their_layer():
    assert group_of("base_model.model.model.layers.3.self_attn.q_proj.lora_A.default.weight") == ("attention LoRA", 3)
    assert group_of("base_model.model.model.layers.0.mlp.experts.lora_B.default.weight") == ("expert LoRA", 0)
    assert group_of("base_model.model.lm_head.lora_A.default.weight") == ("other adapted weights", None)


def test_a_packed_mxfp4_expert_lora_run_records_both_groups_moved_and_the_packed_path(tmp_path):
    root = lay_out(tmp_path, [f"model.id={TINY_MXFP4}", "model.experts=mxfp4", *EXPERT_LORA])
    result = run(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trained = json.loads((root / "model" / "run.json").read_text())["trained"]
    assert set(trained["groups"]) == {"attention LoRA", "expert LoRA"}
    for group in trained["groups"].values():
        assert group["gradient_norm"] > 0 and group["relative_update"] > 0, trained
        assert set(group["layers"]) == {"0", "1"}  # the tiny model's two decoder layers, each moved
    assert trained["paths"]["experts_stored"] == "mxfp4" and trained["optimizer_steps"] == 2
    assert any(name.startswith("Mxfp4Experts") for name in trained["paths"]["experts"]), trained["paths"]
    assert "[toolkit] trained: attention LoRA moved" in result.stdout
    from toolkit.targets.local import LocalJob

    state = LocalJob("tiny", root).status()  # `toolkit jobs status` of a local run shows the same line
    assert state.status.value == "Completed" and state.detail.startswith("trained: attention LoRA moved"), state


def test_an_expert_adapter_no_gradient_reaches_fails_the_run_naming_it_and_saves_nothing(tmp_path):
    root = lay_out(tmp_path, EXPERT_LORA)
    result = run(root, starve=r"mlp\.experts")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith("NothingTrained: expert LoRA (layers 0, 1) received no gradient in 2 optimizer steps")
    assert not (root / "model" / "adapter").exists() and not (root / "model" / "merged").exists()
    left = sorted(p.name for p in (root / "checkpoints").iterdir() if p.name.startswith("checkpoint-"))
    assert left and all(name.endswith(".incomplete") for name in left), left  # the same command starts over
