"""The serving image built by a real Docker engine and pushed to a real registry on loopback.

dockerd (Debian docker.io, private roots, no bridge/iptables) builds containers/serving FROM a local base
(Docker Hub is unreachable); Debian's docker-registry with htpasswd auth stands in for ECR's data plane; ECR's
control plane (the repository, GetAuthorizationToken) is moto's, and the registry accepts the token it issues.
What this does not cover: ECR itself (its scanning, immutability, cross-region pulls).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import boto3
import pytest

from tests import docker_engine
from toolkit.config import load_config
from toolkit.deploy import DeployError
from toolkit.deploy.image import SERVING_CONTEXT, context_tag, ensure_image, login, tag_exists

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not docker_engine.available() and not os.environ.get("CI"), reason="docker.io not installed"),
]
BASE = "toolkit-test-base:1"
ECR_PASSWORD = "123456789012-auth-token"  # what moto's GetAuthorizationToken issues for user AWS


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    started = docker_engine.DockerEngine(tmp_path_factory.mktemp("docker"), "AWS", ECR_PASSWORD).start()
    started.import_base_image(BASE)
    yield started
    started.stop()


@pytest.fixture
def registry_config(engine, aws_env, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", engine.env["DOCKER_HOST"])
    boto3.client("ecr", region_name="us-east-1").create_repository(repositoryName="toolkit-serving")
    return load_config("tiny-gpt-oss-local", [f"aws.registry_url={engine.registry_url}", f"serving.base_image={BASE}"])


def test_build_push_then_skip_when_the_registry_has_the_tag(engine, registry_config):
    lines: list[str] = []
    image = ensure_image(registry_config, lines.append)
    host = engine.registry_url.removeprefix("http://")
    assert image == f"{host}/toolkit-serving:{context_tag(SERVING_CONTEXT, BASE)}"
    assert any(line.startswith("Step ") for line in lines) and any("Pushed" in line for line in lines)

    # what was pushed is the serving image: pull it back into a clean engine state and read its config
    assert engine.docker("rmi", image).returncode == 0
    pulled = engine.docker("--config", str(engine.root / "pull-auth"), "login", "-u", "AWS", "--password-stdin",
                           engine.registry_url, stdin=ECR_PASSWORD.encode())  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    assert engine.docker("--config", str(engine.root / "pull-auth"), "pull", image).returncode == 0
    inspected = engine.docker("image", "inspect", "--format", "{{json .Config.Entrypoint}} {{.Config.Env}}", image)
    assert b'["python3","/opt/toolkit/serve.py"]' in inspected.stdout and b"SM_VLLM_PORT=8080" in inspected.stdout

    # SageMaker hosting: a single-platform Docker v2 manifest (not an OCI index), linux/amd64
    manifest = registry_manifest(engine, image)
    assert manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    platform = engine.docker("image", "inspect", "--format", "{{.Os}}/{{.Architecture}}", image)
    assert platform.stdout.decode().strip() == "linux/amd64"
    # the build installed exactly the transformers the Dockerfile pins, with uv into the system Python as vLLM's
    # image installs (the stand-in base's uv records its calls)
    calls = engine.docker("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", image, "-c",
                          "while read -r line; do echo \"$line\"; done < /opt/uv-calls")  # fmt: skip
    pins = dockerfile_pins()
    assert f"pip install --system --no-cache transformers=={pins['TRANSFORMERS_VERSION']}" in calls.stdout.decode()

    again: list[str] = []
    assert ensure_image(registry_config, again.append) == image
    assert again == [f"{image} already in the registry: nothing to build"]


def test_the_training_image_holds_the_lock_and_the_elastic_agent(engine, aws_env, monkeypatch):
    """Through the CLI, as a user builds it for HyperPod: the pinned DLC is replaced by the stand-in base here
    (hyperpod.base_image); what the build installs is the lock shipped in the code channel, plus
    hyperpod-elastic-agent (its `hyperpodrun` launches a HyperPodPyTorchJob's ranks)."""
    from typer.testing import CliRunner

    from toolkit.cli import app
    from toolkit.resources import MLFLOW_LOCK, TRAINING_DOCKERFILE, TRAINING_LOCK

    monkeypatch.setenv("DOCKER_HOST", engine.env["DOCKER_HOST"])
    boto3.client("ecr", region_name="us-east-1").create_repository(repositoryName="toolkit-training")
    args = ["image", "build", "training", "-c", "tiny-gpt-oss-local",
            "--set", f"aws.registry_url={engine.registry_url}", "--set", f"hyperpod.base_image={BASE}"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    image = result.output.strip().splitlines()[-1]
    assert image.startswith(f"{engine.registry_url.removeprefix('http://')}/toolkit-training:train-")

    def in_image(command: str) -> str:
        ran = engine.docker("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", image, "-c", command)
        return ran.stdout.decode()

    read = 'while IFS= read -r line; do echo "$line"; done < '
    assert in_image(read + "/opt/toolkit/requirements.txt") == TRAINING_LOCK.read_text()
    assert in_image(read + "/opt/toolkit/requirements-mlflow.txt") == MLFLOW_LOCK.read_text()
    agent = next(line for line in TRAINING_DOCKERFILE.read_text().splitlines() if "ELASTIC_AGENT_VERSION=" in line)
    pinned = agent.split("=", 1)[1]
    lock = "-r /opt/toolkit/requirements.txt -r /opt/toolkit/requirements-mlflow.txt"
    assert in_image(read + "/opt/python3-calls").strip().splitlines() == [  # the base's torch checked first
        f"-m pip install --dry-run --quiet --report /tmp/toolkit-plan.json {lock} hyperpod-elastic-agent=={pinned}",
        "/opt/toolkit/check_base.py /tmp/toolkit-plan.json",
        f"-m pip install --no-cache-dir {lock} hyperpod-elastic-agent=={pinned}",
    ]
    again = CliRunner().invoke(app, [*args, "--json"])  # unchanged content: nothing built
    assert again.exit_code == 0 and json.loads(again.stdout)["image_uri"] == image


def registry_manifest(engine, image: str) -> dict:
    import base64
    import json
    import urllib.request

    from toolkit.deploy.image import MANIFEST_TYPES

    rest = image.partition("/")[2]
    repository, _, tag = rest.partition(":")
    token = base64.b64encode(f"AWS:{ECR_PASSWORD}".encode()).decode()
    request = urllib.request.Request(
        f"{engine.registry_url}/v2/{repository}/manifests/{tag}",
        headers={"Authorization": f"Basic {token}", "Accept": MANIFEST_TYPES},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def dockerfile_pins() -> dict[str, str]:
    lines = (SERVING_CONTEXT / "Dockerfile").read_text().splitlines()
    return dict(line[len("ARG ") :].split("=", 1) for line in lines if line.startswith("ARG ") and "=" in line)


def test_where_buildx_builds_the_image_is_loaded_into_the_engine_docker_pushes_from(monkeypatch):
    """buildx with a non-default (docker-container) builder keeps a `type=image` result in the builder's cache, where
    `docker push` never finds it; `type=docker` loads it into the engine from any builder, with Docker v2 media
    types. This machine's docker has no buildx: its answer to `docker buildx version` is stood in for here."""
    import subprocess as real

    from toolkit.deploy import image

    def buildx_present(argv, **kwargs):
        assert argv == ["docker", "buildx", "version"]
        return real.CompletedProcess(argv, 0, b"github.com/docker/buildx v0.17.1", b"")

    monkeypatch.setattr(image.subprocess, "run", buildx_present)
    flags = image.build_flags(None)
    assert flags[flags.index("--output") + 1] == "type=docker,oci-mediatypes=false"
    assert "--provenance=false" in flags and "--sbom=false" in flags


def test_the_tag_follows_the_content_and_the_base(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    first = context_tag(tmp_path, "base:1")
    assert context_tag(tmp_path, "base:2") != first
    (tmp_path / "serve.py").write_text("print('changed')\n")
    assert context_tag(tmp_path, "base:1") != first


def test_a_missing_repository_is_a_clear_error_and_nothing_is_built(engine, aws_env, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", engine.env["DOCKER_HOST"])
    cfg = load_config("tiny-gpt-oss-local", [f"aws.registry_url={engine.registry_url}", "serving.repository=nope"])
    images_before = sorted(engine.docker("images", "-q").stdout.split())  # its order ties on creation time
    with pytest.raises(DeployError, match="ECR repository nope does not exist: run `toolkit infra deploy`"):
        ensure_image(cfg)
    assert sorted(engine.docker("images", "-q").stdout.split()) == images_before


def test_a_failed_build_names_the_step(engine, registry_config):
    broken = registry_config.model_copy(deep=True)
    broken.serving.base_image = "no-such-base:1"  # not in the engine, and Docker Hub is unreachable
    with pytest.raises(DeployError, match="docker build failed"):
        ensure_image(broken)


def test_deploy_builds_pushes_and_serves_that_image(engine, registry_config, aws_env):
    from toolkit import sdk

    cfg = load_config(
        "tiny-gpt-oss-local",
        [f"aws.registry_url={engine.registry_url}", f"serving.base_image={BASE}", f"aws.role={aws_env['role']}",
         "serving.instance_type=ml.g4dn.xlarge"],
    )  # fmt: skip
    state = sdk.deploy(cfg, model_data="s3://toolkit-test-bucket/m/model.tar.gz", poll_seconds=0)
    model = boto3.client("sagemaker", region_name="us-east-1").describe_model(ModelName=state.config_name)
    image = model["PrimaryContainer"]["Image"]
    tag = context_tag(SERVING_CONTEXT, BASE)
    assert image == f"{engine.registry_url.removeprefix('http://')}/toolkit-serving:{tag}"
    assert tag_exists(login(cfg), "toolkit-serving", tag)  # the endpoint's image is in the registry


def wheel(directory: Path, name: str, version: str, requires: list[str]) -> None:
    """A minimal wheel pip can resolve and install (METADATA, WHEEL, RECORD), for an offline index."""
    import zipfile

    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(directory / f"{dist}-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)


@pytest.mark.parametrize("agent_torch, refused", [("torch<2.12.0,>=2.4.0", True), ("torch>=2.4.0", False)])
def test_the_build_stops_when_the_base_torch_is_outside_the_agents_range(tmp_path, agent_torch, refused):
    """The Dockerfile's first step, for real: pip's dry-run report of the install, then check_base.py, in an
    environment whose torch plays the base's (this venv's 2.13.0). The index is offline: a stand-in agent with the
    real agent's torch requirement (hyperpod-elastic-agent 1.1.3: torch<2.12.0,>=2.4.0) and a torch 2.11.0."""
    import subprocess
    import sys
    from importlib.metadata import version

    from toolkit.resources import TRAINING_BASE_CHECK

    index = tmp_path / "index"
    index.mkdir()
    wheel(index, "hyperpod-elastic-agent", "1.1.3", [agent_torch])
    wheel(index, "torch", "2.11.0", [])
    plan = tmp_path / "plan.json"
    dry_run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(plan), "--no-index",
         "--find-links", str(index), "hyperpod-elastic-agent==1.1.3"], capture_output=True, text=True,
    )  # fmt: skip
    assert dry_run.returncode == 0, dry_run.stderr
    checked = subprocess.run([sys.executable, str(TRAINING_BASE_CHECK), str(plan)], capture_output=True, text=True)
    if not refused:
        assert checked.returncode == 0 and checked.stderr == ""
        return
    assert checked.returncode == 1
    (line,) = checked.stderr.splitlines()
    assert line == (
        f"the base image's torch {version('torch')} is outside what hyperpod-elastic-agent 1.1.3 "
        f"(torch<2.12.0,>=2.4.0) accepts (pip would install torch 2.11.0): choose a base image "
        "(hyperpod.base_image) whose torch is in that range"
    )


@pytest.mark.parametrize("kind", ["serving", "training"])
def test_image_build_dry_run_needs_no_aws(kind, monkeypatch):
    """No credentials and an endpoint nobody listens on: the dry run still names the image (the account from
    aws.role, ECR's host for the region, the content tag), because it makes no AWS call at all."""
    from typer.testing import CliRunner

    from toolkit.cli import app

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    role = "arn:aws:iam::123456789012:role/toolkit-execution"
    result = CliRunner().invoke(app, ["image", "build", kind, "-c", "gpt-oss-20b-lora", "--dry-run",
                                      "--set", f"aws.role={role}", "--set", "aws.region=eu-west-1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    repository = "toolkit-serving" if kind == "serving" else "toolkit-training"
    host = r"123456789012\.dkr\.ecr\.eu-west-1\.amazonaws\.com"
    assert re.fullmatch(rf"{host}/{repository}:(serve|train)-[0-9a-f]{{12}}\n", result.stdout), result.stdout


def push_oci_manifest(engine, repository: str, tag: str) -> None:
    """What Docker's containerd image store pushes (an OCI image manifest), put into the real registry over its
    HTTP API: a config and a layer blob, then the manifest."""
    import base64
    import hashlib
    import urllib.request

    auth = {"Authorization": "Basic " + base64.b64encode(f"AWS:{ECR_PASSWORD}".encode()).decode()}

    def blob(data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        start = urllib.request.Request(f"{engine.registry_url}/v2/{repository}/blobs/uploads/", method="POST",
                                       headers=auth, data=b"")  # fmt: skip
        with urllib.request.urlopen(start, timeout=30) as response:
            location = response.headers["Location"]
        location = location if location.startswith("http") else engine.registry_url + location
        url = f"{location}{'&' if '?' in location else '?'}digest={digest}"
        put = urllib.request.Request(url, data=data, method="PUT",
                                     headers={**auth, "Content-Type": "application/octet-stream"})  # fmt: skip
        urllib.request.urlopen(put, timeout=30).close()
        return {"digest": digest, "size": len(data)}

    image_config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    config = {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(json.dumps(image_config).encode())}
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(b"\x1f\x8b" + b"\0" * 18)}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": config, "layers": [layer]}).encode()  # fmt: skip
    oci = "application/vnd.oci.image.manifest.v1+json"
    put = urllib.request.Request(f"{engine.registry_url}/v2/{repository}/manifests/{tag}", data=manifest,
                                 method="PUT", headers={**auth, "Content-Type": oci})  # fmt: skip
    urllib.request.urlopen(put, timeout=30).close()


def test_an_oci_manifest_in_the_registry_fails_in_one_line_before_any_create_model(engine, registry_config, aws_env):
    """The containerd image store's push (an OCI manifest), which CreateModel refuses: deploy stops with one line
    naming the media type and the fix, and no model is created. (This dockerd, 20.10, has no containerd image store,
    so the manifest is pushed over the registry API instead of by `docker push`.)"""
    from toolkit import sdk

    cfg = load_config("tiny-gpt-oss-local", [
        f"aws.registry_url={engine.registry_url}", "serving.base_image=oci:1", f"aws.role={aws_env['role']}",
        "serving.instance_type=ml.g4dn.xlarge"])  # fmt: skip
    push_oci_manifest(engine, "toolkit-serving", context_tag(SERVING_CONTEXT, "oci:1"))
    with pytest.raises(DeployError, match=r"manifest type application/vnd\.oci\.image\.manifest\.v1\+json, which "
                                          r"SageMaker's CreateModel refuses .*containerd-snapshotter"):  # fmt: skip
        sdk.deploy(cfg, model_data="s3://toolkit-test-bucket/m/model.tar.gz", poll_seconds=0)
    assert boto3.client("sagemaker", region_name="us-east-1").list_models()["Models"] == []
