#!/usr/bin/env bash
# What a GPU lease carries and brings home, on this machine (ops/README.md, "A lease, call by call"):
#   bash ops/lease_files.sh prepare           # before the first call: .whl/, .stage/{cont,a,b,c}
#   bash ops/lease_files.sh prepare --no-continuation  # a lease without one (PixelCNN++): .whl/, .stage/{a,b,c}
#   bash ops/lease_files.sh release           # after a lease whose results go elsewhere: what prepare held back, back
#   bash ops/lease_files.sh home FILES_AT... [--note TEXT ...]  # after the last: pretrained/cifar10_gpu, its card,
#                                              # lineage/cifar10_gpu (lineage.json, leases, continuation); a folder for
#                                              # each call that brought files back (wait, finish, more)
# GPU_MODEL=pretrained/superres_gpu (environment) for the super-resolution model's lease (CONFIG=configs/superres_gpu.yaml
# on the lent machine).
#
# Every call sends the whole working tree (tracked and untracked-not-ignored files) plus what it
# carries, 64 MiB in all. The shipped models (pretrained/: the GPU models' bf16 weights, ~15 MiB each,
# and the CPU models, ~7 MiB) and their training history (lineage/: each GPU model's packed
# continuation, ~30 MiB) would leave no room for the data, so `prepare` copies the GPU model's
# continuation into .stage/cont/ (carried once, by the first call) and takes pretrained/ and
# lineage/ out of git's index and into .git/info/exclude for the lease: they stay on disk and in
# HEAD, and travel with no call (nothing the lent machine runs reads them). `home` puts them back
# and stages the lease's new files for the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_MODEL=${GPU_MODEL:-pretrained/cifar10_gpu}  # or pretrained/superres_gpu (ops/README.md, "A super-resolution lease"): the model the lease trains on
LINEAGES=lineage  # beside pretrained/: each lease-trained model's training history (ops/lease_cards.py, LINEAGE)
LINEAGE=$LINEAGES/$(basename "$GPU_MODEL")  # this model's: lineage.json, leases/lease_N/, continuation/
# What no call carries: the shipped models, their lineages, and the CPU road study's checkpoints
# (experiments/road_results/ckpt: ~12 MiB, read by no step of a lease).
HELD_BACK=(pretrained "$LINEAGES" experiments/road_results/ckpt)
# The largest continuation call 1 carries beside the wheels (1.4 MiB), a shard (27 MiB) and the working tree
# (4 MiB) within a call's 64 MiB, with a few MiB to spare: 14 layers' (28.3 MiB) does, 28 layers' (56.4) not.
CONTINUATION_BESIDE_SHARD_MIB=30
SHARDS=${SHARDS:-../shared/cifar10}
PYTHON=${PYTHON:-.venv/bin/python}
EXCLUDE=.git/info/exclude
# What imagetx needs beyond the GPU image's packages (device KINDS.md: torch, lightning, torchvision,
# einops, torchmetrics, numpy, safetensors, huggingface_hub 1.x and more). Not huggingface_hub 2: the
# image's transformers, which torchmetrics imports, refuses it (the lease of 2026-11-26); its 1.x is
# within pyproject's range. constriction: imagetx.evaluate imports the codec package (that lease's
# first try at scoring stopped on it).
WHEELS=(jsonargparse==4.53.0 docstring_parser==0.18.0 typeshed_client==2.14.0 torchdata==0.11.0 constriction==0.5.0)

release_held_back() {  # back in git's index as in HEAD, and out of .git/info/exclude
  if [ -f "$EXCLUDE" ]; then
    for held in "${HELD_BACK[@]}"; do grep -vxF "/$held/" "$EXCLUDE" >"$EXCLUDE.new" || true; mv "$EXCLUDE.new" "$EXCLUDE"; done
  fi
  git reset -q -- "${HELD_BACK[@]}"
}

case "${1:-}" in
prepare)
  [ "${2:-}" = "" ] || [ "${2:-}" = "--no-continuation" ] || {
    echo "usage: bash ops/lease_files.sh prepare [--no-continuation]" >&2; exit 2; }
  rm -rf .whl  # exactly the list above: a wheel left from an older list would be installed too
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "${WHEELS[@]}"
  # Call 1 carries .whl, .stage/cont and .stage/a (one shard: the warm-up's data); calls 2 and 3 two
  # shards each (ops/README.md, "A lease, call by call"). Without a continuation call 1 has room for two
  # shards, and so has call 2 after a continuation too large to travel beside one (a grown model's:
  # 56 MiB at 28 layers), which call 1 carries alone with the wheels: then .stage/a, b, c a call each.
  continuation=  # what the lease goes on from, if anything
  if [ "${2:-}" != "--no-continuation" ] && [ -f "$LINEAGE/continuation/continuation.json" ]; then
    continuation=$LINEAGE/continuation
  fi
  rm -rf .stage && mkdir -p .stage/a .stage/b .stage/c
  if [ -n "$continuation" ] && [ "$(du -sm "$continuation" | cut -f1)" -le "$CONTINUATION_BESIDE_SHARD_MIB" ]; then
    cp "$SHARDS"/train-0.npz .stage/a/
    cp "$SHARDS"/train-1.npz "$SHARDS"/train-2.npz .stage/b/
    cp "$SHARDS"/train-3.npz "$SHARDS"/train-4.npz .stage/c/
  else
    cp "$SHARDS"/train-0.npz "$SHARDS"/train-1.npz .stage/a/
    cp "$SHARDS"/train-2.npz "$SHARDS"/train-3.npz .stage/b/
    cp "$SHARDS"/train-4.npz .stage/c/
  fi
  if [ -n "$continuation" ]; then
    mkdir .stage/cont && cp -r "$continuation" .stage/cont/continuation
    echo "the lease goes on from $continuation (step $(grep -o '"step": [0-9]*' "$continuation/continuation.json" \
        | cut -d' ' -f2), $(du -sm "$continuation" | cut -f1) MiB)"
    if [ -e .stage/a/train-1.npz ]; then echo "call 1 carries .whl and .stage/cont alone; .stage/a, b and c a call each"; fi
  elif [ "${2:-}" = "--no-continuation" ]; then
    echo "no continuation carried"
  else
    echo "no continuation in $LINEAGE: the lease starts the recipe"
  fi
  mkdir -p "$(dirname "$EXCLUDE")"  # a fresh clone may have no .git/info
  for held in "${HELD_BACK[@]}"; do
    if [ -n "$(git ls-files "$held")" ]; then git rm -r -q --cached "$held"; fi
    grep -qsxF "/$held/" "$EXCLUDE" || echo "/$held/" >>"$EXCLUDE"
  done
  tree=$(git ls-files -co --exclude-standard -z | du -cm --files0-from=- | tail -1 | cut -f1)
  echo "the working tree every call sends: $tree MiB (+ what it carries; 64 MiB in all)"
  first=$([ -d .stage/cont ] && echo .stage/cont || echo .stage/a)  # call 1 carries the wheels beside it
  for folder in .whl .stage/*; do
    mib=$(du -sm "$folder" | cut -f1)
    echo "$folder: $mib MiB"
    call=$((tree + mib + $([ "$folder" = "$first" ] && du -sm .whl | cut -f1 || echo 0)))
    if [ "$folder" != .whl ] && [ "$call" -gt 64 ]; then
      echo "warning: the call carrying $folder sends $call MiB, over the 64 a call takes" >&2
    fi
  done
  ;;
home)
  [ -d "${2:-}" ] || { echo "usage: bash ops/lease_files.sh home FILES_AT... (each call's folder of files)" >&2; exit 2; }
  release_held_back
  "$PYTHON" ops/lease_record.py home "${@:2}" --into "$GPU_MODEL" --suite-record ops/cuda_suite_passed.json
  # FILES_AT... [--note TEXT ...]: the model into $GPU_MODEL, its history into $LINEAGE
  git add "$GPU_MODEL" "$LINEAGE"  # the lease's files, staged for its commit
  git status --short "${HELD_BACK[@]}"
  ;;
release)
  release_held_back
  git status --short "${HELD_BACK[@]}"
  ;;
*)
  echo "usage: bash ops/lease_files.sh prepare [--no-continuation] | home FILES_AT | release" >&2; exit 2
  ;;
esac
