"""`toolkit plan` and the quota/price preflight of `toolkit train`.

Offline: the shipped throughput table (built from bench/results) and price file. Online: the AWS emulator (moto
server) over HTTP. moto 5.2 implements neither the Price List API (GetProducts answers HTTP 500) nor SageMaker's
Service Quotas (ListServiceQuotas answers 500; ListAWSDefaultServiceQuotas knows only `vpc`): those two clients
are botocore Stubbers here (the only mocks), which check every request against botocore's service model, and the
requests are validated again with tests.botocore_model. Everything else (credentials, SageMaker) is the emulator.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from toolkit_train.run import checkpoints, prepared
from typer.testing import CliRunner

from tests.botocore_model import assert_valid_call
from tests.runs import held_out_rows
from toolkit import limits, sdk
from toolkit.cli import app
from toolkit.config import load_config, preset_names
from toolkit.config.instances import INSTANCES
from toolkit.plan import THROUGHPUT_FILE, throughput_table
from toolkit.targets.base import get_target

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(autouse=True)
def price_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "_cache_file", lambda: tmp_path / "prices.json")  # no answer another test cached
    monkeypatch.setattr(limits, "_unreachable", set())  # nor a region an earlier test in this process found offline


def test_the_shipped_throughput_table_is_the_one_built_from_bench_results():
    spec = importlib.util.spec_from_file_location("throughput_table", REPO / "bench" / "throughput_table.py")
    assert spec and spec.loader
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert json.loads(THROUGHPUT_FILE.read_text()) == builder.build(), "run python bench/throughput_table.py"
    for row in throughput_table()["rows"]:
        assert (REPO / row["source"]).is_file(), row


@pytest.mark.parametrize("preset", preset_names())
def test_plan_prints_the_table_offline_for_every_preset(preset, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: an AWS call would fail
    result = runner.invoke(app, ["plan", preset, "--offline", "--tokens", "1000000", "--json"])
    assert result.exit_code == 0, result.output
    planned = json.loads(result.stdout)
    assert planned["candidates"], planned
    shipped = limits.shipped_prices()["training"]
    for c in planned["candidates"]:
        assert c["quota_detail"] == "not checked (--offline)"
        if c["target"] == "hyperpod":  # billed under HyperPod's own usage type: no training rate passed off as it
            assert c["usd_per_hour"] is None and f"pass --price {c['instance_type']}=USD" in c["price_source"]
        elif c["instance_type"] in shipped:
            assert c["usd_per_hour"] == pytest.approx(shipped[c["instance_type"]] * c["nodes"])
            assert c["price_source"].startswith("shipped price file")
        if c["tokens_per_s"] is not None:  # a figure always says how it was reached and from which file
            assert c["throughput"] in ("measured", "scaled", "estimated") and "bench/results/" in c["throughput_detail"]
            assert c["hours"] == pytest.approx(c["tokens"] / c["tokens_per_s"] / 3600)
        if c["cost_usd"] is not None:
            assert c["cost_usd"] == pytest.approx(c["hours"] * c["usd_per_hour"])
    table = runner.invoke(app, ["plan", preset, "--offline"])
    assert table.exit_code == 0 and "candidate" in table.stdout, table.output


def test_the_configured_target_comes_first_and_what_does_not_fit_is_left_out():
    cfg = load_config("gpt-oss-120b-lora-1node", ["target=training-job", "training_job.instance_type=ml.p5.48xlarge"])
    planned = sdk.plan(cfg, online=False)
    first = planned.candidates[0]
    assert first.configured and (first.target, first.instance_type) == ("training-job", "ml.p5.48xlarge")
    assert first.fits == "yes" and "train_throughput_1gpu_h100_80gb.json" in first.fits_detail  # measured limit
    assert first.throughput == "scaled"  # measured per GPU, times 8 GPUs
    assert first.tokens == 50 * 8192 * 8  # max_steps x a full micro-batch x GPUs
    left = {line.split(":", 1)[0] for line in planned.left_out}
    assert "ml.g5.xlarge" in left and "ml.p5.48xlarge" not in left  # 120b's packed weights exceed 24 GiB
    assert {c.instance_type for c in planned.candidates} | left == set(INSTANCES)
    # a micro-batch measured to run out of memory on 80 GB GPUs: p5 no longer fits, the H200 types still do
    oom = load_config("gpt-oss-120b-lora-1node", ["training.tokens_per_micro_batch=24576"])
    types = {c.instance_type: c.fits for c in sdk.plan(oom, online=False, all_types=True).candidates}
    assert types["ml.p5.48xlarge"] == "no" and types["ml.p5en.48xlarge"] == "yes"


def test_a_dense_qwen3_is_sized_by_its_bf16_weights():
    """Qwen3-8B's shape is in the table the checks use: the plan names its bf16 weights (8.19 B parameters, ~15 GiB)
    on each GPU and claims no fit it has not measured."""
    planned = sdk.plan(load_config("qwen3-8b-lora", ["target=training-job"]), online=False)
    first = planned.candidates[0]
    assert first.configured and first.instance_type == "ml.g6e.2xlarge"
    assert first.fits == "unknown" and "the weights take ~15 GiB of each 48 GiB GPU" in first.fits_detail, first


def test_a_qwen3_moe_is_sized_by_its_bf16_weights_experts_included():
    """Qwen3-30B-A3B's shape is in the table: 30.53 B parameters (28.99 B of them experts, which it stores in bf16,
    not MXFP4), ~57 GiB on each GPU; the plan claims no fit it has not measured."""
    planned = sdk.plan(load_config("qwen3-30b-a3b-lora", ["target=training-job"]), online=False)
    first = planned.candidates[0]
    assert first.configured and first.instance_type == "ml.p5.48xlarge"
    assert first.fits == "unknown" and "the weights take ~57 GiB of each 80 GiB GPU" in first.fits_detail, first


def test_tokens_come_from_data_prepare_statistics_while_they_describe_this_config(tmp_path, monkeypatch):
    """runs/<name>/prepared's sealed statistics count the data; prepared with another max_length (or left
    without its seal) they are not this config's tokens, and plan says why it did not use them."""
    monkeypatch.chdir(tmp_path)
    cfg = load_config("gpt-oss-20b-lora")
    assert sdk.plan(cfg, online=False).data_tokens is None  # a hub dataset, never prepared here
    directory = tmp_path / "runs" / cfg.name / "prepared"
    directory.mkdir(parents=True)
    (directory / "state.json").write_text("{}")
    stats = {"tokens": 1_234_567}
    checkpoints.seal(directory, prepared.record(cfg.data.source, "train", cfg.data, cfg.model, stats))
    planned = sdk.plan(cfg, online=False)
    assert planned.data_tokens == 1_234_567 and "toolkit data prepare" in planned.data_tokens_source
    assert all(c.tokens == 1_234_567 for c in planned.candidates)  # num_epochs: 1
    longer = load_config("gpt-oss-20b-lora", ["data.max_length=4096"])
    stale = sdk.plan(longer, online=False)
    assert stale.data_tokens is None and "data.max_length (prepared with 2048, this config: 4096)" in (
        stale.data_tokens_source
    )
    held_out = sdk.plan(load_config("gpt-oss-20b-lora", ["data.eval.fraction=0.25"]), online=False)
    assert held_out.data_tokens is None and "data.eval (prepared with None" in held_out.data_tokens_source
    (directory / checkpoints.SEAL).unlink()
    (directory / prepared.UNSEALED_STATS).write_text(json.dumps(stats))  # an interrupted (older) prepare
    unsealed = sdk.plan(cfg, online=False)
    assert unsealed.data_tokens is None and "no completion record" in unsealed.data_tokens_source


def test_price_override_beats_every_other_source():
    cfg = load_config("gpt-oss-20b-lora", ["target=training-job"])
    planned = sdk.plan(cfg, tokens=10**6, prices=limits.parse_price_overrides(["ml.p5.48xlarge=50"]), online=False)
    assert planned.candidates[0].usd_per_hour == 50 and planned.candidates[0].price_source == "--price"
    result = runner.invoke(app, ["plan", "gpt-oss-20b-lora", "--offline", "--price", "ml.p5.48xlarge=fifty"])
    refused(result, "--price", "TYPE=USD")


# -- online: the emulator, with the two clients it lacks stubbed ---------------------------------------------------


def refused(result, *fragments: str) -> str:
    """Exit 2, one clear line, no traceback (CliRunner's result)."""
    assert (result.exit_code == 2 and result.exception is None) or isinstance(result.exception, SystemExit), (
        result.output
    )
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in result.output, result.output
    return result.output


def stubbed(service: str, aws_env: dict) -> tuple:
    client = boto3.client(service, region_name="us-east-1", endpoint_url=aws_env["endpoint"])
    return client, Stubber(client)


def quota_page(values: dict[str, float]) -> dict:
    return {"Quotas": [{"ServiceCode": "sagemaker", "QuotaName": name, "QuotaCode": f"L-{i:08X}", "Value": value}
                       for i, (name, value) in enumerate(values.items())]}  # fmt: skip


def product(instance_type: str, usd: float, usage: str = "Train") -> str:
    return json.dumps({
        "product": {"attributes": {"instanceName": instance_type, "usagetype": f"USE1-{usage}:{instance_type}"}},
        "terms": {"OnDemand": {"T": {"priceDimensions": {"D": {"unit": "Hrs", "pricePerUnit": {"USD": str(usd)}}}}}},
    })  # fmt: skip


def test_plan_reads_the_price_list_api_and_service_quotas(aws_env, monkeypatch):
    cfg = load_config("gpt-oss-20b-lora", ["target=training-job"])
    order = list(dict.fromkeys(c.instance_type for c in sdk.plan(cfg, tokens=10**6, online=False).candidates))
    quotas, quota_stub = stubbed("service-quotas", aws_env)
    names = {limits.quota_name(t, limits.TRAINING_JOB) for t in order}
    names.add(limits.quota_name(cfg.hyperpod.instance_type, limits.CLUSTER))
    applied = {"ml.p5.48xlarge for training job usage": 0.0}  # a new account's default for p5
    quota_stub.add_response("list_service_quotas", quota_page(applied), {"ServiceCode": "sagemaker"})
    defaults = {"ml.p5en.48xlarge for training job usage": 2.0}
    quota_stub.add_response("list_aws_default_service_quotas", quota_page(defaults), {"ServiceCode": "sagemaker"})
    pricing, price_stub = stubbed("pricing", aws_env)
    for index, instance_type in enumerate(order):
        request = limits.price_list_request("us-east-1", instance_type)
        assert_valid_call("pricing", "get_products", request)
        listed = [product(instance_type, 1000.0 + index, "Host"), product(instance_type, 10.0 + index)]
        price_stub.add_response("get_products", {"PriceList": listed, "FormatVersion": "aws_v1"}, request)
    assert_valid_call("service-quotas", "list_service_quotas", {"ServiceCode": "sagemaker"})
    monkeypatch.setattr(limits, "quotas_client", lambda settings: quotas)
    monkeypatch.setattr(limits, "pricing_client", lambda settings: pricing)
    with quota_stub, price_stub:
        planned = sdk.plan(cfg, tokens=10**6)
        price_stub.assert_no_pending_responses()
        quota_stub.assert_no_pending_responses()
    by_type = {(c.target, c.instance_type, c.nodes): c for c in planned.candidates}
    p5 = by_type[("training-job", "ml.p5.48xlarge", 1)]
    assert p5.usd_per_hour == 10.0 + order.index("ml.p5.48xlarge") and p5.price_source.startswith("AWS Price List API")
    assert p5.quota == 0 and "'ml.p5.48xlarge for training job usage' is 0" in (p5.problem or "")
    assert by_type[("training-job", "ml.p5en.48xlarge", 1)].quota == 2 and not by_type[
        ("training-job", "ml.p5en.48xlarge", 1)].problem  # fmt: skip
    assert by_type[("hyperpod", "ml.p5.48xlarge", 1)].quota is None  # listed by neither: said, not guessed
    assert len(names) >= 2
    # the second plan reads the prices from the cache (no GetProducts response is left to give)
    monkeypatch.setattr(limits, "quotas", lambda settings, wanted: {n: limits.Quota(n, None, "x") for n in wanted})
    with price_stub:
        again = sdk.plan(cfg, tokens=10**6)
    assert again.candidates[0].price_source.startswith("AWS Price List API (us-east-1, cached")


def test_against_the_emulator_alone_plan_says_what_it_could_not_read(aws_env):
    """moto answers ListServiceQuotas and GetProducts with HTTP 500: plan still prints, each figure sourced."""
    result = runner.invoke(app, ["plan", "gpt-oss-20b-lora", "--target", "training-job", "--tokens", "1000000",
                                 "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    shown = result.stdout[result.stdout.index("{\n") :]  # the in-process moto server prints its 500s to stdout too
    first = json.loads(shown)["candidates"][0]
    assert first["quota"] is None and first["quota_detail"].startswith("quota not read")
    assert first["price_source"].startswith("shipped price file")


def train_args(aws_env) -> list[str]:
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    Path("chat.jsonl").write_text(json.dumps(row) + "\n")
    return ["train", "gpt-oss-20b-lora", "--target", "training-job", "--set", f"aws.role={aws_env['role']}",
            "--set", f"aws.bucket={aws_env['bucket']}", "--set", "data.source=chat.jsonl",
            "--set", "data.format=messages"]  # fmt: skip


def test_a_zero_quota_refuses_train_before_anything_is_submitted(aws_env, monkeypatch):
    quotas, stub = stubbed("service-quotas", aws_env)
    stub.add_response("list_service_quotas", quota_page({"ml.p5.48xlarge for training job usage": 0.0}),
                      {"ServiceCode": "sagemaker"})  # fmt: skip
    monkeypatch.setattr(limits, "quotas_client", lambda settings: quotas)
    with stub:
        result = runner.invoke(app, train_args(aws_env))
    output = refused(result, "Service Quota 'ml.p5.48xlarge for training job usage' is 0", "request 1 or more")
    assert len([line for line in output.splitlines() if line.strip()]) == 1, output
    assert boto3.client("sagemaker", region_name="us-east-1").list_training_jobs()["TrainingJobSummaries"] == []
    assert not list(Path(".").glob("runs/*/training-job.json"))


def test_preflight_line_names_quota_and_price(aws_env, monkeypatch):
    quotas, stub = stubbed("service-quotas", aws_env)
    stub.add_response("list_service_quotas", quota_page({"ml.p5.48xlarge for training job usage": 4.0}),
                      {"ServiceCode": "sagemaker"})  # fmt: skip
    monkeypatch.setattr(limits, "quotas_client", lambda settings: quotas)
    lines: list[str] = []
    cfg = load_config("gpt-oss-20b-lora", ["target=training-job"])
    with stub:
        get_target(cfg.target).preflight(cfg, lines.append)
    shipped = limits.shipped_prices()["training"]["ml.p5.48xlarge"]
    assert lines == [lines[0]] and "= 4;" in lines[0] and f"${shipped:,.2f}/h on demand" in lines[0]


def test_plan_reads_the_token_count_data_prepare_measured_without_the_held_out_rows(tmp_path):
    prepared = tmp_path / "prepared"
    held = ["--set", "data.eval.fraction=0.25"]
    made = runner.invoke(app, ["data", "prepare", "tiny-gpt-oss-local", "--output", str(prepared), "--json", *held])
    assert made.exit_code == 0, made.output
    report = json.loads(made.stdout[made.stdout.index("{") :])
    assert report["held_out_rows"] == held_out_rows()
    assert report["training_tokens"] + report["held_out_tokens"] == report["tokens"]
    planned = runner.invoke(app, ["plan", "tiny-gpt-oss-local", "--offline", "--json", "--set",
                                  f"data.source={prepared}", *held])  # fmt: skip
    assert planned.exit_code == 0, planned.output
    shown = json.loads(planned.stdout)
    assert shown["data_tokens"] == report["training_tokens"] > 0
    assert "toolkit data prepare" in shown["data_tokens_source"]
