#!/usr/bin/env bash
# Issue 77, item 1(b): is a 100-step re-warm-up enough for a continuation without Adam's moments? The GPU
# recipe CPU-sized, cut in two through the lease format and continued to the uncut run's steps, against
# the uncut run, two seeds, every figure on all 5,000 val images (docs/experiments.md entry 32).
#   bash experiments/rewarmup_runs.sh [DATA_ROOT] [OUT]     # about 100 minutes of two busy cores
set -euo pipefail
ROOT=$(realpath "${1:-../shared/cifar10}")
OUT=$(realpath -m "${2:-runs/rewarmup}")
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
mkdir -p "$OUT"
sweep() { sed "s|RUNS/|$OUT/|g" "experiments/rewarmup_plan_$1.txt" >"$OUT/plan_$1.txt"
  "$PY" -m experiments.budget_sweep --plan "$OUT/plan_$1.txt" --data.root "$ROOT" --parallel 2 --out "$OUT" \
      --json "$OUT/$1.json"; }
sweep a
for seed in 0 1; do
  "$PY" -m imagetx.training.continuation pack "$OUT/lease1_1500_s$seed/checkpoints/continue.ckpt" \
      "$OUT/packed_s$seed" --moments none
done
sweep b
sweep c
