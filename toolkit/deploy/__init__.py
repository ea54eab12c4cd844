"""Serving: the image (build + push), the SageMaker endpoint lifecycle, local vLLM, the chat client, the registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.config.members import hf_token_environment, vllm_flag_environment
from toolkit.errors import BadInput, Failed

if TYPE_CHECKING:
    from toolkit.config import Config


ADAPTER_NAME = "adapter"  # the LoRA adapter's model name on the server (serving.weights: adapter)
ADAPTER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"  # selects it on SageMaker's /invocations route


class DeployError(Failed):
    """A deployment step failed (exit 1); the message says what to do."""


class Refused(DeployError):
    """A check of what a deployment serves failed (exit 1): the deployment is not kept (endpoint.Endpoints.undo)."""


class DeployInputError(BadInput, DeployError):
    """A deployment cannot start: bad input or a missing resource (exit 2; still a DeployError)."""


def served_name(config: Config) -> str:
    """The name a server of this config answers to (its base model's, with an adapter): serving.vllm_args may
    rename it."""
    return vllm_environment(config, gpu=False)["SM_VLLM_SERVED_MODEL_NAME"]


def vllm_environment(config: Config, gpu: bool = True) -> dict[str, str]:
    """The serving container's SM_VLLM_* settings (containers/serving/serve.py turns them into vLLM flags)."""
    serving = config.serving
    env = {
        "SM_VLLM_SERVED_MODEL_NAME": config.name,
        "SM_VLLM_MAX_MODEL_LEN": str(serving.max_model_len),
        "SM_VLLM_MAX_NUM_SEQS": str(serving.max_num_seqs),
    }
    if config.data.conversation_date is not None:  # harmony's `Current date:` as training rendered it
        env["VLLM_SYSTEM_START_DATE"] = config.data.conversation_date.isoformat()
    if gpu:
        env["SM_VLLM_TENSOR_PARALLEL_SIZE"] = str(serving.tensor_parallel_size)
        env["SM_VLLM_GPU_MEMORY_UTILIZATION"] = str(serving.gpu_memory_utilization)
    if serving.weights == "adapter":
        env["SM_VLLM_BASE_MODEL"] = config.model.id
        if config.model.revision:  # the base the adapter was trained on, not whatever the hub's main is today
            env["SM_VLLM_REVISION"] = config.model.revision
        env["SM_VLLM_ADAPTER_NAME"] = ADAPTER_NAME
        env["SM_VLLM_MAX_LORAS"] = str(serving.max_loras)
        env["TOOLKIT_LORA_RANK"] = str(config.lora.max_rank)  # serve.py rounds it up to a --max-lora-rank vLLM allows
        if serving.hf_token_secret:  # serve.py reads the token from it before vLLM downloads the base
            env.update(hf_token_environment(serving.hf_token_secret, config.aws.region))
    return {**env, **vllm_flag_environment(serving.vllm_args)}
