"""The serving image's extension step against what vLLM's own Dockerfile says about the vllm-openai image's Python
(containers/serving/vllm-image-facts.json, read by hand): the base image cannot be pulled here, so the facts read
from its Dockerfile decide the install command, and the facts must have been recorded for the pinned release."""

from __future__ import annotations

import json
import re
import shlex

from toolkit.deploy.image import SERVING_CONTEXT

FACTS = SERVING_CONTEXT / "vllm-image-facts.json"
# The install command each layout of the image's Python requires: a new layout read from a new release fails here
# until it has its command (KeyError), instead of the Dockerfile keeping a step written for another layout.
REQUIRED_INSTALL = {
    ("system", "uv"): ["uv", "pip", "install", "--system"],  # no venv: --system, or uv refuses to pick the python
    ("venv", "uv"): ["uv", "pip", "install"],  # VIRTUAL_ENV set in the image: uv installs into it
    ("system", "pip"): ["python3", "-m", "pip", "install"],
}


def dockerfile() -> str:
    return (SERVING_CONTEXT / "Dockerfile").read_text()


def pins() -> dict[str, str]:
    return dict(line[len("ARG ") :].split("=", 1) for line in dockerfile().splitlines() if re.match(r"ARG \w+=", line))


def install_commands() -> list[list[str]]:
    """Every package-install command in the Dockerfile's RUN steps (continuation lines joined)."""
    joined = re.sub(r"\\\n", " ", dockerfile())
    commands = []
    for line in joined.splitlines():
        if not line.startswith("RUN "):
            continue
        for part in re.split(r";|&&|\|\||\bthen\b|\bfi\b", line[len("RUN ") :]):
            words = shlex.split(part)
            if "install" in words and any(w in ("pip", "uv") for w in words):
                commands.append(words)
    return commands


def test_the_facts_were_recorded_for_the_pinned_vllm():
    facts = json.loads(FACTS.read_text())
    assert facts["pin"] == pins()["VLLM_VERSION"], (
        f"{FACTS.name} was recorded for vLLM {facts['pin']}, the Dockerfile pins {pins()['VLLM_VERSION']}: read "
        f"{facts['source']['path']} at the new tag and record what it says"
    )
    assert facts["source"]["wanted_tag"] == f"v{pins()['VLLM_VERSION']}"
    assert pins()["BASE_IMAGE"] == "vllm/vllm-openai:v${VLLM_VERSION}"
    if not facts["source"]["is_the_tag"]:  # said plainly in the file: what was read instead, and why
        assert re.fullmatch(r"[0-9a-f]{40}", facts["source"]["read_at_commit"]) and facts["source"]["why_not_the_tag"]


def test_the_extension_step_installs_the_way_the_image_requires():
    facts = json.loads(FACTS.read_text())
    required = REQUIRED_INSTALL[(facts["python"], facts["installer"])]
    commands = install_commands()
    assert commands, "no install step found in the serving Dockerfile"
    for words in commands:
        assert words[: len(required)] == required, f"{' '.join(words)!r}: vLLM's image requires {' '.join(required)}"
    pinned = f"transformers=={pins()['TRANSFORMERS_VERSION']}"
    assert any(
        w.replace("${TRANSFORMERS_VERSION}", pins()["TRANSFORMERS_VERSION"]) == pinned for c in commands for w in c
    )


def test_the_command_check_reads_every_install_step(tmp_path, monkeypatch):
    """The parser the check rests on: a pip step next to the uv one is seen (and would fail the check above)."""
    (tmp_path / "Dockerfile").write_text(
        'FROM base\nRUN if [ -n "x" ]; then \\\n      uv pip install --system "a==1"; \\\n    fi && pip install b\n'
    )
    monkeypatch.setattr(f"{__name__}.SERVING_CONTEXT", tmp_path)
    assert install_commands() == [["uv", "pip", "install", "--system", "a==1"], ["pip", "install", "b"]]
