#!/usr/bin/env bash
# The recipe per GPU-minute, measured on the CPU at fixed steps (docs/experiments.md entry 33): attention span,
# head size, batch and width at equal images, and many epochs of a 1,000-image subset with dropout 0,
# dropout 0.1 and flips. One thread a run, two at a time.
#   bash experiments/recipe_minute_runs.sh PLAN [DATA_ROOT] [OUT]
# PLAN: experiments/recipe_minute_plan.txt (the first part, of which base_s0 and full_s0 ran), then
# experiments/recipe_minute_plan_2.txt (the rest, as run).
set -euo pipefail
PLAN=${1:?usage: bash experiments/recipe_minute_runs.sh PLAN [DATA_ROOT] [OUT]}
ROOT=$(realpath "${2:-../shared/cifar10}")
OUT=$(realpath -m "${3:-runs/recipe_minute}")
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
# The GPU recipe shrunk to the CPU: 2 layers of d 128 with the recipe's heads of 32, filter 2 x d, norm,
# rotary positions, DMOL head and warmup-stable-decay; quick's peak for d 128; float32, not compiled.
COMMON="--trainer.precision 32-true --model.compile false --model.config.n_layers 2 --model.config.d_model 128"
COMMON+=" --model.config.d_filter 256 --model.config.n_heads 4 --model.peak_lr 0.008 --model.warmup_steps 180"
COMMON+=" --data.batch_size 8 --data.eval_batch_size 32 --trainer.val_check_interval 250 --trainer.limit_val_batches 8"
mkdir -p "$OUT"
"$PY" -m experiments.subset_shards "$ROOT" "$OUT/cifar10_1000" --train 1000
NAME=$(basename "$PLAN" .txt)
sed "s|COMMON|$COMMON|; s|SUBSET|$OUT/cifar10_1000|" "$PLAN" >"$OUT/$NAME.txt"
# Training reads SUBSET where a run says so (its --data.root comes last); every run is scored on ROOT's val.
"$PY" -m experiments.budget_sweep --plan "$OUT/$NAME.txt" --data.root "$ROOT" --parallel 2 --out "$OUT" \
    --json "$OUT/$NAME.json"
