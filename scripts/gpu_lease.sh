#!/usr/bin/env bash
# One training run on a lent GPU machine, in steps that each fit one device call (docs/gpu.md,
# "A lease, call by call"). Run from the repository root there:
#   bash scripts/gpu_lease.sh setup                      # wheels, the shards carried in .stage/*/, versions
#   bash scripts/gpu_lease.sh pilot MAX_TIME [OVERRIDES] # the preset on the shards staged so far
#   bash scripts/gpu_lease.sh tests                      # the CUDA-only tests
#   bash scripts/gpu_lease.sh launch MAX_TIME [OVERRIDES] # the run, detached (setsid): outlives the call
#   bash scripts/gpu_lease.sh wait SECONDS               # progress every 30 s until the run ends or SECONDS pass
#   bash scripts/gpu_lease.sh finish SECONDS             # weights, metrics, scores, grids into $OUT
# CONFIG (environment) picks the preset; MAX_TIME is Lightning's DD:HH:MM:SS.
# The machine has torch, lightning, einops; jsonargparse, torchdata and their needs travel as
# wheels in .whl/ (W&B stays behind: --wandb disabled, metrics go to csv/).
set -u
DATA=/root/data
RUN=/root/run
CODE=/root/code  # a copy of the package: later calls re-send the working tree under a running job
CONFIG=${CONFIG:-configs/cifar10_dmol_25min.yaml}
export PYTHONPATH=$CODE:/tmp/site PYTHONUNBUFFERED=1 WANDB_MODE=disabled
# The lines of a training log worth a call's output (the rest is progress bars and warnings).
LOG_LINES="data:|horizon|Time limit|Error|error"

# The run's own process id, written at launch. (Matching command lines with `pgrep -f` also
# matches the shell of any call whose command names the module, which then waits on itself.)
running() { [ -f $RUN/train.pid ] && kill -0 "$(cat $RUN/train.pid)" 2>/dev/null; }

latest_metrics() {  # the newest value of each throughput column, and the val curve
  python3 - "$1" <<'EOF'
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

in_out() { cp "$@" "$OUT"/ && echo "in \$OUT: $*"; }  # results go back as soon as they exist

case "$1" in
setup)
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site .whl/*.whl || exit 1
  mkdir -p $DATA && cp -n .stage/*/*.npz $DATA/ 2>/dev/null
  running || { rm -rf $CODE && mkdir -p $CODE && cp -r imagetx $CODE/; }
  ls -la $DATA; nvidia-smi -L
  python3 -c "import torch, lightning, jsonargparse, torchdata; print(torch.__version__, lightning.__version__, torch.cuda.get_device_name())"
  ;;
pilot)
  rm -rf /root/pilot
  python3 -m imagetx.train --config $CONFIG --data.root $DATA --wandb disabled \
      --trainer.default_root_dir /root/pilot --trainer.max_time "$2" \
      --trainer.val_check_interval 1000 "${@:3}" 2>&1 | grep -E "$LOG_LINES" | tail -20
  latest_metrics /root/pilot
  ;;
tests)
  PYTHONPATH=$PWD:/tmp/site timeout 240 python3 -m pytest -q -p no:cacheprovider \
      tests/test_sampler.py tests/test_flex_attention.py -k cuda 2>&1 | tail -25
  ;;
launch)
  running && { echo "a run is going already (pid $(cat $RUN/train.pid))"; exit 1; }
  rm -rf $RUN && mkdir -p $RUN
  setsid nohup python3 -m imagetx.train --config $CONFIG --data.root $DATA --wandb disabled \
      --trainer.default_root_dir $RUN --trainer.max_time "$2" "${@:3}" >$RUN/train.log 2>&1 </dev/null &
  echo $! >$RUN/train.pid
  sleep 60; grep -E "$LOG_LINES" $RUN/train.log
  ;;
wait)
  end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ] && running; do
    sleep 30
    echo "--- $(date +%T)  $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)"
    latest_metrics $RUN | tail -2
  done
  grep -E "$LOG_LINES" $RUN/train.log | tail -5
  ;;
finish)
  end=$((SECONDS + $2))
  while running; do
    [ $SECONDS -lt $end ] || { echo "the run is still going after $2 s: stopping it (last.ckpt stays)"; kill "$(cat $RUN/train.pid)"; sleep 20; }
    sleep 5
  done
  tail -3 $RUN/train.log
  # What the lease is for comes back first: the weights, the metrics, the log.
  python3 -m imagetx.export --ckpt $RUN/checkpoints/last.ckpt --out /root/export --dtype bf16 | tail -1
  in_out /root/export/model.safetensors /root/export/config.json $RUN/train.log
  in_out "$(ls $RUN/csv/version_*/metrics.csv | tail -1)"
  # The shipped (bf16) weights on all 5,000 val images, through FlexAttention (auto on CUDA).
  timeout 120 python3 -m imagetx.evaluate --ckpt /root/export --data.root $DATA --split val --device cuda \
      --batch_size 250 | tail -1 | tee $OUT/eval_val.json
  timeout 90 python3 -m imagetx.sample --ckpt /root/export --task generate --count 64 --seed 0 \
      --device cuda --out /root/grids | tail -1
  timeout 60 python3 -m imagetx.sample --ckpt /root/export --task complete --rows 16 --count 8 --samples 3 \
      --data.root $DATA --split val --seed 0 --device cuda --out /root/grids | tail -1
  in_out /root/grids/*.png
  ls -la $OUT
  ;;
*)
  echo "usage: bash scripts/gpu_lease.sh setup|pilot|tests|launch|wait|finish ..." >&2; exit 2
  ;;
esac
