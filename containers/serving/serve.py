"""SageMaker hosting contract -> vLLM's OpenAI server.

Model: /opt/ml/model (SM_MODEL_DIR). The toolkit's training output holds merged/ (served as is) and adapter/
(served with --enable-lora on top of SM_VLLM_BASE_MODEL when set, named SM_VLLM_ADAPTER_NAME).
Settings: SM_VLLM_<FLAG>=value becomes --<flag> value (SM_VLLM_TENSOR_PARALLEL_SIZE=8 ->
--tensor-parallel-size 8; "true" -> a bare flag).
gpt-oss gets its reasoning and tool-call parsers by default. Exit code 2 with a message when the model
directory is missing, empty or unreadable.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PREFIX = "SM_VLLM_"
OWN = {"SM_VLLM_HOST", "SM_VLLM_PORT", "SM_VLLM_BASE_MODEL", "SM_VLLM_ADAPTER_NAME"}  # read here, not passed through
GPT_OSS_DEFAULTS = {
    "--reasoning-parser": "openai_gptoss",
    "--tool-call-parser": "openai",
    "--enable-auto-tool-choice": None,
}


class ModelDirError(Exception):
    pass


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
        flag = "--" + key[len(PREFIX) :].lower().replace("_", "-")
        value = env[key]
        if value.lower() == "true":
            flags.append(flag)
        elif value.lower() != "false":
            flags += [flag, value]
    return flags


def command(env: dict[str, str]) -> list[str]:
    root = Path(env.get("SM_MODEL_DIR", "/opt/ml/model"))
    flags = flags_from_env(env)
    base = env.get("SM_VLLM_BASE_MODEL")
    adapter = root / "adapter"
    if base and (adapter / "adapter_config.json").is_file():
        model = base
        name = env.get("SM_VLLM_ADAPTER_NAME") or "adapter"  # requests select it by this name
        flags += ["--enable-lora", "--lora-modules", f"{name}={adapter}"]
        model_type = ""
    else:
        path = model_path(root)
        model = str(path)
        model_type = json.loads((path / "config.json").read_text()).get("model_type", "")
    if model_type == "gpt_oss" or "gpt-oss" in model:
        for flag, value in GPT_OSS_DEFAULTS.items():
            if flag not in flags:
                flags += [flag] if value is None else [flag, value]
    host, port = env.get("SM_VLLM_HOST", "0.0.0.0"), env.get("SM_VLLM_PORT", "8080")
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", host, "--port", port,
            "--model", model, *flags]  # fmt: skip


def main() -> None:
    try:
        argv = command(dict(os.environ))
    except ModelDirError as exc:
        print(f"serve: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    print("serve: " + " ".join(argv), flush=True)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
