"""Model families are records (toolkit_train.families): every field of every record reaches the code that reads
it, and no module branches on a family's name instead."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest
from pydantic import ValidationError
from toolkit_train import families
from toolkit_train.families import FAMILIES, GENERIC, ModelFamily, family_of, known_family
from toolkit_train.settings import ModelSettings, TrainSettings

ROOT = Path(__file__).resolve().parents[3]
FAMILIES_MODULE = ROOT / "entrypoints" / "toolkit_train" / "families" / "__init__.py"
SERVING_COPY = ROOT / "containers" / "serving" / "serve.py"
DATA = {"source": "builtin:multilingual-thinking-sample"}
OTHER = "mistralai/Mistral-7B-v0.3"  # a causal LM no record claims: the generic family
FIELDS_CHECKED = {  # every ModelFamily field, and the test below that shows the code reading it
    "name", "chat_format", "model_type", "id_marker", "id_excludes", "id_requires", "example_id", "lora_modules",
    "expert_parameters", "all_linear_reaches_experts",
    "attention_kernels", "attention_reason", "decoder_layer", "fused_experts", "packed_mxfp4", "lora_serving_needs_gpu",
    "vllm_defaults", "serves_expert_adapters",
}  # fmt: skip


def hub_id(family: ModelFamily) -> str:
    """A hub id of the family's form that no size table knows (so that no model size check applies)."""
    assert family.id_marker and family.example_id, f"{family.name}: a family needs a name marker and an example id"
    return f"some-org/{family.example_id.split('/')[1]}-copy"


def test_every_family_field_is_covered_here():
    """A field added to the record without a test of the code that reads it fails here."""
    assert {f.name for f in fields(ModelFamily)} == FIELDS_CHECKED


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_a_family_is_found_by_hub_name_and_by_a_local_checkpoint(family, tmp_path):
    assert family_of(hub_id(family)) is family
    checkpoint = tmp_path / "renamed-copy"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": family.model_type}))
    assert family_of(str(checkpoint)) is family, "a local copy need not carry the family's name"
    named = tmp_path / hub_id(family).split("/")[1]
    named.mkdir()
    (named / "config.json").write_text(json.dumps({"model_type": "some_other_moe"}))
    assert family_of(str(named)) is GENERIC, "a checkpoint here is what its config says, whatever its name"
    assert ModelSettings(id=str(checkpoint)).family is family
    assert known_family("/fsx/not-here", is_path=True) is None, "a path that exists only where the job runs"
    assert family_of(OTHER) is GENERIC and known_family(OTHER, is_path=False) is GENERIC


def test_qwen3_moe_ids_carry_dense_qwen3s_marker_and_are_told_apart(tmp_path):
    """Qwen3-MoE ids carry dense Qwen3's marker (qwen3) and name their active parameters (-A3B, -A22B) or say "moe":
    another architecture (qwen3_moe: other decoder layers, a router, 3-D experts), its own record. A checkpoint here
    is still what its config.json says, whatever its name."""
    from toolkit_train.families import QWEN3, QWEN3_MOE

    moe_ids = ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-Coder-30B-A3B-Instruct",
               "some-org/qwen3-moe-tiny", "builtin:tiny-qwen3-moe")  # fmt: skip
    for moe in moe_ids:
        assert family_of(moe) is QWEN3_MOE, moe
    for dense in ("Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-32B",
                  "builtin:tiny-qwen3", "some-org/qwen3-moebius-8b"):  # fmt: skip
        assert family_of(dense) is QWEN3, dense
    for other in ("Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen/Qwen3-Next-80B-A3B-Instruct",
                  "Qwen/Qwen3-Omni-30B-A3B-Instruct"):  # fmt: skip
        assert family_of(other) is GENERIC, other  # another architecture: not guessed as either (#67)
    renamed = tmp_path / "Qwen3-30B-A3B-distilled-dense"
    renamed.mkdir()
    (renamed / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert family_of(str(renamed)) is QWEN3
    (renamed / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    assert family_of(str(renamed)) is QWEN3_MOE


def test_every_familys_example_is_its_own_and_no_one_elses():
    for family in FAMILIES:
        assert family.example_id and [f for f in FAMILIES if f.holds(family.example_id)] == [family], family.name


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_attention_kernels_a_family_refuses_are_refused_with_its_reason(family):
    kernels = ("eager", "flex_attention", "sdpa")
    for kernel in kernels:
        settings = {"id": hub_id(family), "attn_implementation": kernel}
        if family.attention_kernels is None or kernel in family.attention_kernels:
            ModelSettings.model_validate(settings)
            continue
        with pytest.raises(ValidationError, match=re.escape(family.attention_reason) + ": set model.attn_impl"):
            ModelSettings.model_validate(settings)
    ModelSettings.model_validate({"id": OTHER, "attn_implementation": "sdpa"})  # generic: anything


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_lora_targets_are_checked_against_the_family_names(family):
    model = {"id": hub_id(family)}
    assert family.lora_modules, f"{family.name}: name its LoRA-able modules"
    TrainSettings.model_validate({"model": model, "data": DATA, "lora": {"target_modules": list(family.lora_modules)}})
    with pytest.raises(ValidationError, match=f"{family.name} has no module.*gate_proj_typo"):
        TrainSettings.model_validate({"model": model, "data": DATA, "lora": {"target_modules": ["gate_proj_typo"]}})
    if family.expert_parameters:
        TrainSettings.model_validate(
            {"model": model, "data": DATA, "lora": {"target_parameters": list(family.expert_parameters), "dropout": 0}}
        )
    with pytest.raises(ValidationError, match=f"{family.name} has no parameter"):
        TrainSettings.model_validate(
            {"model": model, "data": DATA, "lora": {"target_parameters": ["mlp.nope"], "dropout": 0}}
        )
    # the generic family checks no names (it cannot know them)
    TrainSettings.model_validate({"model": {"id": OTHER}, "data": DATA, "lora": {"target_modules": ["x"]}})


def test_all_linear_is_asked_by_name_where_peft_reads_it_as_the_experts_too(tiny_model_path, tiny_qwen3_path,
                                                                             tiny_qwen3_moe_path):  # fmt: skip
    """peft's MoE conversion reads `all-linear` on Qwen3-MoE as transformers v4's linear layers: the router and every
    expert too (gate_up_proj at twice the rank; with dropout PEFT then fails at training). The record says which
    families do (checked against peft on each tiny model), and their configs ask for the modules by name."""
    from peft import LoraConfig, get_peft_model
    from toolkit_train.families import GPT_OSS, QWEN3, QWEN3_MOE
    from transformers import AutoModelForCausalLM

    for path, family in ((tiny_model_path, GPT_OSS), (tiny_qwen3_path, QWEN3), (tiny_qwen3_moe_path, QWEN3_MOE)):
        model = AutoModelForCausalLM.from_pretrained(path)
        adapted = get_peft_model(model, LoraConfig(target_modules="all-linear", lora_dropout=0.0)).peft_config
        assert bool(adapted["default"].target_parameters) is family.all_linear_reaches_experts, family.name
    for family in FAMILIES:
        config = {"model": {"id": hub_id(family)}, "data": DATA, "lora": {"target_modules": "all-linear"}}
        if not family.all_linear_reaches_experts:
            TrainSettings.model_validate(config)
            continue
        with pytest.raises(ValidationError, match=f"all-linear on {family.name} adapts, to peft, the router and every"):
            TrainSettings.model_validate(config)
        TrainSettings.model_validate({**config, "lora": {"target_modules": list(family.lora_modules)}})
        left_out = TrainSettings.model_validate({**config, "lora": {"r": 4}}).lora
        assert left_out.target_modules == list(family.lora_modules), "the default is the family's modules by name"


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_packed_mxfp4_experts_are_offered_only_where_the_family_has_them(family):
    config = {"model": {"id": hub_id(family), "experts": "mxfp4"}, "data": DATA, "lora": {"target_parameters": []}}
    if family.packed_mxfp4:
        TrainSettings.model_validate(config)
    with pytest.raises(ValidationError, match="model.experts: mxfp4 is for"):
        TrainSettings.model_validate({**config, "model": {"id": OTHER, "experts": "mxfp4"}})


def test_the_training_code_reads_decoder_layer_and_fused_experts_from_the_record():
    """FSDP's wrap class and the fused experts come from the record (the CPU training tests run them for real:
    tests/toolkit_train/kernels/test_moe.py, test_train.py); here: the readers exist, and for each family the decoder
    layer is a class its transformers architecture has."""
    import transformers

    train = (ROOT / "entrypoints" / "toolkit_train" / "run" / "trainer.py").read_text()
    model = (ROOT / "entrypoints" / "toolkit_train" / "run" / "model.py").read_text()
    assert "family.decoder_layer" in train and "family.fused_experts" in model
    for family in FAMILIES:
        if family.decoder_layer:
            module = importlib.import_module(f"transformers.models.{family.model_type}.modeling_{family.model_type}")
            assert hasattr(module, family.decoder_layer), (family.name, family.decoder_layer, transformers.__version__)


def test_lora_serving_needs_gpu_is_what_local_deploy_refuses_on_a_cpu(tmp_path):
    from toolkit.deploy.local import _adapter_family

    for family in FAMILIES:
        adapter = tmp_path / family.name / "adapter"
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": hub_id(family)}))
        assert _adapter_family(adapter.parent) is family
    assert _adapter_family(tmp_path / "no-adapter") is None


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.expert_parameters], ids=lambda f: f.name)
def test_an_expert_adapter_served_as_an_adapter_is_refused_where_vllm_cannot_load_it(family):
    from pydantic import ValidationError

    from toolkit.config import Config

    config = {"name": "experts", "model": {"id": hub_id(family)}, "data": DATA,
              "lora": {"target_parameters": list(family.expert_parameters), "dropout": 0},
              "serving": {"weights": "adapter"}}  # fmt: skip
    if family.serves_expert_adapters:
        Config.model_validate(config)
    else:
        with pytest.raises(ValidationError, match="serve the merged model"):
            Config.model_validate(config)
    Config.model_validate({**config, "serving": {"weights": "merged"}})


def test_the_serving_image_copy_of_the_vllm_defaults_is_the_records():
    spec = importlib.util.spec_from_file_location("serve", SERVING_COPY)
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)  # type: ignore[union-attr]
    records = {f.model_type: (f.id_marker, f.vllm_defaults) for f in FAMILIES if f.vllm_defaults}
    assert records == serve.FAMILY_DEFAULTS
    # a family trained through its chat template is served with the parsers its model's template calls for
    assert set(serve.TEMPLATE_FAMILIES) == {f.model_type for f in FAMILIES if f.chat_format == "template"}


def test_no_module_branches_on_a_family_name():
    """A family's name marker, model type and layer class are literals only in its record (inside longer strings,
    messages and docs, they are fine): a new `if "gpt-oss" in id` or `== "gpt_oss"` fails here."""
    names = "|".join(re.escape(v) for f in FAMILIES for v in (f.id_marker, f.model_type, f.decoder_layer) if v)
    branch = re.compile(rf"""(["'])({names})\1""")  # the bare name as a literal: a comparison, a lookup, a list
    offenders = []
    for folder in ("toolkit", "entrypoints", "containers"):
        for path in (ROOT / folder).rglob("*.py"):
            if path in (FAMILIES_MODULE, SERVING_COPY):  # the record, and the image's copy tied to it above
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if branch.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "use the family record (toolkit_train/families/__init__.py):\n" + "\n".join(offenders)


def test_the_prompt_parity_check_runs_in_every_familys_chat_format(monkeypatch):
    """Deploy compares the served prompts with training's rendering in the family's format (a template with the
    model's tokenizer); a causal LM of no family record with its own template, as trained (issue 66)."""
    from toolkit_train.families.formats import for_family

    import toolkit.sdk
    from toolkit.config import Config

    def config(model_id: str) -> Config:
        return Config.model_validate({"name": "parity", "model": {"id": model_id}, "data": DATA})

    # no hub here: the hub ids' tokenizers are stood in for (loading one is tested in tests/toolkit/test_model_input.py)
    monkeypatch.setattr(toolkit.sdk, "_tokenizer", lambda cfg, load: f"tokenizer of {cfg.model.id}")
    for family in FAMILIES:
        chat_format, tokenizer = toolkit.sdk.trained_rendering(config(hub_id(family)))  # type: ignore[misc]
        assert chat_format is for_family(family), family.name
        assert tokenizer == (f"tokenizer of {hub_id(family)}" if chat_format.renders_with_tokenizer else None)
    assert toolkit.sdk.trained_rendering(config(OTHER)) == (for_family(GENERIC), f"tokenizer of {OTHER}")


def test_every_family_has_a_chat_format_training_renders():
    """A record names its format (families/formats.py); the generic family renders through the model's own chat
    template (a model without one is refused: tests/toolkit/test_model_input.py)."""
    from toolkit_train.families.formats import FORMATS, for_family

    for family in FAMILIES:
        assert family.chat_format in FORMATS and for_family(family) is FORMATS[family.chat_format], family.name
    assert for_family(GENERIC) is FORMATS["template"]


def test_a_new_family_is_a_record_and_nothing_else(monkeypatch, tmp_path):
    """A family added as a record alone (a fake one; the tiny Qwen3's tokenizer under its own model_type) is found by
    its hub name and by a local checkpoint, has its LoRA names checked, is trainable, and its rows render in the
    format it names: no other module needed a change (and test_no_module_branches_on_a_family_name keeps it so)."""
    import shutil

    from toolkit_train.builtin.tiny_qwen3 import tiny_qwen3_path
    from toolkit_train.data import IGNORE_INDEX, chat_format_of, load_rows, prepare
    from toolkit_train.families.formats import CHAT_TEMPLATE
    from transformers import AutoTokenizer

    from toolkit import sdk
    from toolkit.config import Config

    fake = ModelFamily(name="fake-lm", chat_format="template", model_type="fake_lm", id_marker="fake-lm",
                       lora_modules=("q_proj", "v_proj"))  # fmt: skip
    monkeypatch.setattr(families, "FAMILIES", (*FAMILIES, fake))
    assert family_of("some-org/Fake-LM-7B") is fake and family_of(OTHER) is GENERIC
    checkpoint = tmp_path / "renamed"
    shutil.copytree(tiny_qwen3_path(), checkpoint, ignore=shutil.ignore_patterns("*.safetensors"))
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "fake_lm"}))
    lora = {"target_modules": ["q_proj"]}
    config = Config.model_validate({"name": "fake", "model": {"id": str(checkpoint)}, "data": DATA, "lora": lora})
    assert config.model.family is fake
    with pytest.raises(ValidationError, match="fake-lm has no module.*gate_proj"):
        TrainSettings.model_validate({"model": {"id": str(checkpoint)}, "data": DATA,
                                      "lora": {"target_modules": ["gate_proj"]}})  # fmt: skip
    sdk.require_trainable(config)
    assert chat_format_of(config.model) is CHAT_TEMPLATE
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    rows = load_rows(config.data.source).select(range(2))
    dataset = prepare(rows, tokenizer, config.data, chat_format=chat_format_of(config.model))
    trained = tokenizer.decode([t for t in dataset[0]["labels"] if t != IGNORE_INDEX])
    assert trained.startswith("<think>") and trained.endswith(f"{rows[0]['final']}<|im_end|>")


def test_a_hub_model_downloaded_before_is_told_by_its_config_not_its_name(tmp_path, monkeypatch):
    """A hub id in the Hugging Face cache is what its config.json says (read offline): a fine-tune named without the
    family's marker is found, and a name that carries a marker but another architecture is not claimed by it."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))

    def cached(model_id: str, model_type: str) -> None:
        repo = tmp_path / ("models--" + model_id.replace("/", "--"))
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("abc123")
        (repo / "snapshots" / "abc123").mkdir(parents=True)
        (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps({"model_type": model_type}))

    cached("acme/support-bot-v2", "qwen3_moe")
    cached("acme/qwen3-style-llama", "llama")
    assert family_of("acme/support-bot-v2").name == "qwen3-moe"
    assert family_of("acme/qwen3-style-llama") is GENERIC
    assert family_of("acme/never-downloaded") is GENERIC and family_of("acme/qwen3-8b-never-downloaded").name == "qwen3"
