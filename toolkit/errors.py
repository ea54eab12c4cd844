"""One map from a failure to its exit code and its one-line message, for every command.

Exit codes: 0 success; 1 the job or operation failed (a training job, a deployment, an AWS call that AWS
refused for a reason other than the input); 2 bad input or a missing resource (config, data, arguments, a
bucket/job/secret that does not exist, credentials, an endpoint that cannot be reached); 130 interrupted.
The code follows the cause, chosen where the error is raised: every toolkit error is a `BadInput` or a
`Failed`: an area's error class is one of them, and the area's other kind names the other base first, e.g.
`DeployInputError(BadInput, DeployError)` (exit 2, and SDK callers still catch DeployError). AWS errors are
classified by their error code alone, never by message text.
The CLI applies it once, around every command (`toolkit.cli`); SDK callers get the exceptions themselves.
"""

from __future__ import annotations

FAILED, BAD_INPUT, INTERRUPTED = 1, 2, 130


class BadInput(Exception):
    """Bad input or a missing resource (exit 2): the user changes the input or creates the resource."""


class Failed(Exception):
    """An operation that was started failed (exit 1): the input was fine, the run was not."""


class CannotWrite(BadInput):
    """A path the user named that cannot be written (permissions, a read-only file system): choose another."""


class WriteFailed(Failed):
    """A write that failed for another reason than the path (a full disk, an I/O error)."""


def unwritable(
    exc: OSError,
    where: object,
    setting: str,
    bad: type[Exception] = CannotWrite,
    failed: type[Exception] = WriteFailed,
    outcome: str = "nothing half-written was kept",
) -> Exception:
    """The one line for a write that failed: bad input (exit 2, `bad`) when it is the path (permissions, a read-only
    file system, a file where a directory must be, a name too long), a failed operation (exit 1, `failed`) otherwise
    (a full disk). `setting`: where the
    user chose the path (a config field or an option); `outcome`: what the failure left."""
    import errno

    path = exc.filename or where
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG):
        return bad(f"{setting}: cannot write {path} ({exc.strerror}): choose a directory you can write")
    return failed(f"cannot write {path} ({exc.strerror}); {outcome}")


SHOWN_VALUE_CHARS = 80  # a value echoed in a message is cut to this: a 5,000-character value is not the message


def brief(value: object, limit: int = SHOWN_VALUE_CHARS) -> str:
    """A value as a message shows it: its repr, cut to `limit` characters; a section by its keys, never its repr."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        value = dump(exclude_defaults=True)
    if isinstance(value, dict):
        return "a section with " + (", ".join(map(str, value)) or "defaults only")
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 25]}... ({len(text)} characters)"


# The optional parts of the toolkit (pyproject.toml's extras): `pip install .` gives the config, `plan --offline` and
# the local dry runs; `train` adds training and `data prepare`, `eval` the scorers, `aws` every AWS verb. A command
# that reaches a missing one ends in one line naming the extra (exit 2): classify maps the ModuleNotFoundError, and a
# target that needs an extra says so before anything runs (`require_extra`). The top-level import name of each
# extra's distributions; tests/toolkit/test_extras.py ties it to pyproject.toml through the installed metadata.
EXTRA_OF_MODULE = {
    "boto3": "aws", "botocore": "aws", "sagemaker": "aws", "kubernetes": "aws",
    "torch": "train", "transformers": "train", "peft": "train", "trl": "train", "datasets": "train",
    "accelerate": "train", "openai_harmony": "train", "jsonschema": "train", "tiktoken": "train",
    "lingua": "train",  # the reasoning-language detector: GRPO's reward and `toolkit eval`'s metric
    "rouge_score": "eval", "sacrebleu": "eval", "matplotlib": "eval", "lm_eval": "eval",
}  # fmt: skip
WHAT_EXTRA_GIVES = {
    "aws": "the AWS verbs (training jobs, HyperPod, endpoints, the registry, infra, images)",
    "train": "training and data preparation",
    "eval": "`toolkit eval`'s scorers",
}


class MissingExtra(BadInput):
    """An optional dependency of the toolkit is not installed: the message names the extra to install."""


def _missing_extra_line(needed_for: str, extra: str, module: str) -> str:
    return (
        f"{needed_for}: the toolkit's `{extra}` extra is not installed (no {module}): run "
        f"pip install '.[{extra}]' in the toolkit's checkout, or use the .venv that `bash scripts/demo.sh` builds "
        "(every extra)"
    )


def missing_extra(exc: BaseException) -> MissingExtra | None:
    """The one line for an ImportError of a module an extra provides; None for any other (a bug keeps its
    traceback)."""
    import importlib.util

    name = getattr(exc, "name", None) or ""
    top = name.split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if not isinstance(exc, ImportError) or extra is None or importlib.util.find_spec(top) is not None:
        return None  # installed: a missing part of it is a version mismatch or a bug, not a missing extra
    return MissingExtra(_missing_extra_line(WHAT_EXTRA_GIVES[extra], extra, top))


def require_extra(extra: str, needed_for: str) -> None:
    """MissingExtra unless every module of `extra` is installed: called before anything runs or is read."""
    import importlib.util

    for module, of in EXTRA_OF_MODULE.items():
        if of == extra and importlib.util.find_spec(module) is None:
            raise MissingExtra(_missing_extra_line(needed_for, extra, module))


# AWS error codes that a lookup by name gets when the name names nothing. SageMaker answers a missing model,
# endpoint (config) or training job with ValidationException and CloudFormation a missing stack with
# ValidationError (their only input is the name); `toolkit.aws.is_missing` reads this table, nothing reads text.
MISSING = {
    "NoSuchBucket", "NoSuchKey", "404", "NotFound", "ResourceNotFoundException", "ResourceNotFound",
    "ValidationException", "ValidationError", "NoSuchEntity", "RepositoryNotFoundException",
    "ImageNotFoundException",
}  # fmt: skip
# AWS error codes that mean "the input names something that is not there, is malformed, or may not be used"
MISSING_OR_INVALID = MISSING | {
    "InvalidBucketName", "AccessDenied", "AccessDeniedException", "UnrecognizedClientException",
    "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException", "AuthFailure", "403",
}  # fmt: skip
HINTS = {
    "NoSuchBucket": "create it with `toolkit infra deploy`, or set aws.bucket to an existing bucket",
    "InvalidBucketName": "set aws.bucket to a valid S3 bucket name",
    "AccessDenied": "your credentials (or the execution role) lack this permission",
    "AccessDeniedException": "your credentials (or the execution role) lack this permission",
    "ExpiredToken": "refresh your credentials (`aws sso login`)",
    "ExpiredTokenException": "refresh your credentials (`aws sso login`)",
}


def classify(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for a failure the toolkit knows, or None for a bug (which keeps its traceback)."""
    from toolkit_train.data import DataError  # the entrypoints run without the toolkit: no base class there

    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED, "interrupted"
    if isinstance(exc, DataError):
        return BAD_INPUT, str(exc)
    missing = missing_extra(exc)
    if missing is not None:
        return BAD_INPUT, str(missing)
    kind = next((base for base in type(exc).__mro__ if base in (BadInput, Failed)), None)
    if kind is not None:  # the first of the two in the class's bases decides: DeployInputError(BadInput, DeployError)
        return (BAD_INPUT if kind is BadInput else FAILED), str(exc)
    return _classify_cloud(exc)


SERVICE_TEXT_CHARS = 300  # a service's error message is cut to this (a proxy's or an emulator's page is not a line)


def service_text(text: str) -> str:
    """A service's error message as one line: an HTML error page (a proxy, a load balancer, an emulator's crash)
    reduced to its title and text, whitespace collapsed, cut to SERVICE_TEXT_CHARS."""
    import html
    import re

    if re.search(r"<\s*(!doctype|html|body|h1|title)\b", text, re.IGNORECASE):
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        body = re.sub(r"<(script|style|head)[^>]*>.*?</\1>", " ", text, flags=re.IGNORECASE | re.DOTALL)
        text = " ".join(filter(None, [title.group(1) if title else "", re.sub(r"<[^>]+>", " ", body)]))
        text = "an HTML page, not an AWS error: " + html.unescape(text)
    line = " ".join(text.split())
    return line if len(line) <= SERVICE_TEXT_CHARS else line[: SERVICE_TEXT_CHARS - 3] + "..."


def _classify_cloud(exc: BaseException) -> tuple[int, str] | None:
    try:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            ReadTimeoutError,
        )
    except ImportError:  # without the aws extra nothing can raise these
        return None
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "ClientError"))
        operation = getattr(exc, "operation_name", "") or "the AWS call"
        resource = error.get("BucketName") or error.get("Key") or ""
        message = f"{operation} failed: {code}: {service_text(str(error.get('Message') or exc))}"
        message += f" ({resource})" if resource else ""
        message += f"; {HINTS[code]}" if code in HINTS else ""
        return (BAD_INPUT if code in MISSING_OR_INVALID else FAILED), message
    if isinstance(exc, EndpointConnectionError):
        where = exc.kwargs.get("endpoint_url")
        return BAD_INPUT, f"cannot reach {where}: check aws.region / aws.endpoint_url and the network"
    if isinstance(exc, NoCredentialsError):
        return BAD_INPUT, "no AWS credentials found: run `aws configure` or `aws sso login`, or export AWS_PROFILE"
    if isinstance(exc, ReadTimeoutError):  # the service took the request and did not answer in time
        return FAILED, f"AWS did not answer in time: {service_text(str(exc))}; try again"
    if isinstance(exc, BotoCoreError):  # botocore's own: no region, an unknown profile, a malformed parameter
        return BAD_INPUT, f"AWS client: {service_text(str(exc))}"
    return None
