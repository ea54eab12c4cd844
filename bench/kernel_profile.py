"""GPU time of a training step by kernel class, from a torch.profiler run (bench/train_throughput.py --profile).

Each kernel is classed by its own name and by the CPU op that launched it (the profiler links the two by
correlation id; with record_shapes the op's input shapes too), so that what a lever acts on can be read off:
  expert GEMMs   the grouped GEMMs of the MoE experts (torch._grouped_mm: CUTLASS grouped kernels)
  attention      flex attention's forward and backward kernels (Triton templates, named after the op)
  LoRA GEMMs     GEMMs with a dimension of a LoRA rank (2..64, and not the router's experts): rows @ A, @ B
  dense GEMMs    the frozen base's projections, the router, lm_head
  dequantization the MXFP4 decode (integer bit operations: the only kernels with bitwise ops in a step)
  optimizer      AdamW's kernels
  glue           everything else: elementwise, norms, routing, copies, the loss's softmax
Besides the classes: the GPU's busy time against the profiled window (its idle share is time the GPU waited on
the host: launches, Python, synchronisation) and kernel launches per step. The top kernels are kept by name, so a
result can be classed again without a GPU.
"""

from __future__ import annotations

from typing import Any

EXPERT_GEMM_KEYS = ("grouped_mm", "grouped_gemm", "groupproblemshape", "ptrarray", "ptr_array", "group_gemm")
ATTENTION_KEYS = ("flex_attention", "flash", "fmha", "sdpa", "attention")
GEMM_KEYS = ("gemm", "nvjet", "xmma", "cutlass", "cublas", "matmul", "sm90_", "triton_tem_fused_mm",
             "triton_tem_fused_addmm")  # fmt: skip
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")
OPTIMIZER_KEYS = ("adam", "multi_tensor", "foreach")
DEQUANT_KEYS = ("bitwise", "mxfp4", "dequant", "e2m1")
CLASSES = ("expert GEMMs", "attention", "LoRA GEMMs", "dense GEMMs", "MXFP4 dequantization", "optimizer", "glue")


def classify(kernel: str, ops: tuple[str, ...] = (), shapes: tuple = (), lora_ranks: tuple[int, ...] = ()) -> str:
    """One kernel's class from its name, the ops it ran under (innermost first) and the launching op's input
    shapes. `lora_ranks`: the run's LoRA ranks (a GEMM with one of these as a dimension is LoRA's)."""
    name = kernel.lower()
    context = " ".join(ops).lower()
    if any(k in name for k in OPTIMIZER_KEYS) or "optimizer.step" in context:
        return "optimizer"
    if any(k in name for k in EXPERT_GEMM_KEYS) or ops[:1] == ("aten::_grouped_mm",):
        return "expert GEMMs"
    if any(k in name for k in DEQUANT_KEYS):
        return "MXFP4 dequantization"
    if any(k in name for k in ATTENTION_KEYS):
        return "attention"
    gemm = any(k in name for k in GEMM_KEYS) or (bool(ops) and ops[0] in GEMM_OPS)
    if gemm:
        dims = {d for shape in shapes if isinstance(shape, (list, tuple)) for d in shape if isinstance(d, int)}
        return "LoRA GEMMs" if dims & set(lora_ranks) else "dense GEMMs"
    return "glue"


def _ops(event) -> tuple[str, ...]:
    names = []
    while event is not None and len(names) < 12:
        names.append(str(event.name))
        event = getattr(event, "cpu_parent", None)
    return tuple(names)


def kernel_profile(prof, steps: int, step_s: float, lora_ranks: tuple[int, ...] = ()) -> dict[str, Any]:
    """Per-step GPU milliseconds by class, the top kernels, busy share and launches of the profiled steps."""
    events = list(prof.events())
    cpu = {}
    kernels = []
    for event in events:
        device = str(getattr(event, "device_type", "")).lower()
        if "cuda" in device:
            kernels.append(event)
        elif "cpu" in device:
            cpu[getattr(event, "id", None)] = event
    totals = {c: 0.0 for c in CLASSES}
    by_name: dict[str, list] = {}
    linked = 0
    intervals = []
    for kernel in kernels:
        start, end = kernel.time_range.start, kernel.time_range.end
        micros = end - start
        if micros <= 0 or getattr(kernel, "is_user_annotation", False) or str(kernel.name).startswith("ProfilerStep"):
            continue  # record_function ranges drawn on the GPU's timeline are no kernels
        op = cpu.get(getattr(kernel, "linked_correlation_id", None))
        linked += op is not None
        ops = _ops(op) if op is not None else ()
        shapes = tuple(getattr(op, "input_shapes", None) or ()) if op is not None else ()
        kind = classify(str(kernel.name), ops, shapes, lora_ranks)
        totals[kind] += micros
        entry = by_name.setdefault(str(kernel.name), [0.0, 0, kind, ops[:1]])
        entry[0] += micros
        entry[1] += 1
        intervals.append((start, end))
    intervals.sort()
    busy, window, current = 0.0, 0.0, None
    for start, end in intervals:
        if current is None or start > current[1]:
            if current is not None:
                busy += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current is not None:
        busy += current[1] - current[0]
        window = max(e for _, e in intervals) - intervals[0][0]  # the first kernel's start to the last one's end
    whole = sum(totals.values()) or 1.0
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])
    return {
        "steps": steps,
        "step_s_wall": step_s,
        "kernel_ms_per_step": round(whole / 1000 / steps, 1),
        "gpu_busy_ms_per_step": round(busy / 1000 / steps, 1),  # kernels' union: overlapping streams counted once
        "gpu_idle_share_of_window": round(1 - busy / window, 3) if window else None,
        "launches_per_step": round(len(intervals) / steps),
        "kernels_linked_to_ops": round(linked / max(len(intervals), 1), 3),
        "classes": {
            kind: {"ms_per_step": round(us / 1000 / steps, 1), "share": round(us / whole, 3)}
            for kind, us in sorted(totals.items(), key=lambda kv: -kv[1])
            if us
        },
        "top_kernels": [
            {
                "name": name[:160],
                "ms_per_step": round(us / 1000 / steps, 2),
                "calls_per_step": round(n / steps, 1),
                "class": kind,
                "op": op[0] if op else "",
            }
            for name, (us, n, kind, op) in top[:40]
        ],
    }
