"""Names as AWS and Kubernetes check them, one helper per kind of name, used wherever such a name appears.

Each helper returns what is wrong (a phrase to put after the field) or None. S3 bucket names follow S3's general
purpose bucket naming rules (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html); regions are
the regions of botocore's own partition data (`botocore/data/partitions.json`, the table botocore resolves endpoints
with); Kubernetes object names are RFC 1123 (lowercase) and label values the API server's label value rule
(k8s.io/apimachinery/pkg/util/validation: IsDNS1123Label, IsDNS1123Subdomain, IsValidLabelValue); container image
references the grammar the kubelet, containerd and Docker parse them with (github.com/distribution/reference,
regexp.go and reference.go).
"""

from __future__ import annotations

import functools
import ipaddress
import re

from toolkit.errors import brief

_BUCKET_CHARS = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Prefixes and suffixes S3 reserves (access point, Object Lambda, Multi-Region, directory and table bucket names)
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def bucket_name_problem(name: str) -> str | None:
    """What S3 would refuse in a bucket name, said with the fix; None for a valid one."""
    if _URI.match(name) or "/" in name:
        bucket = _URI.sub("", name).split("/", 1)[0]
        return f"{brief(name)} is a URI or path: write a bucket name, not a URI (e.g. {bucket!r})"
    rules = "3-63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit"
    if not _BUCKET_CHARS.fullmatch(name) or ".." in name:
        return f"{brief(name)} is not a valid S3 bucket name: {rules}, no '..'"
    try:
        ipaddress.IPv4Address(name)
        return f"{brief(name)} is not a valid S3 bucket name: it must not be formatted as an IP address"
    except ValueError:
        pass
    reserved = [p for p in _BUCKET_RESERVED_PREFIXES if name.startswith(p)]
    reserved += [s for s in _BUCKET_RESERVED_SUFFIXES if name.endswith(s)]
    if reserved:
        return f"{brief(name)} is not a valid S3 bucket name: S3 reserves {reserved[0]!r} for other kinds of names"
    return None


def bucket_of(uri: str) -> str:
    """The bucket of an s3:// URI."""
    return uri[len("s3://") :].split("/", 1)[0]


@functools.cache
def known_regions() -> dict[str, str] | None:
    """Every region of botocore's partition data -> its partition (aws, aws-cn, aws-us-gov, ...); None without
    botocore (the config can be checked without the aws extra: then only the region's shape is checked)."""
    try:
        from botocore.loaders import create_loader
    except ImportError:
        return None
    data = create_loader().load_data("partitions")
    return {
        region: partition["id"]
        for partition in data["partitions"]
        for region in partition["regions"]
        if not region.endswith("-global")  # the partitions' global endpoints, not regions one can run in
    }


def region_problem(region: str) -> str | None:
    regions = known_regions()
    if regions is None:
        shaped = re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", region)
        return None if shaped else f"{brief(region)} is not an AWS region name (like us-east-1, eu-west-2)"
    if region in regions:
        return None
    import difflib

    close = difflib.get_close_matches(region, list(regions), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    some = ", ".join(sorted(regions)[:4])
    return f"{brief(region)} is not an AWS region (botocore's partition data has {len(regions)}: {some}, ...){hint}"


_K8S_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
K8S_KINDS = {  # what the API server checks: RFC 1123 label (namespaces) or subdomain (most other objects)
    "label": (_K8S_LABEL, 63),
    "subdomain": (re.compile(rf"{_K8S_LABEL.pattern}(\.{_K8S_LABEL.pattern})*"), 253),
}


def k8s_name_problem(name: str, kind: str = "subdomain") -> str | None:
    """What Kubernetes would refuse in an object name (RFC 1123: lowercase letters, digits, '-', and '.' between
    labels of a subdomain); None for a valid one."""
    pattern, limit = K8S_KINDS[kind]
    if len(name) <= limit and pattern.fullmatch(name):
        return None
    dots = ", '-' and '.'" if kind == "subdomain" else " and '-'"
    lowered = re.sub(r"[^a-z0-9.-]+", "-", name.lower())[:limit].strip("-.")
    return (
        f"{brief(name)} is not a Kubernetes object name (RFC 1123: at most {limit} lowercase letters, digits{dots}, "
        f"starting and ending with a letter or digit), e.g. {brief(lowered)}"
    )


# IsValidLabelValue: empty, or at most 63 of [-A-Za-z0-9_.], starting and ending with a letter or digit
_K8S_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def k8s_label_value_problem(value: str) -> str | None:
    """What Kubernetes would refuse in a label value; None for a valid one."""
    if len(value) <= 63 and _K8S_LABEL_VALUE.fullmatch(value):
        return None
    return (
        f"{brief(value)} is not a Kubernetes label value (at most 63 letters, digits, '-', '_' and '.', starting and "
        "ending with a letter or digit)"
    )


# distribution/reference's grammar: [domain[:port]/]path-component[/path-component...][:tag][@digest], the name (all
# before the tag) at most 255 characters
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_IMAGE_HOST = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_IMAGE_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_IMAGE_HOST}/)?{_IMAGE_PATH}(?:/{_IMAGE_PATH})*)(?::\w[\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)


def image_reference_problem(reference: str) -> str | None:
    """What a container runtime would refuse in an image reference (registry/repository[:tag][@digest]); None for a
    valid one."""
    matched = _IMAGE_REFERENCE.fullmatch(reference)
    if matched and len(matched["name"]) <= 255:
        return None
    return (
        f"{brief(reference)} is not a container image reference ([registry[:port]/]repository[:tag][@digest]: a "
        "lowercase repository path, a tag of at most 128 letters, digits, '_', '.' and '-')"
    )


# SageMaker hosting names as the API checks them (botocore's service model: each shape's pattern and maximum
# length, read from botocore/data/sagemaker/*/service-2.json; a test compares this table with it)
_SAGEMAKER_DASHED = r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"
_SAGEMAKER_HYPHENATED = r"[a-zA-Z0-9]([\-a-zA-Z0-9]*[a-zA-Z0-9])?"
SAGEMAKER_NAMES = {  # kind -> (botocore shape, pattern, maximum length)
    "endpoint": ("EndpointName", _SAGEMAKER_DASHED, 63),
    "endpoint config": ("EndpointConfigName", _SAGEMAKER_DASHED, 63),
    "model": ("ModelName", _SAGEMAKER_HYPHENATED, 63),
    "inference component": ("InferenceComponentName", _SAGEMAKER_HYPHENATED, 63),
}


def sagemaker_name_problem(name: str, kind: str) -> str | None:
    """What SageMaker would refuse in a hosting resource's name; None for a valid one."""
    _, pattern, limit = SAGEMAKER_NAMES[kind]
    if len(name) <= limit and re.fullmatch(pattern, name):
        return None
    return (
        f"{brief(name)} is not a SageMaker {kind} name (at most {limit} letters, digits and '-', starting and "
        "ending with a letter or digit)"
    )


def in_ecr_repository(image: str | None, repository: str | None) -> bool:
    """Whether `image` (registry/repository[:tag|@digest]) is in the ECR repository named `repository`."""
    if not image:
        return False
    path = image.split("@", 1)[0]
    if ":" in path.rsplit("/", 1)[-1]:
        path = path.rpartition(":")[0]
    host, _, name = path.partition("/")
    return ".dkr.ecr." in host and name == repository
