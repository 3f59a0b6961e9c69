#!/usr/bin/env bash
# PixelCNN++ beside the Image Transformer on a lent GPU (issue "PixelCNN++ beside the Image Transformer
# at equal GPU minutes"; docs/results.md, "PixelCNN++ on the same GPU"): experiments/pixelcnn_pp.py at
# the paper's size, in the calls of docs/gpu.md's lease plan. Run from the repository root there:
#   bash ops/pixelcnn_lease.sh setup             # wheels and shards (ops/gpu_lease.sh setup)
#   bash ops/pixelcnn_lease.sh begin             # call 1: `first`, detached, beside the calls staging data
#   bash ops/pixelcnn_lease.sh await SECONDS     # wait for it (ops/gpu_lease.sh await)
#   bash ops/pixelcnn_lease.sh launch SECONDS    # the run, detached, for SECONDS of training
#   bash ops/pixelcnn_lease.sh wait SECONDS      # progress until the run ends or SECONDS pass
#   bash ops/pixelcnn_lease.sh finish SECONDS    # waits for the run (at most SECONDS, then stops its training);
#                                                # result.json, train.log, samples.png (and the CUDA suite's
#                                                # record after a whole-suite pass) into $OUT
# `first` runs the project's CUDA tests (ops/gpu_lease.sh tests: their result is the lease's finding;
# the PixelCNN++ run does not depend on them) beside a few compiled steps of the run's settings, which
# fill Inductor's cache on this machine's disk, so that the run compiles from it. Where those steps
# fail, `launch` trains uncompiled and says so.
# DRY_RUN=1 runs every step on this CPU with a tiny network, uncompiled (tests/test_pixelcnn_lease.py).
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
if [ "$DRY_RUN" = 1 ]; then
  NET=(--device cpu --nr-resnet 1 --nr-filters 8 --nr-logistic-mix 3 --batch-size 2 --eval-batch-size 2 --val-size 2)
  EXTRA=()
else
  # The paper's CIFAR-10 model (5 gated resnets a stage, 160 filters, 10 logistics, dropout 0.5); batch
  # 120 (the reference's 16 on each of 8 GPUs: 128) divides the 45,000 training images, so every step
  # has one shape; 500 divides the 5,000 val images. bf16 autocast, the head in float32; scored in float32.
  NET=(--device cuda --nr-resnet 5 --nr-filters 160 --nr-logistic-mix 10 --dropout 0.5 --batch-size 120
      --eval-batch-size 500 --val-size 5000 --precision bf16)
  EXTRA=(--compile)
fi

running() { [ -f "$RUN/run.pid" ] && kill -0 "$(cat "$RUN/run.pid")" 2>/dev/null; }
copy_code() { rm -rf "$1" && mkdir -p "$1" && cp -r imagetx experiments "$1"/; }

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
  timeout 400 "$PYTHON" -m experiments.pixelcnn_pp --data.root "$DATA" "${NET[@]}" "${EXTRA[@]}" --max-minutes 1 \
      --max-steps 3 --val-limit "$([ "$DRY_RUN" = 1 ] && echo 2 || echo 500)" --progress-seconds 1 \
      >"$WORK/pixelcnn_warm.log" 2>&1 && touch "$COMPILED" & warming=$!
  tests_status=0; bash ops/gpu_lease.sh tests || tests_status=$?
  warm_status=0; wait "$warming" || warm_status=$?
  grep -E "^(data|PixelCNN|compiled|step|[0-9,]+ steps)" "$WORK/pixelcnn_warm.log" || tail -5 "$WORK/pixelcnn_warm.log"
  echo "first: CUDA tests exit $tests_status; the run's compiled steps exit $warm_status"
  [ "$tests_status" = 0 ] || [ "$warm_status" = 0 ]
  ;;
launch)
  if running; then echo "a run is going already (pid $(cat "$RUN/run.pid"))" >&2; exit 1; fi
  rm -rf "$RUN" && mkdir -p "$RUN"
  [ -d "$CODE" ] || copy_code "$CODE"
  COMPILE=()
  if [ -f "$COMPILED" ]; then COMPILE=("${EXTRA[@]}"); elif [ ${#EXTRA[@]} -gt 0 ]; then
    echo "launch: the compiled steps did not run in first: training uncompiled" >&2
  fi
  minutes=$("$PYTHON" -c "print(round($2 / 60, 3))")
  setsid nohup "$PYTHON" -m experiments.pixelcnn_pp --data.root "$DATA" "${NET[@]}" "${COMPILE[@]}" \
      --max-minutes "$minutes" --curve-seconds "${CURVE_SECONDS:-30}" --grid "$RUN/samples.png" \
      --json "$RUN/result.json" "${@:3}" >"$RUN/train.log" 2>&1 </dev/null &
  echo $! >"$RUN/run.pid"
  echo "launch: PixelCNN++ for $minutes training minutes (pid $(cat "$RUN/run.pid"))"
  sleep "${LAUNCH_WAIT:-20}"
  running || [ -f "$RUN/result.json" ] || { tail -20 "$RUN/train.log"; echo "the run ended at once" >&2; exit 1; }
  grep -E "^(data|PixelCNN|compiled)" "$RUN/train.log" || true
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
      echo "the run is still going after $2 s: stopping its training" >&2; kill -TERM "$(cat "$RUN/run.pid")" || true
      stopped=1 end=$((SECONDS + ${STOP_GRACE:-90}))
    elif [ $SECONDS -ge $end ]; then
      echo "the run has not ended ${STOP_GRACE:-90} s after that: killing it" >&2; kill -KILL "$(cat "$RUN/run.pid")" || true
    fi
    sleep 2
  done
  tail -4 "$RUN/train.log" | cut -c1-400
  for name in "$RUN/result.json" "$RUN/train.log" "$RUN/samples.png" "$WORK/pixelcnn_warm.log" \
      "$WORK/cuda_tests.log" "$WORK/cuda_suite_passed.json"; do
    [ ! -e "$name" ] || { cp "$name" "$OUT"/ && echo "in \$OUT: $(basename "$name")"; }
  done
  [ -f "$RUN/result.json" ]
  ;;
*)
  echo "usage: bash ops/pixelcnn_lease.sh setup|begin|await|launch|wait|finish ..." >&2; exit 2
  ;;
esac
