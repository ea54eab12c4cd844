"""What the toolkit knows about SageMaker GPU instance types: the one table every check uses.

GPUs, EFA interfaces and GPU memory per node, and whether the type has local NVMe instance storage: SageMaker
refuses an EBS KMS key (VolumeKmsKeyId) for training and an EBS size (VolumeSizeInGB) for endpoints on those
(the NVMe volumes are encrypted by the hardware). Source: the AWS instance-type pages and the SageMaker API
reference for ResourceConfig.VolumeKmsKeyId and ProductionVariant.VolumeSizeInGB.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from toolkit.errors import brief


class Instance(NamedTuple):
    gpus: int
    efa: int  # EFA interfaces HyperPod pods should request (0: no EFA)
    gpu_memory_gib: int
    gpu: str  # the GPU model: a key of GPUS
    local_nvme: bool = True  # instance storage on NVMe (every type here but p3)


class Gpu(NamedTuple):
    """What `toolkit plan` scales a measurement by: dense bf16 tensor TFLOP/s from NVIDIA's data sheets (no
    sparsity); 0 for GPUs without bf16 (T4, V100: the training stack runs in bf16)."""

    bf16_tflops: float


GPUS: dict[str, Gpu] = {
    "B200": Gpu(2250),
    "H200": Gpu(989),
    "H100": Gpu(989),
    "A100": Gpu(312),
    "L40S": Gpu(362),
    "A10G": Gpu(125),  # NVIDIA publishes the A10's figure; AWS's A10G variant is not separately listed
    "T4": Gpu(0),
    "V100": Gpu(0),
}


INSTANCES: dict[str, Instance] = {
    "ml.p6-b200.48xlarge": Instance(8, 8, 179, "B200"),
    "ml.p5en.48xlarge": Instance(8, 16, 141, "H200"),
    "ml.p5e.48xlarge": Instance(8, 32, 141, "H200"),
    "ml.p5.48xlarge": Instance(8, 32, 80, "H100"),
    "ml.p4de.24xlarge": Instance(8, 4, 80, "A100"),
    "ml.p4d.24xlarge": Instance(8, 4, 40, "A100"),
    "ml.g6e.xlarge": Instance(1, 0, 48, "L40S"),
    "ml.g6e.2xlarge": Instance(1, 0, 48, "L40S"),
    "ml.g6e.12xlarge": Instance(4, 0, 48, "L40S"),
    "ml.g6e.48xlarge": Instance(8, 1, 48, "L40S"),
    "ml.g5.xlarge": Instance(1, 0, 24, "A10G"),
    "ml.g5.2xlarge": Instance(1, 0, 24, "A10G"),
    "ml.g5.12xlarge": Instance(4, 0, 24, "A10G"),
    "ml.g5.48xlarge": Instance(8, 1, 24, "A10G"),
    "ml.g4dn.xlarge": Instance(1, 0, 16, "T4"),
    "ml.g4dn.12xlarge": Instance(4, 0, 16, "T4"),
    "ml.p3.2xlarge": Instance(1, 0, 16, "V100", local_nvme=False),
    "ml.p3.16xlarge": Instance(8, 0, 16, "V100", local_nvme=False),
}


# The models whose weights the training and serving checks size against the GPUs
class ModelShape(NamedTuple):
    """What the checks need of a known model (its Hugging Face config.json)."""

    params_b: float  # total parameters, billions
    attention_heads: int
    kv_heads: int
    context: int  # max_position_embeddings: the longest sequence it takes
    expert_params_b: float = 0.0  # of which MoE expert weights, billions (stored as MXFP4 by gpt-oss)

    @property
    def bf16_gib(self) -> float:
        """Weights in bf16: what training holds with the experts dequantized (model.experts: bf16)."""
        return 2 * self.params_b * 1e9 / 2**30

    @property
    def packed_gib(self) -> float:
        """Weights with the experts in MXFP4 (4.25 bits: 4-bit values + one 8-bit scale per 32) and the rest in
        bf16: the released checkpoint, what model.experts: mxfp4 holds and merges to."""
        dense = self.params_b - self.expert_params_b
        return (2 * dense + 4.25 / 8 * self.expert_params_b) * 1e9 / 2**30

    def weights_gib(self, experts: str) -> float:
        return self.packed_gib if experts == "mxfp4" else self.bf16_gib


# gpt-oss experts: layers x experts x (2880 x 5760 gate_up + 2880 x 2880 down) = 24.9M weights each
MODELS: dict[str, ModelShape] = {
    "openai/gpt-oss-20b": ModelShape(20.9, 64, 8, 131072, expert_params_b=24 * 32 * 0.02488),
    "openai/gpt-oss-120b": ModelShape(116.8, 64, 8, 131072, expert_params_b=36 * 128 * 0.02488),
    # dense Qwen3 (config.json: 36 layers, hidden 4096, 32 heads / 8 KV heads, 40,960 positions, untied head)
    "Qwen/Qwen3-8B": ModelShape(8.19, 32, 8, 40960),
    # Qwen3-MoE (config.json: 48 layers, hidden 2048, 32 heads / 4 KV heads, 128 experts of 3 x 2048 x 768 each,
    # 40,960 positions, untied head): 28.99 B of its 30.53 B in the experts, bf16 (no MXFP4 checkpoint)
    "Qwen/Qwen3-30B-A3B": ModelShape(30.53, 32, 4, 40960, expert_params_b=48 * 128 * 3 * 2048 * 768 / 1e9),
}


class MeasuredMicroBatch(NamedTuple):
    """Packed micro-batches measured on a GPU of this memory: the largest that trained, the smallest that did not."""

    fits: int
    out_of_memory: int
    source: str


# (model, model.experts, GPU GiB) -> measured with ddp, recomputation, LoRA r16 q/k/v/o, max length 4,096:
# bench/train_throughput.py --gpu-memory-gb 85.52 (an H100 80GB's memory, on an H200 with the allocator capped).
# Without recomputation a micro-batch needs more, so what ran out of memory with it is refused either way.
MICRO_BATCH_LIMITS: dict[tuple[str, str, int], MeasuredMicroBatch] = {
    ("openai/gpt-oss-120b", "mxfp4", 80): MeasuredMicroBatch(
        16384, 24576, "bench/results/train_throughput_1gpu_h100_80gb.json"
    ),
}


def instance(name: str, field: str) -> Instance:
    """Look up an instance type, or fail with a message that names the field and the choices."""
    try:
        return INSTANCES[name]
    except KeyError:
        known = ", ".join(sorted(INSTANCES))
        raise ValueError(f"{field}: unknown GPU instance type {brief(name)}; use one of: {known}") from None


@functools.lru_cache(maxsize=1)
def local_gpus() -> tuple[int, ...]:
    """This machine's NVIDIA GPUs, their memory in GiB each (nvidia-smi; no torch import); () without any.
    What the memory checks of `target: local` use in place of an instance type."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return ()
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(round(int(line) / 1024) for line in listed.stdout.split() if line.strip().isdigit())
