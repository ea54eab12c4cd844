#!/usr/bin/env bash
# The main job on the embedded default: build a tiny gpt-oss offline, LoRA-train it on the bundled
# multilingual sample through the real entrypoint, serve the merged model with vLLM on this machine through
# the serving container's entry script, and ask it a question (reasoning in French, asked in German).
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_SERVE=1 source scripts/env.sh
toolkit="$VENV/bin/toolkit"
"$toolkit" config validate tiny-gpt-oss-local
"$toolkit" train tiny-gpt-oss-local --fresh "$@"
"$toolkit" deploy tiny-gpt-oss-local --target local &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
"$toolkit" invoke tiny-gpt-oss-local "Wie viele Planeten hat unser Sonnensystem?" \
  --reasoning-language French --target local --wait 600 --max-tokens 48
