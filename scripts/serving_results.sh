#!/usr/bin/env bash
# Regenerates results/serving/: the simulated suites (each answer planned again on 5 fresh
# seeds), medium at 60,000 qps with the hot-row cache and int8 rows, the study of Lui et al.'s
# findings, the simulator's speed and the measured `bench` suite. Resumable: each finished step is listed in results/serving/.progress and skipped when
# the script runs again; `scripts/serving_results.sh fresh` starts over.
# `scripts/serving_results.sh simulated` runs all but the measured suite;
# `scripts/serving_results.sh bench` redoes only the measured suite: it calibrates this machine
# first, then measures every strategy's deployment (and a replicated and a 7-server one) by
# replay, one server at a time, holding /tmp/autoshard-measure.lock so no other measurement
# overlaps it. Run it on a quiet machine (the report records the load average before and after).
set -euo pipefail
cd "$(dirname "$0")/.."
AS=.venv/bin/autoshard
# one BLAS thread: the simulator's matrices are small, and threads contend on a small machine
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
DONE=results/serving/.progress
mkdir -p results/serving
MODE=${1:-all}
if [[ "$MODE" == fresh ]]; then rm -f "$DONE"; MODE=all; fi
touch "$DONE"
step() {  # step NAME COMMAND...: runs COMMAND unless NAME is already done
  local name=$1; shift
  if grep -qx "$name" "$DONE"; then echo "skip $name (done)"; return; fi
  "$@"
  echo "$name" >> "$DONE"
}
if [[ "$MODE" != bench ]]; then
  step small $AS serve compare --suite small --requests 10000 --samples 5 --span 3 --seeds 1,2,3,4,5 \
    -o results/serving
  step medium $AS serve compare --suite medium --requests 10000 --samples 5 --span 4 --seeds 1,2,3,4,5 \
    -o results/serving
  step sparse $AS serve compare --suite sparse --requests 10000 --samples 5 --span 4 --seeds 1,2,3,4,5 \
    -o results/serving
  step large $AS serve compare --suite large --requests 10000 --samples 5 --span 4 --seeds 1,2,3,4,5 \
    -o results/serving
  step medium60k-cache $AS serve plan --model medium --p99-ms 5 --qps 60000 --cache \
    -o results/serving/medium-60k-cache
  step medium60k-cache-int8 $AS serve plan --model medium --p99-ms 5 --qps 60000 --cache \
    --precision int8 -o results/serving/medium-60k-cache-int8
  step study $AS serve study --requests 10000 --samples 5 -o results/serving
  step simulator .venv/bin/python benchmarks/bench_serving.py
fi
if [[ "$MODE" == simulated ]]; then exit 0; fi
if [[ "$MODE" == bench ]]; then sed -i '/^bench$/d' "$DONE"; fi
step bench flock /tmp/autoshard-measure.lock $AS serve compare --suite bench --measure \
  --bench-mode replay --bench-requests 1100 --bench-warmup 100 --bench-rounds 5 \
  --requests 20000 --span 2 -o results/serving
