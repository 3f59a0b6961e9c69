#!/usr/bin/env bash
# Issue 125's speed figures beside decode_side_by_side.py, each in a fresh process a tree, the trees
# alternated round by round (CPU seconds or wall medians of one thread; see each script):
#   step.py TREE             median wall µs of one eager decoding step, 2 images, quick's model (3 x 1,024 steps)
#   sample64.py TREE MODE    CPU seconds of sample(model, 64) with quick's model, eager or compiled, after one
#                            untimed sample of 64 (which compiles)
#   build.py TREE PRESET     CPU seconds of build_model(PRESET's model config)
#   bash experiments/decoder_timings/run.sh /tmp/base /tmp/new    # worktrees of the two commits
set -euo pipefail
HERE=$(realpath "$(dirname "$0")")
PY=$(realpath -s "${PY:-.venv/bin/python}")
for round in 1 2 3; do
    for tree in "$@"; do
        tree=$(realpath "$tree")
        echo "$round step $tree $(cd "$tree" && PYTHONPATH=$tree "$PY" "$HERE/step.py" "$tree" | tail -1)"
        for mode in eager compiled; do
            echo "$round sample64-$mode $tree $(cd "$tree" && PYTHONPATH=$tree "$PY" "$HERE/sample64.py" "$tree" $mode | tail -1)"
        done
        echo "$round build-imagenet64 $tree $(cd "$tree" && PYTHONPATH=$tree "$PY" "$HERE/build.py" "$tree" imagenet64 | tail -1)"
    done
done
