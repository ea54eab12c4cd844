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


def test_the_served_model_check_reads_v1_models_and_lets_other_servers_be(tmp_path):
    """require_serving refuses a vLLM server listing other names; a server that does not list its models (no
    /v1/models, not JSON) is asked as before."""
    import http.server
    import threading

    import pytest

    from toolkit.deploy import DeployInputError
    from toolkit.deploy.client import require_serving, served_models

    answers = {"/v1/models": (200, b'{"object": "list", "data": [{"id": "job-a"}, {"id": "adapter"}]}')}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = answers.get(self.path, (404, b"not found"))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        assert served_models(url) == {"job-a", "adapter"}
        require_serving(url, "job-a")
        with pytest.raises(DeployInputError, match=f"{url} serves adapter, job-a, not job-b"):
            require_serving(url, "job-b")
        answers["/v1/models"] = (200, b"<html>a proxy</html>")
        assert served_models(url) is None
        require_serving(url, "job-b")
        del answers["/v1/models"]
        assert served_models(url) is None
    finally:
        httpd.shutdown()
    assert served_models(url) is None  # nothing there any more
