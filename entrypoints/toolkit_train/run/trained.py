"""What trained: after a run, which adapted parameter groups received gradients and moved, and which code paths ran.

Runs that finish but trained something else are the most common silent failure of MoE LoRA (expert adapters never
created or never updated, gradients that do not flow on some kernels). Every run measures, per group (attention
LoRA, expert LoRA, any other adapted weights; per layer too): the gradient that reached it over the run (summed
norm, taken before each optimizer step) and its relative update |theta_end - theta_start| / |theta_start| (LoRA
factors, from the start of this session: a resumed run counts what it trained). A group that received no gradient
fails the run with one line naming it, before anything is merged. The summary goes into run.json (`trained`) and
the log.

Sharded runs (FSDP) measure each rank's local shard and add the squares across ranks; replicated ones (DDP, one
process) measure once. The start is copied to host memory (a 120b expert adapter is ~2 GB there, none on the GPU).
"""

from __future__ import annotations

import math
import re
from typing import Any

GROUPS = (("expert LoRA", re.compile(r"\.mlp\.experts\.")), ("attention LoRA", re.compile(r"\.self_attn\.")))
OTHER = "other adapted weights"
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def group_of(name: str) -> tuple[str, int | None]:
    """(the group, the decoder layer or None) of a trainable parameter by its name."""
    kind = next((group for group, pattern in GROUPS if pattern.search(f".{name}")), OTHER)
    layer = _LAYER.search(f".{name}")
    return kind, int(layer.group(1)) if layer else None


def _local(parameter: Any) -> Any:
    """The part of a parameter this rank holds (a DTensor's local shard; FSDP1's are plain views already)."""
    to_local = getattr(parameter, "to_local", None)
    return to_local() if callable(to_local) else parameter


class Measure:
    """Started when training begins (the model prepared: sharded, resumed); `gradient` before each optimizer step;
    `summary` at the end."""

    def __init__(self, model: Any, sharded: bool) -> None:
        import torch

        self.model, self.sharded = model, sharded
        self.trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.start = {name: _local(p).detach().to("cpu", torch.float32, copy=True) for name, p in self.trainable}
        self.keys = sorted({group_of(name) for name, _ in self.trainable}, key=str)
        device = next((p.device for _, p in self.trainable), torch.device("cpu"))
        self.gradient_sq = torch.zeros(len(self.keys), dtype=torch.float64, device=device)  # no sync per step
        self.steps = 0
        self.first_step = 0  # the global step training began at (a resumed run's checkpoint)

    def gradient(self) -> None:
        """Add this step's gradient norms per group: one fused norm kernel per group, no copy of any gradient (a 120b
        expert adapter's gradient is GBs), no host sync."""
        import torch

        self.steps += 1
        by_group: dict[int, list[Any]] = {}
        index = {key: i for i, key in enumerate(self.keys)}
        for name, p in self.trainable:
            if p.grad is not None and _local(p.grad).numel():
                by_group.setdefault(index[group_of(name)], []).append(_local(p.grad).detach())
        for i, grads in by_group.items():
            norms = torch.stack(torch._foreach_norm(grads)).double()
            self.gradient_sq[i] += torch.sum(norms.to(self.gradient_sq.device) ** 2)

    def summary(self) -> dict[str, Any]:
        """Per group and layer: summed gradient norm and relative update; the same on every rank."""
        import torch

        index = {key: i for i, key in enumerate(self.keys)}
        moved = torch.zeros(len(self.keys), 2, dtype=torch.float64)  # |delta|^2, |start|^2
        for name, p in self.trainable:
            now = _local(p).detach().to("cpu", torch.float32)
            start = self.start[name]
            moved[index[group_of(name)]] += torch.tensor([float(((now - start) ** 2).sum()), float((start**2).sum())])
        gradient_sq = self.gradient_sq.cpu()
        if self.sharded:
            gradient_sq, moved = _sum_over_ranks(gradient_sq), _sum_over_ranks(moved)
        groups: dict[str, Any] = {}
        for i, (kind, layer) in enumerate(self.keys):
            group = groups.setdefault(
                kind, {"gradient_norm": 0.0, "relative_update": 0.0, "layers": {}, "_sq": [0.0] * 3}
            )
            delta_sq, start_sq, grad_sq = float(moved[i, 0]), float(moved[i, 1]), float(gradient_sq[i])
            group["layers"][str(layer)] = _figures(grad_sq, delta_sq, start_sq)
            group["_sq"] = [a + b for a, b in zip(group["_sq"], (grad_sq, delta_sq, start_sq), strict=True)]
        for group in groups.values():
            group.update(_figures(*group.pop("_sq")))
        return {"optimizer_steps": self.steps, "groups": groups}


def _figures(grad_sq: float, delta_sq: float, start_sq: float) -> dict[str, float]:
    return {"gradient_norm": math.sqrt(grad_sq),
            "relative_update": math.sqrt(delta_sq / start_sq) if start_sq else math.sqrt(delta_sq)}  # fmt: skip


def _sum_over_ranks(values: Any) -> Any:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return values
    device = "cuda" if torch.cuda.is_available() else "cpu"
    summed = values.to(device)
    dist.all_reduce(summed)
    return summed.cpu()


def starved(summary: dict[str, Any]) -> list[str]:
    """The groups (with their layers) that no gradient reached: their adapters would be saved as they started."""
    out = []
    for kind, group in summary["groups"].items():
        if group["gradient_norm"] == 0.0:
            layers = [layer for layer, figures in group["layers"].items() if figures["gradient_norm"] == 0.0]
            shown = ", ".join(layers) if layers != ["None"] else "all"
            out.append(f"{kind} (layers {shown})")
    return out


def paths_that_ran(model: Any, settings: Any, compiled: int) -> dict[str, Any]:
    """Which implementations the trained model used, read from the model itself where it can say."""
    from .trainer import uses_packing

    experts = sorted({_inner(module) for name, module in model.named_modules() if name.endswith("mlp.experts")})
    config = getattr(model, "config", None)
    return {
        "experts": experts or None,
        "experts_stored": settings.model.experts,
        "experts_implementation": getattr(config, "experts_implementation", None) if config is not None else None,
        "attention": getattr(config, "_attn_implementation", None) if config is not None else None,
        "compiled_layers": compiled,
        "method": settings.training.method,
        "packing": uses_packing(settings),
        "distributed": settings.training.distributed,
    }


def _inner(module: Any) -> str:
    """A module's class, under the adapter wrappers around it (peft's ParamWrapper for expert parameters)."""
    wrappers = []
    while getattr(module, "base_layer", None) is not None:
        wrappers.append(type(module).__name__)
        module = module.base_layer
    return type(module).__name__ + (f" (in {', '.join(wrappers)})" if wrappers else "")


def line(summary: dict[str, Any], ran: dict[str, Any]) -> str:
    """One log line: each group's movement, then the paths."""
    groups = "; ".join(
        f"{kind} moved {g['relative_update']:.3g} (gradient {g['gradient_norm']:.3g}, {len(g['layers'])} layer(s))"
        for kind, g in summary["groups"].items()
    )
    paths = ", ".join(f"{key} {value}" for key, value in ran.items() if value not in (None, []))
    return f"trained: {groups or 'nothing trainable'}; ran: {paths}"
