#!/usr/bin/env bash
# Does a resumed run find its compiled graphs in Inductor's cache, filled by a fresh run (a GPU
# lease's `warm`)? The GPU recipe shrunk to one layer of width 16, on the CPU: a fresh run of 20
# steps (sanity validation first, as `warm`), then a run resumed from its continue.ckpt (no sanity
# validation: training first), sharing one fresh cache. Prints the FX graphs each run added to the
# cache and the recompilations Dynamo logged (docs/experiments.md entry 30).
#   bash experiments/resume_compile_cache.sh ../shared/cifar10 runs/resume_compile_cache
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-../shared/cifar10}
OUT=${2:-runs/resume_compile_cache}
PYTHON=${PYTHON:-.venv/bin/python}
rm -rf "$OUT" && mkdir -p "$OUT"
export TORCHINDUCTOR_CACHE_DIR=$PWD/$OUT/inductor WANDB_MODE=disabled TORCH_LOGS=recompiles
# Training and validation batches of different sizes, as the recipe's 120 and 250.
SMALL=(--config configs/cifar10_dmol_25min.yaml --data.root "$ROOT" --wandb disabled
       --model.config.n_layers 1 --model.config.d_model 16 --model.config.attention.n_heads 2 --model.config.d_filter 32
       --model.lr_horizon steps --model.warmup_steps 2 --data.batch_size 4 --data.eval_batch_size 8
       --data.val_size 16 --trainer.limit_val_batches 2 --trainer.val_check_interval 10
       --trainer.precision 32-true --trainer.max_time null)
graphs() { find "$TORCHINDUCTOR_CACHE_DIR" -path '*fxgraph*' -type f 2>/dev/null | wc -l; }

SECONDS=0
"$PYTHON" -m imagetx.train "${SMALL[@]}" --trainer.max_steps 20 --trainer.default_root_dir "$OUT/fresh" \
    >"$OUT/fresh.log" 2>&1
echo "fresh run: $(graphs) FX graphs in the cache, $(grep -c 'Recompiling function' "$OUT/fresh.log") recompilations, ${SECONDS} s"
before=$(graphs); SECONDS=0
"$PYTHON" -m imagetx.train "${SMALL[@]}" --trainer.max_steps 36 --trainer.default_root_dir "$OUT/resumed" \
    --resume "$OUT/fresh/checkpoints/continue.ckpt" >"$OUT/resumed.log" 2>&1
echo "resumed run: $(( $(graphs) - before )) FX graphs added, $(grep -c 'Recompiling function' "$OUT/resumed.log") recompilations, ${SECONDS} s"
