"""An in-process Kubernetes API emulator (kmock) on loopback, with the glue a cluster's CRDs would provide.

kmock stores any object posted to any resource path and answers 409 for duplicates. The glue adds what an
API server with the operators' CRDs does: a custom resource that is not installed answers 404, and a posted
object that fails its schema check answers 422 with the problems (kmock stores it anyway). Tests write a
kubeconfig for it and use the toolkit's real Kubernetes client code. What it does not cover: the operators
(nothing runs pods), admission webhooks, quotas, Kueue.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock

Validator = Callable[[dict], list[str]]


class KubeApi:
    def __init__(self, installed: dict[str, Validator | None], missing: list[str]) -> None:
        """installed: 'group/version/plural' -> schema check (or None); missing: CRDs that answer 404."""
        self.installed, self.missing = installed, missing
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.url = ""
        self.emulator: Any = None

    async def _serve(self) -> None:
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            for resource, check in self.installed.items():
                if check is not None:
                    emulator["post", kmock.resource(resource), self._rejects(check)] << kmock.Response(
                        status=422, payload=self._invalid(check)
                    )
            for resource in self.missing:
                emulator[kmock.resource(resource)] << kmock.Response(
                    status=404,
                    payload=self._status(404, "NotFound", "the server could not find the requested resource"),
                )
            self.emulator, self.url = emulator, str(server.url).rstrip("/")
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    @staticmethod
    def _rejects(check: Validator) -> Callable[[Any], bool]:
        return lambda request: bool(check(request.data or {}))

    def _invalid(self, check: Validator) -> Callable[[Any], dict]:
        return lambda request: self._status(422, "Invalid", "; ".join(check(request.data or {})))

    @staticmethod
    def _status(code: int, reason: str, message: str) -> dict:
        return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason,
                "message": message}  # fmt: skip

    def __enter__(self) -> KubeApi:
        threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True).start()
        if not self._ready.wait(15):
            raise RuntimeError("the Kubernetes API emulator did not start")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)

    def write_kubeconfig(self, path: Path, context: str = "emulator") -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "unused"}}],
            "contexts": [{"name": context, "context": {"cluster": "emulator", "user": "tester"}}],
        }))  # fmt: skip
        return path

    def objects(self, resource: str) -> dict[str, dict]:
        """Stored objects of one resource ('group/version/plural' or 'v1/plural'), by name."""
        wanted = kmock.resource(resource)
        return {key[2]: dict(obj.last.raw) for key, obj in self.emulator.objects.items()
                if key[0] == wanted and not obj.deleted}  # fmt: skip
