"""A real Docker engine (Debian docker.io) and a real registry (Debian docker-registry) on this machine.

dockerd runs with private data/exec roots and socket, no bridge and no iptables; the registry listens on
127.0.0.1 with htpasswd (bcrypt) auth for the given user, standing in for ECR's data plane. Both are stopped
by PID. Docker Hub is unreachable here: test images are built from a local base (`base_image`).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

PACKAGES = ["docker.io", "docker-registry"]


def available() -> bool:
    return all(shutil.which(tool) for tool in ("dockerd", "docker", "docker-registry"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not come up in {timeout} s")


class DockerEngine:
    def __init__(self, root: Path, username: str, password: str) -> None:
        self.root = root
        self.socket = root / "docker.sock"
        self.env = dict(os.environ, DOCKER_HOST=f"unix://{self.socket}")
        self.registry_url = f"http://127.0.0.1:{_free_port()}"
        self.username, self.password = username, password
        self.processes: list[subprocess.Popen] = []

    def start(self) -> DockerEngine:
        self.processes.append(
            subprocess.Popen(
                ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false",
                 f"--data-root={self.root / 'data'}", f"--exec-root={self.root / 'exec'}",
                 f"--pidfile={self.root / 'dockerd.pid'}", "-H", f"unix://{self.socket}"],
                stdout=open(self.root / "dockerd.log", "w"),  # noqa: SIM115 (the daemon owns it)
                stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        self._start_registry()
        _wait(lambda: self.docker("info").returncode == 0, "dockerd")
        _wait(lambda: self._registry_status() == 401, "docker-registry")
        return self

    def _start_registry(self) -> None:
        import bcrypt

        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=5)).decode()
        (self.root / "htpasswd").write_text(f"{self.username}:{hashed}\n")
        (self.root / "registry.yml").write_text(
            "version: 0.1\n"
            f"storage: {{filesystem: {{rootdirectory: {self.root / 'registry'}}}}}\n"
            f"http: {{addr: '{self.registry_url.removeprefix('http://')}'}}\n"
            f"auth: {{htpasswd: {{realm: test, path: {self.root / 'htpasswd'}}}}}\n"
        )
        self.processes.append(
            subprocess.Popen(
                ["docker-registry", "serve", str(self.root / "registry.yml")],
                stdout=open(self.root / "registry.log", "w"),  # noqa: SIM115 (the daemon owns it)
                stderr=subprocess.STDOUT,
            )
        )  # fmt: skip

    def _registry_status(self) -> int:
        try:
            with urllib.request.urlopen(self.registry_url + "/v2/", timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def docker(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], env=self.env, input=stdin, capture_output=True, timeout=300)

    def import_base_image(self, tag: str) -> None:
        """A minimal local base image (Docker Hub is unreachable), made with `docker import`: a shell (this host's
        dash and the two libraries it needs) so the Dockerfile's RUN steps run, and a stand-in `python3` that
        records how it was called in /opt/python3-calls, and a stand-in `uv` recording its calls in /opt/uv-calls
        (what the build asked uv to install: vLLM's image installs with `uv pip install --system`)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for host_path, image_path in (
                ("/bin/dash", "bin/sh"),
                ("/lib/x86_64-linux-gnu/libc.so.6", "lib/x86_64-linux-gnu/libc.so.6"),
                ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
            ):
                archive.add(os.path.realpath(host_path), image_path)
            for path, data, mode in (
                ("etc/toolkit-test-base", b"toolkit test base\n", 0o644),
                ("usr/bin/python3", b'#!/bin/sh\necho "$@" >> /opt/python3-calls\n', 0o755),
                ("opt/python3-calls", b"", 0o666),
                ("usr/local/bin/uv", b'#!/bin/sh\necho "$@" >> /opt/uv-calls\n', 0o755),  # vLLM's image has uv
                ("opt/uv-calls", b"", 0o666),
            ):
                info = tarfile.TarInfo(path)
                info.size, info.mode = len(data), mode
                archive.addfile(info, io.BytesIO(data))
        result = self.docker("import", "-", tag, stdin=buffer.getvalue())
        assert result.returncode == 0, result.stderr.decode()

    def stop(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(self.root, ignore_errors=True)
