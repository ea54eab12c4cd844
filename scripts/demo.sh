#!/usr/bin/env bash
# The main job on the embedded default: build a tiny gpt-oss offline (pre-trained once to speak the harmony
# format, then cached), LoRA-train it on the bundled multilingual sample through the real entrypoint, serve the
# merged model with vLLM on this machine through the serving container's entry script, and ask it one of the
# sample's questions (asked in German, reasoning in French). The reasoning (analysis channel) and the answer
# (final channel) are printed apart; the demo fails unless the served model produced both. Then `toolkit eval`
# serves the base and the fine-tuned model in turn and prints them side by side on the rows training held out
# (validation loss, ROUGE-L, chrF, reasoning language, format validity).
set -euo pipefail
cd "$(dirname "$0")/.."
# every extra: the environment it leaves (.venv) runs every verb the README shows, the AWS ones included
EXTRAS=${EXTRAS:-train,eval,aws} WITH_SERVE=1 source scripts/env.sh
installed=$SECONDS  # the README states both times: the installs (cached once per machine), then the main job
toolkit="$VENV/bin/toolkit"
held_out=(--set data.eval.fraction=0.25 --set data.eval.steps=10)  # 15 of the sample's 60 rows, never trained on
# what the fine-tune is for: reasoning in the named language, its 95% interval above zero (toolkit register's gate)
gate=(--set registry.gate.metric=reasoning_language --set registry.gate.require_ci=true)
"$toolkit" config validate tiny-gpt-oss-local
"$toolkit" train tiny-gpt-oss-local "${held_out[@]}" --fresh "$@"
"$toolkit" deploy tiny-gpt-oss-local "${held_out[@]}" --target local &
server=$!
stop_server() { kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true; }
trap stop_server EXIT
"$toolkit" invoke tiny-gpt-oss-local "Wie viele Minuten hat ein Tag?" --reasoning-language French \
  --target local --wait 600 --max-tokens 160 --temperature 0 --check
stop_server  # eval starts vLLM servers of its own, one model at a time (two would not fit a small machine)
echo
"$toolkit" eval tiny-gpt-oss-local "${held_out[@]}" "${gate[@]}" --max-tokens 128
echo
echo "The main job works ($((SECONDS - installed)) s after $installed s of installs): trained, merged, served by vLLM,"
echo "answered with its reasoning apart, and evaluated"
echo "against its base model on the held-out rows (the table above; runs/tiny-gpt-oss-local/eval/ has the report)."
echo "Next: toolkit lives in $VENV (source $VENV/bin/activate, or run $toolkit); see README.md, 'Use'."
