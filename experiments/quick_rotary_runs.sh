#!/usr/bin/env bash
# Issue 53's timed runs (docs/experiments.md, entry 18): the 14-minute presets with rotary positions
# and warmup-stable-decay, each scored on all 5,000 val images. A timed run needs the machine to
# itself: `alone` runs one with torch's default threads (both cores), the others two side by side
# on one thread each.
#   bash experiments/quick_rotary_runs.sh alone SEED          # README's `quick` row, seed SEED
#   bash experiments/quick_rotary_runs.sh pair RUN RUN         # two runs side by side, one thread each
#   bash experiments/quick_rotary_runs.sh beside RUN           # one, beside another one-thread training
# A RUN is quick:SEED, quick_superres:SEED, pixelcnn:SEED (experiments/pixelcnn_pp.py), or
# NAME:SEED:OVERRIDES (quick.yaml with the overrides, e.g. "lr12:0:--model.peak_lr 0.012").
# The slots run: alone 0; alone 1; pair quick:0 pixelcnn:0; pair quick_superres:1 quick:1;
# beside quick_superres:0 and beside "ema99:0:--trainer.callbacks+=...", each beside the completion
# model's training (docs/experiments.md, entry 18); then (entry 20, quick.yaml's decay over 20 %
# then) pair quick:0 "dec40:0:--model.decay_fraction 0.4", the same with seed 1, and, with the
# decay over 40 % in quick.yaml, alone 0 and alone 1; then (entry 22) pair "q40:0:" pixelcnn:0 and
# pair "q40:1:" pixelcnn:1 (quick.yaml as it is, under a new name: quick_1t_s0 holds entry 20's
# run); then (entry 25) pair "q40:2:" "dec60:2:--model.decay_fraction 0.6", the same with seed 3.
# Each slot takes about 17 minutes;
# DATA_ROOT (default ../shared/cifar10) names the data; results land in runs/quick53/NAME.json.
set -euo pipefail
ROOT=${DATA_ROOT:-../shared/cifar10}
OUT=runs/quick53
PY=.venv/bin/python
export WANDB_MODE=disabled

# train NAME CONFIG SEED [OVERRIDES...]: 14 minutes (the preset's max_time), then all val images
train() {
  local name=$1 config=$2 seed=$3; shift 3
  $PY -m imagetx.train --config "configs/$config.yaml" --data.root "$ROOT" --seed_everything "$seed" \
      --trainer.default_root_dir "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  $PY -m imagetx.evaluate --ckpt "$OUT/$name/checkpoints/last.ckpt" --data.root "$ROOT" --split val \
      | tail -1 > "$OUT/$name.json"
  echo "$name: $(cat "$OUT/$name.json")"
}

# one_thread RUN: a RUN of the usage above, on one torch thread
one_thread() {
  export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
  local kind seed overrides
  IFS=: read -r kind seed overrides <<< "$1"
  case $kind in
    quick|quick_superres) train "${kind}_1t_s$seed" "$kind" "$seed" ;;
    pixelcnn) $PY -m experiments.pixelcnn_pp --data.root "$ROOT" --max-minutes 14 --seed "$seed" \
                  --json "$OUT/pixelcnn_pp_s$seed.json" > "$OUT/pixelcnn_pp_s$seed.log" 2>&1
              echo "pixelcnn_pp_s$seed: $(tail -1 "$OUT/pixelcnn_pp_s$seed.log")" ;;
    # shellcheck disable=SC2086  # the overrides are words on purpose
    *) train "${kind}_1t_s$seed" quick "$seed" $overrides ;;
  esac
}

mkdir -p $OUT
case ${1:-} in
  alone) train "quick_s$2" quick "$2" ;;
  pair) one_thread "$2" & one_thread "$3" & wait ;;
  beside) one_thread "$2" ;;
  *) echo "usage: $0 alone SEED | pair RUN RUN | beside RUN (see the head of this file)" >&2; exit 2 ;;
esac
