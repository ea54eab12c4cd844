"""The toolkit's images, built with docker, tagged by a hash of their content, pushed to ECR:

- serving: containers/serving (vLLM behind SageMaker's hosting contract);
- training: containers/training (the AWS PyTorch training container + the locked training stack + HyperPod's
  elastic agent), its context assembled from that Dockerfile and the lock files in entrypoints/toolkit_train/.

The tag is a hash of the build context and base image, so an unchanged image is never rebuilt: when the registry
already has the tag, nothing is built or pushed. Registry credentials come from ECR's GetAuthorizationToken and
live only in a temporary docker config directory for the build (an ECR base image) and the push, named after the
process: removed when it ends, and by the next build where it was killed before it could (login_directory).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from toolkit import aws, digest
from toolkit.config import Config
from toolkit.config.models import CONTENT_TAG_DIGITS, IMAGE_TAG_PREFIXES
from toolkit.deploy import DeployError, DeployInputError
from toolkit.resources import MLFLOW_LOCK, SERVING_CONTEXT, TRAINING_BASE_CHECK, TRAINING_DOCKERFILE, TRAINING_LOCK

ImageKind = Literal["serving", "training"]
ECR_HOST = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")

MANIFEST_TYPES = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
])  # fmt: skip


@dataclass
class Registry:
    url: str  # scheme://host[:port]
    username: str
    password: str

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[-1].rstrip("/")


@dataclass(frozen=True)
class ImageSpec:
    kind: ImageKind
    repository: str
    base_image: str | None  # None: the Dockerfile's pinned base

    @property
    def tag_prefix(self) -> str:
        return IMAGE_TAG_PREFIXES[self.kind]


def image_spec(config: Config, kind: ImageKind) -> ImageSpec:
    if kind == "serving":
        return ImageSpec(kind, config.serving.repository, config.serving.base_image)
    base = config.hyperpod.base_image
    if base is None:  # the region's own copy of the DLC the training jobs run (ECR logins are per region)
        from toolkit.sagemaker_sdk import default_image

        base = default_image(config.aws.region, config.hyperpod.instance_type)
    return ImageSpec(kind, config.hyperpod.image_repository, base)


@contextlib.contextmanager
def build_context(kind: ImageKind) -> Iterator[Path]:
    """The directory docker builds from. The training image's is assembled: its Dockerfile and the lock files
    (one copy of each, in entrypoints/toolkit_train/, shipped in the code channel too)."""
    if kind == "serving":
        yield SERVING_CONTEXT
        return
    with tempfile.TemporaryDirectory(prefix="toolkit-training-image-") as assembled:
        for source in (TRAINING_DOCKERFILE, TRAINING_LOCK, MLFLOW_LOCK, TRAINING_BASE_CHECK):
            shutil.copy(source, Path(assembled) / source.name)
        yield Path(assembled)


def context_tag(context: Path, base_image: str | None, prefix: str = "serve") -> str:
    return f"{prefix}-" + digest.of_files(context, CONTENT_TAG_DIGITS, salt=base_image or "")


def login(config: Config) -> Registry:
    data = aws.client(config.aws, "ecr").get_authorization_token()["authorizationData"][0]
    username, password = base64.b64decode(data["authorizationToken"]).decode().split(":", 1)
    return Registry(config.aws.registry_url or data["proxyEndpoint"], username, password)


def planned_repository_uri(config: Config, spec: ImageSpec) -> str:
    """The repository's URI as a dry run names it, from the config alone: the registry host from
    aws.registry_url, else ECR's host for the account in aws.role's ARN (`<account>` when the config has none)."""
    if config.aws.registry_url:
        return f"{config.aws.registry_url.split('://', 1)[-1].rstrip('/')}/{spec.repository}"
    role = config.aws.role or ""
    account = role.split(":")[4] if role.count(":") >= 5 and role.split(":")[4].isdigit() else "<account>"
    suffix = "amazonaws.com.cn" if aws.partition(config.aws.region) == "aws-cn" else "amazonaws.com"
    return f"{account}.dkr.ecr.{config.aws.region}.{suffix}/{spec.repository}"


def repository_uri(config: Config, registry: Registry, spec: ImageSpec) -> str:
    from botocore.exceptions import ClientError

    name = spec.repository
    field = "serving.repository" if spec.kind == "serving" else "hyperpod.image_repository"
    try:
        aws.client(config.aws, "ecr").describe_repositories(repositoryNames=[name])
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "RepositoryNotFoundException":
            raise DeployInputError(
                f"ECR repository {name} does not exist: run `toolkit infra deploy` (it creates toolkit-serving "
                f"and toolkit-training) or set {field} to yours"
            ) from None
        raise
    return f"{registry.host}/{name}"


# What SageMaker's CreateModel accepts: a Docker image manifest (schema 2) or a Docker manifest list. It refuses
# OCI manifests and indexes ("Unsupported manifest media type application/vnd.oci.image.manifest.v1+json"),
# which Docker's containerd image store (the default on fresh Docker Engine 29 / Docker Desktop) pushes.
SAGEMAKER_MANIFESTS = {
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}


def manifest_media_type(registry: Registry, repository: str, tag: str) -> str | None:
    """The tag's manifest media type as the registry serves it (Docker Registry v2 API, which ECR serves too:
    GET /v2/<repository>/manifests/<tag> with the Accept list); None when the tag is not there."""
    token = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    request = urllib.request.Request(
        f"{registry.url.rstrip('/')}/v2/{repository}/manifests/{tag}",
        headers={"Authorization": f"Basic {token}", "Accept": MANIFEST_TYPES},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
            declared = (response.headers.get("Content-Type") or "").split(";")[0].strip()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise DeployError(f"registry {registry.host} answered {exc.code} for {repository}:{tag}") from None
    except urllib.error.URLError as exc:
        raise DeployInputError(f"cannot reach registry {registry.url}: {exc.reason}") from None
    with contextlib.suppress(ValueError, AttributeError):
        declared = json.loads(body).get("mediaType") or declared
    return declared


def tag_exists(registry: Registry, repository: str, tag: str) -> bool:
    """Ask the registry itself whether the tag is there."""
    return manifest_media_type(registry, repository, tag) is not None


def check_manifest(media_type: str | None, image: str) -> None:
    """Fail in one line, before any CreateModel, when SageMaker would refuse the pushed manifest."""
    if media_type not in SAGEMAKER_MANIFESTS:
        raise DeployError(
            f"{image} was pushed with manifest type {media_type}, which SageMaker's CreateModel refuses (it takes "
            'Docker v2 manifests): turn off Docker\'s containerd image store (daemon.json: "features": '
            '{"containerd-snapshotter": false}) or build with buildx (the toolkit passes oci-mediatypes=false), '
            "then delete the tag and re-run"
        )


def _docker(args: list[str], on_line: Callable[[str], None], stdin: str | None = None) -> None:
    if shutil.which("docker") is None:
        raise DeployInputError(
            "docker is not installed: install Docker to build the serving image, or pass --image-uri"
        )
    process = subprocess.Popen(
        ["docker", *args], stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    if stdin is not None and process.stdin:
        process.stdin.write(stdin)
        process.stdin.close()
    tail: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        tail = [*tail[-19:], line.rstrip()]
        on_line(line.rstrip())
    if process.wait() != 0:
        step = args[2] if args[0] == "--config" else args[0]  # build, login, push
        raise DeployError(f"docker {step} failed (exit {process.returncode}):\n" + "\n".join(tail))


def build_flags(base_image: str | None) -> list[str]:
    """SageMaker hosting runs linux/amd64 images with a single-platform Docker v2 manifest: BuildKit's provenance
    and SBOM attestations would turn the push into an OCI index, which CreateModel can refuse. The legacy builder
    writes neither (and knows no such flags), so they are passed only where buildx is the builder."""
    flags = ["--network", "host", "--platform", "linux/amd64"]
    if base_image:
        flags += ["--build-arg", f"BASE_IMAGE={base_image}"]
    buildx = subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0
    # buildx with the containerd image store writes OCI media types unless told otherwise; and the image must land
    # in the engine's store that `docker push` reads: `type=docker` (what --load means) loads it there from any
    # builder, where `type=image` left it inside a non-default (docker-container) builder's own cache
    docker_types = ["--provenance=false", "--sbom=false", "--output", "type=docker,oci-mediatypes=false"]
    return [*flags, *docker_types] if buildx else flags


LOGIN_PREFIX = "toolkit-docker-"  # $TMPDIR/toolkit-docker-<pid>-*: one build's docker config (its registry login)


@contextlib.contextmanager
def login_directory() -> Iterator[str]:
    """A private docker config directory for one build and push, named after this process: removed when the block
    ends (an error or Ctrl-C too); what a killed process left (SIGKILL, a closed terminal) is removed by the next
    build (remove_leftover_logins)."""
    with tempfile.TemporaryDirectory(prefix=f"{LOGIN_PREFIX}{os.getpid()}-") as directory:
        yield directory


def remove_leftover_logins() -> list[Path]:
    """The docker config directories (registry logins: base64 user:token) of toolkit builds whose process is gone,
    removed; a live build's is left alone. Those removed are returned."""
    from toolkit_train.run.prepared import process_alive

    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{LOGIN_PREFIX}*"):
        pid = path.name[len(LOGIN_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
            continue  # an older toolkit's (no process named), or not this user's
        if not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def ensure_image(
    config: Config,
    on_progress: Callable[[str], None] | None = None,
    dry_run: bool = False,
    kind: ImageKind = "serving",
) -> str:
    """The image's URI in ECR, built and pushed unless the registry already has this content's tag."""
    report = on_progress or (lambda _: None)
    remove_leftover_logins()
    spec = image_spec(config, kind)
    with build_context(kind) as context:
        if not (context / "Dockerfile").is_file():
            raise DeployInputError(f"{context} not found: build from a toolkit checkout, or pass --image-uri")
        tag = context_tag(context, spec.base_image, spec.tag_prefix)
        if dry_run:  # offline: no credentials, no AWS call
            return f"{planned_repository_uri(config, spec)}:{tag}"
        registry = login(config)
        image = f"{repository_uri(config, registry, spec)}:{tag}"
        media_type = manifest_media_type(registry, spec.repository, tag)
        if media_type is not None:
            if kind == "serving":
                check_manifest(media_type, image)
            report(f"{image} already in the registry: nothing to build")
            return image
        with login_directory() as docker_config:  # credentials never persist past this process
            base_host = (spec.base_image or "").split("/", 1)[0]
            for host in dict.fromkeys([registry.url, *([base_host] if ECR_HOST.match(base_host) else [])]):
                # ECR's token is valid for every registry these credentials may pull from (the DLC's account too)
                _docker(["--config", docker_config, "login", "--username", registry.username, "--password-stdin",
                         host], report, stdin=registry.password)  # fmt: skip
            report(f"building {image}")
            _docker(["--config", docker_config, "build", *build_flags(spec.base_image), "-t", image, str(context)],
                    report)  # fmt: skip
            report(f"pushing {image}")
            _docker(["--config", docker_config, "push", image], report)
        if kind == "serving":
            check_manifest(manifest_media_type(registry, spec.repository, tag), image)
    return image
