#!/usr/bin/env bash
# The test command: lint, format check, type check, then every test (unit and integration), pytest's slowest
# durations at the end. `--quick` (first argument): lint, types and the unit tests only, no engines, on two
# workers (development; CI always runs everything). Other arguments go to pytest. docs/testing.md: what each
# module starts, the budget.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--quick" ]; then
  shift
  EXTRAS=train,aws,dev,eval source scripts/env.sh
  "$VENV/bin/ruff" check .
  "$VENV/bin/ruff" format --check .
  "$VENV/bin/mypy"
  exec "$VENV/bin/pytest" -q -n 2 --dist loadfile -m "not integration" --durations=10 "$@"
fi
# Real engines for the integration tests (Debian packages; the tests start and stop the daemons by PID):
# a two-node Slurm cluster (HyperPod Slurm), dockerd + a registry (the serving image's build and push).
need=""
for tool in slurmctld munged dockerd docker-registry; do command -v "$tool" >/dev/null || need=1; done
if [ -n "$need" ]; then
  packages="slurm-wlm slurmctld slurmd slurm-client munge docker.io docker-registry"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends $packages >/dev/null \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages >/dev/null; }
fi
# .venv: the toolkit with training, AWS and test tooling; .venv-serve: vLLM (CPU build here) for serving tests
EXTRAS=train,aws,dev,eval WITH_SERVE=1 source scripts/env.sh
# The builtin tiny models the tests load (pre-trained once per machine, cached: tiny_model.py, tiny_qwen3.py), built
# in the background from here on: on a fresh machine their minutes of CPU overlap the next environments' downloads,
# the checks and the demo (which waits for the plain one under the cache's lock), and no test's fixture builds one
# against its 900 s limit beside the other worker's tests. Nothing to do where they are cached.
"$VENV/bin/python" -c 'from toolkit_train.run.model import resolve_model_path
from toolkit_train.settings import BUILTIN_MODELS, ModelSettings
for model in BUILTIN_MODELS: resolve_model_path(ModelSettings(id=model))' > .tiny-models.log 2>&1 &
tiny_models=$!
stop_tiny_models() { pkill -P "$tiny_models" 2>/dev/null || true; kill "$tiny_models" 2>/dev/null || true; }
trap stop_tiny_models EXIT  # a failed check stops the build (each step may fail: the trap runs under set -e)
# .venv-hyperpod: the HyperPod SDK's job models, to validate rendered manifests (its pins clash with .venv's).
# Only its pydantic models are loaded, so it goes in without its dependencies (none of its telemetry code runs).
hyperpod_spec="sagemaker-hyperpod==3.12.0"
build_hyperpod_venv() { _pip "$1" pydantic && _pip "$1" --no-deps "$hyperpod_spec"; }
hyperpod_entry=$(cached_venv "$(venv_key hyperpod <(echo "$hyperpod_spec"))" build_hyperpod_venv)
link_venv .venv-hyperpod "$hyperpod_entry"
# .venv-slim: the README's `pip install .` (no extras), where tests/test_newcomer.py runs what it must run or refuse
make_slim_venv .venv-slim
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
# The main job exactly as the README runs it, in a fresh environment holding only what the demo installs
# itself (a missing dependency fails here). It shares the vLLM environment and the tiny-model cache.
if [ -z "${SKIP_DEMO:-}" ]; then
  VENV=.venv-demo bash scripts/demo.sh 2>&1 | tee .demo.log
  grep -q "^reasoning: ." .demo.log && grep -q "^answer: ." .demo.log
  # the base-vs-fine-tuned table on at least 12 held-out rows: a generative metric and the validation loss, both
  # models with a number, and registry.gate's verdict on reasoning_language (what the fine-tune is for)
  grep -qE "^\| rougeL \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \|" .demo.log
  grep -qE "^\| validation loss \(lower is better\) \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \|" .demo.log
  grep -qE "^registry.gate: gate passed: reasoning_language" .demo.log
  # what the fine-tune is for, learned on rows neither model saw (the skill above the base); its cost printed beside it
  "$VENV/bin/python" scripts/main_job_check.py runs/tiny-gpt-oss-local/eval/report.json
  # the README's table is the recorded run docs/results/main-job.json (tests/test_docs_results.py): say whether this
  # machine reproduced it (the bases and the date are pinned; another CPU's arithmetic may still differ)
  "$VENV/bin/python" - <<'RECORD'
import json
from toolkit.evaluate.report import markdown
table = lambda r: [line for line in markdown(r, r.get("validation")).splitlines() if line.startswith("|")]
fresh, record = (json.load(open(p)) for p in ("runs/tiny-gpt-oss-local/eval/report.json", "docs/results/main-job.json"))
same = table(fresh) == table(record)
print("the main job reproduced its record, docs/results/main-job.json" if same else
      "note: the main job's table differs from its record, docs/results/main-job.json (its checks passed):\n"
      + "\n".join(table(fresh)))
RECORD
fi
wait "$tiny_models" || { cat .tiny-models.log; echo "error: building the tiny models failed (above)" >&2; exit 1; }
# two workers, each module on one (its module fixtures made once): engine start-ups and waits overlap on a 2-core machine
CI=${CI:-1} "$VENV/bin/pytest" -n 2 --dist loadfile --durations=40 "$@"
