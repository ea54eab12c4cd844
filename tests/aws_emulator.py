"""What moto server lacks for the toolkit's SageMaker tests, added to the emulator (not to the toolkit).

moto creates endpoints but starts no container: InvokeEndpoint answers from a queue of scripted results
(`/moto-api/static/sagemaker/endpoint-results`) or with the literal "body". `toolkit deploy` probes a new
gpt-oss endpoint for prompt parity (toolkit/deploy/parity.py: requests with `return_token_ids`) before it
reports success, so on bare moto every deploy would fail its check. `render_like_training` answers exactly those
probes as a container whose prompts are training's (toolkit_train/families/harmony.py) and leaves every other invocation
to moto's queue. It is a stand-in for the container, used by the lifecycle tests only; whether the real serving
container (vLLM) renders like training is tested against it in tests/toolkit/deploy/test_endpoint_parity.py.
"""

from __future__ import annotations

import base64
import json
from typing import Any


def _parity_probe(unique_repr: bytes) -> dict[str, Any] | None:
    """The request body when it is the parity check's (a JSON chat request asking for prompt token ids)."""
    try:
        body = json.loads(json.loads(base64.b64decode(unique_repr))["Body"])
    except (ValueError, KeyError, TypeError):
        return None
    return body if isinstance(body, dict) and body.get("return_token_ids") else None


def _served_date(account_id: str, region: str, endpoint_name: str) -> str | None:
    """The date vLLM renders into the served prompt: the container's VLLM_SYSTEM_START_DATE (data.conversation_date),
    read from the endpoint's models as the container would get it; None (today) when none sets it."""
    from moto.sagemaker.models import sagemaker_backends

    backend = sagemaker_backends[account_id][region]
    endpoint = backend.endpoints.get(endpoint_name)
    config = backend.endpoint_configs.get(endpoint.endpoint_config_name) if endpoint else None
    names = [v.get("ModelName") for v in (config.production_variants if config else [])]
    models = [backend._models[n] for n in names if n in backend._models] or list(backend._models.values())
    dates = set()
    for model in models:  # an adapter's base is an inference component's model: then any model of the account
        for container in [model.primary_container or {}, *(model.containers or [])]:
            dates.add((container.get("Environment") or {}).get("VLLM_SYSTEM_START_DATE"))
    dates.discard(None)
    if not dates:  # a registered version's model: its containers (and their environment) are the package's
        for package in backend.model_packages.values():
            for container in (package.inference_specification or {}).get("Containers", []):
                dates.add((container.get("Environment") or {}).get("VLLM_SYSTEM_START_DATE"))
        dates.discard(None)
    return dates.pop() if len(dates) == 1 else None


def render_like_training() -> None:
    """Patch moto's InvokeEndpoint (in this process: ThreadedMotoServer) to answer parity probes."""
    from moto.sagemakerruntime.models import SageMakerRuntimeBackend
    from toolkit_train.families import harmony

    original = SageMakerRuntimeBackend.invoke_endpoint
    if getattr(original, "renders_like_training", False):
        return

    def invoke_endpoint(self: Any, endpoint_name: str, unique_repr: bytes) -> tuple[str, str, str, str]:
        probe = _parity_probe(unique_repr)
        if probe is None:
            return original(self, endpoint_name, unique_repr)
        conversation = harmony.normalize(probe, probe["messages"], "medium", complete=False)
        date = _served_date(self.account_id, self.region_name, endpoint_name)
        reply = {"choices": [{"message": {"content": ""}, "finish_reason": "length"}],
                 "prompt_token_ids": harmony.prompt_ids(conversation, date), "model": probe.get("model")}  # fmt: skip
        return json.dumps(reply), "application/json", "AllTraffic", ""

    invoke_endpoint.renders_like_training = True  # type: ignore[attr-defined]
    SageMakerRuntimeBackend.invoke_endpoint = invoke_endpoint  # type: ignore[method-assign]
