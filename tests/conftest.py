"""Test session guards and shared fixtures.

- A network guard: any connection beyond loopback fails the test (SDKs that ignore endpoint overrides).
- Hub access is off; the tiny gpt-oss (and the tiny Qwen3) is built once per machine into the cache outside the
  checkout (TOOLKIT_CACHE_DIR, default ~/.cache/toolkit), shared with the demo.
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


def pytest_collection_modifyitems(config, items):
    """The modules that start engines first. Under pytest-xdist (scripts/test.sh: two workers, --dist loadfile, each
    module's tests on one worker, so its module fixtures are made once) the longest modules then do not start last:
    xdist hands modules out in this order."""
    engines = {item.path for item in items if item.get_closest_marker("integration")}
    items.sort(key=lambda item: item.path not in engines)  # stable: each module's own order is kept


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from toolkit_train.builtin.tiny_model import tiny_gpt_oss_path

    return tiny_gpt_oss_path()


@pytest.fixture(scope="session")
def tiny_qwen3_path() -> Path:
    """The tiny dense Qwen3 with Qwen3's chat template (toolkit_train/builtin/tiny_qwen3.py): random weights, seconds to
    build, cached beside the tiny gpt-oss."""
    from toolkit_train.builtin.tiny_qwen3 import tiny_qwen3_path

    return tiny_qwen3_path()


@pytest.fixture(scope="session")
def tiny_qwen3_moe_path() -> Path:
    """The tiny Qwen3-MoE (the same tokenizer, template and pre-training; a sparse MLP of 4 experts, top-2)."""
    from toolkit_train.builtin.tiny_qwen3 import tiny_qwen3_path

    return tiny_qwen3_path(moe=True)


@pytest.fixture(scope="session", params=["builtin:tiny-llama", "builtin:tiny-gemma"], ids=["llama", "gemma"])
def tiny_generic_path(request) -> Path:
    """Each tiny causal LM of no family record (builtin/tiny_generic.py): Llama with Llama 3's chat template,
    Gemma with Gemma 3's; built once per machine and cached beside the tiny Qwen3."""
    from toolkit_train.builtin.tiny_generic import tiny_generic_path

    return tiny_generic_path(request.param)


@pytest.fixture(autouse=True)
def _no_leaked_root_log_handlers():
    """A library run inside a CliRunner call may give the root logger a stream handler bound to that call's captured
    stderr (lm-evaluation-harness's task index calls logging.basicConfig); once the capture closes, any later record
    that reaches it prints "--- Logging error ---" and a traceback into another test's output. Each test leaves the
    root logger's handlers as it found them."""
    import logging

    root = logging.getLogger()
    before = list(root.handlers)
    yield
    for handler in [h for h in root.handlers if h not in before]:
        root.removeHandler(handler)


@pytest.fixture(scope="session")
def qwen3_job_run(tmp_path_factory):
    """(config, model directory): the tiny Qwen3 preset's trained and merged run, once per session (tests/runs.py)."""
    from tests.runs import qwen3_job_run

    return qwen3_job_run(tmp_path_factory.mktemp("qwen3-job"))


@pytest.fixture(scope="session")
def qwen3_moe_job_run(tmp_path_factory):
    """(config, model directory): the tiny Qwen3-MoE preset's trained and merged run, once per session."""
    from tests.runs import QWEN3_MOE_JOB, qwen3_job_run

    return qwen3_job_run(tmp_path_factory.mktemp("qwen3-moe-job"), QWEN3_MOE_JOB)


@pytest.fixture(scope="session")
def moto_server():
    """A real HTTP AWS emulator (moto server) on loopback, for the whole session; its InvokeEndpoint answers the
    deploy's prompt-parity probe as a container rendering like training (tests/aws_emulator.py says why)."""
    import logging

    from moto.server import ThreadedMotoServer

    from tests.aws_emulator import render_like_training

    render_like_training()
    # werkzeug gives its logger a stderr handler at its first request, bound to whatever sys.stderr is then: often a
    # CliRunner's capture, closed by the time a later test's request is logged ("--- Logging error ---" and a
    # traceback in that test's CLI output). A handler of our own keeps it from adding one; records reach pytest's.
    logging.getLogger("werkzeug").addHandler(logging.NullHandler())
    logging.getLogger("werkzeug").propagate = False  # nor through a root handler a library bound to a capture

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(moto_server, monkeypatch, tmp_path):
    """A clean emulated account: a bucket and an execution role; every client points at the emulator."""
    import boto3
    import requests

    requests.post(f"{moto_server}/moto-api/reset", timeout=10)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="toolkit-test-bucket")
    role = boto3.client("iam", region_name="us-east-1").create_role(
        RoleName="toolkit-execution", AssumeRolePolicyDocument="{}"
    )["Role"]["Arn"]
    return {"endpoint": moto_server, "role": role, "bucket": "toolkit-test-bucket"}


@pytest.fixture(scope="session")
def main_job_run(tmp_path_factory):
    """(config, model directory): the main job's trained and merged run, once per session (tests/runs.py)."""
    from tests.runs import main_job_run

    return main_job_run(tmp_path_factory.mktemp("main-job"))
