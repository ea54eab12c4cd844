"""The one place that makes boto3 sessions and clients: region, endpoint override, retries, credentials.

`aws.endpoint_url` (or the standard AWS_ENDPOINT_URL) points every client at one endpoint, e.g. a local
emulator; nothing here calls a hard-coded AWS host.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.errors import MISSING, BadInput

if TYPE_CHECKING:
    from toolkit.config.models import AwsSettings

log = logging.getLogger(__name__)


class AwsError(BadInput):
    """An AWS precondition or call failed; the message says what to do."""


def partition(region: str) -> str:
    """The ARN partition of a region: botocore's partition data, else by the region's prefix."""
    from toolkit.config.names import known_regions

    known = (known_regions() or {}).get(region)
    if known:
        return known
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def endpoint_url(settings: AwsSettings) -> str | None:
    return settings.endpoint_url or os.environ.get("AWS_ENDPOINT_URL")


def _every_client_at(made: Any, url: str | None) -> Any:
    """aws.endpoint_url for every client this session makes, including those the SageMaker SDK makes from it
    internally (its S3 uploads, its STS and IAM lookups): a config-file override must behave like AWS_ENDPOINT_URL,
    never send part of a job to the real regional endpoint."""
    if not url:
        return made
    plain_client, plain_resource = made.client, made.resource

    def client(*args: Any, **kwargs: Any) -> Any:
        kwargs["endpoint_url"] = kwargs.get("endpoint_url") or url
        return plain_client(*args, **kwargs)

    def resource(*args: Any, **kwargs: Any) -> Any:
        kwargs["endpoint_url"] = kwargs.get("endpoint_url") or url
        return plain_resource(*args, **kwargs)

    made.client, made.resource = client, resource
    return made


def session(settings: AwsSettings):
    import boto3

    made = boto3.Session(region_name=settings.region)
    if made.get_credentials() is None:
        raise AwsError(
            "no AWS credentials found: run `aws configure` or `aws sso login`, "
            "or export AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        )
    return _every_client_at(made, settings.endpoint_url)


class OfflineCall(AwsError):
    """A dry run tried to call AWS."""


def offline_session(settings: AwsSettings):
    """A session for dry runs: placeholder credentials (none are needed or read) and a hook that refuses every
    request before it is signed or sent, so a rendering can never reach AWS, nor fail for lack of access."""
    import boto3

    made = boto3.Session(region_name=settings.region, aws_access_key_id="dry-run", aws_secret_access_key="dry-run")

    def refuse(model: Any, **_: Any) -> None:
        raise OfflineCall(f"a dry run must not call AWS, but tried {model.service_model.service_name}.{model.name}")

    made.events.register("before-call", refuse)
    return _every_client_at(made, settings.endpoint_url)


# AWS's own endpoints: ride out throttling (adaptive backoff). An endpoint override (an emulator, a proxy) that
# refuses connections would only be retried into the same refusal for ~7 s: there, 2 attempts. Connecting to an
# AWS endpoint takes milliseconds, so a host that does not answer within seconds is not there (botocore: 60 s).
RETRIES = {
    "aws": {"total_max_attempts": 9, "mode": "adaptive"},
    "override": {"total_max_attempts": 2, "mode": "standard"},
}
CONNECT_TIMEOUT_SECONDS = 5


def client(settings: AwsSettings, service: str, boto_session: Any = None) -> Any:
    from botocore.config import Config as BotoConfig

    made = boto_session or session(settings)
    url = endpoint_url(settings)
    return log_calls(made.client(
        service,
        endpoint_url=url,
        config=BotoConfig(
            retries=dict(RETRIES["override" if url else "aws"]),  # a copy: botocore edits it
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            user_agent_appid="toolkit",
        ),
    ))  # fmt: skip


def log_calls(made: Any) -> Any:
    """Every call of this client on the `toolkit.aws` logger (`toolkit -v` shows it): the operation, where it
    went, the HTTP status, the retries botocore made and the time it took."""
    import time

    def before(model: Any, context: Any, **_: Any) -> None:
        context["toolkit_started"] = time.monotonic()

    def after(model: Any, http_response: Any, parsed: Any, context: Any, **_: Any) -> None:
        if not log.isEnabledFor(logging.DEBUG):
            return
        took = time.monotonic() - context.get("toolkit_started", time.monotonic())
        meta = parsed.get("ResponseMetadata", {}) if isinstance(parsed, dict) else {}
        error = parsed.get("Error", {}).get("Code") if isinstance(parsed, dict) else None
        log.debug(
            "%s.%s -> %s%s, %d retries, %.2f s (%s)", model.service_model.service_name, model.name,
            getattr(http_response, "status_code", "?"), f" {error}" if error else "", meta.get("RetryAttempts", 0),
            took, made.meta.endpoint_url,
        )  # fmt: skip

    made.meta.events.register("before-call", before)
    made.meta.events.register("after-call", after)
    return made


def is_missing(exc: BaseException) -> bool:
    """Whether a lookup by name failed because the name names nothing: by AWS's error code
    (`toolkit.errors.MISSING`), never by message text. Only for calls whose one input is the name."""
    response = getattr(exc, "response", None)
    return isinstance(response, dict) and str(response.get("Error", {}).get("Code")) in MISSING


def require(settings: AwsSettings, *fields: str) -> None:
    """Fail before any request when the config lacks what the call needs."""
    missing = [f"aws.{name}" for name in fields if not getattr(settings, name)]
    if missing:
        raise AwsError(
            f"{', '.join(missing)} not set: add them to the config (`toolkit infra outputs` can write them) "
            "or pass --set aws.<field>=..."
        )


def require_bucket(settings: AwsSettings, boto_session: Any = None) -> None:
    """aws.bucket must exist (and be reachable with these credentials) before anything is uploaded to it."""
    from botocore.exceptions import ClientError

    try:
        client(settings, "s3", boto_session).head_bucket(Bucket=settings.bucket)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise AwsError(
                f"aws.bucket: bucket {settings.bucket!r} does not exist: create it with `toolkit infra deploy` "
                "(then `toolkit infra outputs --write`), or set aws.bucket to an existing bucket"
            ) from None
        if code in ("403", "AccessDenied"):
            raise AwsError(f"aws.bucket: no access to bucket {settings.bucket!r} with these credentials") from None
        raise


# The bucket's layout under aws.prefix that infra/toolkit.yaml's rules name (the checkpoint lifecycle rule, the
# export role's scope): the jobs write there through these, and tests/infra/test_stack.py holds the template to them.
def checkpoint_root(prefix: str) -> str:
    """Every training job's checkpoints, the prefix the stack expires after CheckpointRetentionDays."""
    return f"{prefix}/checkpoints/"


def checkpoint_prefix(prefix: str, config_name: str, job_name: str) -> str:
    return f"{checkpoint_root(prefix)}{config_name}/{job_name}/"


def model_prefix(prefix: str, config_name: str) -> str:
    """Models exported from HyperPod EKS runs (the stack's export role may write only here)."""
    return f"{prefix}/models/{config_name}"


UPLOAD_MARKER = ".toolkit-complete"  # written last under an uploaded prefix: there, the upload is whole


def upload_once(s3, settings: AwsSettings, source: Path, kind: str = "data", key: str | None = None) -> str:
    """Upload a local file or tree under `{prefix}/{kind}/{key}/` (key: the content digest unless given); a marker
    object proves a complete earlier upload, so a rerun uploads nothing."""
    from toolkit import digest

    bucket = settings.bucket
    assert bucket is not None  # callers check aws.bucket first
    prefix = f"{settings.prefix}/{kind}/{key or digest.of_files(source)}"
    if not upload_complete(s3, bucket, prefix):
        upload_tree(s3, source, bucket, prefix)
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{UPLOAD_MARKER}", Body=b"")
    return f"s3://{bucket}/{prefix}/"


def upload_complete(s3: Any, bucket: str, prefix: str) -> bool:
    """Whether an earlier upload under `prefix` finished (its marker exists)."""
    try:
        s3.head_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{UPLOAD_MARKER}")
        return True
    except s3.exceptions.ClientError as exc:
        if not is_missing(exc):
            raise
        return False


def upload_tree(s3: Any, source: Path, bucket: str, prefix: str) -> None:
    """Upload a file, or every file under a directory (keeping relative paths), under `prefix`."""
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    for file in files:
        relative = file.name if source.is_file() else file.relative_to(source).as_posix()
        s3.upload_file(str(file), bucket, f"{prefix.rstrip('/')}/{relative}".lstrip("/"))


def download_tree(s3: Any, uri: str, destination: Path) -> Path:
    """Every object under an s3:// prefix into `destination`, keeping relative paths (the upload marker skipped)."""
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    prefix = prefix.rstrip("/") + "/"
    found = False
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix) :]
            if not relative or relative == UPLOAD_MARKER or relative.endswith("/"):
                continue
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(target))
            found = True
    if not found:
        raise AwsError(f"{uri}: no objects under this prefix: check the URI (a training job's model prefix ends /)")
    return destination


def download_whole(s3: Any, uri: str, destination: Path) -> Path:
    """download_tree into a sibling directory renamed to `destination` once every object is there: `destination`
    is whole or absent, whenever the process dies (a partial sibling is removed by the next download)."""
    import shutil

    partial = destination.with_name(f".{destination.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    download_tree(s3, uri, partial)
    partial.rename(destination)
    return destination


def model_artifacts(description: dict) -> dict[str, str]:
    """Where the job's /opt/ml/model went: uncompressed under <S3OutputPath>/<job>/output/model/ (AWS's layout for
    CompressionType NONE; an S3 prefix the endpoint serves as is), or a model.tar.gz from older jobs."""
    model = description.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    if not model:
        return {}
    output = description.get("OutputDataConfig", {})
    if output.get("CompressionType") == "NONE":
        prefix = f"{output['S3OutputPath'].rstrip('/')}/{description['TrainingJobName']}/output/model/"
        return {"model": prefix, "adapter": f"{prefix}adapter/", "merged": f"{prefix}merged/"}
    return {"model": model, "adapter": f"{model}#adapter/", "merged": f"{model}#merged/"}
