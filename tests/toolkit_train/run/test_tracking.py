"""training.report_to: [mlflow] logs a real training run to a real MLflow tracking server (on loopback)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.toolkit_train.helpers import lay_out, losses, run_entrypoint

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    store = tmp_path / "mlflow"
    store.mkdir()
    server = subprocess.Popen(
        [Path(sys.executable).parent / "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{store}/runs.db",
         "--default-artifact-root", (store / "artifacts").as_uri()],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{url}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_run_logs_its_parameters_and_every_step_to_mlflow(tmp_path, mlflow_server, tiny_model_path):
    from mlflow.tracking import MlflowClient

    tracking = ["training.report_to=[mlflow]", f"training.mlflow.tracking_uri={mlflow_server}",
                "training.mlflow.experiment=recipe-compare"]  # fmt: skip
    root = lay_out(tmp_path / "job", [*tracking, "training.max_steps=4", "training.save_steps=2"])
    result = run_entrypoint(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    printed = losses(result.stdout)

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("recipe-compare")
    assert experiment is not None, "no experiment on the server"
    (run,) = client.search_runs([experiment.experiment_id])
    logged = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)]
    assert logged == pytest.approx(printed, abs=1e-4) and len(logged) == 4  # the same losses the job printed
    assert run.data.params["max_steps"] == "4" and run.data.params["model_type"] == "gpt_oss"
    # kept with the checkpoints: a resumed job continues this run instead of starting another
    assert (root / "checkpoints" / "mlflow-run-id").read_text() == run.info.run_id


@pytest.fixture
def recording_proxy(mlflow_server):
    """Forwards to the tracking server and records each MLflow REST call a run makes (what sagemaker-mlflow
    signs for a SageMaker managed server, one IAM action per call)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    calls: list[tuple[str, str]] = []

    class Forward(BaseHTTPRequestHandler):
        def _forward(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            calls.append((self.command, self.path.split("?")[0]))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            reply = requests.request(self.command, mlflow_server + self.path, data=body, headers=headers, timeout=60)
            self.send_response(reply.status_code)
            self.send_header("Content-Type", reply.headers.get("Content-Type", "application/json"))
            self.send_header("Content-Length", str(len(reply.content)))
            self.end_headers()
            self.wfile.write(reply.content)

        do_GET = do_POST = do_PATCH = do_DELETE = _forward

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", calls
    finally:
        server.shutdown()


def iam_actions(calls: list[tuple[str, str]]) -> set[str]:
    """The sagemaker-mlflow IAM action of each REST call: its RPC's name in MLflow's own service definition."""
    from mlflow.protos import databricks_pb2, service_pb2

    rpcs = {}
    for method in service_pb2.MlflowService.DESCRIPTOR.methods:
        for endpoint in method.GetOptions().Extensions[databricks_pb2.rpc].endpoints:
            rpcs[(endpoint.method, endpoint.path)] = method.name[0].upper() + method.name[1:]
    found = set()
    for verb, path in calls:
        rest = path.split("/api/2.0", 1)[-1].split("/ajax-api/2.0", 1)[-1]
        assert (verb, rest) in rpcs, f"{verb} {path} is no MLflow tracking RPC"
        found.add(f"sagemaker-mlflow:{rpcs[(verb, rest)]}")
    return found


def test_the_stack_grants_exactly_the_mlflow_calls_a_run_and_its_resume_make(tmp_path, recording_proxy):
    from tests.infra.test_stack import mlflow_actions

    url, calls = recording_proxy
    tracking = ["training.report_to=[mlflow]", f"training.mlflow.tracking_uri={url}", "training.save_steps=2"]
    for steps in (2, 4):  # the second run resumes the first's checkpoint and MLflow run
        root = lay_out(tmp_path / "job", [*tracking, f"training.max_steps={steps}"])
        result = run_entrypoint(root)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "resuming from" in result.stdout
    assert iam_actions(calls) == set(mlflow_actions())  # infra/toolkit.yaml's MlflowPolicy
