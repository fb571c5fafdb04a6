#!/usr/bin/env bash
# Builds autoshard's wheel and installs it in fresh virtual environments outside the checkout
# (dependencies from the package registries), in two stages:
# 1. the wheel alone, without extras (no torch): it plans with recshard, evaluates, writes a plan
#    file and exports it for TorchRec; `plan -s ppo` exits 2 naming the `learned` extra;
# 2. torch pinned to the 2.13.0 CPU build first (as in setup.sh), then the wheel with the extras
#    `plan -s ppo` and `demo` need (learned, costmodel, plots): both run, and the committed
#    policy and learned cost model must come from the installed package, not from this checkout.
# Usage: scripts/wheel_smoke.sh [WORKDIR]     (default: a new temporary folder, removed after)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
# shellcheck source=scripts/pip.sh
source scripts/pip.sh
WORK=${1:-$(mktemp -d -t autoshard-wheel-XXXXXX)}
[ $# -ge 1 ] || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
case "$WORK/" in
  "$ROOT"/*) echo "wheel_smoke: $WORK lies inside the checkout" >&2; exit 1 ;;
esac

echo "wheel_smoke: building the wheel"
# From a copy of the files git tracks or would track, so that nothing stale in the checkout
# (build/, an old egg-info) reaches the wheel and the checkout is left untouched.
rm -rf "$WORK/src" "$WORK/dist"
mkdir -p "$WORK/src"
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
  | tar --null -T - -cf - | tar -xf - -C "$WORK/src"
pip_in "$PY" wheel --no-deps -q -w "$WORK/dist" "$WORK/src"
wheel=$(ls "$WORK"/dist/autoshard-*.whl)

# from_wheel VENV: fails unless VENV's autoshard is the installed wheel's.
from_wheel() {
  local where
  where=$("$WORK/$1/bin/python" -c "import autoshard; print(autoshard.__file__)")
  case "$where" in
    "$WORK/$1"/*) ;;
    *) echo "wheel_smoke: autoshard imported from $where, not the wheel" >&2; exit 1 ;;
  esac
}

echo "wheel_smoke: stage 1: $(basename "$wheel") without extras in a fresh venv"
stage1_start=$SECONDS
rm -rf "$WORK/core" "$WORK/stage1"
"$PY" -m venv "$WORK/core"
pip_in "$WORK/core/bin/python" install -q "$wheel"
mkdir -p "$WORK/stage1"
cd "$WORK/stage1"  # nothing of the checkout on sys.path from here on
from_wheel core
../core/bin/python - <<'PY'
import importlib.util

from autoshard.extras import EXTRAS

present = sorted({m for e in EXTRAS.values() for m in e.modules
                  if importlib.util.find_spec(m) is not None})
assert not present, f"installed without extras, yet these are importable: {present}"
PY
../core/bin/autoshard --help >/dev/null
COLUMNS=200 ../core/bin/autoshard sharders
COLUMNS=200 ../core/bin/autoshard plan -t default -s recshard --devices 8 --hbm-gb 6 \
  --time-limit 10 -o plan.json | tail -n 3
../core/bin/autoshard evaluate plan.json --json >evaluate.json
COLUMNS=200 ../core/bin/autoshard export plan.json -o torchrec_plan.yaml
../core/bin/python - <<'PY'
import json

import yaml

plan = json.load(open("plan.json"))
assert plan["sharder"] == "recshard" and len(plan["placements"]) == 856, plan.get("sharder")
report = json.load(open("evaluate.json"))
assert report["cost_ratio"] >= 1.0, report["cost_ratio"]
exported = yaml.safe_load(open("torchrec_plan.yaml"))
assert exported["kind"] == "torchrec_sharding_plan" and len(exported["tables"]) == 856
PY
status=0
../core/bin/autoshard plan -t default -s ppo --devices 8 --hbm-gb 6 -o ppo.json 2>ppo.err \
  || status=$?
cat ppo.err
if [ "$status" -ne 2 ] || ! grep -qF "pip install 'autoshard[learned]'" ppo.err \
    || [ -e ppo.json ]; then
  echo "wheel_smoke: plan -s ppo without the learned extra must exit 2 naming it" \
    "(exit status $status)" >&2
  exit 1
fi
echo "wheel_smoke: stage 1 passed in $((SECONDS - stage1_start)) s"

cd "$ROOT"
echo "wheel_smoke: stage 2: torch==2.13.0, then $(basename "$wheel")[learned,costmodel,plots]"
rm -rf "$WORK/venv"
"$PY" -m venv "$WORK/venv"
pip_in "$WORK/venv/bin/python" install -q torch==2.13.0
pip_in "$WORK/venv/bin/python" install -q "$wheel[learned,costmodel,plots]"

cd "$WORK"  # nothing of the checkout on sys.path from here on
from_wheel venv

echo "wheel_smoke: the wheel installs autoshard alone at top level"
venv/bin/python - <<'PY'
import importlib.metadata as metadata
import importlib.util

dist = metadata.distribution("autoshard")
top = {str(f).split("/")[0] for f in dist.files or [] if not str(f).startswith("..")}
extra = {t for t in top if t not in ("autoshard", "__pycache__") and not t.endswith(".dist-info")}
assert not extra, f"the wheel installs other top-level names: {sorted(extra)}"
for name in ("envs", "training", "cost_models"):
    assert importlib.util.find_spec(name) is None, f"'{name}' is importable at top level"
import autoshard.envs, autoshard.training.train, autoshard.cost_models.model  # noqa: E401,F401
PY

echo "wheel_smoke: autoshard plan -s ppo"
venv/bin/autoshard plan -t default -s ppo --devices 8 --hbm-gb 6 -o plan.json
venv/bin/python - <<'PY'
import json
plan = json.load(open("plan.json"))
assert plan["sharder"] == "ppo" and len(plan["placements"]) == 856, plan.get("sharder")
PY

echo "wheel_smoke: autoshard demo"
COLUMNS=300 venv/bin/autoshard demo --out demo --time-limit 10 | tee demo.log
grep -q "re-pricing with the learned model in $WORK/venv/" demo.log
venv/bin/python - <<'PY'
import csv
rows = {r["sharder"]: r for r in csv.DictReader(open("demo/demo.csv"))}
assert rows["ppo"]["status"] == "ok", rows["ppo"]
PY
echo "wheel_smoke: passed (without extras: recshard, evaluate, export, ppo refused; with them:" \
  "plan -s ppo and demo, from the installed wheel)"
