"""What AWS says about an instance type before anything launches: its price (the Price List API, cached, with the
shipped price file as the offline fallback) and the account's Service Quotas for it.

Quota names are SageMaker's own ("ml.p5.48xlarge for training job usage"); their codes (L-...) differ by quota and
are not known offline, so the quotas are listed and matched by name. New accounts start at 0 for most GPU types:
`toolkit train` refuses before CreateTrainingJob would fail with ResourceLimitExceeded.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.errors import BadInput
from toolkit.files import write_atomically
from toolkit.resources import HERE as RESOURCES

if TYPE_CHECKING:
    from toolkit.config.models import AwsSettings

log = logging.getLogger(__name__)
PRICE_FILE = RESOURCES / "prices.json"
PRICE_CACHE_SECONDS = 7 * 24 * 3600
PRICING_REGION = "us-east-1"  # the Price List API answers in us-east-1, eu-central-1 and ap-south-1 only
QUOTA_CONSOLE = "https://console.aws.amazon.com/servicequotas/home/services/sagemaker/quotas"


_unreachable: set[str] = set()  # regions whose Price List API could not be reached in this process: not retried


class QuotaError(BadInput):
    """The account may not start the instances (a Service Quota below what the job needs)."""


@dataclass(frozen=True)
class Usage:
    """How SageMaker counts instances against a quota and bills them: a kind of use (SageMaker's vocabulary), not a
    target; each target's record (toolkit/targets/) says which its instances draw on."""

    quota: str  # the quota name's ending: "<instance type> for <quota>"
    price: str  # the Price List API's usage type, `<region code>-<price>:<instance type>`
    billed_as: str  # how a message names it


# Training jobs bill under `Train` (on demand; spot is billed at a discount of it). HyperPod bills its cluster
# instances under a kind of its own, looked up as `Cluster`, and the shipped file has no HyperPod prices: without a
# match the plan shows no price and asks for --price, never the training rate under another name.
TRAINING_JOB = Usage("training job usage", "Train", "training job")
SPOT_TRAINING_JOB = Usage("spot training job usage", "Train", "training job")
CLUSTER = Usage("cluster usage", "Cluster", "hyperpod")


@dataclass
class Price:
    usd_per_hour: float | None  # on demand, one instance
    source: str  # where the figure came from: "--price", "AWS Price List API ...", the shipped file, or why none


@dataclass
class Quota:
    name: str  # the quota to request, as the Service Quotas console names it
    value: float | None  # None: not known (the reason is in `detail`)
    detail: str


def quota_name(instance_type: str, usage: Usage) -> str:
    return f"{instance_type} for {usage.quota}"


def parse_price_overrides(values: list[str]) -> dict[str, float]:
    """--price TYPE=USD (per instance-hour); a bare USD applies to every instance type ("*")."""
    prices = {}
    for value in values:
        name, _, usd = value.rpartition("=")
        try:
            prices[name or "*"] = float(usd)
        except ValueError:
            raise BadInput(f"--price {value!r}: write TYPE=USD per instance-hour, e.g. ml.p5.48xlarge=55.04") from None
    return prices


def _cache_file() -> Path:
    from toolkit_train.settings import cache_root

    return cache_root() / "prices.json"


def shipped_prices() -> dict[str, Any]:
    return json.loads(PRICE_FILE.read_text())


def price(
    settings: AwsSettings,
    instance_type: str,
    overrides: dict[str, float] | None = None,
    online: bool = True,
    usage: Usage = TRAINING_JOB,
) -> Price:
    """On-demand USD per instance-hour of an instance as `usage` bills it: --price, else the cache, else the Price
    List API (when online), else the shipped file (training jobs only)."""
    overrides = overrides or {}
    if instance_type in overrides or "*" in overrides:
        return Price(overrides.get(instance_type, overrides.get("*")), "--price")
    shipped_usage = usage.price == TRAINING_JOB.price  # the shipped file holds training prices only
    key = f"{settings.region}/{instance_type}" + ("" if shipped_usage else f"/{usage.price}")
    cache = _read_cache()
    cached = cache.get(key)
    if cached and time.time() - cached["at"] < PRICE_CACHE_SECONDS:
        return Price(cached["usd"], f"AWS Price List API ({settings.region}, cached {_age(cached['at'])})")
    if online and settings.region not in _unreachable:
        fetched = _price_list(settings, instance_type, usage.price)
        if fetched is not None:
            cache[key] = {"usd": fetched, "at": time.time()}
            _write_cache(cache)
            return Price(fetched, f"AWS Price List API ({settings.region})")
    if not shipped_usage:
        why = "it bills apart from training jobs and no price is shipped for it" + ("" if online else "; offline")
        return Price(None, f"no {usage.billed_as} price for {instance_type} ({why}): pass --price {instance_type}=USD")
    shipped = shipped_prices()
    usd = shipped["training"].get(instance_type)
    if usd is None:
        return Price(None, f"no price for {instance_type} offline: pass --price {instance_type}=USD")
    where = "" if settings.region == shipped["region"] else f"; {shipped['region']}'s, not {settings.region}'s"
    return Price(usd, f"shipped price file ({shipped['as_of']}{where})")


def _age(at: float) -> str:
    hours = (time.time() - at) / 3600
    return f"{hours:.0f} h ago" if hours < 48 else f"{hours / 24:.0f} days ago"


def _read_cache() -> dict[str, Any]:
    try:
        return json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(cache: dict[str, Any]) -> None:
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(cache, indent=1))
    except OSError as exc:  # a read-only home: the price is still right, only not remembered
        log.debug("price cache not written: %s", exc)


def pricing_client(settings: AwsSettings) -> Any:
    from toolkit import aws

    return aws.client(settings.model_copy(update={"region": PRICING_REGION}), "pricing")


def price_list_request(region: str, instance_type: str) -> dict[str, Any]:
    """GetProducts for SageMaker's products of one instance type in one region (training, hosting, ... all come)."""
    return {
        "ServiceCode": "AmazonSageMaker",
        "Filters": [
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
            {"Type": "TERM_MATCH", "Field": "instanceName", "Value": instance_type},
        ],
        "FormatVersion": "aws_v1",
        "MaxResults": 100,
    }


def _price_list(settings: AwsSettings, instance_type: str, usage: str = "Train") -> float | None:
    """The on-demand price from the Price List API: the product whose usage type is `...<usage>:TYPE`."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client = pricing_client(settings)
        pages = client.get_paginator("get_products").paginate(**price_list_request(settings.region, instance_type))
        products = [json.loads(item) for page in pages for item in page.get("PriceList", [])]
    except (ClientError, BotoCoreError, BadInput) as exc:
        log.info("price of %s from the Price List API: %s", instance_type, exc)
        if not isinstance(exc, ClientError):  # no credentials, no network: the next instance type fares no better
            _unreachable.add(settings.region)
        return None
    for product in products:
        kind = product.get("product", {}).get("attributes", {}).get("usagetype", "")
        if not kind.endswith(f"{usage}:{instance_type}"):
            continue  # hosting, notebooks, processing, spot, ...
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD", 0))
                if usd > 0:
                    return usd
    log.info("the Price List API lists no on-demand %s price for %s in %s", usage, instance_type, settings.region)
    return None


def quotas_client(settings: AwsSettings) -> Any:
    from toolkit import aws

    return aws.client(settings, "service-quotas")


def quotas(settings: AwsSettings, names: list[str]) -> dict[str, Quota]:
    """The account's SageMaker quotas by name: the applied value (ListServiceQuotas), else AWS's default
    (ListAWSDefaultServiceQuotas: applied values are listed only for some quotas); value None when unreadable."""
    from botocore.exceptions import BotoCoreError, ClientError

    wanted = set(names)
    found: dict[str, Quota] = {}
    try:
        client = quotas_client(settings)
        for operation, what in (("list_service_quotas", "applied"), ("list_aws_default_service_quotas", "default")):
            if wanted <= set(found):
                break
            for page in client.get_paginator(operation).paginate(ServiceCode="sagemaker"):
                for item in page.get("Quotas", []):
                    name = item.get("QuotaName")
                    if name in wanted and name not in found:
                        found[name] = Quota(name, float(item["Value"]), f"{what} value, {item.get('QuotaCode', '')}")
    except (ClientError, BotoCoreError, BadInput) as exc:
        log.info("Service Quotas: %s", exc)
        reason = f"quota not read ({_short(exc)})"
        return {name: found.get(name) or Quota(name, None, reason) for name in names}
    return {name: found.get(name) or Quota(name, None, "quota not listed by Service Quotas") for name in names}


def _short(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error", {}).get("Code"):
        return f"{getattr(exc, 'operation_name', 'the call')}: {response['Error']['Code']}"
    return str(exc).splitlines()[0][:120]


def quota_problem(quota: Quota, needed: int) -> str | None:
    """The one line that refuses a launch, or None: a quota below the instances the job needs."""
    if quota.value is None or quota.value >= needed:
        return None
    return (
        f"Service Quota {quota.name!r} is {quota.value:g} in this account and region, the job needs {needed}: "
        f"request {needed} or more (Service Quotas console, {QUOTA_CONSOLE}, or `aws service-quotas "
        f"request-service-quota-increase`), or pass --no-preflight to submit anyway"
    )


def preflight(
    settings: AwsSettings,
    instance_type: str,
    count: int,
    usage: Usage,
    on_note: Callable[[str], None] | None = None,
    online: bool = True,
) -> str:
    """Before instances are launched for a job (the target's record decides when: toolkit/targets/): refuse
    (QuotaError) when the account's quota for them is below `count`; else one line with the quota and the price.
    `online=False`: the price file only."""
    name = quota_name(instance_type, usage)
    quota = quotas(settings, [name])[name] if online else Quota(name, None, "not checked")
    problem = quota_problem(quota, count)
    if problem:
        raise QuotaError(problem)
    cost = price(settings, instance_type, online=online, usage=usage)
    quota_text = f"{quota.value:g}" if quota.value is not None else quota.detail
    price_text = (
        f"${cost.usd_per_hour * count:,.2f}/h on demand ({cost.source})" if cost.usd_per_hour is not None
        else cost.source
    )  # fmt: skip
    line = (
        f"preflight: {count} x {instance_type}: quota {name!r} = {quota_text}; {price_text}; "
        "time and cost: `toolkit plan CONFIG`"
    )
    if on_note:
        on_note(line)
    return line


# A model package's CustomerMetadataProperties (SageMaker's CreateModelPackage / UpdateModelPackage, as botocore's
# service model carries them; tests/toolkit/deploy/test_gate.py holds these to it): at most 50 entries, keys of 1-128
# and values of 1-256 characters, each a letter, number, space or one of _ . : / = + - @
METADATA_ENTRIES = 50
METADATA_KEY_CHARS = 128
METADATA_VALUE_CHARS = 256
_METADATA_OTHER = re.compile(r"[^\w .:/=+\-@]")


def customer_metadata(entries: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Entries as a model package may hold them, in their order of importance: a character AWS refuses becomes
    `_`, an empty value `-`, a longer value is cut; a key that is too long, or any entry past the 50th, is left out
    and named in the second value (never sent for AWS to refuse the whole registration)."""
    kept: dict[str, str] = {}
    left_out = []
    for key, value in entries.items():
        key = _METADATA_OTHER.sub("_", key)
        if not key or len(key) > METADATA_KEY_CHARS or len(kept) == METADATA_ENTRIES:
            left_out.append(key)
            continue
        kept[key] = _METADATA_OTHER.sub("_", str(value))[:METADATA_VALUE_CHARS] or "-"
    return kept, left_out
