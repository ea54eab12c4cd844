"""A chat client for the served model: a SageMaker endpoint (sagemaker-runtime) or a local server (HTTP).

Both speak the same request: an OpenAI chat completion posted to the SageMaker hosting route `/invocations`.
vLLM's reasoning parser of the model's family returns the reasoning apart from the answer (gpt-oss: the analysis
channel apart from the final one; Qwen3: what is in <think> apart from what follows); both are kept apart here.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from toolkit.deploy import ADAPTER_HEADER, DeployError, DeployInputError


@dataclass
class ChatReply:
    content: str
    reasoning: str
    finish_reason: str
    usage: dict[str, Any]
    model: str = ""  # the model that answered (the adapter's name when one was addressed)
    tool_calls: list[dict] = field(default_factory=list)  # [{id, name, arguments}]: vLLM's gpt-oss tool parser


@dataclass
class Delta:
    kind: Literal["reasoning", "content", "tool_call", "finish"]
    text: str  # for a tool call: a piece of its arguments (JSON text); for "finish": the finish_reason
    name: str = ""  # a tool call's function name (on its first piece)
    index: int = 0  # which tool call of the reply


@dataclass
class Shown:
    """What of a streamed reply to show as it arrives: new text of the reasoning or of the answer (`kind`, as in
    `Delta`); `opens`: the first text of its part (where a label goes)."""

    kind: Literal["reasoning", "content"]
    text: str
    opens: bool


class ReplyAssembler:
    """A streamed reply put together from its deltas (`ChatClient.stream`). Iterating yields what to show as it
    arrives: the reasoning and the answer each up to its first raw harmony token (`before_markup`: a reply cut off
    in a channel header, or a header the model wrote into its answer, is never shown as text). Tool calls are shown
    whole once the reply ends: `reply()`, the whole reply (no usage: a stream reports none), holds them."""

    def __init__(self, deltas: Iterable[Delta] = ()) -> None:
        self._deltas = deltas
        self._parts = {"reasoning": "", "content": ""}
        self._shown = {"reasoning": 0, "content": 0}  # characters of each part shown so far
        self._calls: dict[int, dict] = {}
        self._finish = ""

    def __iter__(self) -> Iterator[Shown]:
        for delta in self._deltas:
            yield from self.add(delta)
        yield from self._rest()

    def add(self, delta: Delta) -> list[Shown]:
        """Take one delta; what of it to show now (none for a tool call's piece, the finish reason, held-back
        markup). A part's text that may be the start of a harmony token split across deltas (`<|chan`) waits
        for the next delta: shown once it is plain text, never once it is a token."""
        if delta.kind == "finish":
            self._finish = delta.text
            return []
        if delta.kind == "tool_call":
            call = self._calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["name"] += delta.name
            call["arguments"] += delta.text
            return []
        self._parts[delta.kind] += delta.text
        visible = before_markup(self._parts[delta.kind])
        if len(visible) == len(self._parts[delta.kind]):  # no token yet: hold back a tail that may begin one
            visible = visible[: PARTIAL_TOKEN.search(visible).start()]  # type: ignore[union-attr]
        return self._show(delta.kind, visible)

    def _rest(self) -> list[Shown]:
        """The stream ended: a held-back tail that never became a token is text."""
        parts: tuple[Literal["reasoning", "content"], ...] = ("reasoning", "content")
        return [shown for kind in parts for shown in self._show(kind, before_markup(self._parts[kind]))]

    def _show(self, kind: Literal["reasoning", "content"], visible: str) -> list[Shown]:
        before = self._shown[kind]
        if len(visible) <= before:
            return []
        self._shown[kind] = len(visible)
        return [Shown(kind, visible[before:], opens=not before)]

    def reply(self) -> ChatReply:
        return ChatReply(self._parts["content"], self._parts["reasoning"], self._finish, {},
                         tool_calls=list(self._calls.values()))  # fmt: skip


def ping(url: str) -> bool:
    """Whether a server at `url` answers the SageMaker health check (GET /ping) with 200."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/ping", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def served_models(url: str) -> set[str] | None:
    """The model names a vLLM server at `url` answers to (GET /v1/models: the served model and its adapters); None
    where it does not say (another server, or none there yet)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=5) as response:
            listed = json.loads(response.read()).get("data")
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        return None
    if not isinstance(listed, list):
        return None
    return {entry["id"] for entry in listed if isinstance(entry, dict) and isinstance(entry.get("id"), str)}


def require_serving(url: str, name: str) -> None:
    """Refuse to ask a server that serves another config's model: SageMaker's /invocations route answers with
    whatever model the server holds, whatever the request names, so the reply would be that model's, silently."""
    served = served_models(url)
    if served is not None and name not in served:
        shown = ", ".join(sorted(served)) or "no model"
        raise DeployInputError(
            f"{url} serves {shown}, not {name}: ask it with the config it serves, or start {name}'s server "
            f"(`toolkit deploy {name} --target local`; --url names a server on another port)"
        )


def wait_for(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ping(url):
        if time.monotonic() > deadline:
            raise DeployError(f"{url} did not answer /ping within {timeout:.0f} s (is the server running?)")
        time.sleep(1)


def messages_for(question: str, reasoning_language: str | None = None, system: str | None = None) -> list[dict]:
    """The published recipe's prompt: a 'reasoning language: X' system message, then the question."""
    system_lines = [
        line for line in (system, reasoning_language and f"reasoning language: {reasoning_language}") if line
    ]
    messages = [{"role": "system", "content": "\n".join(system_lines)}] if system_lines else []
    return [*messages, {"role": "user", "content": question}]


SPECIAL_TOKEN = re.compile(r"<\|[a-z_0-9]+\|>")  # harmony's <|start|>, <|channel|>, ...; Qwen's <|im_end|>
PARTIAL_TOKEN = re.compile(r"(<(\|[a-z_0-9]*\|?)?)?$")  # the end of a text that may begin a token (or nothing)


# a chat template's reasoning and tool-call tags (Qwen3's): in a parsed reply's text they are markup the server's
# parsers failed to take apart (an unclosed <think>, a <tool_call> that is not JSON)
TEMPLATE_TAG = re.compile(r"</?(?:think|tool_call|tool_response)>")


def reply_problems(reply: ChatReply, harmony: bool = True, reasoning: bool = True) -> list[str]:
    """What keeps a reply from being an answer with its reasoning shown apart: both parts present (gpt-oss's
    analysis and final channels; a template's <think> and what follows), no raw special tokens or template tags.
    `harmony`: name the parts by gpt-oss's channels (else by a chat template's reasoning block); `reasoning`: the
    model writes reasoning (a chat model trained without it, Config.writes_reasoning, answers alone)."""
    problems = []
    if reasoning and not reply.reasoning.strip():
        problems.append("has no reasoning" + (" (analysis channel)" if harmony else " (no <think> block came back)"))
    if not reply.content.strip() and not reply.tool_calls:  # a tool call is an answer too (the turn ends there)
        problems.append("has no answer" + (" (final channel)" if harmony else ""))
    text = reply.reasoning + reply.content
    leaked = sorted(set(SPECIAL_TOKEN.findall(text)))
    if leaked:
        problems.append("shows special tokens: " + " ".join(leaked))
    tags = sorted(set(TEMPLATE_TAG.findall(text)))
    if tags:
        problems.append("shows chat-template tags: " + " ".join(tags))
    return problems


def before_markup(text: str) -> str:
    """What of a reply's part is shown as text: all of it up to the first raw harmony token (a reply cut off inside
    a channel header, or a model writing a second header into its answer), which is never shown as an answer."""
    found = SPECIAL_TOKEN.search(text)
    return text if found is None else text[: found.start()]


def markup_note(reply: ChatReply, harmony: bool = True) -> str | None:
    """Why part of a reply was not shown (see before_markup); None when nothing was held back. `harmony`: the
    tokens are gpt-oss's harmony markup (else a chat template's special tokens, e.g. ChatML's <|im_start|>)."""
    leaked = sorted(set(SPECIAL_TOKEN.findall(reply.reasoning + reply.content)))
    if not leaked:
        return None
    what = "raw harmony markup" if harmony else "raw special tokens"
    return (f"the reply holds {what} ({' '.join(leaked)}): not shown as text from there on; --json shows the reply "
            "as the server sent it")  # fmt: skip


def cut_off(finish_reason: str, max_tokens: int) -> str | None:
    """What to say about a reply that ended at max_tokens instead of its own end; None for one that ended itself."""
    if finish_reason != "length":
        return None
    return f"cut off at --max-tokens {max_tokens} (finish_reason: length): raise --max-tokens for the whole reply"


def _reasoning(part: dict) -> str:
    return part.get("reasoning_content") or part.get("reasoning") or ""  # vLLM renamed the field across releases


def json_reply(raw: bytes, where: str) -> dict:
    """The server's JSON reply; anything else (an empty body, an HTML error page) is one line, not a traceback."""
    try:
        return json.loads(raw)
    except ValueError:
        shown = repr(raw[:200].decode(errors="replace")) if raw else "an empty body"
        raise DeployError(f"{where} did not answer with JSON ({shown}): check that it serves, and ask again") from None


def reply_from(body: dict) -> ChatReply:
    if "choices" not in body:
        raise DeployError(f"the server did not return a chat completion: {json.dumps(body)[:500]}")
    choice = body["choices"][0]
    message = choice.get("message", {})
    calls = [
        {
            "id": c.get("id", ""),
            "name": c.get("function", {}).get("name", ""),
            "arguments": c.get("function", {}).get("arguments", ""),
        }
        for c in message.get("tool_calls") or []
    ]
    return ChatReply(message.get("content") or "", _reasoning(message), choice.get("finish_reason") or "",
                     body.get("usage") or {}, body.get("model") or "", calls)  # fmt: skip


STREAM_END = b"[DONE]"  # the last event of every OpenAI-style stream: a reply without it was cut off


def deltas_from(chunks: Iterable[bytes]) -> Iterator[Delta]:
    """Server-sent events (`data: {...}` lines, split anywhere across chunks) -> reasoning/content deltas.

    A stream that ends before its end event broke off, however the transport ended: a server killed mid-reply
    can close its connection as cleanly as one that finished, so the end event, not the socket, says it is whole.
    """
    buffer = b""
    ended = False
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            ended = ended or _payload(line) == STREAM_END
            yield from _delta(line.strip())
    ended = ended or _payload(buffer) == STREAM_END
    if not ended:  # what is left unterminated is a fragment of the event a killed server was writing: not read
        raise DeployError(
            "the reply broke off before its end (no closing [DONE] event): the server stopped or crashed "
            "mid-reply; check that it still runs (its log) and ask again"
        )
    yield from _delta(buffer.strip())


def _payload(line: bytes) -> bytes | None:
    line = line.strip()
    return line[len(b"data:") :].strip() if line.startswith(b"data:") else None


def _delta(line: bytes) -> Iterator[Delta]:
    payload = _payload(line)
    if payload is None or payload == STREAM_END:
        return
    try:
        event = json.loads(payload)
    except ValueError:
        raise DeployError(
            f"the server sent a stream event that is not JSON ({payload[:200]!r}): check its log and ask again"
        ) from None
    if "error" in event:
        raise DeployError(f"the server failed while streaming: {event['error']}")
    for choice in event.get("choices", []):
        delta = choice.get("delta", {})
        if _reasoning(delta):
            yield Delta("reasoning", _reasoning(delta))
        if delta.get("content"):
            yield Delta("content", delta["content"])
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            yield Delta("tool_call", function.get("arguments") or "", function.get("name") or "", call.get("index", 0))
        if choice.get("finish_reason"):  # why the reply ended: stop, length (max_tokens), tool_calls
            yield Delta("finish", choice["finish_reason"])


class ChatClient:
    """`chat()` returns the whole reply; `stream()` yields deltas as tokens arrive."""

    def __init__(self, send: Callable[[dict], dict], send_streaming: Callable[[dict], Iterable[bytes]], model: str):
        self._send, self._send_streaming, self.model = send, send_streaming, model

    @classmethod
    def for_endpoint(cls, endpoint: str, runtime: Any, model: str, component: str | None = None) -> ChatClient:
        """A SageMaker endpoint through a boto3 `sagemaker-runtime` client; `component`: the inference component
        (an adapter's) that answers, picked by name."""
        picked = {"InferenceComponentName": component} if component else {}

        def send(body: dict) -> dict:
            response = runtime.invoke_endpoint(
                EndpointName=endpoint, ContentType="application/json", Accept="application/json",
                Body=json.dumps(body).encode(), **picked,
            )  # fmt: skip
            return json_reply(response["Body"].read(), f"endpoint {endpoint}")

        def send_streaming(body: dict) -> Iterator[bytes]:
            response = runtime.invoke_endpoint_with_response_stream(
                EndpointName=endpoint, ContentType="application/json", Body=json.dumps(body).encode(), **picked
            )
            for event in response["Body"]:
                if "PayloadPart" in event:
                    yield event["PayloadPart"]["Bytes"]
                elif event:  # ModelStreamError / InternalStreamFailure
                    raise DeployError(f"endpoint {endpoint} failed while streaming: {event}")

        return cls(send, send_streaming, model)

    @classmethod
    def for_url(
        cls, url: str, model: str, timeout: float = 300, adapter: bool = False, serves: str | None = None
    ) -> ChatClient:
        """A server speaking the SageMaker hosting contract over HTTP (`toolkit deploy --target local`).

        `adapter`: `model` is a LoRA adapter's name. SageMaker's /invocations route answers with the base model
        unless its adapter header names the adapter (the body's `model` alone is overwritten), so both are sent.
        `serves`: the model name the server must serve (a config's), checked before the first request.
        """
        route = url.rstrip("/") + "/invocations"
        headers = {"Content-Type": "application/json", **({ADAPTER_HEADER: model} if adapter else {})}
        unchecked = [serves] if serves else []  # checked once, at the first request (the server may start late)

        def post(body: dict):
            while unchecked:
                require_serving(url, unchecked.pop())
            request = urllib.request.Request(route, data=json.dumps(body).encode(), headers=headers)
            try:
                return urllib.request.urlopen(request, timeout=timeout)
            except urllib.error.HTTPError as exc:
                raise DeployError(f"{route} answered {exc.code}: {exc.read().decode(errors='replace')[:500]}") from None
            except urllib.error.URLError as exc:
                raise DeployInputError(f"cannot reach {route}: {exc.reason} (is the server running?)") from None
            except (http.client.HTTPException, OSError) as exc:  # accepted, then gone before its reply
                raise DeployError(f"{route} closed the connection before replying ({exc!r})") from None

        def send(body: dict) -> dict:
            with post(body) as response:
                return json_reply(response.read(), route)

        def send_streaming(body: dict) -> Iterator[bytes]:
            received = 0
            with post(body) as response:
                try:
                    for chunk in iter(lambda: response.read1(4096), b""):
                        received += len(chunk)
                        yield chunk
                except (http.client.HTTPException, OSError) as exc:  # the server went away mid-reply
                    raise DeployError(
                        f"the reply from {route} broke off after {received} bytes ({type(exc).__name__}): the "
                        "server stopped or crashed; check that it still runs (its log) and ask again"
                    ) from None

        return cls(send, send_streaming, model)

    def send(self, body: dict) -> dict:
        """A raw chat-completion body (e.g. with vLLM's `return_token_ids`) -> the server's JSON reply."""
        return self._send(body)

    def _body(
        self,
        messages: list[dict],
        max_tokens: int,
        temperature: float,
        stream: bool,
        tools: list[dict] | None = None,
        reasoning_effort: str | None = None,
    ) -> dict:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": stream,
        }
        if tools:  # OpenAI function tools: harmony's developer message; calls come back in message.tool_calls
            body["tools"] = tools
        if reasoning_effort:  # the system message's `Reasoning:` level (low, medium, high)
            body["reasoning_effort"] = reasoning_effort
        return body  # fmt: skip

    def chat(
        self,
        messages: list[dict],
        max_tokens: int = 512,
        temperature: float = 0.7,
        tools: list[dict] | None = None,
        reasoning_effort: str | None = None,
    ) -> ChatReply:
        return reply_from(self._send(self._body(messages, max_tokens, temperature, False, tools, reasoning_effort)))

    def stream(
        self,
        messages: list[dict],
        max_tokens: int = 512,
        temperature: float = 0.7,
        tools: list[dict] | None = None,
        reasoning_effort: str | None = None,
    ) -> Iterator[Delta]:
        body = self._body(messages, max_tokens, temperature, True, tools, reasoning_effort)
        yield from deltas_from(self._send_streaming(body))  # fmt: skip

    def stream_reply(
        self,
        messages: list[dict],
        max_tokens: int = 512,
        temperature: float = 0.7,
        tools: list[dict] | None = None,
        reasoning_effort: str | None = None,
    ) -> ReplyAssembler:
        """`stream()` put together: iterate it for what to show as tokens arrive, then `reply()` for the whole."""
        return ReplyAssembler(self.stream(messages, max_tokens, temperature, tools, reasoning_effort))


def read_tools(path: str) -> list[dict]:
    """An OpenAI `tools` list from a JSON file, checked as training checks a row's tools (one-line errors)."""
    from toolkit_train.families.harmony import tool_names

    try:
        tools = json.loads(open(path, encoding="utf-8").read())  # noqa: SIM115
    except OSError as exc:
        raise DeployInputError(f"--tools {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise DeployInputError(f"--tools {path}: not JSON ({exc}); write a list of OpenAI function tools") from None
    tools = tools.get("tools", tools) if isinstance(tools, dict) else tools
    try:
        tool_names(tools)
    except ValueError as exc:
        raise DeployInputError(f"--tools {path}: {exc}") from None
    return tools


def show_tool_calls(calls: list[dict]) -> list[str]:
    """One line per tool call the model made: `tool call: NAME ARGUMENTS`."""
    return [f"tool call: {call['name']} {call['arguments']}" for call in calls]
