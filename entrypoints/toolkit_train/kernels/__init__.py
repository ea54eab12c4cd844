"""Kernels: how the training step computes on gpt-oss's experts and rows (the fused MoE path, MXFP4 packed experts and
their LoRA, packing rows into micro-batches). Below the run; above the schema and the data."""
