#!/usr/bin/env bash
# What a GPU lease carries and brings home, on this machine (docs/gpu.md, "A lease, call by call"):
#   bash scripts/lease_files.sh prepare           # before the first call: .whl/, .stage/{cont,a,b,c}
#   bash scripts/lease_files.sh home FILES_AT     # after the last: pretrained/cifar10_gpu, lineage, card
#
# Every call sends the whole working tree (tracked and untracked-not-ignored files) plus what it
# carries, 64 MiB in all. The GPU model's folder (its bf16 weights and packed continuation, ~42 MiB
# for cifar10_dmol_25min) would leave no room for the data, so `prepare` copies the continuation into
# .stage/cont/ (carried once, by the first call) and takes the folder out of git's index and into
# .git/info/exclude for the lease: it stays on disk and in HEAD, and travels with no call. `home`
# puts it back and stages the lease's new files for the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_MODEL=pretrained/cifar10_gpu
SHARDS=${SHARDS:-../shared/cifar10}
PYTHON=${PYTHON:-.venv/bin/python}
EXCLUDE=.git/info/exclude

case "${1:-}" in
prepare)
  if [ ! -d .whl ]; then  # what imagetx needs beyond the GPU image's torch, lightning, torchvision, einops
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform any -d .whl \
        jsonargparse==4.53.0 torchdata==0.11.0 docstring_parser==0.18.0 typeshed_client==2.14.0 safetensors==0.8.0 \
        huggingface_hub==2.4.0 hf_xet==1.8.0 httpx2==2.16.2 httpcore2==2.16.2 anyio==4.16.0 h11==0.16.0 \
        idna==3.20 click==8.5.1 truststore==0.10.5
  fi
  rm -rf .stage && mkdir -p .stage/cont .stage/a .stage/b .stage/c
  cp "$SHARDS"/train-0.npz "$SHARDS"/train-1.npz .stage/a/
  cp "$SHARDS"/train-2.npz "$SHARDS"/train-3.npz .stage/b/
  cp "$SHARDS"/train-4.npz .stage/c/
  if [ -f "$GPU_MODEL/continuation/continuation.json" ]; then
    cp -r "$GPU_MODEL/continuation" .stage/cont/continuation
    echo "the lease goes on from $GPU_MODEL/continuation (step $(grep -o '"step": [0-9]*' \
        "$GPU_MODEL/continuation/continuation.json" | cut -d' ' -f2))"
  else
    echo "no continuation in $GPU_MODEL: the lease starts the recipe"
  fi
  if [ -n "$(git ls-files "$GPU_MODEL")" ]; then
    git rm -r -q --cached "$GPU_MODEL"
    grep -qxF "/$GPU_MODEL/" "$EXCLUDE" || echo "/$GPU_MODEL/" >>"$EXCLUDE"
  fi
  for folder in .whl .stage/cont .stage/a .stage/b .stage/c; do
    echo "$folder: $(du -sm "$folder" | cut -f1) MiB"
  done
  echo "the working tree every call sends: $(git ls-files -co --exclude-standard -z | du -cm --files0-from=- \
      | tail -1 | cut -f1) MiB (+ what it carries; 64 MiB in all)"
  ;;
home)
  [ -d "${2:-}" ] || { echo "usage: bash scripts/lease_files.sh home FILES_AT (the folder the last call's files are in)" >&2; exit 2; }
  if [ -f "$EXCLUDE" ]; then grep -vxF "/$GPU_MODEL/" "$EXCLUDE" >"$EXCLUDE.new" || true; mv "$EXCLUDE.new" "$EXCLUDE"; fi
  "$PYTHON" scripts/lease_record.py home "$2" --into "$GPU_MODEL"
  git add "$GPU_MODEL"
  git status --short "$GPU_MODEL"
  ;;
*)
  echo "usage: bash scripts/lease_files.sh prepare | home FILES_AT" >&2; exit 2
  ;;
esac
