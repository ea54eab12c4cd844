"""What moto server lacks for the toolkit's SageMaker tests, added to the emulator (not to the toolkit).

moto creates endpoints but starts no container: InvokeEndpoint answers from a queue of scripted results
(`/moto-api/static/sagemaker/endpoint-results`) or with the literal "body". `toolkit deploy` probes a new
gpt-oss endpoint for prompt parity (toolkit/deploy/parity.py: requests with `return_token_ids`) before it
reports success, so on bare moto every deploy would fail its check. `render_like_training` answers exactly those
probes as a container whose prompts are training's (toolkit_train/harmony.py) and leaves every other invocation
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


def render_like_training() -> None:
    """Patch moto's InvokeEndpoint (in this process: ThreadedMotoServer) to answer parity probes."""
    from moto.sagemakerruntime.models import SageMakerRuntimeBackend
    from toolkit_train import harmony

    original = SageMakerRuntimeBackend.invoke_endpoint
    if getattr(original, "renders_like_training", False):
        return

    def invoke_endpoint(self: Any, endpoint_name: str, unique_repr: bytes) -> tuple[str, str, str, str]:
        probe = _parity_probe(unique_repr)
        if probe is None:
            return original(self, endpoint_name, unique_repr)
        conversation = harmony.normalize(probe, probe["messages"], "medium", complete=False)
        reply = {"choices": [{"message": {"content": ""}, "finish_reason": "length"}],
                 "prompt_token_ids": harmony.prompt_ids(conversation), "model": probe.get("model")}  # fmt: skip
        return json.dumps(reply), "application/json", "AllTraffic", ""

    invoke_endpoint.renders_like_training = True  # type: ignore[attr-defined]
    SageMakerRuntimeBackend.invoke_endpoint = invoke_endpoint  # type: ignore[method-assign]
