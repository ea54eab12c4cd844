#!/usr/bin/env bash
# The main job on the embedded default: build a tiny gpt-oss offline (pre-trained once to speak the harmony
# format, then cached), LoRA-train it on the bundled multilingual sample through the real entrypoint, serve the
# merged model with vLLM on this machine through the serving container's entry script, and ask it one of the
# sample's questions (asked in German, reasoning in French). The reasoning (analysis channel) and the answer
# (final channel) are printed apart; the demo fails unless the served model produced both.
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_SERVE=1 source scripts/env.sh
toolkit="$VENV/bin/toolkit"
"$toolkit" config validate tiny-gpt-oss-local
"$toolkit" train tiny-gpt-oss-local --fresh "$@"
"$toolkit" deploy tiny-gpt-oss-local --target local &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
"$toolkit" invoke tiny-gpt-oss-local "Wie viele Minuten hat ein Tag?" --reasoning-language French \
  --target local --wait 600 --max-tokens 160 --temperature 0 --check
echo
echo "The main job works: trained, merged, served by vLLM, answered with its reasoning apart."
echo "Next: toolkit lives in $VENV (source $VENV/bin/activate, or run $toolkit); see README.md, 'Use'."
