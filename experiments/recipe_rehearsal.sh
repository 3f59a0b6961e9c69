#!/usr/bin/env bash
# The recipe's whole schedule rehearsed on the CPU at the proxy's size (issue 110, docs/experiments.md entry 38):
# configs/cifar10_recipe.yaml itself, shrunk as entry 35's proxy (2 layers of d 128, 4 heads of 32, filter 256,
# peak 8e-3, warm-up 180, batch 8, float32) on its 1,720-image subset, growing inside the run to 4 layers at the
# recipe's point (40 epochs of the training images: 68,800 of the subset's) with flips from step 0 and one
# warmup-stable-decay over the whole run, for the FLOPs of entry 35's grown-with-flips arm (deepreg_s0/s1,
# val 3.372 / 3.369): 8,600 steps at 2 layers and 12,081 at 4, 20,681 in all, as that arm ended.
# Fixed steps, one thread, resumable across sessions: last.ckpt (every 500 steps) and the metrics are copied
# into experiments/recipe_rehearsal_results/ every 5 minutes, from which a later session goes on.
#   bash experiments/recipe_rehearsal.sh [DATA_ROOT]      # starts or resumes; detaches nothing (use setsid)
set -euo pipefail
SOURCE=$(realpath "${1:-../shared/cifar10}")
OUT=$(realpath -m runs/recipe_rehearsal)
RESULTS=$(realpath -m experiments/recipe_rehearsal_results)
PY=$(realpath -s "${PY:-.venv/bin/python}")
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
mkdir -p "$OUT" "$RESULTS"
# The code of the commit the rehearsal began at (a later session rebuilds the same copy from it).
[ -f "$RESULTS/COMMIT" ] || git rev-parse HEAD >"$RESULTS/COMMIT"
CODE="$OUT/code"
if [ ! -d "$CODE/imagetx" ]; then
    mkdir -p "$CODE" && git archive "$(cat "$RESULTS/COMMIT")" | tar -x -C "$CODE"
fi
SUBSET="$OUT/cifar10_1720"
[ -f "$SUBSET/train-0.npz" ] || (cd "$CODE" && "$PY" -m experiments.subset_shards "$SOURCE" "$SUBSET" --train 1720)
RUN="$OUT/run"
mkdir -p "$RUN/checkpoints"
if [ ! -f "$RUN/checkpoints/last.ckpt" ] && [ -f "$RESULTS/last.ckpt" ]; then
    cp "$RESULTS/last.ckpt" "$RUN/checkpoints/last.ckpt"  # a later session: on from the kept checkpoint
    # the earlier sessions' metrics, kept beside this session's (which the copies below write)
    [ -f "$RESULTS/metrics.csv.gz" ] && mv "$RESULTS/metrics.csv.gz" "$RESULTS/metrics.to-step-$(
        "$PY" -c 'import sys, torch; print(torch.load(sys.argv[1], weights_only=True, map_location="cpu")["global_step"])' \
        "$RESULTS/last.ckpt").csv.gz"
fi
cat >"$OUT/growth.yaml" <<'EOF'
trainer:
  callbacks:
    - class_path: imagetx.training.grow.GrowDepth
      init_args:
        layers: 4
        at_images: 68800      # 40 epochs of the 1,720 images: the recipe's 40 epochs of 45,000
EOF
keep() {  # the newest checkpoint and metrics, where git keeps them
    while sleep 300; do
        if [ -f "$RUN/checkpoints/last.ckpt" ]; then
            cp "$RUN/checkpoints/last.ckpt" "$RESULTS/last.ckpt.tmp" && mv "$RESULTS/last.ckpt.tmp" "$RESULTS/last.ckpt"
        fi
        cat "$RUN"/csv/version_*/metrics.csv 2>/dev/null | gzip >"$RESULTS/metrics.csv.gz" || true
    done
}
keep &
KEEPER=$!
trap 'kill $KEEPER 2>/dev/null' EXIT
cd "$CODE"
"$PY" -m imagetx.train --config configs/cifar10_recipe.yaml --config "$OUT/growth.yaml" --resume auto \
    --data.root "$SUBSET" --wandb disabled --trainer.default_root_dir "$RUN" --trainer.enable_progress_bar false \
    --trainer.max_time null --trainer.max_steps 20681 --trainer.precision 32-true --model.compile false \
    --model.config.n_layers 2 --model.config.d_model 128 --model.config.d_filter 256 \
    --model.config.attention.n_heads 4 --model.peak_lr 0.008 --model.warmup_steps 180 \
    --data.batch_size 8 --data.eval_batch_size 50 --trainer.val_check_interval 8600 --trainer.limit_val_batches 1.0 \
    --trainer.log_every_n_steps 10 --checkpoint_every_n_steps 500 --checkpoint_every_minutes 0
cp "$RUN/checkpoints/last.ckpt" "$RESULTS/last.ckpt"
cat "$RUN"/csv/version_*/metrics.csv | gzip >"$RESULTS/metrics.csv.gz"
"$PY" -m imagetx.evaluate --ckpt "$RUN/checkpoints/last.ckpt" --data.root "$SUBSET" --val_size 5000 --split val \
    --batch_size 50 --device cpu | tail -1 >"$RESULTS/val.json"
cat "$RESULTS/val.json"
