"""`toolkit plan`: before a run, per candidate (the configured target first, then the training-job instance types
and HyperPod node counts that fit): whether it fits in GPU memory, the expected tokens/s and wall-clock, the cost,
and the account's quota for it.

Every figure says where it comes from. Throughput and memory: the one shipped table of measurements
(toolkit/resources/throughput.json, built from bench/results by bench/throughput_table.py) and the measured limits
(toolkit.config.instances.MICRO_BATCH_LIMITS); a row that is scaled (more GPUs than measured) or estimated (another
GPU, micro-batch or expert setting than measured) says so. Prices and quotas: toolkit.limits.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from toolkit.config import Config
from toolkit.config.instances import GPUS, INSTANCES, MICRO_BATCH_LIMITS, MODELS
from toolkit.config.targets import run_home
from toolkit.resources import HERE as RESOURCES
from toolkit.targets.base import Size, Target, get_target, registered_targets

THROUGHPUT_FILE = RESOURCES / "throughput.json"
CHARS_PER_TOKEN = 4  # the fast count of an unprepared local file: its bytes / 4 (marked estimated)
Basis = Literal["measured", "scaled", "estimated", "none"]
BASIS_ORDER: list[Basis] = ["measured", "scaled", "estimated", "none"]


@dataclass
class Candidate:
    target: str
    instance_type: str | None
    nodes: int
    gpus: int
    configured: bool
    fits: Literal["yes", "no", "unknown"]
    fits_detail: str
    tokens: int | None  # tokens the run trains on (all its optimizer steps)
    tokens_per_s: float | None
    throughput: Basis
    throughput_detail: str
    hours: float | None  # training steps only: not instance start-up, the model download or the merge
    usd_per_hour: float | None  # on demand, all nodes together
    price_source: str
    cost_usd: float | None
    spot_cost_usd: tuple[float, float] | None  # where spot runs it: (the most savings AWS quotes, on demand)
    quota_name: str | None
    quota: float | None
    quota_detail: str
    problem: str | None = None  # the one line that refuses this candidate's launch (a quota below what it needs)


@dataclass
class Plan:
    config: str
    model: str
    data_tokens: int | None  # one epoch's tokens
    data_tokens_source: str
    candidates: list[Candidate] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # instance types that do not fit, one line each
    notes: list[str] = field(default_factory=list)


@cache
def throughput_table() -> dict[str, Any]:
    return json.loads(THROUGHPUT_FILE.read_text())


def data_tokens(cfg: Config, tokens: int | None = None) -> tuple[int | None, str]:
    """One epoch's tokens: --tokens, else the statistics sealed with the dataset `toolkit data prepare` made
    (data.source itself, or runs/<name>/prepared while its source and settings are still the config's), else a fast
    count of a local file (bytes / 4, estimated), else unknown. A prepared dataset not used says why."""
    from toolkit_train.data import SAMPLE_DATASET, SAMPLE_PATH

    if tokens:
        return tokens, "--tokens"
    source = cfg.data.source
    found, why_not = _prepared_tokens(cfg, Path(source), own_source=True)
    if found is None and not why_not:
        found, why_not = _prepared_tokens(cfg, run_home(cfg.name) / "prepared", own_source=False)
    if found is not None:
        return found
    aside = f" ({why_not})" if why_not else ""
    local = SAMPLE_PATH if source == SAMPLE_DATASET else Path(source)
    if local.is_file():
        size = local.stat().st_size
        return size // CHARS_PER_TOKEN, f"estimated: {local.name}'s {size:,} bytes / {CHARS_PER_TOKEN}{aside}"
    return None, (
        f"unknown for {source}{aside}: run `toolkit data prepare CONFIG` (saves the token statistics plan reads) "
        "or pass --tokens N"
    )


def _prepared_tokens(cfg: Config, directory: Path, own_source: bool) -> tuple[tuple[int, str] | None, str]:
    """(tokens and where they come from, or None; why a prepared dataset there was not used, or "")."""
    from toolkit_train.data import DataError
    from toolkit_train.run import prepared

    if cfg.data.source.startswith(("s3://", "fsx://")) and own_source:
        return None, ""
    try:
        made = prepared.sealed(directory, by_content=False)  # sizes: plan reads no dataset through
    except DataError as exc:
        return None, f"not used: {exc}"
    if made is None:
        return None, ""
    stale = prepared.differences(made, cfg.data, cfg.model)
    held_out = cfg.data.eval.model_dump(mode="json") if cfg.data.eval is not None else None
    if made.get("eval") != held_out:  # the held-out share is counted apart (or not at all) with another data.eval
        stale.append(f"data.eval (prepared with {made.get('eval')}, this config: {held_out})")
    if not own_source and made.get("source") != prepared.canonical(cfg.data.source):
        stale.append(f"data.source (prepared from {made.get('source')!r})")
    elif not own_source and made.get("split") != cfg.data.split:
        stale.append(f"data.split (prepared from split {made.get('split')!r})")
    elif not own_source and made.get("source_sha256") != prepared.source_digest(cfg.data.source):
        stale.append(f"the content of {cfg.data.source} (changed since it was prepared)")
    if stale:
        return None, f"{directory} not used: prepared for other values of {'; '.join(stale)}"
    stats = made.get("stats", {})
    tokens = stats.get("training_tokens", stats.get("tokens"))  # data.eval.fraction's rows are not trained on
    if not isinstance(tokens, int):
        return None, f"{directory} not used: its record holds no token count"
    return (tokens, f"measured by `toolkit data prepare` ({directory})"), ""


def run_tokens(cfg: Config, world: int, epoch_tokens: int | None) -> tuple[int | None, str]:
    """Tokens the whole run trains on, on `world` GPUs: max_steps x tokens per optimizer step (an upper bound:
    full micro-batches), else epochs x the data's tokens."""
    t = cfg.training
    if t.max_steps:
        per_micro = cfg.micro_batch_tokens() if t.packing else t.per_device_batch_size * cfg.data.max_length
        return t.max_steps * per_micro * t.gradient_accumulation_steps * world, "up to: max_steps x full micro-batches"
    if epoch_tokens is None:
        return None, ""
    return int(t.num_epochs * epoch_tokens), f"{t.num_epochs:g} epoch(s)"


def _rows(cfg: Config) -> tuple[list[dict], str]:
    """The measured rows for this model and setting; else the model's other settings (then marked estimated)."""
    rows = [r for r in throughput_table()["rows"] if r["model"] == cfg.model.id]
    expert_lora = bool(cfg.lora.target_parameters)
    same = [r for r in rows if r["experts"] == cfg.model.experts and r["expert_lora"] == expert_lora
            and r["packed"] == cfg.training.packing]  # fmt: skip
    if same:
        return same, ""
    packed = [r for r in rows if r["packed"] == cfg.training.packing and r["expert_lora"] == expert_lora] or rows
    if not packed:
        return [], ""
    return packed, "measured with another setting (model.experts / training.distributed) than this config's"


def _checkpointing(cfg: Config) -> set[bool]:
    value = cfg.training.gradient_checkpointing
    return {True, False} if value == "auto" else {bool(value)}


def throughput(cfg: Config, instance_type: str, world: int) -> tuple[float | None, Basis, str]:
    """Expected tokens/s of the whole job: the closest measured row, per GPU, times the GPUs."""
    rows, caveat = _rows(cfg)
    gpu = INSTANCES[instance_type].gpu
    if not rows:
        return None, "none", f"no measurement of {cfg.model.id}"
    budget = cfg.micro_batch_tokens() if cfg.training.packing else None
    checkpointing = _checkpointing(cfg)

    def distance(row: dict) -> tuple:
        size = 0.0 if budget is None or row["tokens_per_micro_batch"] is None else abs(
            math.log(row["tokens_per_micro_batch"] / budget))  # fmt: skip
        return (row["gpu"] != gpu, size, row["gradient_checkpointing"] not in checkpointing)

    row = min(rows, key=distance)
    basis: Basis = "estimated" if caveat else "measured"
    details = [f"{row['row']} ({row['source']}): {row['tokens_per_s_per_gpu']:,} tokens/s per {row['gpu']}"]
    if row["note"]:
        details.append(row["note"])
    if caveat:
        details.append(caveat)
    per_gpu = float(row["tokens_per_s_per_gpu"])
    if row["tokens_per_micro_batch"] != budget and budget is not None:
        basis = "estimated"
        details.append(f"the nearest measured micro-batch ({row['tokens_per_micro_batch']:,}, not {budget:,} tokens)")
    if row["gradient_checkpointing"] not in checkpointing:
        basis = "estimated"
        details.append(f"measured with gradient checkpointing {'on' if row['gradient_checkpointing'] else 'off'}")
    if row["gpu"] != gpu:
        ratio = GPUS[gpu].bf16_tflops / GPUS[row["gpu"]].bf16_tflops
        if ratio == 0:
            return None, "none", f"{gpu} has no bf16 (the training stack runs in bf16)"
        per_gpu *= ratio
        basis = "estimated"
        details.append(f"x {ratio:.2f} for {gpu} (peak bf16 TFLOP/s against {row['gpu']})")
    total = per_gpu * world
    if world > 1:
        efficiency = throughput_table()["ddp_2gpu_efficiency"]["value"]
        total *= efficiency ** math.log2(world)
        basis = "estimated" if basis == "estimated" else "scaled"
        details.append(f"scaled to {world} GPUs at the measured 2-GPU ddp efficiency ({efficiency}) per doubling; "
                       "more GPUs and nodes are not measured")  # fmt: skip
    return total, basis, "; ".join(details)


def memory_fit(cfg: Config, instance_type: str, world: int) -> tuple[Literal["yes", "no", "unknown"], str]:
    """Whether the config's micro-batch fits the instance's GPUs: the config's own checks (the ddp weights check,
    measured out-of-memory limits), then a measured peak on GPUs of this memory or less."""
    from toolkit.config import ConfigError
    from toolkit.config.loader import validate

    data = cfg.model_dump()
    data.update(target="training-job", training_job={**data["training_job"], "instance_type": instance_type})
    try:
        validate(data, f"{cfg.name} on {instance_type}")
    except ConfigError as exc:
        return "no", str(exc).splitlines()[-1].strip()
    memory = INSTANCES[instance_type].gpu_memory_gib
    budget = cfg.micro_batch_tokens()
    limit = MICRO_BATCH_LIMITS.get((cfg.model.id, cfg.model.experts, memory))
    if limit and budget <= limit.fits:
        return "yes", f"measured: {limit.fits:,}-token micro-batches fit {memory} GiB GPUs ({limit.source})"
    rows, caveat = _rows(cfg)
    checkpointing = _checkpointing(cfg)
    for row in sorted(rows, key=lambda r: r["peak_mem_gb"]):
        larger = row["tokens_per_micro_batch"] is None or budget is None or row["tokens_per_micro_batch"] >= budget
        if (
            not caveat
            and larger
            and row["gpu_memory_gib"] <= memory
            and (not row["gradient_checkpointing"] or True in checkpointing)
        ):
            size = "1-row" if row["tokens_per_micro_batch"] is None else f"{row['tokens_per_micro_batch']:,}-token"
            return "yes", f"measured: {size} micro-batches peaked at {row['peak_mem_gb']} GB ({row['source']})"
    shape = MODELS.get(cfg.model.id)
    nearest = [r for r in rows if budget is None or r["tokens_per_micro_batch"] == budget]
    peaks = [f"{r['peak_mem_gb']} GB peak on {r['gpu']} ({r['source']})" for r in nearest[:2]]
    weights = f"; measured elsewhere: {', '.join(peaks)}" if peaks else ""
    if shape:
        per_gpu = shape.weights_gib(cfg.model.experts) / (world if cfg.training.distributed == "fsdp" else 1)
        weights += f"; the weights take ~{per_gpu:.0f} GiB of each {memory} GiB GPU"
    return "unknown", f"not measured for this setting on {memory} GiB GPUs{weights}"


def _choices(cfg: Config, notes: list[str]) -> list[tuple[Target, Size, bool]]:
    """(target, size, configured): the configured size first, then every target's sizes (asked of each target's
    record: a new target takes part without a change here)."""
    own = get_target(cfg.target)
    configured = own.configured_size(cfg)
    if configured is None:
        notes.append(f"target {own.name}: {own.unrented}; the table compares the cloud targets")
    first = [(own, configured, True)] if configured is not None else []
    return first + [(target, size, False) for target in registered_targets() for size in target.sizes(cfg)
                     if (target, size) != (own, configured)]  # fmt: skip


def _chooses_types(target: Target, cfg: Config) -> bool:
    """A target that offers several instance types names each one that does not fit (plan's left_out); one whose
    type is fixed (a cluster's) has no alternative to name."""
    return len({size.instance_type for size in target.sizes(cfg)}) > 1


def plan(
    cfg: Config,
    tokens: int | None = None,
    prices: dict[str, float] | None = None,
    online: bool = True,
    all_types: bool = False,
) -> Plan:
    """The table `toolkit plan` prints: the configured target first, then the alternatives that fit."""
    from toolkit import limits

    epoch_tokens, tokens_source = data_tokens(cfg, tokens)
    result = Plan(cfg.name, cfg.model.id, epoch_tokens, tokens_source)
    rows = []
    for target, size, configured in _choices(cfg, result.notes):
        fits, fits_detail = memory_fit(cfg, size.instance_type, size.gpus)
        if fits == "no" and not configured and not all_types:
            if _chooses_types(target, cfg):
                result.left_out.append(f"{size.instance_type}: {fits_detail}")
            continue
        rows.append((target, size, configured, fits, fits_detail))
    names = sorted({limits.quota_name(size.instance_type, size.usage) for _, size, *_ in rows})
    quota_values = limits.quotas(cfg.aws, names) if online else {
        name: limits.Quota(name, None, "not checked (--offline)") for name in names}  # fmt: skip
    for target, size, configured, fits, fits_detail in rows:
        instance_type, nodes = size.instance_type, size.nodes
        count, count_source = run_tokens(cfg, size.gpus, epoch_tokens)
        rate, basis, rate_detail = throughput(cfg, instance_type, size.gpus) if fits != "no" else (None, "none", "")
        hours = count / rate / 3600 if count and rate else None
        cost = limits.price(cfg.aws, instance_type, prices, online, size.usage)
        usd = cost.usd_per_hour * nodes if cost.usd_per_hour is not None else None
        spot = None
        if target.offers_spot and usd is not None and hours is not None:
            spot = (hours * usd * (1 - limits.shipped_prices()["spot"]["max_savings"]), hours * usd)
        quota = quota_values[limits.quota_name(instance_type, size.usage)]
        result.candidates.append(Candidate(
            target.name, instance_type, nodes, size.gpus, configured, fits, fits_detail, count, rate, basis,
            "; ".join(x for x in (count_source, rate_detail) if x), hours, usd, cost.source,
            hours * usd if hours is not None and usd is not None else None, spot, quota.name, quota.value,
            quota.detail, limits.quota_problem(quota, nodes),
        ))  # fmt: skip
    if any(c.hours is None for c in result.candidates) and epoch_tokens is None and not cfg.training.max_steps:
        result.notes.append(f"tokens: {tokens_source}")
    return result
