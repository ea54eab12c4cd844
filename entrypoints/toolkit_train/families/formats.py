"""Chat formats: how a normalized conversation (harmony.normalize's {messages, tools, effort}) becomes token ids.

A model family's record names its format (families.ModelFamily.chat_format); `for_family` gives the renderer. Each
renders three things the same way for every caller:
- `examples`: one example per assistant turn (a turn ends with an answer that calls no tool), its ids and which of
  them are trained (what the model generates for that turn);
- `prompt_ids`: what the serving engine renders for a request whose messages end before the assistant's turn;
- `pair`: a preference pair as the prompt's ids and each reply's ids after it (the tokens DPO scores).

Two formats:
- harmony (gpt-oss): openai_harmony renders, exactly as the pinned vLLM does (toolkit_train/families/harmony.py);
- template: the tokenizer's own chat template (`tokenizer.apply_chat_template`, what vLLM renders for a model
  served with its template). The trained tokens come from the template's `{% generation %}` markers
  (`return_assistant_tokens_mask`); a template without them is diffed instead (as TRL does): an assistant
  message's tokens are those its rendering adds to the prompt before it (with the generation prompt), up to its
  end-of-turn token (the tokenizer's eos) when the template writes one. The reasoning goes in the template's
  thinking field (Qwen3's `reasoning_content`, or `thinking`), the tools in its `tools`; a row that needs one the
  template does not read is refused rather than trained without it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from . import harmony
from .harmony import Example


class FormatError(ValueError):
    """A conversation this format cannot render for this tokenizer (the whole dataset's problem, not one row's)."""


class ChatFormat:
    name = ""
    developer_role = False  # it renders a developer message apart from the system prompt (harmony's instructions)
    renders_with_tokenizer = True  # its rendering reads the tokenizer (a chat template); harmony's is its own

    def check(self, tokenizer) -> None:
        """Raises FormatError when the tokenizer cannot render this format."""

    def validate(self, conversation: dict[str, Any], tokenizer) -> None:
        """A checked row (or pair) this format can render: ValueError naming the message where it cannot (a bad row),
        FormatError where no row can be (the whole dataset's problem)."""

    def examples(self, conversation: dict[str, Any], tokenizer, date: str | None = None) -> list[Example]:
        raise NotImplementedError

    def prompt_ids(self, conversation: dict[str, Any], tokenizer, date: str | None = None) -> list[int]:
        raise NotImplementedError

    def pair(self, pair: dict[str, Any], tokenizer, date: str) -> tuple[list[int], list[int], list[int]]:
        """(prompt ids, chosen ids, rejected ids): the prompt as the server renders it, each reply's rendering
        after it through its last trained token."""
        chosen = pair["chosen"]
        prompt = self.prompt_ids({**chosen, "messages": chosen["messages"][:-1]}, tokenizer, date)
        replies = []
        for key in ("chosen", "rejected"):
            example = self.examples(pair[key], tokenizer, date)[-1]
            end = max(i for i, trained in enumerate(example.trained) if trained) + 1
            ids = example.ids[:end]
            assert ids[: len(prompt)] == prompt, "a reply's rendering does not start with its prompt's"
            replies.append(ids[len(prompt) :])
        return prompt, replies[0], replies[1]


class Harmony(ChatFormat):
    """gpt-oss's harmony, rendered by openai_harmony (toolkit_train/families/harmony.py); the tokenizer must be
    o200k_harmony (its ids are harmony's own)."""

    name = "harmony"
    developer_role = True
    renders_with_tokenizer = False

    def check(self, tokenizer) -> None:
        for token in ("<|start|>", "<|channel|>", "<|message|>", "<|return|>", "<|call|>"):
            if tokenizer.convert_tokens_to_ids(token) != harmony.encoding().encode(token, allowed_special="all")[0]:
                raise FormatError(
                    f"the tokenizer's id for {token} is not harmony's: the harmony format needs gpt-oss's "
                    "o200k_harmony tokenizer (model.id a gpt-oss checkpoint)"
                )

    def examples(self, conversation: dict[str, Any], tokenizer, date: str | None = None) -> list[Example]:
        return harmony.examples(conversation, date)

    def prompt_ids(self, conversation: dict[str, Any], tokenizer, date: str | None = None) -> list[int]:
        return harmony.prompt_ids(conversation, date)


REASONING_FIELDS = ("reasoning_content", "thinking")  # the message field a template reads the reasoning from


class ChatTemplate(ChatFormat):
    """The tokenizer's own chat template, as the serving engine renders it."""

    name = "template"

    def check(self, tokenizer) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise FormatError("the tokenizer has no chat template: the chat-template format renders with it")

    @staticmethod
    def _template(tokenizer) -> str:
        template = tokenizer.chat_template
        return template if isinstance(template, str) else json.dumps(template)

    def reads(self, tokenizer) -> tuple[str | None, bool]:
        """What the template reads beyond role and content: its reasoning field (None: it has none) and whether
        it reads tools."""
        template = self._template(tokenizer)
        field = next(
            (name for name in REASONING_FIELDS if re.search(rf"""\.{name}\b|\[["']{name}["']\]""", template)), None
        )
        return field, bool(re.search(r"\btools\b", template))

    def messages(self, conversation: dict[str, Any], tokenizer) -> list[dict[str, Any]]:
        """The conversation as the chat request's messages (OpenAI's shape, with the template's reasoning field;
        tool-call arguments parsed, as vLLM passes them to a template)."""
        field, reads_tools = self.reads(tokenizer)
        if conversation.get("tools") and not reads_tools:
            raise FormatError(
                "the model's chat template does not read tools: rows with tools cannot be rendered for it; train on "
                "rows without tools, or use a model whose template reads them"
            )
        out = []
        for message in conversation["messages"]:
            item: dict[str, Any] = {"role": message["role"], "content": message["content"]}
            if message["role"] == "tool":
                item["tool_call_id"] = message["tool_call_id"]
            if message.get("thinking"):
                if field is None:
                    raise FormatError(
                        "the model's chat template has no reasoning field (reasoning_content or thinking): rows with "
                        "reasoning cannot be rendered for it; set data.reasoning: drop to train the answers alone, "
                        "or use a model whose template reads it"
                    )
                item[field] = message["thinking"]
            if message.get("tool_calls"):
                item["tool_calls"] = [
                    {"id": call["id"], "type": "function",
                     "function": {"name": call["name"], "arguments": json.loads(call["arguments"])}}
                    for call in message["tool_calls"]
                ]  # fmt: skip
            out.append(item)
        return out

    def validate(self, conversation: dict[str, Any], tokenizer) -> None:
        """Every message's text is in the rendering: a template that renders no message of a role (Qwen3's has no
        `developer`) would drop it from training and serving alike; the row is refused instead, as one the template
        itself refuses (raise_exception: Gemma's has no tool role)."""
        from jinja2 import TemplateError

        self.check(tokenizer)
        for one in (conversation["chosen"], conversation["rejected"]) if "chosen" in conversation else (conversation,):
            try:
                text = tokenizer.apply_chat_template(
                    self.messages(one, tokenizer), tools=one.get("tools") or None, tokenize=False
                )
            except TemplateError as exc:  # the template's own raise_exception (Gemma's: roles must alternate)
                raise ValueError(f"the model's chat template refuses this conversation: {exc}") from None
            for i, message in enumerate(one["messages"]):
                if message["content"].strip() not in text:
                    hint = ": use role system" if message["role"] == "developer" else ""
                    raise ValueError(
                        f"messages[{i}]: the model's chat template does not render this {message['role']} message "
                        f"(it would be dropped in training and when served){hint}"
                    )

    def _render(self, tokenizer, conversation, messages, generation: bool = False, mask: bool = False):
        tools = conversation.get("tools")
        rendered = tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=generation, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=mask,
        )  # fmt: skip
        ids = list(rendered["input_ids"])
        return (ids, list(rendered["assistant_masks"])) if mask else ids

    def prompt_ids(self, conversation: dict[str, Any], tokenizer, date: str | None = None) -> list[int]:
        return self._render(tokenizer, conversation, self.messages(conversation, tokenizer), generation=True)

    def examples(self, conversation: dict[str, Any], tokenizer, date: str | None = None) -> list[Example]:
        from trl.chat_template_utils import has_generation_markers

        messages = self.messages(conversation, tokenizer)
        chat = conversation["messages"]
        markers = has_generation_markers(self._template(tokenizer))
        answers = [
            i for i, m in enumerate(chat) if m["role"] == "assistant" and m["content"] and not m.get("tool_calls")
        ]
        out = []
        previous = -1
        for last in answers:
            first = next(i for i in range(previous + 1, last + 1) if chat[i]["role"] == "assistant")
            prompt = self._render(tokenizer, conversation, messages[:first], generation=True)
            if markers:
                ids, mask = self._render(tokenizer, conversation, messages[: last + 1], mask=True)
                trained = [bool(m) and i >= len(prompt) for i, m in enumerate(mask)]
            else:
                ids = self._render(tokenizer, conversation, messages[: last + 1])
                trained = [False] * len(ids)
                for i in range(first, last + 1):
                    if chat[i]["role"] == "assistant":
                        start, end = self._diffed(tokenizer, conversation, messages, i, ids)
                        trained[start:end] = [True] * (end - start)
            self._starts_with(ids, prompt, last)
            out.append(Example(ids, trained))
            previous = last
        return out

    def _diffed(self, tokenizer, conversation, messages, index: int, ids: list[int]) -> tuple[int, int]:
        """Where assistant message `index` lies in `ids` (the whole turn's rendering): what its own rendering adds
        to the prompt before it, through the end-of-turn token."""
        before = self._render(tokenizer, conversation, messages[:index], generation=True)
        through = self._render(tokenizer, conversation, messages[: index + 1])
        self._starts_with(through, before, index)
        self._starts_with(ids, through, index)
        end = len(through)
        eos = tokenizer.eos_token_id
        if eos in through[len(before) :]:
            end = len(through) - through[::-1].index(eos)  # the newline after <|im_end|> is not generated
        return len(before), end

    @staticmethod
    def _starts_with(ids: list[int], prefix: list[int], index: int) -> None:
        if ids[: len(prefix)] != prefix:
            raise FormatError(
                f"the chat template renders the conversation before message {index} differently once the message "
                "follows (it is not prefix-preserving): what the model is trained on would not be what it is served"
            )


HARMONY = Harmony()
CHAT_TEMPLATE = ChatTemplate()
FORMATS: dict[str, ChatFormat] = {f.name: f for f in (HARMONY, CHAT_TEMPLATE)}


def for_family(family) -> ChatFormat | None:
    """The format a family's record names; None for a family training cannot render (no format known for it)."""
    return FORMATS.get(family.chat_format) if family.chat_format else None


def rendering(family, load_tokenizer: Callable[[], Any]) -> tuple[ChatFormat, Any] | None:
    """How training renders a family's conversations: its format, and the model's tokenizer where the format renders
    with it (a chat template; harmony needs none: `load_tokenizer` is not called); None for a family of no format.
    What the served-prompt check and the preference eval render with, as training did."""
    chat_format = for_family(family)
    if chat_format is None:
        return None
    return chat_format, load_tokenizer() if chat_format.renders_with_tokenizer else None
