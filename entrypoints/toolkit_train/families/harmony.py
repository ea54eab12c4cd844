"""Chat rows in OpenAI's shape -> harmony token ids and labels, rendered by `openai_harmony` itself.

The prompt of every trained turn is built the way vLLM (the pinned version) builds it for the same chat request
(vllm/entrypoints/openai/parser/harmony_utils.py): the first system/developer message becomes the developer
instructions, `tools` the developer message's `functions` namespace, `reasoning_effort` the system message's
`Reasoning:` line, assistant `tool_calls` commentary messages to `functions.NAME` (in vLLM's legacy header form,
`assistant to=functions.NAME<|channel|>commentary json`), `tool` messages messages from `functions.NAME`; the
analysis before the last final answer is dropped. A row with N assistant turns (each ending in a final answer)
gives N examples: turn k's prompt is what inference shows for turn k, and its trained tokens are what the model
generates for it (analysis, tool calls, the analysis after a tool result, the final answer ending in
`<|return|>`); tool results, system, developer and user text carry no labels.
"""

from __future__ import annotations

import datetime
import itertools
import json
from dataclasses import dataclass
from typing import Any

EFFORTS = ("low", "medium", "high")
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class Example:
    ids: list[int]
    trained: list[bool]


def _h():
    import openai_harmony

    return openai_harmony


_ENCODING = None


def encoding():
    global _ENCODING
    if _ENCODING is None:
        h = _h()
        _ENCODING = h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)
    return _ENCODING


def _special(name: str) -> int:
    return encoding().encode(name, allowed_special="all")[0]


def tool_names(tools: list[dict] | None) -> dict[str, dict]:
    """Declared function tools by name -> their JSON schema (validated: ValueError with the reason)."""
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise ValueError("field 'tools' must be a list of {type: function, function: {name, parameters}}")
    declared: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise ValueError(f"tools[{i}] must be {{type: function, function: {{name, description, parameters}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"tools[{i}].function.name is missing")
        if name in declared:
            raise ValueError(f"tools[{i}]: the tool {name!r} is declared twice")
        parameters = function.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        declared[name] = parameters
    return declared


def _check_arguments(where: str, name: str, arguments: Any, schema: dict) -> str:
    """The call's arguments as the JSON text sent to the model; ValueError unless they are JSON of the schema."""
    if isinstance(arguments, dict):
        text = json.dumps(arguments)
        value: Any = arguments
    elif isinstance(arguments, str):
        text = arguments
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}.arguments is not JSON ({exc.msg} at column {exc.colno})") from None
    else:
        raise ValueError(f"{where}.arguments must be a JSON string or object")
    try:
        import jsonschema
    except ImportError:  # the training image may lack it: the required keys are still checked
        missing = [key for key in schema.get("required", []) if not isinstance(value, dict) or key not in value]
        if missing:
            raise ValueError(f"{where}: arguments for {name!r} lack required {missing}") from None
        return text
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is not None:
        path = "".join(f"[{p!r}]" for p in error.absolute_path)
        raise ValueError(f"{where}: arguments{path} do not match the schema of {name!r}: {error.message}")
    return text


def unanswered_calls(calls: dict[str, str], answered: set[str]) -> list[str]:
    return [c for c in calls if c not in answered]


def normalize(row: dict[str, Any], messages: list[Any], default_effort: str, complete: bool = True) -> dict[str, Any]:
    """A row's conversation checked and in one shape: {messages, tools, effort}. ValueError names the field.
    `complete`: it ends with the assistant's final answer (a training row); else it is a request's messages."""
    effort = row.get("reasoning_effort") or default_effort
    if effort not in EFFORTS:
        raise ValueError(f"reasoning_effort {effort!r} is not one of {', '.join(EFFORTS)}")
    tools = row.get("tools") or None
    declared = tool_names(tools)
    clean: list[dict[str, Any]] = []
    calls: dict[str, str] = {}  # id -> name, awaiting an answer
    answered: set[str] = set()
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ValueError(f"messages[{i}] needs a role of {', '.join(ROLES)}")
        role, content = message["role"], message.get("content")
        item: dict[str, Any] = {"role": role}
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in calls:
                raise ValueError(f"messages[{i}]: tool_call_id {call_id!r} answers no earlier assistant tool call")
            if call_id in answered:
                raise ValueError(f"messages[{i}]: tool call {call_id!r} is answered twice")
            if not isinstance(content, str):
                raise ValueError(f"messages[{i}].content (the tool result) must be a string")
            answered.add(call_id)
            clean.append({**item, "tool_call_id": call_id, "name": calls[call_id], "content": content})
            continue
        if unanswered := unanswered_calls(calls, answered):
            raise ValueError(f"messages[{i}]: tool call {unanswered[0]!r} has no tool message answering it")
        thinking = message.get("reasoning") or message.get("thinking")
        if thinking is not None and (role != "assistant" or not isinstance(thinking, str)):
            raise ValueError(f"messages[{i}].reasoning must be a string on an assistant message")
        tool_calls = message.get("tool_calls")
        if tool_calls and role != "assistant":
            raise ValueError(f"messages[{i}]: only assistant messages have tool_calls")
        if tool_calls:
            if not isinstance(tool_calls, list):
                raise ValueError(f"messages[{i}].tool_calls must be a list")
            rendered = []
            for j, call in enumerate(tool_calls):
                where = f"messages[{i}].tool_calls[{j}]"
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(call.get("id"), str):
                    raise ValueError(f"{where} must be {{id, type: function, function: {{name, arguments}}}}")
                name = function.get("name")
                if name not in declared:
                    known = ", ".join(declared) or "none: the row has no 'tools'"
                    raise ValueError(f"{where}: {name!r} is not a declared tool (declared: {known})")
                if call["id"] in calls:
                    raise ValueError(f"{where}: the id {call['id']!r} is used twice")
                calls[call["id"]] = name
                arguments = _check_arguments(where, name, function.get("arguments", "{}"), declared[name])
                rendered.append({"id": call["id"], "name": name, "arguments": arguments})
            item["tool_calls"] = rendered
        if content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string")
        item["content"] = content or ""
        if thinking:
            item["thinking"] = thinking
        if role == "assistant" and not (item["content"] or tool_calls or thinking):
            raise ValueError(f"messages[{i}]: an assistant message needs content, reasoning or tool_calls")
        clean.append(item)
    if complete and unanswered_calls(calls, answered):
        raise ValueError(f"tool call {unanswered_calls(calls, answered)[0]!r} has no tool message answering it")
    if not complete:
        return {"messages": clean, "tools": tools, "effort": effort}
    if not clean or clean[-1]["role"] != "assistant" or not clean[-1]["content"] or clean[-1].get("tool_calls"):
        raise ValueError("the last message must be the assistant's final answer (content, no tool_calls)")
    return {"messages": clean, "tools": tools, "effort": effort}


def conversation_date(date: str | datetime.date | None = None) -> str:
    """The `Current date:` of the system message: the given one (data.conversation_date), else today's, as vLLM
    renders it unless VLLM_SYSTEM_START_DATE pins it (toolkit.deploy.vllm_environment sets it from the same
    setting)."""
    if date is None:
        return datetime.date.today().isoformat()
    return date if isinstance(date, str) else date.isoformat()


def _harmony_messages(conversation: dict[str, Any], date: str) -> list:
    """Harmony messages as vLLM builds them for this chat request (the preamble, then each chat message's)."""
    h = _h()
    chat = conversation["messages"]
    instructions = None
    if chat and chat[0]["role"] in ("system", "developer"):
        instructions, chat = chat[0]["content"], chat[1:]
    system = h.SystemContent.new().with_conversation_start_date(date)
    system = system.with_reasoning_effort(h.ReasoningEffort(conversation["effort"].capitalize()))
    out = [h.Message.from_role_and_content(h.Role.SYSTEM, system)]
    tools = conversation["tools"]
    if instructions or tools:
        developer = h.DeveloperContent.new()
        if instructions is not None:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools([
                h.ToolDescription.new(name=t["function"]["name"], description=t["function"].get("description") or "",
                                      parameters=t["function"].get("parameters"))
                for t in tools
            ])  # fmt: skip
        out.append(h.Message.from_role_and_content(h.Role.DEVELOPER, developer))
    for message in chat:
        role = message["role"]
        produced = []
        if role == "tool":
            author = h.Author.new(h.Role.TOOL, f"functions.{message['name']}")
            produced.append(h.Message.from_author_and_content(author, message["content"]).with_channel("commentary")
                            .with_recipient("assistant"))  # fmt: skip
        elif role == "assistant" and message.get("tool_calls"):
            if message["content"]:  # vLLM: text beside tool calls is a commentary preamble, before the reasoning
                produced.append(h.Message.from_role_and_content(h.Role.ASSISTANT, message["content"])
                                .with_channel("commentary"))  # fmt: skip
            if message.get("thinking"):
                produced.append(h.Message.from_role_and_content(h.Role.ASSISTANT, message["thinking"])
                                .with_channel("analysis"))  # fmt: skip
            for call in message["tool_calls"]:
                produced.append(h.Message.from_role_and_content(h.Role.ASSISTANT, call["arguments"])
                                .with_channel("commentary").with_recipient(f"functions.{call['name']}")
                                .with_content_type("json"))  # fmt: skip
        elif role == "assistant":
            if message.get("thinking"):
                produced.append(h.Message.from_role_and_content(h.Role.ASSISTANT, message["thinking"])
                                .with_channel("analysis"))  # fmt: skip
            if message["content"]:
                produced.append(h.Message.from_role_and_content(h.Role.ASSISTANT, message["content"])
                                .with_channel("final"))  # fmt: skip
        elif role in ("system", "developer"):  # a later one: vLLM makes it a developer message
            produced.append(h.Message.from_role_and_content(
                h.Role.DEVELOPER, h.DeveloperContent.new().with_instructions(message["content"])))  # fmt: skip
        else:
            produced.append(h.Message.from_role_and_content(h.Role.USER, message["content"]))
        out.extend(produced)
    return out


def _is_final(message) -> bool:
    return message.author.role.value == "assistant" and message.channel == "final"


def _render(messages: list, generation: bool = False) -> list[list[int]]:
    """Each harmony message's tokens, as in one rendered conversation (analysis kept: the caller dropped it);
    with `generation`, a last part `<|start|>assistant` (the prompt for the next assistant message)."""
    h = _h()
    config = h.RenderConversationConfig(auto_drop_analysis=False)
    conversation = h.Conversation.from_messages(messages)
    if generation:
        tokens = encoding().render_conversation_for_completion(conversation, h.Role.ASSISTANT, config=config)
    else:
        tokens = encoding().render_conversation(conversation, config=config)
    start = _special("<|start|>")
    bounds = [i for i, t in enumerate(tokens) if t == start] + [len(tokens)]
    if len(bounds) != len(messages) + 1 + generation:
        raise ValueError("a message's text contains a harmony special token")
    return [legacy_tool_call_header(tokens[a:b]) for a, b in itertools.pairwise(bounds)]


def legacy_tool_call_header(tokens: list[int]) -> list[int]:
    """One message's tokens with an assistant tool call's header as the pinned vLLM renders earlier tool calls
    (its _use_legacy_tool_call_headers): `assistant to=R<|channel|>C T`, not harmony's
    `assistant<|channel|>C to=R <|constrain|>T`."""
    enc = encoding()
    channel, constrain, message = _special("<|channel|>"), _special("<|constrain|>"), _special("<|message|>")
    if message not in tokens or channel not in tokens or constrain not in tokens:
        return tokens
    end = tokens.index(message)
    at, cut = tokens.index(channel), tokens.index(constrain)
    if not at < cut < end or enc.decode(tokens[1:at]) != "assistant":
        return tokens
    channel_and_recipient, content_type = enc.decode(tokens[at + 1 : cut]), enc.decode(tokens[cut + 1 : end])
    if " to=" not in channel_and_recipient or not channel_and_recipient.endswith(" "):
        return tokens
    name, recipient = channel_and_recipient[:-1].split(" to=", 1)
    header = [tokens[0], *enc.encode(f"assistant to={recipient}"), channel, *enc.encode(f"{name} {content_type}")]
    return [*header, message, *tokens[end + 1 :]]


def examples(conversation: dict[str, Any], date: str | None = None) -> list[Example]:
    """One example per assistant turn (a turn ends with a final answer): its prompt as inference renders it (the
    analysis of earlier turns dropped), its own messages trained, the last ending in <|return|>."""
    messages = _harmony_messages(conversation, conversation_date(date))
    finals = [i for i, m in enumerate(messages) if _is_final(m)]
    out = []
    previous = -1
    for last in finals:
        kept = [i for i in range(last + 1) if not (i < previous and messages[i].channel == "analysis")]
        # trained: the assistant's own messages after the previous turn's final answer (tool results are not)
        parts = _render([messages[i] for i in kept])
        parts[-1] = [*parts[-1][:-1], _special("<|return|>")]
        ids: list[int] = []
        trained: list[bool] = []
        for i, part in zip(kept, parts, strict=True):
            ids.extend(part)
            trained.extend([i > previous and messages[i].author.role.value == "assistant"] * len(part))
        out.append(Example(ids, trained))
        previous = last
    return out


def prompt_ids(conversation: dict[str, Any], date: str | None = None) -> list[int]:
    """The prompt for the next assistant turn after the conversation (as vLLM renders it for the request)."""
    messages = _harmony_messages(conversation, conversation_date(date))
    finals = [i for i, m in enumerate(messages) if _is_final(m)]
    last = finals[-1] if finals else -1
    kept = [m for i, m in enumerate(messages) if not (i < last and m.channel == "analysis")]
    return [t for part in _render(kept, generation=True) for t in part]
