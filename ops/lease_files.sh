#!/usr/bin/env bash
# What a GPU lease carries and brings home, on this machine (docs/gpu.md, "A lease, call by call"):
#   bash ops/lease_files.sh prepare           # before the first call: .whl/, .stage/{cont,a,b,c}
#   bash ops/lease_files.sh home FILES_AT [--note TEXT ...]  # after the last: pretrained/cifar10_gpu, lineage, card
# GPU_MODEL=pretrained/superres_gpu (environment) for the super-resolution model's lease (CONFIG=configs/superres_gpu.yaml
# on the lent machine).
#
# Every call sends the whole working tree (tracked and untracked-not-ignored files) plus what it
# carries, 64 MiB in all. The shipped models (pretrained/: the GPU model's bf16 weights and packed
# continuation, ~42 MiB, and the CPU models, ~7 MiB) would leave no room for the data, so `prepare`
# copies the GPU model's continuation into .stage/cont/ (carried once, by the first call) and takes
# pretrained/ out of git's index and into .git/info/exclude for the lease: it stays on disk and in
# HEAD, and travels with no call (nothing the lent machine runs reads it). `home` puts it back and
# stages the lease's new files for the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_MODEL=${GPU_MODEL:-pretrained/cifar10_gpu}  # or pretrained/superres_gpu (docs/gpu.md): the model the lease trains on
HELD_BACK=pretrained
SHARDS=${SHARDS:-../shared/cifar10}
PYTHON=${PYTHON:-.venv/bin/python}
EXCLUDE=.git/info/exclude
# What imagetx needs beyond the GPU image's packages (device KINDS.md: torch, lightning, torchvision,
# einops, torchmetrics, numpy, safetensors, huggingface_hub 1.x and more). Not huggingface_hub 2: the
# image's transformers, which torchmetrics imports, refuses it (the lease of 2026-11-26); its 1.x is
# within pyproject's range. constriction: imagetx.evaluate imports the codec package (that lease's
# first try at scoring stopped on it).
WHEELS=(jsonargparse==4.53.0 docstring_parser==0.18.0 typeshed_client==2.14.0 torchdata==0.11.0 constriction==0.5.0)

case "${1:-}" in
prepare)
  rm -rf .whl  # exactly the list above: a wheel left from an older list would be installed too
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "${WHEELS[@]}"
  # Call 1 carries .whl, .stage/cont and .stage/a (one shard: the warm-up's data); calls 2 and 3 two
  # shards each (docs/gpu.md, "A lease, call by call").
  rm -rf .stage && mkdir -p .stage/cont .stage/a .stage/b .stage/c
  cp "$SHARDS"/train-0.npz .stage/a/
  cp "$SHARDS"/train-1.npz "$SHARDS"/train-2.npz .stage/b/
  cp "$SHARDS"/train-3.npz "$SHARDS"/train-4.npz .stage/c/
  if [ -f "$GPU_MODEL/continuation/continuation.json" ]; then
    cp -r "$GPU_MODEL/continuation" .stage/cont/continuation
    echo "the lease goes on from $GPU_MODEL/continuation (step $(grep -o '"step": [0-9]*' \
        "$GPU_MODEL/continuation/continuation.json" | cut -d' ' -f2))"
  else
    echo "no continuation in $GPU_MODEL: the lease starts the recipe"
  fi
  if [ -n "$(git ls-files "$HELD_BACK")" ]; then
    git rm -r -q --cached "$HELD_BACK"
    mkdir -p "$(dirname "$EXCLUDE")"  # a fresh clone may have no .git/info
    grep -qsxF "/$HELD_BACK/" "$EXCLUDE" || echo "/$HELD_BACK/" >>"$EXCLUDE"
  fi
  for folder in .whl .stage/cont .stage/a .stage/b .stage/c; do
    echo "$folder: $(du -sm "$folder" | cut -f1) MiB"
  done
  echo "the working tree every call sends: $(git ls-files -co --exclude-standard -z | du -cm --files0-from=- \
      | tail -1 | cut -f1) MiB (+ what it carries; 64 MiB in all)"
  ;;
home)
  [ -d "${2:-}" ] || { echo "usage: bash ops/lease_files.sh home FILES_AT (the folder the last call's files are in)" >&2; exit 2; }
  if [ -f "$EXCLUDE" ]; then grep -vxF "/$HELD_BACK/" "$EXCLUDE" >"$EXCLUDE.new" || true; mv "$EXCLUDE.new" "$EXCLUDE"; fi
  "$PYTHON" ops/lease_record.py home "$2" --into "$GPU_MODEL" --suite-record ops/cuda_suite_passed.json \
      "${@:3}"  # [--note TEXT ...]
  git add "$HELD_BACK"
  git status --short "$HELD_BACK"
  ;;
*)
  echo "usage: bash ops/lease_files.sh prepare | home FILES_AT" >&2; exit 2
  ;;
esac
