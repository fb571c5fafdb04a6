#!/usr/bin/env bash
# One validation run on one NVIDIA GPU, about 8 minutes in all (from the repository root, with
# .venv set up):
#
#   bash scripts/gpu_validate.sh                   # on the GPU machine
#   bash scripts/gpu_validate.sh --dry-run --out runs/gpu_dry    # anywhere: tiny, on CPU
#   bash scripts/gpu_validate.sh --print-commands  # the GPU run's commands, not run
#
# Steps, each under its own time limit (seconds, overridable by the variable named):
#   1. machine.txt: nvidia-smi, torch and fbgemm versions, git commit, load average;
#   2. grid.csv: the microbenchmark grid at the HBM, UVM and UVM-caching tiers
#      (`autoshard bench --grid gpu --device cuda`, every EVERY-th configuration; GRID_S 180;
#      a grid cut by its limit keeps the rows measured, and a rerun resumes it);
#   3. model/ and compare/: the cost model fitted on the grid, and the held-out comparison of
#      model forms (`autoshard cost-model fit|compare`; FIT_S 45, COMPARE_S 45);
#   4. committed_model_on_grid.json and calibration.json: the committed (CPU-measured) model
#      scored on the grid, and its per-operator calibration, cross-validated (EVAL_S 30 each);
#   5. tiers/: one large skewed table (5M rows x 128) with its rows in HBM, in host memory
#      over UVM, or behind HBM caches of several sizes (FBGEMM MANAGED_CACHING, cache load
#      factor = the plan's HBM rows / rows): measured step time vs the analytical model and
#      the model of step 3 (TIERS_S 120; its file is rewritten after each cache size);
#   6. README.md: what was measured, on which GPU (10 s).
# The limits add up to 460 s; with machine.txt, under 8 minutes.
# Everything lands in results/gpu/<GPU name>/ (or --out DIR); commands.txt lists each command
# as run and steps.txt its exit code and seconds. A step that fails is recorded and the next
# one runs; the script exits 1 if any did (the grid's time limit is not a failure).
set -uo pipefail
PY=${PY:-.venv/bin/python}
DRY=0
PRINT=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --print-commands) PRINT=1 ;;
    --out) OUT=${2:?--out needs a folder}; shift ;;
    *) echo "error: unknown option $1 (--dry-run, --print-commands, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$DRY" = 1 ]; then
  GPU="dry-run (CPU)"; DEVICE=cpu; GRID=tiny; EVERY=1
  FIT_ARGS=(--n-estimators 20); COMPARE_ARGS=(--n-estimators 20 --mlp-epochs 5)
  TIER_ARGS=(--rows 2000 --dim 16 --pooling 4 --batch 256 --iterations 3 --warmup 1)
elif [ "$PRINT" = 1 ]; then
  GPU="GPU"; DEVICE=cuda; GRID=gpu; EVERY=${EVERY:-3}; FIT_ARGS=(); COMPARE_ARGS=()
  TIER_ARGS=(--rows 5000000 --dim 128 --pooling 32 --batch 65536 --iterations 20 --warmup 5)
else
  if ! GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1) \
      || [ -z "$GPU" ]; then
    echo "error: no NVIDIA GPU (nvidia-smi failed); use --dry-run to check the script" >&2
    exit 2
  fi
  DEVICE=cuda; GRID=gpu; EVERY=${EVERY:-3}; FIT_ARGS=(); COMPARE_ARGS=()
  TIER_ARGS=(--rows 5000000 --dim 128 --pooling 32 --batch 65536 --iterations 20 --warmup 5)
fi
SAFE=$(printf '%s' "$GPU" | tr -c 'A-Za-z0-9' '_')
OUT=${OUT:-results/gpu/${SAFE}}
FAILED=0

# step NAME LIMIT_S CMD...: logs the command, runs it under its time limit, records the result.
step() {
  local name=$1 limit=$2 start rc
  shift 2
  if [ "$PRINT" = 1 ]; then
    printf 'timeout %s' "$limit"; printf ' %q' "$@"; echo
    return 0
  fi
  { printf 'timeout %s' "$limit"; printf ' %q' "$@"; echo; } >>"$OUT/commands.txt"
  start=$(date +%s)
  timeout "$limit" "$@" >>"$OUT/log.txt" 2>&1
  rc=$?
  echo "$name rc=$rc seconds=$(( $(date +%s) - start ))" >>"$OUT/steps.txt"
  if [ "$rc" != 0 ] && ! { [ "$name" = grid ] && [ "$rc" = 124 ]; }; then
    echo "step $name failed (exit $rc); see $OUT/log.txt" >&2
    FAILED=1
  fi
}

if [ "$PRINT" = 0 ]; then
  mkdir -p "$OUT"
  : >"$OUT/commands.txt"; : >"$OUT/steps.txt"; : >"$OUT/log.txt"
  {
    echo "start $(date -u +%FT%TZ) on $(hostname); load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "gpu: $GPU"
    if [ "$DRY" = 0 ]; then
      nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
    else
      echo "dry run: no GPU used; tiny sizes on CPU"
    fi
    "$PY" -c 'import torch, fbgemm_gpu; print("torch", torch.__version__, "cuda", torch.version.cuda, "fbgemm_gpu", fbgemm_gpu.__version__)'
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  } >"$OUT/machine.txt" 2>&1
fi

step grid "${GRID_S:-180}" "$PY" -m autoshard bench --grid "$GRID" --device "$DEVICE" \
  --every "$EVERY" --no-progress -o "$OUT/grid.csv"
step fit "${FIT_S:-45}" "$PY" -m autoshard cost-model fit "$OUT/grid.csv" -o "$OUT/model" \
  "${FIT_ARGS[@]}"
step compare "${COMPARE_S:-45}" "$PY" -m autoshard cost-model compare "$OUT/grid.csv" \
  -o "$OUT/compare" "${COMPARE_ARGS[@]}"
step eval "${EVAL_S:-30}" "$PY" -m autoshard cost-model eval autoshard/data/cost_model \
  "$OUT/grid.csv" -o "$OUT/committed_model_on_grid.json"
step calibrate "${EVAL_S:-30}" "$PY" benchmarks/gpu_validate.py calibrate \
  --data "$OUT/grid.csv" --model autoshard/data/cost_model --out "$OUT/calibration.json"
step tiers "${TIERS_S:-120}" "$PY" benchmarks/gpu_validate.py tiers --device "$DEVICE" \
  "${TIER_ARGS[@]}" --hbm-shares 0,0.001,0.01,0.05,0.2,1 --model "$OUT/model" \
  --out "$OUT/tiers"
step summary 10 "$PY" benchmarks/gpu_validate.py summary --dir "$OUT" --gpu "$GPU"
[ "$PRINT" = 1 ] || echo "wrote $OUT (README.md, steps.txt)"
exit "$FAILED"
