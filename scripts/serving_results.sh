#!/usr/bin/env bash
# Regenerates results/serving/ (simulated suites, the measured bench suite, simulator speed).
# About 15 minutes on 2 CPU cores; the measured part calibrates this machine first.
set -euo pipefail
cd "$(dirname "$0")/.."
AS=.venv/bin/autoshard
$AS serve compare --suite small --requests 20000 --span 4
$AS serve compare --suite medium --requests 20000 --span 4
$AS serve compare --suite sparse --requests 20000 --span 4
$AS serve compare --suite large --requests 20000 --span 6
$AS serve compare --suite bench --measure --bench-requests 1000 --requests 20000 --span 2
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_serving.py
