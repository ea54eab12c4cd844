"""training.report_to: [mlflow] logs a real training run to a real MLflow tracking server (on loopback)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.entrypoints.helpers import lay_out, losses, run_entrypoint

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
