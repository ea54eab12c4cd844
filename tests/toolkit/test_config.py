"""The config: every shipped YAML validates, every broken one fails naming its field, schema and models agree."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from toolkit_train.settings import from_hyperparameters, to_hyperparameters

from toolkit.config import Config, ConfigError, load_config, preset_names
from toolkit.config.loader import read_source

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
ENV = {"AWS_ACCOUNT_ID": "123456789012", "TRAINING_IMAGE": f"{ECR}/toolkit-training:train-0123456789ab"}
EKS_EXAMPLE = REPO / "examples" / "gpt-oss-120b-hyperpod-eks.yaml"


def test_presets_are_the_documented_ones():
    assert preset_names() == [
        "gpt-oss-120b-lora",
        "gpt-oss-120b-lora-1node",
        "gpt-oss-20b-lora",
        "qwen3-30b-a3b-lora",
        "qwen3-8b-lora",
        "tiny-gemma-local",
        "tiny-gpt-oss-dpo",
        "tiny-gpt-oss-grpo",
        "tiny-gpt-oss-local",
        "tiny-gpt-oss-tools-local",
        "tiny-llama-local",
        "tiny-qwen3-local",
        "tiny-qwen3-moe-local",
    ]


def test_the_one_node_120b_preset_differs_from_the_recipe_preset_only_where_it_says():
    recipe, one_node = load_config("gpt-oss-120b-lora"), load_config("gpt-oss-120b-lora-1node")
    assert one_node.lora == recipe.lora and one_node.data == recipe.data
    differences = {k for k, v in one_node.training.model_dump().items() if recipe.training.model_dump()[k] != v}
    assert differences == {"distributed", "fsdp_sharding", "gradient_checkpointing"}
    assert (one_node.model.experts, recipe.model.experts) == ("mxfp4", "bf16")


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_validates(preset):
    assert load_config(preset).name == preset


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates(example):
    assert load_config(example, env=ENV).name


def built_training_image() -> str:
    """The URI `toolkit image build training -c gpt-oss-120b-lora` prints (its content-hash tag), built nowhere."""
    from toolkit.deploy.image import build_context, context_tag, image_spec

    spec = image_spec(load_config("gpt-oss-120b-lora", ["aws.region=us-west-2"]), "training")
    with build_context("training") as context:
        tag = context_tag(context, spec.base_image, spec.tag_prefix)
    return f"123456789012.dkr.ecr.us-west-2.amazonaws.com/{spec.repository}:{tag}"


def test_the_eks_example_runs_the_image_the_build_prints():
    image = built_training_image()
    assert load_config(EKS_EXAMPLE, env={**ENV, "TRAINING_IMAGE": image}).hyperpod.image == image
    latest = image.rsplit(":", 1)[0] + ":latest"
    refusal = r"hyperpod.image: tag 'latest' of .*/toolkit-training, an immutable .* use the tag it prints"
    with pytest.raises(ConfigError, match=refusal):
        load_config(EKS_EXAMPLE, env={**ENV, "TRAINING_IMAGE": latest})


@pytest.mark.parametrize(
    "override",
    [f"hyperpod.image={ECR}/toolkit-training:latest", f"hyperpod.image={ECR}/toolkit-training:v1",
     f"hyperpod.image={ECR}/toolkit-training", f"hyperpod.image={ECR}/toolkit-training:serve-0123456789ab",
     f"training_job.image_uri={ECR}/toolkit-training:latest", f"serving.image_uri={ECR}/toolkit-serving:latest"],
)  # fmt: skip
def test_a_mutable_tag_on_the_stacks_immutable_repositories_is_refused(override):
    with pytest.raises(ConfigError, match=override.split("=")[0] + ": tag"):
        load_config("gpt-oss-20b-lora", [override])


@pytest.mark.parametrize(
    "override",
    [f"hyperpod.image={ECR}/my-own-images:latest", f"hyperpod.image={ECR}/toolkit-training@sha256:{'a' * 64}",
     f"hyperpod.image={ECR}/tk-training:train-0123456789ab", "serving.image_uri=localhost:5000/toolkit-serving",
     "hyperpod.image=localhost:5000/toolkit-training:latest"],
)  # fmt: skip
def test_other_repositories_and_digests_keep_any_tag(override):
    overrides = [override, "hyperpod.image_repository=tk-training"] if "tk-training:train" in override else [override]
    assert load_config("gpt-oss-20b-lora", overrides)


def test_databricks_recipe_settings():
    cfg = load_config("gpt-oss-20b-lora")
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules) == (
        8,
        16,
        0.05,
        "all-linear",
    )
    assert cfg.training.gradient_accumulation_steps == 2
    assert (cfg.training.lr_scheduler, cfg.training.min_lr_rate) == ("cosine_with_min_lr", 0.1)
    assert cfg.model.dequantize_mxfp4 and cfg.model.dtype == "bfloat16"


# aws/sagemaker-hyperpod-recipes, llmft_gpt_oss_120b_seq4k_gpu_sft_lora.yaml (read 2026-11-30, commit 1d2f3f9)
HYPERPOD_RECIPE = {
    "max_len": 4096, "r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "learning_rate": 1e-4,
    "lr_scheduler": "cosine", "lr_warmup_ratio": 0.1, "adam_betas": (0.9, 0.95), "weight_decay": 0.0,
    "max_norm": 1.0, "sharding_strategy": "HYBRID_SHARD", "devices": 8,
}  # fmt: skip


def test_hyperpod_recipe_settings():
    """The preset is the public recipe's, except the differences its comments state (steps, packing,
    recomputation, attention kernel)."""
    cfg, recipe = load_config("gpt-oss-120b-lora"), HYPERPOD_RECIPE
    t = cfg.training
    assert (cfg.data.max_length, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (
        recipe["max_len"], recipe["r"], recipe["lora_alpha"], recipe["lora_dropout"])  # fmt: skip
    assert (t.learning_rate, t.lr_scheduler, t.warmup_ratio, t.weight_decay, t.max_grad_norm) == (
        recipe["learning_rate"], recipe["lr_scheduler"], recipe["lr_warmup_ratio"], recipe["weight_decay"],
        recipe["max_norm"])  # fmt: skip
    assert (0.9, t.adam_beta2) == recipe["adam_betas"]  # beta1: AdamW's default
    assert t.distributed == "fsdp" and t.fsdp_sharding == recipe["sharding_strategy"].lower()
    assert cfg.hyperpod.gpus_per_node == recipe["devices"]
    assert t.max_steps == 50 and t.save_steps == 10  # stated differences: the walkthrough's short run


def _schema():
    return Config.model_json_schema()


@pytest.mark.parametrize("source", preset_names() + [str(p) for p in EXAMPLES])
def test_schema_validates_every_shipped_yaml(source):
    # Examples compose a preset through `base:`; the schema checks the resolved document.
    resolved = load_config(source, env=ENV).model_dump(mode="json", exclude_none=True)
    jsonschema.validate(resolved, _schema())
    _, text = read_source(source)
    raw = yaml.safe_load(text)
    raw.pop("base", None)
    for section in raw:  # and every key as written exists in the schema
        assert section in _schema()["properties"], section


BROKEN = [
    (
        {
            "model": {"id": "openai/gpt-oss-20b", "experts": "mxfp4"},
            "lora": {"target_parameters": []},
            "training": {"distributed": "fsdp"},
        },
        "model.experts: mxfp4 trains with",
    ),
    (
        {"model": {"id": "builtin:tiny-gpt-oss", "experts": "mxfp4"}, "lora": {"target_parameters": []}},
        "builtin:tiny-gpt-oss is not one",
    ),
    (
        {"model": {"id": "Qwen/Qwen3-0.6B", "experts": "mxfp4"}, "lora": {"target_parameters": []}},
        "model.experts: mxfp4 is for gpt-oss",
    ),
    ({"model": {"id": "/no/such/checkpoint"}}, "model.id: /no/such/checkpoint is not a directory on this machine"),
    ({"target": "training-job", "model": {"id": "/fsx/models/base"}}, "a training job cannot read the local"),
    ({"lora": {"rnak": 16}}, "lora.rnak: unknown key; did you mean 'r'?"),
    ({"training": {"learning_rate": "fast"}}, "training.learning_rate"),
    ({"training": {"warmup_ratio": 1.5}}, "training.warmup_ratio"),
    ({"lora": {"target_parameters": ["mlp.experts.gate_up_proj"], "dropout": 0.1}}, "set lora.dropout to 0"),
    ({"lora": {"target_parameters": [], "expert_r": 4}}, "lora.expert_r does nothing without lora.target_parameters"),
    (
        {"target": "hyperpod", "hyperpod": {"orchestrator": "slurm", "cluster": "c"}},
        "hyperpod.cluster: 'c' applies only with hyperpod.orchestrator: eks",
    ),
    (
        {"training_job": {"instance_type": "ml.p9.huge"}},
        "training_job.instance_type: unknown GPU instance type",
    ),
    ({"training_job": {"spot": True, "max_wait_seconds": 100, "max_run_seconds": 3600}}, "max_wait_seconds"),
    ({"hyperpod": {"instance_type": "ml.g5.xlarge", "gpus_per_node": 4}}, "has 1 GPUs"),
    ({"model": {"id": "openai/gpt-oss-20b", "attn_implementation": "sdpa"}}, "sinks"),
    ({"model": {"id": "builtin:huge"}}, "unknown builtin model"),
    ({"aws": {"role": "my-role"}}, "aws.role must be an IAM role ARN"),
    ({"name": "has spaces"}, "name"),
    ({"serving": {"instance_type": "ml.g5.xlarge", "tensor_parallel_size": 2}}, "tensor_parallel_size"),
    ({"trainer": {}}, "trainer: unknown key; did you mean 'training'?"),
    (
        {"model": {"id": "openai/gpt-oss-20b"}, "serving": {"instance_type": "ml.g6e.2xlarge"}},
        "merged openai/gpt-oss-20b is ~39 GiB of weights but ml.g6e.2xlarge",
    ),
    ({"lora": {"target_modules": ["q_proj", "gate_proj"]}}, "lora.target_modules: gpt-oss has no module(s) gate_proj"),
    ({"lora": {"target_parameters": ["mlp.experts.up_proj"]}}, "lora.target_parameters: gpt-oss has no parameter"),
    ({"training": {"tokens_per_micro_batch": 256}}, "training.tokens_per_micro_batch (256) is below data.max_length"),
    ({"local": {"output_dir": "runs/{nmae}"}}, "local.output_dir: unknown placeholder(s) {nmae}"),
    ({"hyperpod": {"job_dir": "/fsx/{user}/x"}}, "hyperpod.job_dir: unknown placeholder(s) {user}"),
    ({"serving": {"model_data": "/tmp/model"}}, "serving.model_data: '/tmp/model' is not an s3:// URI"),
    ({"aws": {"bucket": "My_Bucket"}}, "aws.bucket: 'My_Bucket' is not a valid S3 bucket name"),
    ({"aws": {"region": "us-east1"}}, "aws.region: 'us-east1' is not an AWS region"),
    ({"serving": {"max_model_len": 256}}, "serving.max_model_len (256) is below data.max_length (512)"),
    ({"training_job": {"tags": {"k": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}}}, "an AWS secret access key"),
    (
        {"serving": {"instance_type": "ml.g6e.12xlarge", "volume_size_gb": 200}},
        "serving.volume_size_gb: ml.g6e.12xlarge serves from its NVMe instance storage",
    ),
    ({"training": {"report_to": ["mlflow"]}}, "training.mlflow.tracking_uri is not set"),
    ({"training": {"mlflow": {"tracking_uri": "http://127.0.0.1:5000"}}}, "training.mlflow: a section with"),
    ({"training": {"report_to": ["mlflow"], "mlflow": {"tracking_uri": "mlflow.example.com"}}}, "tracking_uri"),
    (
        {"model": {"id": "openai/gpt-oss-20b"}, "serving": {"max_model_len": 200000}},
        "serving.max_model_len (200000) is above openai/gpt-oss-20b's context of 131072",
    ),
    (
        {
            "model": {"id": "openai/gpt-oss-20b"},
            "serving": {"instance_type": "ml.p5.48xlarge", "tensor_parallel_size": 6},
        },
        "serving.tensor_parallel_size (6) does not divide openai/gpt-oss-20b's 64 attention heads",
    ),
    (
        {"model": {"id": "openai/gpt-oss-120b"}, "target": "training-job", "training": {"distributed": "ddp"}},
        "training.distributed: ddp puts all of openai/gpt-oss-120b (~218 GiB, in bf16) on each 80 GiB GPU",
    ),
]


def test_ddp_rule_lets_a_model_that_fits_one_gpu_through():
    assert load_config("gpt-oss-20b-lora", ["target=training-job"]).training.distributed == "ddp"  # 39 GiB on 80
    assert load_config("gpt-oss-120b-lora", ["target=training-job"]).training.distributed == "fsdp"


def test_the_serving_size_check_counts_gib_as_gib():
    """gpt-oss-120b merged is ~218 GiB: it fits 4 H100s of a p5.48xlarge (320 GiB) with room for the KV cache."""
    cfg = load_config("gpt-oss-120b-lora", ["serving.instance_type=ml.p5.48xlarge", "serving.tensor_parallel_size=4"])
    assert cfg.serving.tensor_parallel_size == 4
    with pytest.raises(ConfigError, match="~218 GiB of weights"):
        load_config("gpt-oss-120b-lora", ["serving.instance_type=ml.p5.48xlarge", "serving.tensor_parallel_size=2"])


def test_packed_experts_are_sized_as_mxfp4_for_training_and_serving():
    """model.experts: mxfp4 holds ~61 GiB of 120b (experts at 4.25 bits): ddp on 141 GiB H200s passes, on 48 GiB
    L40S GPUs it is refused naming the size; the merged model it writes is sized the same way for serving."""
    cfg = load_config("gpt-oss-120b-lora-1node", ["target=training-job"])
    assert cfg.model.experts == "mxfp4" and cfg.training.distributed == "ddp"
    with pytest.raises(ConfigError, match=r"~61 GiB, experts in MXFP4\) on each 48 GiB GPU"):
        load_config("gpt-oss-120b-lora-1node", ["target=training-job", "training_job.instance_type=ml.g6e.48xlarge"])
    with pytest.raises(ConfigError, match=r"model.experts: mxfp4 \(~61 GiB\)"):  # the bf16 refusal offers it
        load_config("gpt-oss-120b-lora", ["target=training-job", "training.distributed=ddp"])
    load_config("gpt-oss-120b-lora-1node", ["serving.instance_type=ml.p5.48xlarge", "serving.tensor_parallel_size=2"])


def test_a_micro_batch_measured_to_run_out_of_memory_is_refused_before_launch():
    """120b with packed experts on 80 GB GPUs (bench/train_throughput.py --gpu-memory-gb 85.52): 16,384 tokens ran,
    24,576 ran out of memory. On H200s 24,576 ran (84.5 GB): the limit is per GPU size."""
    on_p5 = ["target=training-job", "training_job.instance_type=ml.p5.48xlarge"]
    assert load_config("gpt-oss-120b-lora-1node", [*on_p5, "training.tokens_per_micro_batch=16384"])
    with pytest.raises(ConfigError, match=r"24576 is too many .* 80 GiB GPUs of ml.p5.48xlarge.*16384 or less"):
        load_config("gpt-oss-120b-lora-1node", [*on_p5, "training.tokens_per_micro_batch=24576"])
    on_hyperpod = ["target=hyperpod", "hyperpod.cluster=c", "hyperpod.instance_type=ml.p5.48xlarge"]
    with pytest.raises(ConfigError, match="hyperpod.instance_type"):
        load_config("gpt-oss-120b-lora-1node", [*on_hyperpod, "training.tokens_per_micro_batch=32768"])
    with pytest.raises(ConfigError, match="24576 is too many"):  # without recomputation it needs more, not less
        load_config("gpt-oss-120b-lora-1node", [*on_p5, "training.gradient_checkpointing=false",
                                                "training.tokens_per_micro_batch=24576"])  # fmt: skip
    with pytest.raises(ConfigError, match="32768 is too many"):  # the default budget: one row of data.max_length
        load_config("gpt-oss-120b-lora-1node", [*on_p5, "data.max_length=32768", "serving.max_model_len=32768",
                                                "training.tokens_per_micro_batch=null"])  # fmt: skip
    assert load_config("gpt-oss-120b-lora-1node", ["target=training-job", "training.tokens_per_micro_batch=24576"])


@pytest.mark.parametrize(("change", "expected"), BROKEN, ids=[b[1][:40] for b in BROKEN])
def test_broken_configs_name_the_field(tmp_path, change, expected):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"base": "tiny-gpt-oss-local", **change}))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(str(path)), message
    assert expected in message, message


def test_yaml_syntax_error_has_line_number(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nlora:\n  r: [8\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: YAML syntax error at line \d+"):
        load_config(path)


def test_missing_file_and_unknown_preset():
    with pytest.raises(ConfigError, match="nope.yaml: no such file"):
        load_config("nope.yaml")
    with pytest.raises(ConfigError, match="neither a file nor a preset; presets: gpt-oss-120b-lora"):
        load_config("gpt-oss-7b")


def test_overrides_and_env_interpolation(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("base: tiny-gpt-oss-local\naws:\n  bucket: b-${ACCOUNT}\n  region: ${REGION:-eu-west-1}\n")
    cfg = load_config(
        path,
        ["lora.r=16", "training.report_to=[mlflow]", "training.mlflow.tracking_uri=http://127.0.0.1:5000"],
        env={"ACCOUNT": "42"},
    )
    assert cfg.lora.r == 16 and cfg.training.report_to == ["mlflow"]
    assert cfg.aws.bucket == "b-42" and cfg.aws.region == "eu-west-1"
    with pytest.raises(ConfigError, match=r"aws.bucket: environment variable ACCOUNT is not set"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match="lora.rank: unknown key"):
        load_config(path, ["lora.rank=4"], env={"ACCOUNT": "1"})
    with pytest.raises(ConfigError, match="section.field=value"):
        load_config(path, ["lora.r"], env={"ACCOUNT": "1"})


def test_set_keeps_text_fields_as_typed():
    """YAML would read 007 as 7 and 2024-01-01 as a date; a text field keeps the characters given."""
    cfg = load_config("tiny-qwen3-local", ["training_job.tags.run=007", "model.revision=2024-01-01",
                                           "model.id=Qwen/Qwen3-0.6B", "aws.prefix=007", "lora.r=16"])  # fmt: skip
    assert cfg.training_job.tags == {"run": "007"} and cfg.model.revision == "2024-01-01"
    assert cfg.aws.prefix == "007" and cfg.lora.r == 16
    # and null unsets an optional text setting, as in a YAML file (it was the text "null": an image named null)
    unset = load_config("tiny-gpt-oss-local", ["model.revision=abc", "model.revision=null", "serving.image_uri=~"])
    assert unset.model.revision is None and unset.serving.image_uri is None


@pytest.mark.parametrize("secret", ["hf_" + "a" * 34, "AKIA" + "B" * 16])
def test_secrets_are_refused(tmp_path, secret):
    path = tmp_path / "job.yaml"
    path.write_text(f"base: tiny-gpt-oss-local\ntraining_job:\n  tags:\n    token: {secret}\n")
    with pytest.raises(ConfigError, match="training_job.tags.token: looks like") as caught:
        load_config(path)
    assert secret not in str(caught.value)


def test_hyperparameters_round_trip_the_shared_schema():
    settings = load_config("gpt-oss-120b-lora").train_settings()
    flat = to_hyperparameters(settings)
    assert all(isinstance(v, str) for v in flat.values())
    assert flat["lora.r"] == "16"
    assert from_hyperparameters(flat) == settings
    assert from_hyperparameters(json.loads(json.dumps(flat))).lora.target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    ]


def test_docs_config_reference_is_current():
    from toolkit.config.reference import BEGIN, END, markdown

    readme = (REPO / "docs" / "config-reference.md").read_text()
    embedded = readme[readme.index(BEGIN) + len(BEGIN) : readme.index(END)]
    assert embedded.strip() == markdown().strip(), "run: python -m toolkit.config.reference (docs/config-reference.md)"


def test_local_memory_checks_use_this_machines_gpus_or_say_they_were_skipped(monkeypatch):
    """target local has no instance type: the GPU-size checks read this machine's GPUs (nvidia-smi). There is no
    GPU here, so the detection is replaced in this test (said so); without one the checks are named as skipped."""
    from typer.testing import CliRunner

    import toolkit.config.models as models
    from toolkit.cli import app

    args = ["config", "validate", "gpt-oss-120b-lora", "--set", "target=local", "--set", "training.distributed=ddp",
            "--set", "training.fsdp_sharding=full_shard"]  # fmt: skip
    monkeypatch.setattr(models, "local_gpus", lambda: (80,))
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2, refused.output
    assert "80 GiB GPU of this machine" in refused.output and "--target training-job" in refused.output
    assert "Traceback" not in refused.output
    monkeypatch.setattr(models, "local_gpus", lambda: ())
    skipped = CliRunner().invoke(app, args)
    assert skipped.exit_code == 0, skipped.output
    assert "not checked (no GPU on this machine to size them by): the model fits one GPU under ddp" in skipped.output


def test_every_registered_target_section_has_its_config_field_and_its_behaviour():
    """Adding a target: its settings section registers it; Config must hold the section and the module must exist."""
    import importlib

    from toolkit.config.models import Config
    from toolkit.config.targets import TARGET_SETTINGS
    from toolkit.targets.base import Target

    assert list(TARGET_SETTINGS) == ["local", "training-job", "hyperpod"]
    for name, section in TARGET_SETTINGS.items():
        assert Config.model_fields[section.section].annotation is section, name
        assert isinstance(importlib.import_module(section.module).TARGET, Target), name
    schema = Config.model_json_schema()["properties"]["target"]
    assert schema["enum"] == list(TARGET_SETTINGS)
