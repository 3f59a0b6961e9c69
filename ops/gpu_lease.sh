#!/usr/bin/env bash
# One training run on a lent GPU machine, in steps that each fit one device call (ops/README.md,
# "A lease, call by call"). Run from the repository root there:
#   bash ops/gpu_lease.sh setup                       # wheels, the shards and continuation carried in .stage/*/
#   bash ops/gpu_lease.sh tests                       # the CUDA correctness tests; the run needs them passed
#   bash ops/gpu_lease.sh warm [OVERRIDES]            # compile the preset's graphs into Inductor's cache
#   bash ops/gpu_lease.sh speed [STEP_CHECK ARGS]     # the speed check of the preset's training step
#   bash ops/gpu_lease.sh candidates SECONDS          # the step of each ops/speed_candidates.txt line, in SECONDS
#   bash ops/gpu_lease.sh first [OVERRIDES]           # tests and warm side by side (both must pass), then speed
#                                                         # (and candidates for $CANDIDATES_SECONDS, where set)
#   bash ops/gpu_lease.sh begin [OVERRIDES]           # call 1: `first`, detached, beside the calls staging data
#   bash ops/gpu_lease.sh await SECONDS               # wait for `begin`'s first; fails as it did
#   bash ops/gpu_lease.sh grow GROWTH                 # the staged continuation grown (--layers N, --dropout P)
#   bash ops/gpu_lease.sh pilot MAX_TIME [OVERRIDES]  # the preset on the shards staged so far
#   bash ops/gpu_lease.sh launch MAX_TIME [OVERRIDES] # the run, detached (setsid): outlives the call
#   bash ops/gpu_lease.sh wait SECONDS                # progress every 30 s until the run ends or SECONDS pass
#   bash ops/gpu_lease.sh finish SECONDS              # the model and continuation into $OUT first; then scores
#   bash ops/gpu_lease.sh more [--again]              # what `finish` had no room for (a call of its own)
# CONFIG (environment) picks the preset; MAX_TIME is Lightning's DD:HH:MM:SS, this run's own training time.
# Every lease adds to one model: where a packed continuation was staged (.stage/*/continuation/, from
# the repository's lineage/cifar10_gpu/continuation by ops/lease_files.sh prepare), the run goes
# on from it (--resume) with a schedule of its own; else it starts the recipe. Either way the run's
# schedule is warmup-stable-decay, so it writes checkpoints/continue.ckpt before its decay. What comes
# home goes through an outbox (ops/outbox.py), each file once, as each call has room (at most 8 files
# of at most 16 MiB, 64 MiB together): `wait` sends that continuation packed (continue.ckpt.partNN) as
# soon as the run has written it; `finish` the decayed model (model.safetensors, bf16, in parts
# model.safetensors.partNN) and results.tar (continuation.json, model.safetensors.parts.json,
# config.json, lease.json, metrics.csv, train.log, eval_val.json, the grids; for a super-resolution
# model also eval_val_bounded.json and input_use.json), and what it has room for of the rest; `more`,
# in a call of its own, what is left. `ops/lease_record.py home` takes every call's folder.
# The machine has torch, lightning, einops; what else imagetx needs travels as wheels in .whl/
# (W&B stays behind: --wandb disabled, metrics go to csv/).
#
# Every step fails loudly: any failing command ends the step with its exit code (set -euo
# pipefail), so that a call's result says what went wrong.
#
# DRY_RUN=1 runs every step on this CPU, under $WORK (no wheels, no nvidia-smi, the CUDA tests
# replaced by a check that pytest runs, evaluate and sample on the CPU): tests/ops/test_gpu_lease.py
# runs it end to end with a tiny preset, so that a typo here is found in CI, not on the GPU.
set -euo pipefail
DRY_RUN=${DRY_RUN:-0}
# DRY_RUN's step_check: the preset made tiny and eager on the CPU, that a step and its JSON work
TINY_STEP=(--device cpu --no-compile --set n_layers=1 --set d_model=32 --set attention.n_heads=2 --set d_filter=64 --batch 2
    --warmup 1 --steps 2)
WORK=${WORK:-/root}
DATA=$WORK/data
RUN=$WORK/run
CODE=$WORK/code  # a copy of the package: later calls re-send the working tree under a running job
SITE=${SITE:-/tmp/site}
OUT=${OUT:?the device tool sets OUT, the folder whose files come back}
# The users' recipe (docs/gpu.md): the lineage trains the config it hands them, its growth (GrowDepth, at 1.8 M
# images) where the callback puts it; `grow --layers 28` before `warm` grows the staged continuation at that
# point, so that the warm-up compiles the grown model's graphs (issue 110).
CONFIG=${CONFIG:-configs/cifar10_recipe.yaml}
PYTHON=${PYTHON:-python3}
STAGE=${STAGE:-.stage}  # the shards carried, a folder each call
DEVICE=$([ "$DRY_RUN" = 1 ] && echo cpu || echo cuda)
GRID_SAMPLES=${GRID_SAMPLES:-64}   # the grid of 64 samples
COMPLETIONS=${COMPLETIONS:-8}      # val images completed (top half given), 3 samples each
VAL_SIZE=${VAL_SIZE:-5000}         # the last 5,000 training images: the val split
EVAL_BATCH=${EVAL_BATCH:-250}      # divides the 5,000 val images: one batch shape
export PYTHONPATH=$CODE:$SITE PYTHONUNBUFFERED=1 WANDB_MODE=disabled
# The lines of a training log worth a call's output (the rest is progress bars and warnings).
LOG_LINES="data:|horizon|continuation|Time limit|Error|error"
TESTS_PASSED=$WORK/cuda_tests_passed  # written by `tests`; `pilot` and `launch` refuse without it
CONTINUATION=$WORK/continuation      # a packed continuation, staged by `setup` when one was carried
MOMENTS=${MOMENTS:-none}             # the packed continuation's Adam moments: none (continuation.py, MOMENTS)
PACKED=$WORK/packed                  # the run's continuation packed, once (`wait` or `finish`)
OUTBOX=$WORK/outbox                  # what comes home, each file once, as the calls have room (ops/outbox.py)
# What one call brings back (the device tool): at most OUT_FILES files of at most OUT_FILE_MIB, OUT_MIB
# together; larger files travel in parts of PART_MIB. RESULTS_MIB: the room `finish` keeps for results.tar
# (logs, metrics and grids: about 1 MiB). Options here so that the dry run can exercise them.
OUT_FILES=${OUT_FILES:-8} OUT_FILE_MIB=${OUT_FILE_MIB:-16} OUT_MIB=${OUT_MIB:-64} PART_MIB=${PART_MIB:-15}
RESULTS_MIB=${RESULTS_MIB:-4}

# The run's own process id, written at launch. (Matching command lines with `pgrep -f` also
# matches the shell of any call whose command names the module, which then waits on itself.)
running() { [ -f "$RUN/train.pid" ] && kill -0 "$(cat "$RUN/train.pid")" 2>/dev/null; }
first_going() { [ -f "$WORK/first.pid" ] && kill -0 "$(cat "$WORK/first.pid")" 2>/dev/null; }  # `begin`'s job

device_name() { "$PYTHON" -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")'; }

latest_metrics() {  # the newest value of each throughput column, and the val curve
  "$PYTHON" - "$1" <<'EOF'
import csv, glob, sys
files = sorted(glob.glob(f"{sys.argv[1]}/csv/version_*/metrics.csv"))
if not files:
    sys.exit(print("no metrics yet"))
rows = list(csv.DictReader(open(files[-1])))
keys = ("train/device/samples_per_sec", "train/device/mfu", "train/device/peak_memory_gib")
newest = {key: next((r[key] for r in reversed(rows) if r.get(key)), None) for key in keys}
print("step", rows[-1].get("step") if rows else None, newest)
print("val/bpd by step:", [(r["step"], r["val/bpd"]) for r in rows if r.get("val/bpd")])
EOF
}

queue_home() { "$PYTHON" ops/outbox.py queue "$OUTBOX" "$@" --file-mib "$OUT_FILE_MIB"; }
send_home() { "$PYTHON" ops/outbox.py send "$OUTBOX" "$OUT" --files "$OUT_FILES" --total-mib "$OUT_MIB" "$@"; }

# The run's continuation packed in parts and queued to come home, once; `wait` calls it when the run's log
# says the file is written whole, `finish` when the run has ended. Adam's moments go as MOMENTS says.
continuation_home() {
  [ ! -e "$PACKED/continuation.json" ] || return 0
  rm -rf "$PACKED.new"
  "$PYTHON" -m imagetx.training.continuation pack "$RUN/checkpoints/continue.ckpt" "$PACKED.new" \
      --moments "$MOMENTS" --part-mib "$PART_MIB" >/dev/null
  queue_home "$PACKED.new"/continue.ckpt.part*
  mv "$PACKED.new" "$PACKED"
}
CONTINUATION_WRITTEN="the last before the decay"  # ContinuationCheckpoint's line, printed once the file is whole

results_tar() {  # the small results in one file (the 8-file limit), remade as more of them exist
  local files=() name
  for name in continuation.json model.safetensors.parts.json config.json lease.json metrics.csv train.log \
      cuda_suite_passed.json step_check.json \
      step_candidates.json eval_val.json eval_val_bounded.json input_use.json grids grids_bounded; do
    [ -e "$WORK/results/$name" ] && files+=("$name")
  done
  tar -C "$WORK/results" -cf "$OUT/results.tar" "${files[@]}" && echo "in \$OUT: results.tar (${files[*]})"
}

needs_tests() {
  [ -f "$TESTS_PASSED" ] || { echo "the CUDA correctness tests have not passed on this machine:" \
      "run 'bash ops/gpu_lease.sh tests' first" >&2; exit 1; }
}

# The staged continuation's model where it is not the preset's (grown by this lease's `grow` below or by
# an earlier one): every run of the lease and the speed checks take its settings, KEY=VALUE lines from
# imagetx/training/resume.py, read again only when the staged manifest changed (a Python start a step).
GROWN_SHAPE=() STEP_SHAPE=()
if [ -e "$CONTINUATION/continuation.json" ]; then
  if ! cmp -s "$CONTINUATION/continuation.json" "$WORK/shape.for"; then
    "$PYTHON" -m imagetx.training.resume settings "$CONTINUATION" --preset "$CONFIG" >"$WORK/shape.settings"
    cp "$CONTINUATION/continuation.json" "$WORK/shape.for"
  fi
  while IFS= read -r setting; do
    GROWN_SHAPE+=("--model.config.${setting%%=*}" "${setting#*=}") && STEP_SHAPE+=(--set "$setting")
  done <"$WORK/shape.settings"
fi
TRAIN=("$PYTHON" -m imagetx.train --config "$CONFIG" --data.root "$DATA" --wandb disabled "${GROWN_SHAPE[@]}")

short_run() {  # short_run FOLDER [ARGS...]: the preset into a fresh FOLDER, in the foreground; its log lines
  rm -rf "$1" && mkdir -p "$1"
  "${TRAIN[@]}" --trainer.default_root_dir "$1" "${@:2}" >"$1/train.log" 2>&1 || { tail -30 "$1/train.log"; exit 1; }
  grep -E "$LOG_LINES" "$1/train.log" | tail -20 || true  # (grep finds nothing: no such lines)
}

case "${1:-}" in
setup)
  if [ "$DRY_RUN" != 1 ]; then
    [ -d "$SITE" ] || "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$SITE" .whl/*.whl
    nvidia-smi -L
  fi
  mkdir -p "$DATA"
  for shard in "$STAGE"/*/*.npz; do [ -e "$shard" ] && cp -n "$shard" "$DATA"/; done
  for packed in "$STAGE"/*/continuation; do
    [ -e "$packed/continuation.json" ] && rm -rf "$CONTINUATION" && cp -r "$packed" "$CONTINUATION"
  done
  [ -e "$CONTINUATION/continuation.json" ] && echo "continuation staged: $(cat "$CONTINUATION/continuation.json" \
      | "$PYTHON" -c 'import json, sys; m = json.load(sys.stdin); print("step", m["step"], "images", m["images_seen"])')"
  running || first_going || { rm -rf "$CODE" && mkdir -p "$CODE" && cp -r imagetx "$CODE"/; }
  ls -la "$DATA"
  "$PYTHON" -c "import torch, lightning, jsonargparse, torchdata, huggingface_hub, imagetx; print(torch.__version__, \
lightning.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"
  ;;
tests)
  rm -f "$TESTS_PASSED"
  # The whole CUDA suite when a file it covers changed since it last passed on a GPU, else the checks
  # the run depends on (ops/cuda_suite.py, ops/cuda_suite_passed.json).
  mapfile -t SELECTION < <("$PYTHON" ops/cuda_suite.py selection)
  echo "CUDA tests: ${SELECTION[0]} (${SELECTION[*]:1})"
  if [ "$DRY_RUN" = 1 ]; then  # no CUDA here: that pytest runs from the copied code is what can be checked
    # (with a file of the reference masks' tests, one of the quickest: CI runs this step twice)
    PYTHONPATH=$PWD:$SITE timeout 240 "$PYTHON" -m pytest -q -p no:cacheprovider tests/model/test_can_attend.py \
        | tee "$WORK/cuda_tests.log" | tail -3
  else
    # -rs lists any skip, and a skipped one fails the step: on the GPU each of them must run.
    PYTHONPATH=$PWD:$SITE timeout 300 "$PYTHON" -m pytest -q -rs -p no:cacheprovider "${SELECTION[@]:1}" 2>&1 \
        | tee "$WORK/cuda_tests.log" | tail -30
    ! grep -q "SKIPPED" "$WORK/cuda_tests.log" || { echo "CUDA tests were skipped: is the GPU visible?" >&2; exit 1; }
  fi
  if [ "${SELECTION[0]}" = whole ] && [ "$DRY_RUN" != 1 ]; then  # brought home by `finish`, installed by `home`
    "$PYTHON" ops/cuda_suite.py record "$WORK/cuda_suite_passed.json" --device "$(device_name)" \
        --passed "$(grep -oE '[0-9]+ passed' "$WORK/cuda_tests.log" | tail -1 | cut -d' ' -f1)"
  fi
  touch "$TESTS_PASSED"
  ;;
warm)
  # A few steps of the preset on the shards staged so far, run beside `tests` in the first call: they
  # compile the training and evaluation graphs into Inductor's cache on this machine's disk, so that
  # the run's budget goes to steps (about 70 s of compilation on a fresh machine; 7 s from the cache).
  # The steps train nothing that is kept: the folder is the warm-up's own.
  short_run "$WORK/warm" --trainer.max_steps "${WARM_STEPS:-20}" "${@:2}"
  echo "warm: compiled and ran ${WARM_STEPS:-20} steps in $SECONDS s"
  ;;
speed)
  # The preset's training step alone (scripts/step_check.py): images/s, MFU, memory, compiled graphs,
  # graph breaks, the costliest kernels; after `warm`, whose Inductor cache can serve its compilation.
  if [ "$DRY_RUN" = 1 ]; then SPEED=("${TINY_STEP[@]}"); else SPEED=(--device cuda); fi
  timeout 240 "$PYTHON" -m scripts.step_check --preset "$CONFIG" "${SPEED[@]}" "${STEP_SHAPE[@]}" \
      --json "$WORK/step_check.json" "${@:2}" 2>&1 | grep -v "^USDT\|^ERROR:.*gpuGetDeviceCount"
  ;;
candidates)
  # Candidates for a faster step (ops/speed_candidates.txt: NAME and step_check arguments a line), each
  # step_check'd in its own process, in the file's order, until SECONDS have passed: one JSON object a line
  # in step_candidates.json. A candidate that fails or outlives what is left is recorded as such.
  end=$((SECONDS + $2))
  mkdir -p "$WORK" && : >"$WORK/step_candidates.json"
  if [ "$DRY_RUN" = 1 ]; then CHECK=("${TINY_STEP[@]}"); else CHECK=(--device cuda --warmup 3 --steps 10); fi
  while read -r name args; do
    case "$name" in ''|'#'*) continue ;; esac
    left=$((end - SECONDS))
    [ "$left" -gt 10 ] || { echo "candidates: out of time before $name" >&2; break; }
    # shellcheck disable=SC2086  # a candidate's arguments are words
    rc=0; timeout "$left" "$PYTHON" -m scripts.step_check --preset "$CONFIG" --name "$name" $args "${CHECK[@]}" \
        "${STEP_SHAPE[@]}" --json "$WORK/candidate.json" >"$WORK/candidate.out" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then  # why, in the record that comes home: out of time (timeout's 124) or the error's last lines
      tail -3 "$WORK/candidate.out" >&2
      "$PYTHON" -c 'import json, sys; print(json.dumps({"name": sys.argv[1], "failed": True, "exit": int(sys.argv[2]),
          "seconds_left": int(sys.argv[3]), "last_lines": open(sys.argv[4], errors="replace").read().splitlines()[-8:]}))' \
          "$name" "$rc" "$left" "$WORK/candidate.out" >>"$WORK/step_candidates.json"; continue
    fi
    grep -m1 "^$name: " "$WORK/candidate.out" || true
    "$PYTHON" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$WORK/candidate.json" \
        >>"$WORK/step_candidates.json"
  done <"${CANDIDATES:-ops/speed_candidates.txt}"
  ;;
first)
  # The first call's work: the CUDA tests and, beside them (the GPU has room for both), the warm-up,
  # then the speed check of the step (alone on the GPU, so that its timing is the step's). The step
  # fails if the tests or the warm-up do, after both have ended; a failed speed check is reported and
  # costs the run nothing (it measures, the run does not depend on it).
  bash "$0" warm "${@:2}" >"$WORK/warm.out" 2>&1 & warming=$!
  tests_status=0; bash "$0" tests || tests_status=$?
  warm_status=0; wait "$warming" || warm_status=$?
  tail -8 "$WORK/warm.out"
  [ "$tests_status" = 0 ] && [ "$warm_status" = 0 ] || {
    echo "first: tests exit $tests_status, warm exit $warm_status" >&2; exit 1; }
  bash "$0" speed || echo "first: the speed check failed (above); the run does not depend on it" >&2
  if [ "${CANDIDATES_SECONDS:-0}" -gt 0 ]; then bash "$0" candidates "$CANDIDATES_SECONDS" || true; fi
  ;;
begin)
  # Call 1's work when more calls stage data after it: `first`, detached, from a copy of the tree (later
  # calls re-send the working tree), so that the calls staging the shards run beside the tests and the
  # warm-up; `await` (in the call that launches) waits for it and fails as `first` did.
  if first_going; then echo "first is going already (pid $(cat "$WORK/first.pid"))" >&2; exit 1; fi
  rm -rf "$WORK/tree" "$WORK/first.rc" "$WORK/first.pid" && mkdir -p "$WORK/tree"
  cp -r imagetx tests configs scripts ops experiments pyproject.toml "$WORK/tree"/
  # The detached shell writes its own process id: the `$!` of a backgrounded `cd && setsid ...` names
  # the subshell around it, which can exit as soon as setsid has forked.
  # LEASE_SCRIPT: whose `first` (ops/pixelcnn_lease.sh begins its own through this step)
  (cd "$WORK/tree" && setsid nohup bash -c 'echo $$ >"$0/first.pid"; bash "$1" first "${@:2}" \
      >"$0/first.out" 2>&1; echo $? >"$0/first.rc"' "$WORK" "${LEASE_SCRIPT:-ops/gpu_lease.sh}" "${@:2}" \
      </dev/null >/dev/null 2>&1 &)
  for _ in $(seq 50); do [ -s "$WORK/first.pid" ] && break; sleep 0.2; done
  first_going || [ -s "$WORK/first.rc" ] || { echo "begin: first did not start" >&2; exit 1; }
  echo "first: started (pid $(cat "$WORK/first.pid")); 'bash ops/gpu_lease.sh await SECONDS' waits for it"
  ;;
await)
  end=$((SECONDS + $2))
  until [ -s "$WORK/first.rc" ]; do
    if [ $SECONDS -ge $end ] || ! first_going && [ ! -s "$WORK/first.rc" ]; then
      tail -20 "$WORK/first.out" 2>/dev/null || true
      echo "await: first has not ended well within $2 s (or was never begun)" >&2; exit 1
    fi
    sleep 2
  done
  tail -20 "$WORK/first.out"
  echo "await: first ended (exit $(cat "$WORK/first.rc")) ${SECONDS} s after this call began"
  exit "$(cat "$WORK/first.rc")"
  ;;
grow)
  # The lineage's rule (ops/README.md, "When the lineage's model grows"): the continuation staged from the repository
  # grown in place, computing the same function (imagetx/training/grow.py), before `warm` and `launch`,
  # which then take the grown shape from its manifest. Grown on this machine, where it costs seconds: the
  # grown continuation would not fit call 1 beside the wheels and a shard. The staged copy is grown too,
  # since every call's `setup` stages it again.
  [ -e "$CONTINUATION/continuation.json" ] || { echo "grow: no continuation staged (run setup first)" >&2; exit 1; }
  rm -rf "$WORK/grown"
  "$PYTHON" -m imagetx.training.grow "$CONTINUATION" "$WORK/grown" "${@:2}"
  for packed in "$STAGE"/*/continuation; do
    [ -e "$packed/continuation.json" ] && rm -rf "$packed" && cp -r "$WORK/grown" "$packed"
  done
  rm -rf "$CONTINUATION" && mv "$WORK/grown" "$CONTINUATION"
  ;;
pilot)
  needs_tests
  short_run "$WORK/pilot" --trainer.max_time "$2" --trainer.val_check_interval 1000 "${@:3}"
  latest_metrics "$WORK/pilot"
  ;;
launch)
  needs_tests
  if running; then echo "a run is going already (pid $(cat "$RUN/train.pid"))" >&2; exit 1; fi
  rm -rf "$RUN" && mkdir -p "$RUN"
  RESUME=()
  [ -e "$CONTINUATION/continuation.json" ] && RESUME=(--resume "$CONTINUATION")  # else the recipe from step 0
  setsid nohup "${TRAIN[@]}" --trainer.default_root_dir "$RUN" --trainer.max_time "$2" "${RESUME[@]}" \
      "${@:3}" >"$RUN/train.log" 2>&1 </dev/null &
  echo $! >"$RUN/train.pid"
  sleep "${LAUNCH_WAIT:-60}"
  if ! running && [ ! -f "$RUN/checkpoints/last.ckpt" ]; then
    tail -20 "$RUN/train.log"; echo "the run ended within its first minute, without a checkpoint" >&2; exit 1
  fi
  grep -E "$LOG_LINES" "$RUN/train.log" || true
  ;;
wait)
  # Progress until the run ends or SECONDS pass; the continuation comes home with this call once the run
  # has written it (at the decay's start), leaving `finish`'s call the model and the figures.
  end=$((SECONDS + $2))
  send_continuation() {
    [ ! -e "$PACKED/continuation.json" ] && grep -q "$CONTINUATION_WRITTEN" "$RUN/train.log" || return 0
    { continuation_home && send_home; } || echo "wait: the continuation could not be packed yet" >&2
  }
  while [ $SECONDS -lt $end ] && running; do
    sleep "${POLL:-30}"
    [ "$DRY_RUN" = 1 ] || \
      echo "--- $(date +%T)  $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)"
    latest_metrics "$RUN" | tail -2
    send_continuation
  done
  send_continuation
  grep -E "$LOG_LINES" "$RUN/train.log" | tail -5 || true
  ;;
finish)
  end=$((SECONDS + $2))
  while running; do
    if [ $SECONDS -ge $end ]; then
      echo "the run is still going after $2 s: stopping it (last.ckpt stays)"
      kill "$(cat "$RUN/train.pid")" || true; sleep 20
    fi
    sleep 5
  done
  tail -3 "$RUN/train.log"
  # What the lease is for comes back first: the decayed model, the continuation (unless `wait` sent it),
  # then metrics and log; what finds no room in this call waits for `more`.
  rm -rf "$WORK/results" "$WORK/model_parts" && mkdir -p "$WORK/results"
  "$PYTHON" -m imagetx.export --ckpt "$RUN/checkpoints/last.ckpt" --out "$WORK/export" --dtype bf16 --force | tail -1
  "$PYTHON" -m imagetx.io.parts split "$WORK/export/model.safetensors" "$WORK/model_parts" --part-mib "$PART_MIB" >/dev/null
  queue_home "$WORK"/model_parts/model.safetensors.part??
  cp "$WORK/model_parts/model.safetensors.parts.json" "$WORK/results/"
  if [ -e "$RUN/checkpoints/continue.ckpt" ]; then
    continuation_home
    cp "$PACKED/continuation.json" "$WORK/results/"
  else
    echo "no continue.ckpt: the run ended before its decay began; the next lease starts where the last began" >&2
  fi
  send_home --keep-files 1 --keep-mib "$RESULTS_MIB"
  "$PYTHON" ops/lease_record.py summary "$RUN" "$WORK/results/lease.json" --device "$DEVICE"
  cp "$WORK/export/config.json" "$RUN/train.log" "$WORK/results/"
  for kept in cuda_suite_passed.json step_check.json step_candidates.json; do [ ! -e "$WORK/$kept" ] || cp "$WORK/$kept" "$WORK/results/"; done
  cp "$(ls "$RUN"/csv/version_*/metrics.csv | tail -1)" "$WORK/results/"
  results_tar
  # The shipped (bf16) weights on all val images, through FlexAttention (auto on CUDA), and the
  # grids, side by side: the score is bound by the GPU, eager decoding by Python's launches, and a
  # lease's minutes are few. Each writes its own log; a failure of one leaves the others' results.
  VAL=(--data.root "$DATA" --split val --val_size "$VAL_SIZE")
  mkdir -p "$WORK/logs"
  pending=()
  score() {  # score NAME WEIGHTS: all val images, into results/NAME.json
    timeout 180 "$PYTHON" -m imagetx.evaluate --ckpt "$2" "${VAL[@]}" --device "$DEVICE" \
        --batch_size "$EVAL_BATCH" >"$WORK/logs/$1.log" 2>&1 && tail -1 "$WORK/logs/$1.log" >"$WORK/results/$1.json"
  }
  if "$PYTHON" -c 'import json, sys; from ops.lease_cards import is_superres; sys.exit(not is_superres(json.load(
      open(sys.argv[1]))))' "$WORK/export/config.json"; then  # the test home applies too (lease_record.py)
    # Super-resolution (docs/model.md §6): also the same weights with exact_box_means (no tensors: a
    # setting put on at export), the score given another image's 8x8 input (what the input is worth),
    # and 16 val images upsampled | samples at 0.8, 0.9, 1.0 | original, with and without the bounds.
    "$PYTHON" -m imagetx.export --ckpt "$WORK/export" --out "$WORK/export_bounded" --exact_box_means true --force | tail -1
    score eval_val "$WORK/export" & pending+=(eval_val:$!)
    score eval_val_bounded "$WORK/export_bounded" & pending+=(eval_val_bounded:$!)
    timeout 240 "$PYTHON" -m experiments.superres_input_use "$WORK/export" --data.root "$DATA" --split val \
        --val_size "$VAL_SIZE" --count "$VAL_SIZE" --batch_size "$EVAL_BATCH" --device "$DEVICE" \
        --json "$WORK/results/input_use.json" >"$WORK/logs/input_use.log" 2>&1 & pending+=(input_use:$!)
    for weights in export export_bounded; do
      grids=grids${weights#export}
      timeout 150 "$PYTHON" -m imagetx.sample --ckpt "$WORK/$weights" --task superres --count 16 "${VAL[@]}" \
          --seed 0 --device "$DEVICE" --out "$WORK/results/$grids" >"$WORK/logs/$grids.log" 2>&1 & pending+=($grids:$!)
    done
  else
    score eval_val "$WORK/export" & pending+=(eval_val:$!)
    timeout 150 "$PYTHON" -m imagetx.sample --ckpt "$WORK/export" --task generate --count "$GRID_SAMPLES" --seed 0 \
        --device "$DEVICE" --out "$WORK/results/grids" >"$WORK/logs/generate.log" 2>&1 & pending+=(generate:$!)
    timeout 150 "$PYTHON" -m imagetx.sample --ckpt "$WORK/export" --task complete --rows 16 --count "$COMPLETIONS" \
        --samples 3 "${VAL[@]}" --seed 0 --device "$DEVICE" --out "$WORK/results/grids" \
        >"$WORK/logs/complete.log" 2>&1 & pending+=(complete:$!)
  fi
  failed=0
  for job in "${pending[@]}"; do  # the scores first: results.tar is remade as each ends
    wait "${job#*:}" || { failed=1; echo "${job%%:*} failed:"; }
    tail -1 "$WORK/logs/${job%%:*}.log"
    results_tar
  done
  ls -la "$OUT"
  exit "$failed"
  ;;
more)
  # What `finish` had no room for, in a call of its own (again until nothing is left); --again: everything
  # from the start, where a call's files did not come back.
  send_home "${@:2}"
  ls -la "$OUT"
  ;;
*)
  echo "usage: bash ops/gpu_lease.sh setup|tests|warm|speed|first|begin|await|pilot|launch|wait|finish|more ..." >&2
  exit 2
  ;;
esac
