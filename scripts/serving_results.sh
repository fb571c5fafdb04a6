#!/usr/bin/env bash
# Regenerates results/serving/ (simulated suites, the measured bench suite, simulator speed).
# About 15 minutes on 2 CPU cores. `scripts/serving_results.sh bench` redoes only the measured
# suite (about 5 minutes): it calibrates this machine first, then serves every strategy for
# real, holding /tmp/autoshard-measure.lock so no other measurement overlaps it. Run it on a
# quiet machine (the report records the load average).
set -euo pipefail
cd "$(dirname "$0")/.."
AS=.venv/bin/autoshard
if [[ "${1:-all}" != bench ]]; then
  $AS serve compare --suite small --requests 20000 --span 4
  $AS serve compare --suite medium --requests 20000 --span 4
  $AS serve compare --suite sparse --requests 20000 --span 4
  $AS serve compare --suite large --requests 20000 --span 6
fi
flock /tmp/autoshard-measure.lock $AS serve compare --suite bench --measure \
  --bench-requests 1100 --bench-warmup 100 --bench-rounds 3 --requests 20000 --span 2
if [[ "${1:-all}" != bench ]]; then
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_serving.py
fi
