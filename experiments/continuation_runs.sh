#!/usr/bin/env bash
# Issue 49's CPU proof (docs/results.md, "A schedule that can be continued"): fixed-step runs of
# quick.yaml, one thread each, two to three side by side, each plan a budget_sweep scored on all
# 5,000 val images.
#   bash experiments/continuation_runs.sh [DATA_ROOT]     # ~100 minutes on the 2-core CPU
set -euo pipefail
ROOT=${1:-../shared/cifar10}
OUT=runs/continuation
PY=.venv/bin/python
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
sweep() { $PY -m experiments.budget_sweep --plan "experiments/continuation_plan_$1.txt" --data.root "$ROOT" \
    --parallel 1 --out "$OUT" --json "$OUT/$1.json"; }
mkdir -p $OUT
(
  sweep a                       # the first lease: 1,500 steps, its continuation at step 1,200
  for moments in fp32 second none; do
    $PY -m imagetx.training.continuation pack $OUT/lease1_1500_s0/checkpoints/continue.ckpt \
        $OUT/packed_$moments --moments $moments
  done
  sweep a2 & sweep c & sweep d  # the second leases; warmup-stable-decay's second seed at 1,500 steps
  wait
) > $OUT.slot_a.log 2>&1 &
sweep b > $OUT.slot_b.log 2>&1 &  # warmup-stable-decay against the cosine at 3,000 steps
wait
