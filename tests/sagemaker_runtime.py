"""A stand-in for SageMaker's runtime front end (moto has no InvokeEndpointWithResponseStream) on loopback.

It forwards InvokeEndpoint and InvokeEndpointWithResponseStream to a serving container's /invocations route
(here: the toolkit's entry script running real vLLM), and frames the streamed reply as AWS event-stream
`PayloadPart` messages, so boto3's own event-stream parser reads it. With `aws_url` (moto server), every other
request is relayed there unchanged: one AWS endpoint URL for the control plane (moto) and the runtime route (the
container), as the toolkit's clients all take AWS_ENDPOINT_URL. What it does not cover: SageMaker's
routing between instances, auth and its payload/timeout limits.
"""

from __future__ import annotations

import re
import struct
import threading
import urllib.error
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROUTE = re.compile(r"^/endpoints/([^/]+)/(invocations|invocations-response-stream)$")


def _header(name: str, value: str) -> bytes:
    encoded = value.encode()
    return bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(encoded)) + encoded


def event_message(payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (lengths + CRC), headers, payload, message CRC."""
    headers = (
        _header(":event-type", "PayloadPart")
        + _header(":message-type", "event")
        + _header(":content-type", "application/octet-stream")
    )
    total = 16 + len(headers) + len(payload)
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + headers + payload
    return message + struct.pack(">I", zlib.crc32(message))


class SageMakerRuntime:
    def __init__(self, serving_url: str, endpoint: str, aws_url: str | None = None) -> None:
        self.serving_url, self.endpoint, self.aws_url = serving_url.rstrip("/"), endpoint, aws_url
        runtime = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked replies

            def log_message(self, *_):
                pass

            def do_GET(self):
                self._relay(b"")

            def do_DELETE(self):
                self._relay(b"")

            def do_PUT(self):
                self._relay(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def _relay(self, body: bytes) -> None:
                assert runtime.aws_url, f"no AWS emulator to relay {self.command} {self.path} to"
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                request = urllib.request.Request(runtime.aws_url + self.path, data=body or None, headers=headers,
                                                 method=self.command)  # fmt: skip
                try:
                    upstream = urllib.request.urlopen(request, timeout=60)
                except urllib.error.HTTPError as exc:
                    upstream = exc
                with upstream:
                    self._reply(upstream.status, upstream.read(), upstream.headers.get("Content-Type", ""))

            def do_POST(self):
                match = ROUTE.match(self.path.split("?")[0])
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not match and runtime.aws_url:
                    self._relay(body)
                    return
                if not match or match.group(1) != runtime.endpoint:
                    self._reply(400, b'{"__type":"ValidationError","message":"Endpoint not found"}')
                    return
                request = urllib.request.Request(
                    runtime.serving_url + "/invocations", data=body, headers={"Content-Type": "application/json"}
                )
                try:
                    upstream = urllib.request.urlopen(request, timeout=300)
                except urllib.error.HTTPError as exc:
                    self._reply(424, b'{"__type":"ModelError","Message":' + repr(exc.read()[:200]).encode() + b"}")
                    return
                with upstream:
                    if match.group(2) == "invocations":
                        self._reply(200, upstream.read(), upstream.headers.get("Content-Type", "application/json"))
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "application/vnd.amazon.eventstream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in iter(lambda: upstream.read1(4096), b""):
                        framed = event_message(chunk)
                        self.wfile.write(f"{len(framed):x}\r\n".encode() + framed + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")

            def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> SageMakerRuntime:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
