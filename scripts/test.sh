#!/usr/bin/env bash
# The test command: lint, format check, type check, then every test (unit and integration).
set -euo pipefail
cd "$(dirname "$0")/.."
# A real Slurm cluster for the HyperPod tests (Debian packages; the tests start and stop the daemons).
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  packages="slurm-wlm slurmctld slurmd slurm-client munge"
  apt-get install -y -qq --no-install-recommends $packages >/dev/null \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages >/dev/null; }
fi
EXTRAS=train,aws,dev source scripts/env.sh
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
"$VENV/bin/pytest" "$@"
