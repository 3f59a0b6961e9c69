#!/usr/bin/env bash
# Issue 49's CPU proof (docs/results.md, "A schedule that can be continued"): two slots of one thread,
# side by side, each a budget_sweep of fixed-step runs scored on all 5,000 val images.
#   bash experiments/continuation_runs.sh [DATA_ROOT]     # ~75 minutes on the 2-core CPU
set -euo pipefail
ROOT=${1:-../shared/cifar10}
OUT=runs/continuation
PY=.venv/bin/python
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
sweep() { $PY -m experiments.budget_sweep --plan "$1" --data.root "$ROOT" --parallel 1 --out "$OUT" --json "$2"; }
(
  sweep experiments/continuation_plan_a.txt $OUT/a.json
  for moments in fp32 second none; do
    $PY -m imagetx.training.continuation pack $OUT/lease1_1500_s0/checkpoints/continue.ckpt \
        $OUT/packed_$moments --moments $moments
  done
  sweep experiments/continuation_plan_a2.txt $OUT/a2.json
) > $OUT.slot_a.log 2>&1 &
sweep experiments/continuation_plan_b.txt $OUT/b.json > $OUT.slot_b.log 2>&1 &
wait
