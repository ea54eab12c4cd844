"""Test session guards and shared fixtures.

- A network guard: any connection beyond loopback fails the test (SDKs that ignore endpoint overrides).
- Hub access is off; the tiny gpt-oss is built once per session into a shared cache.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOOLKIT_CACHE_DIR", str(REPO / ".pytest_cache" / "toolkit-models"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _loopback_only(address) -> None:
    if isinstance(address, tuple) and address:
        host = address[0]
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None if host == "localhost" else ipaddress.ip_address(socket.gethostbyname(host))
        if ip is not None and not ip.is_loopback:
            raise AssertionError(f"test tried to reach {address}: only loopback is allowed")


def _guarded_connect(self, address):
    _loopback_only(address)
    return _real_connect(self, address)


def _guarded_connect_ex(self, address):
    _loopback_only(address)
    return _real_connect_ex(self, address)


socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from entrypoints.tiny_model import tiny_gpt_oss_path

    return tiny_gpt_oss_path()
