#!/usr/bin/env bash
# The test command: lint, format check, type check, then every test (unit and integration).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=train,aws,dev source scripts/env.sh
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
"$VENV/bin/pytest" "$@"
