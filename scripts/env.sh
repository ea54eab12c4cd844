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
