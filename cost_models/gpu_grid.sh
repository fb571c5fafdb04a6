#!/usr/bin/env bash
# HBM vs UVM vs UVM-caching microbenchmark grid on one NVIDIA GPU, then the held-out comparison.
#
#   bash cost_models/gpu_grid.sh [NAME]      (from the repository root, with .venv set up)
#
# Measures the `gpu` grid at the hbm / uvm / uvm_caching tiers (FBGEMM EmbeddingLocation DEVICE /
# MANAGED / MANAGED_CACHING; where FBGEMM has no CUDA build, the torch operator only, with `uvm`
# read from pinned host memory), timed with CUDA events. Rerunning resumes the CSV. Writes
# results/microbench/NAME.csv (default: gpu_<GPU name>), its log, and the comparison and a model
# fitted on it under results/cost_model/NAME/.
set -euo pipefail
PY=${PY:-.venv/bin/python}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1 | tr -c 'A-Za-z0-9\n' '_')
NAME=${1:-gpu_${GPU}}
CSV=results/microbench/${NAME}.csv
LOG=results/microbench/${NAME}.log
mkdir -p results/microbench "results/cost_model/${NAME}"
{
  echo "start $(date -u +%FT%TZ) on ${GPU}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  time "$PY" -m autoshard bench --grid gpu --device cuda --no-progress -o "$CSV"
  echo "end $(date -u +%FT%TZ)"
} 2>&1 | tee -a "$LOG"
"$PY" -m autoshard cost-model compare "$CSV" -o "results/cost_model/${NAME}"
"$PY" -m autoshard cost-model fit "$CSV" -o "results/cost_model/${NAME}/model"
