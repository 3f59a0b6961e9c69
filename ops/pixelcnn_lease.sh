#!/usr/bin/env bash
# PixelCNN++ beside the Image Transformer on a lent GPU (issue "PixelCNN++ beside the Image Transformer
# at equal GPU minutes"; docs/results.md, "PixelCNN++ on the same GPU"): experiments/pixelcnn_pp.py at
# the paper's size, in the calls of the lease plan (ops/README.md, "A PixelCNN++ lease"). Run from the repository root there:
#   bash ops/pixelcnn_lease.sh setup             # wheels and shards (ops/gpu_lease.sh setup)
#   bash ops/pixelcnn_lease.sh begin             # call 1: `first`, detached, beside the calls staging data
#   bash ops/pixelcnn_lease.sh await SECONDS     # wait for it (ops/gpu_lease.sh await)
#   bash ops/pixelcnn_lease.sh launch SECONDS    # the run (`train`), detached, for SECONDS of training
#   bash ops/pixelcnn_lease.sh wait SECONDS      # progress until the run ends or SECONDS pass
#   bash ops/pixelcnn_lease.sh finish SECONDS    # waits for the run (at most SECONDS, then stops its training);
#                                                # result.json, train.log, samples.png (and the CUDA suite's
#                                                # record after a whole-suite pass) into $OUT
# `first` runs the project's CUDA tests (ops/gpu_lease.sh tests: their result is the lease's finding;
# the PixelCNN++ run does not depend on them) beside a few steps of the run's settings (bf16 autocast,
# compiled), which fill Inductor's cache on this machine's disk, so that the run compiles from it.
# The run trains with those settings; where the steps in `first` failed, or where the run stops on a
# non-finite loss or gradient, in float32 with TF32, uncompiled, for the training seconds left (the
# first run's result kept beside, result_first.json).
# DRY_RUN=1 runs every step on this CPU with a tiny network in float32 (tests/ops/test_pixelcnn_lease.py);
# PRIMARY_ARGS (environment) adds arguments to the first run only.
set -euo pipefail
DRY_RUN=${DRY_RUN:-0}
WORK=${WORK:-/root}
DATA=$WORK/data
RUN=$WORK/pixelcnn
CODE=$WORK/pixelcnn_code  # the run's own copy: later calls re-send the working tree under it
OUT=${OUT:?the device tool sets OUT, the folder whose files come back}
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$CODE:$SITE PYTHONUNBUFFERED=1
COMPILED=$WORK/pixelcnn_compiled  # written by `first` when the compiled steps ran
SAFE=(--precision 32)  # float32, TF32 on CUDA
if [ "$DRY_RUN" = 1 ]; then
  NET=(--device cpu --nr-resnet 1 --nr-filters 8 --nr-logistic-mix 3 --batch-size 2 --eval-batch-size 2 --val-size 2)
  FAST=(--precision 32)
else
  # The paper's CIFAR-10 model (5 gated resnets a stage, 160 filters, 10 logistics, dropout 0.5); batch
  # 120 (the reference's 16 on each of 8 GPUs: 128) divides the 45,000 training images, so every step
  # has one shape; 500 divides the 5,000 val images. Scored in float32 whatever it trains in.
  NET=(--device cuda --nr-resnet 5 --nr-filters 160 --nr-logistic-mix 10 --dropout 0.5 --batch-size 120
      --eval-batch-size 500 --val-size 5000)
  FAST=(--precision bf16 --compile)  # the head projects and scores in float32 under bf16 autocast
fi

# The grid's samples (1,024 passes of the network at that batch): GRID_SAMPLES, where set, else the
# script's default; DRAW_SAMPLES=0: none
GRID=(--grid "$RUN/samples.png" ${GRID_SAMPLES:+--grid-samples "$GRID_SAMPLES"})
[ "${DRAW_SAMPLES:-1}" != 0 ] || GRID=()
# The run's process group (`train` leads it: setsid), alive while any of its processes is.
running() { [ -f "$RUN/run.pid" ] && kill -0 -- "-$(cat "$RUN/run.pid")" 2>/dev/null; }
copy_code() { rm -rf "$1" && mkdir -p "$1" && cp -r imagetx experiments ops "$1"/; }
pixelcnn() {  # pixelcnn SECONDS NAME [ARGS...]: one run, its result in $RUN/NAME.json, its log appended to train.log
  "$PYTHON" -m experiments.pixelcnn_pp --data.root "$DATA" "${NET[@]}" \
      --max-minutes "$("$PYTHON" -c "print($1 / 60)")" \
      --curve-seconds "${CURVE_SECONDS:-30}" "${GRID[@]}" --json "$RUN/$2.json" "${@:3}" >>"$RUN/train.log" 2>&1
}

case "${1:-}" in
setup|await)
  exec bash ops/gpu_lease.sh "$@"
  ;;
begin)
  LEASE_SCRIPT=ops/pixelcnn_lease.sh exec bash ops/gpu_lease.sh begin
  ;;
first)
  # The compiled steps beside the CUDA tests; `first` fails only where neither could run.
  copy_code "$CODE"
  rm -f "$COMPILED"
  timeout 400 "$PYTHON" -m experiments.pixelcnn_pp --data.root "$DATA" "${NET[@]}" "${FAST[@]}" --max-minutes 1 \
      --max-steps 3 --val-limit "$([ "$DRY_RUN" = 1 ] && echo 2 || echo 500)" --progress-seconds 1 \
      >"$WORK/pixelcnn_warm.log" 2>&1 && touch "$COMPILED" & warming=$!
  tests_status=0; bash ops/gpu_lease.sh tests || tests_status=$?
  warm_status=0; wait "$warming" || warm_status=$?
  grep -E "^(data|PixelCNN|compiled|step|[0-9,]+ steps)" "$WORK/pixelcnn_warm.log" || tail -5 "$WORK/pixelcnn_warm.log"
  echo "first: CUDA tests exit $tests_status; the run's compiled steps exit $warm_status"
  [ "$tests_status" = 0 ] || [ "$warm_status" = 0 ]
  ;;
launch)
  # The run, detached from the call (setsid: its own process group, which `finish` signals).
  [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "launch needs the training seconds: bash ops/pixelcnn_lease.sh launch SECONDS" >&2; exit 2; }
  if running; then echo "a run is going already (pid $(cat "$RUN/run.pid"))" >&2; exit 1; fi
  rm -rf "$RUN" && mkdir -p "$RUN"
  [ -d "$CODE" ] || copy_code "$CODE"
  setsid nohup bash "$CODE/ops/pixelcnn_lease.sh" train "$2" "${@:3}" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 50); do [ -s "$RUN/run.pid" ] && break; sleep 0.2; done
  echo "launch: PixelCNN++ for $2 training seconds (process group $(cat "$RUN/run.pid"))"
  sleep "${LAUNCH_WAIT:-20}"
  running || [ -f "$RUN/result.json" ] || { tail -20 "$RUN/train.log"; echo "the run ended at once" >&2; exit 1; }
  grep -E "^(data|PixelCNN|compiled|train:)" "$RUN/train.log" || true
  ;;
train)
  # What `launch` runs: the settings `first` compiled (else float32), and where that run stops on a
  # non-finite step with more than a minute of its budget left, float32 for what is left.
  echo $$ >"$RUN/run.pid"
  FIRST_RUN=("${SAFE[@]}")
  if [ -f "$COMPILED" ]; then FIRST_RUN=("${FAST[@]}"); else
    echo "train: the compiled steps did not run in first: ${SAFE[*]}" >>"$RUN/train.log"; fi
  # shellcheck disable=SC2086  # PRIMARY_ARGS: words
  pixelcnn "$2" result "${FIRST_RUN[@]}" ${PRIMARY_ARGS:-} "${@:3}" || true
  left=$("$PYTHON" -c 'import json, sys; r = json.load(open(sys.argv[1]))
print(int(float(sys.argv[2]) - 60 * r["minutes"]) if r["nonfinite_stop"] else 0)' "$RUN/result.json" "$2")
  if [ "$left" -gt "${FALLBACK_MIN_SECONDS:-60}" ]; then
    mv "$RUN/result.json" "$RUN/result_first.json"
    echo "train: the first run stopped on a non-finite step; ${SAFE[*]} for the $left s left" >>"$RUN/train.log"
    pixelcnn "$left" result "${SAFE[@]}" "${@:3}"
  fi
  ;;
wait)
  end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ] && running; do
    sleep "${POLL:-30}"
    grep -E "^(step|val)" "$RUN/train.log" | tail -2 || true
  done
  ;;
finish)
  # SIGTERM ends the run's training after its step; it then scores and writes its result, for which
  # it has STOP_GRACE seconds before it is killed.
  end=$((SECONDS + $2)) stopped=0
  while running; do
    if [ $SECONDS -ge $end ] && [ $stopped = 0 ]; then
      echo "the run is still going after $2 s: stopping its training" >&2
      kill -TERM -- "-$(cat "$RUN/run.pid")" || true
      stopped=1 end=$((SECONDS + ${STOP_GRACE:-90}))
    elif [ $SECONDS -ge $end ]; then
      echo "the run has not ended ${STOP_GRACE:-90} s after that: killing it" >&2
      kill -KILL -- "-$(cat "$RUN/run.pid")" || true
    fi
    sleep 2
  done
  tail -4 "$RUN/train.log" | cut -c1-400
  for name in "$RUN/result.json" "$RUN/result_first.json" "$RUN/train.log" "$RUN/samples.png" \
      "$WORK/pixelcnn_warm.log" "$WORK/cuda_tests.log" "$WORK/cuda_suite_passed.json"; do
    [ ! -e "$name" ] || { cp "$name" "$OUT"/ && echo "in \$OUT: $(basename "$name")"; }
  done
  [ -f "$RUN/result.json" ]
  ;;
*)
  echo "usage: bash ops/pixelcnn_lease.sh setup|begin|await|launch|train|wait|finish ..." >&2; exit 2
  ;;
esac
