#!/usr/bin/env bash
# Distribution augmentation against flips on the CPU proxy (issue 127, docs/experiments.md entry 40): the recipe's
# schedule as entry 38 rehearsed it (experiments/recipe_rehearsal.sh: configs/cifar10_recipe.yaml shrunk to entry
# 35's proxy, 2 layers of d 128 grown inside the run to 4 at 68,800 images, flips from step 0, one
# warmup-stable-decay to step 20,681: the FLOPs of entry 35's grown-with-flips arm, 150 epochs of the base shape)
# on entry 35's 1,720-image subset, with each training image also transformed by one of a set drawn uniformly
# (Jun et al. 2020's sets) and the model told which (--model.config.num_transforms 48), scored with the identity.
# Equal FLOPs: the same fixed steps (the transform's embedding adds one (B, 1, d) sum a step).
#   bash experiments/distribution_augmentation.sh ARM SEED [DATA_ROOT]   # starts or resumes; detaches nothing
# ARM: flips (no transforms: the rehearsal's arm at another seed), or a --data.transforms set: rotations,
# transposition, channels, rotations+transposition, rotations+channels, rotations+transposition+channels.
# The proxy's settings: experiments/distribution_augmentation.yaml. Fixed steps, one thread, resumable across
# sessions: the run lives in experiments/distribution_augmentation_results/ARM_SEED/ (last.ckpt every 500 steps;
# rerunning the same command goes on from it with --resume auto, from the code of the commit in COMMIT).
set -euo pipefail
ARM=${1:?ARM: flips or a transform set (rotations, channels, ...)}
SEED=${2:?SEED: 0 or 1}
SOURCE=$(realpath "${3:-../shared/cifar10}")
RESULTS=$(realpath -m experiments/distribution_augmentation_results)
RUN="$RESULTS/${ARM//+/_}_s$SEED"
WORK=$(realpath -m runs/distribution_augmentation)
PY=$(realpath -s "${PY:-.venv/bin/python}")
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
mkdir -p "$RUN" "$WORK"
if [ "$ARM" = flips ]; then
    AUGMENT=()
else
    AUGMENT=(--data.transforms "$ARM" --model.config.num_transforms 48)
fi
# The code of the commit the study began at (a later session rebuilds the same copy from it).
[ -f "$RESULTS/COMMIT" ] || git rev-parse HEAD >"$RESULTS/COMMIT"
CODE="$WORK/code-$(cat "$RESULTS/COMMIT")"
# Each start writes into a folder of its own and renames it into place, so that two arms started at once on a
# fresh machine do not collide (mv -T fails when the other start got there first; its copy is the same).
if [ ! -d "$CODE/imagetx" ]; then
    TMP=$(mktemp -d "$CODE.XXXXXX")
    git archive "$(cat "$RESULTS/COMMIT")" | tar -x -C "$TMP"
    mv -T "$TMP" "$CODE" 2>/dev/null || rm -rf "$TMP"
fi
SUBSET="$WORK/cifar10_1720"
if [ ! -f "$SUBSET/train-0.npz" ]; then  # entry 35's subset: the first 1,720 training images and the 5,000 val
    TMP=$(mktemp -d "$SUBSET.XXXXXX")
    (cd "$CODE" && "$PY" -m experiments.subset_shards "$SOURCE" "$TMP" --train 1720)
    mv -T "$TMP" "$SUBSET" 2>/dev/null || rm -rf "$TMP"
fi
cd "$CODE"
"$PY" -m imagetx.train --config configs/cifar10_recipe.yaml --config experiments/distribution_augmentation.yaml \
    --resume auto --seed_everything "$SEED" "${AUGMENT[@]}" --data.root "$SUBSET" --wandb disabled \
    --trainer.default_root_dir "$RUN"
# Scored with the identity transform (what evaluate does for a model with transforms unless told otherwise);
# val.json appears whole, once evaluate has succeeded (its presence is what marks a run ended).
"$PY" -m imagetx.evaluate --ckpt "$RUN/checkpoints/last.ckpt" --data.root "$SUBSET" --val_size 5000 --split val \
    --batch_size 50 --device cpu | tail -1 >"$RUN/val.json.part"
mv "$RUN/val.json.part" "$RUN/val.json"
cat "$RUN/val.json"
