"""Expert LoRA (`lora.target_parameters`) on packed MXFP4 experts (`model.experts: mxfp4`), in peft's own format.

peft adapts a 3-D expert parameter with `lora.ParamWrapper`: for each forward it parametrizes the parameter as
W + scaling * A @ B, which needs W as a real tensor (and builds a weight-sized sum). Packed experts have no such
parameter: W exists only for a moment inside each grouped GEMM (kernels/mxfp4.py). `PackedExpertLora` is that
same ParamWrapper (same adapter modules, state-dict keys, adapter_config.json, hence what vLLM's MoE-LoRA loads:
`experts.base_layer` = gate_up_proj, `experts` = down_proj) with two changes: its forward hands the factors (A, B,
scaling) to the packed experts, which add scaling * (rows @ A) @ B beside their dequantized GEMM; and its merge adds
the delta to the dequantized experts and requantizes them to MXFP4 (which rounds away much of a small delta: the
merge logs how much of it was kept).

peft finds target parameters among a module's parameters by name; packed experts hold uint8 buffers instead, so
while peft injects (`get_peft_model`, `PeftModel.from_pretrained`) each packed experts module shows stand-ins of
the right shape, dtype and device (one element each, expanded; no storage), removed again afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
from peft.tuners.lora.layer import ParamWrapper
from peft.tuners.tuners_utils import check_adapters_to_merge
from torch import nn

from .mxfp4 import PROJECTIONS, Mxfp4Experts


def _stand_in(experts: Mxfp4Experts, name: str) -> torch.Tensor:
    """A tensor that looks like transformers' [E, in, out] expert parameter (shape, dtype, device) and holds one
    element: what peft reads from the parameter it adapts."""
    like = cast(torch.Tensor, experts.gate_up_proj_bias)
    return torch.empty((), dtype=like.dtype, device=like.device).expand(experts.parameter_shapes[name])


class PackedExpertLora(ParamWrapper):
    """peft's ParamWrapper for one projection of packed MXFP4 experts (see the module docstring)."""

    def experts(self) -> Mxfp4Experts:
        return cast(Mxfp4Experts, self.get_base_layer())

    def get_param(self):
        return _stand_in(self.experts(), self.parameter_name)

    @contextmanager
    def _activate_lora(self, active_adapters: list[str]):
        adapters = [a for a in active_adapters if a in self.lora_A]
        if not adapters:
            yield
            return
        if len(adapters) > 1:
            raise ValueError("packed MXFP4 experts train or serve one expert LoRA adapter at a time")
        experts = self.experts()
        experts.lora_factors[self.parameter_name] = self.get_delta_factors(adapters[0])
        try:
            yield
        finally:
            experts.lora_factors.pop(self.parameter_name, None)

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        for adapter in check_adapters_to_merge(self, adapter_names):
            if adapter in self.lora_A:
                delta = self.get_delta_weight(adapter)
                if safe_merge and not torch.isfinite(delta).all():
                    raise ValueError(f"NaNs in the delta of adapter {adapter}: it seems to be broken")
                experts = self.experts()
                experts.merge_report[self.parameter_name] = experts.merge_delta(self.parameter_name, delta)
                self.merged_adapters.append(adapter)

    def unmerge(self) -> None:
        raise NotImplementedError("a LoRA merged into MXFP4 experts was requantized and cannot be subtracted again")


# peft nests a second parameter's wrapper only into a module whose class is named ParamWrapper (it checks the name,
# tuners_utils.create_and_replace_param): this is one, for gate_up_proj's wrapper to take down_proj's around it
PackedExpertLora.__name__ = PackedExpertLora.__qualname__ = "ParamWrapper"


def register(config) -> None:
    """Make peft wrap packed experts with PackedExpertLora (peft's custom-module hook; not saved with the adapter)."""
    config._register_custom_module({Mxfp4Experts: PackedExpertLora})


@contextmanager
def targets_visible(model: nn.Module) -> Iterator[None]:
    """While peft injects: each packed experts module shows its projections as parameters, in transformers' order
    (gate_up_proj, then down_proj: the order decides peft's nesting and so the adapter's state-dict keys)."""
    shown = [m for m in model.modules() if isinstance(m, Mxfp4Experts)]
    for experts in shown:
        for name in PROJECTIONS:
            experts.register_parameter(name, nn.Parameter(_stand_in(experts, name), requires_grad=False))
    try:
        yield
    finally:
        for experts in shown:
            for name in PROJECTIONS:
                experts._parameters.pop(name, None)


def merge_report(model: nn.Module) -> dict[str, dict[str, float]]:
    """After a merge: per projection, the smallest `kept` and largest `error` over the layers (merge_delta's)."""
    summary: dict[str, dict[str, float]] = {}
    for experts in (m for m in model.modules() if isinstance(m, Mxfp4Experts)):
        for name, report in experts.merge_report.items():
            seen = summary.setdefault(name, {"kept_min": report["kept"], "error_max": report["error"]})
            seen["kept_min"] = min(seen["kept_min"], report["kept"])
            seen["error_max"] = max(seen["error_max"], report["error"])
    return summary
