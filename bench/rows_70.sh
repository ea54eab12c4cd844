#!/usr/bin/env bash
# #70's owed rows on one GPU, in two device calls of under 10 minutes each (each sub-run under its own timeout, so
# a slow one leaves the next its share; a killed run still leaves its per-variant JSON lines in the log).
#   bash bench/rows_70.sh a   # 20b vs the recipe (same run), 120b 16k recomputation compiled + eager (as 80 GB)
#   bash bench/rows_70.sh b   # 120b expert LoRA r4 12k (as 80 GB), the timing helper's check, DPO 24 layers varied
# Logs and result JSON go to $OUT when it is set (the device machine), else /tmp/rows_70.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rows_70}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
start=$SECONDS
left() { echo $((${1:-570} - (SECONDS - start))); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu_$1.txt"
case "$1" in
a)
  timeout 300 python3 bench/train_throughput.py --variants recipe,toolkit-12k-compiled,toolkit-8k-compiled \
    --steps 6 --rows 400 --tag _70_20b 2>&1 | tee "$OUT/log_20b"
  timeout "$(left)" python3 bench/train_throughput.py --variants 120b-mxfp4-16k-gc-compiled,120b-mxfp4-16k-gc \
    --steps 4 --rows 400 --gpu-memory-gb 85.52 --tag _70_120b 2>&1 | tee "$OUT/log_120b"
  ;;
b)
  timeout 170 python3 bench/train_throughput.py --variants 120b-mxfp4-12k-gc-experts-r4 --steps 4 \
    --gpu-memory-gb 85.52 --tag _70_experts 2>&1 | tee "$OUT/log_experts"
  timeout 130 python3 bench/train_throughput.py --variants moe-block,fp8-block,fp8-gemm --budget 8192 \
    --tag _70_timing 2>&1 | tee "$OUT/log_timing"
  budget=$(($(left) - 25))
  timeout "$(left)" python3 bench/dpo_throughput.py --layers 24 --variants toolkit-unpacked,toolkit --no-gate \
    --length-sigma 0.5 --budget-s "$budget" --name dpo_throughput_1gpu_70_24layers_varied 2>&1 | tee "$OUT/log_dpo"
  ;;
esac
cp bench/results/*_70_* "$OUT/" 2>/dev/null
ls -la "$OUT"
echo "rows_70 $1 done in $((SECONDS - start)) s"
