#!/usr/bin/env bash
# The batch rule, measured on the CPU at fixed steps (issue 110, docs/experiments.md entry 38): the peak learning
# rate and the warm-up at batch 8, 32 and 128 at equal images. One thread, one run at a time (the study runs
# beside other work on the 2-core machine: fixed steps, so only its wall time moves), from a copy of the code
# at the commit it starts from, so that work in the tree cannot change a run half-way.
#   bash experiments/batch_rule_runs.sh PLAN [DATA_ROOT] [OUT]
set -euo pipefail
PLAN=$(realpath "${1:?usage: bash experiments/batch_rule_runs.sh PLAN [DATA_ROOT] [OUT]}")
ROOT=$(realpath "${2:-../shared/cifar10}")
OUT=$(realpath -m "${3:-runs/batch_rule}")
PY=$(realpath -s "${PY:-.venv/bin/python}")  # -s: the venv's link, not the interpreter it points to
RESULTS=$(realpath experiments/batch_rule_results)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
CODE="$OUT/code"
if [ ! -d "$CODE" ]; then
    mkdir -p "$CODE" && git archive HEAD | tar -x -C "$CODE" && git rev-parse HEAD >"$CODE/COMMIT"
fi
# The GPU recipe shrunk to the CPU (entries 33 and 35): no flips (as entry 33), no validation during the run
# (the sweep scores every run's end on all 5,000 val images), no sample grids.
COMMON="--trainer.precision 32-true --model.compile false --model.config.n_layers 2 --model.config.d_model 128"
COMMON+=" --model.config.d_filter 256 --model.config.attention.n_heads 4 --data.random_flip false"
COMMON+=" --trainer.limit_val_batches 0 --trainer.callbacks null --trainer.log_every_n_steps 1"
mkdir -p "$OUT" "$RESULTS"
NAME=$(basename "$PLAN" .txt)
sed "s|COMMON|$COMMON|" "$PLAN" >"$OUT/$NAME.expanded.txt"  # (not the plan's own name: it may live in OUT)
cd "$CODE"
"$PY" -m experiments.budget_sweep --plan "$OUT/$NAME.expanded.txt" --data.root "$ROOT" --parallel 1 --out "$OUT" \
    --json "$RESULTS/$NAME.json"
