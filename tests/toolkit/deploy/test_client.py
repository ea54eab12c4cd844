"""The streamed reply as `toolkit invoke` shows it (toolkit/deploy/client.py: ReplyAssembler), delta by delta, as
vLLM's stream splits it: no part of a raw harmony token is ever shown, and text that only looked like one is."""

from __future__ import annotations

from toolkit.deploy.client import Delta, ReplyAssembler


def shown(*deltas: Delta) -> list[tuple[str, str, bool]]:
    return [(piece.kind, piece.text, piece.opens) for piece in ReplyAssembler(deltas)]


def test_a_token_split_across_deltas_is_never_shown():
    pieces = shown(Delta("reasoning", "Thinking"), Delta("reasoning", " hard<|chan"), Delta("reasoning", "nel|>final"),
                   Delta("content", "42"), Delta("finish", "stop"))  # fmt: skip
    assert pieces == [("reasoning", "Thinking", True), ("reasoning", " hard", False), ("content", "42", True)]


def test_text_that_only_looked_like_a_token_is_shown_when_it_is_not_one():
    pieces = shown(Delta("content", "if a <"), Delta("content", " b then"), Delta("content", " x <|"),
                   Delta("finish", "length"))  # fmt: skip
    assert "".join(text for _, text, _ in pieces) == "if a < b then x <|"  # the tail, once the stream ended
    assert pieces[0] == ("content", "if a ", True)


def test_a_chat_templates_special_tokens_are_not_called_harmony_markup():
    """Found by an adversarial try: a Qwen3 reply holding ChatML's <|im_start|> was said to hold "raw harmony
    markup"; outside gpt-oss it is a template's special token."""
    from toolkit.deploy.client import ChatReply, markup_note

    reply = ChatReply("Paris.<|im_start|>user", "", "stop", {})
    assert "raw harmony markup (<|im_start|>)" in (markup_note(reply) or "")
    assert "raw special tokens (<|im_start|>)" in (markup_note(reply, harmony=False) or "")
