#!/usr/bin/env bash
# The main job on the embedded default: build a tiny gpt-oss offline, LoRA-train it on the bundled
# multilingual sample through the real entrypoint, and print where the adapter and merged model are.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
"$VENV/bin/toolkit" config validate tiny-gpt-oss-local
"$VENV/bin/toolkit" train tiny-gpt-oss-local --fresh "$@"
