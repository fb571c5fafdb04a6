#!/usr/bin/env bash
# Builds autoshard's wheel, installs it in a fresh virtual environment outside the checkout
# (dependencies from the package registries; torch pinned to the 2.13.0 CPU build as in
# setup.sh), and runs `autoshard plan -s ppo` and `autoshard demo` there: the committed policy
# and learned cost model must come from the installed package, not from this checkout.
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

echo "wheel_smoke: installing $(basename "$wheel") in a fresh venv"
rm -rf "$WORK/venv"
"$PY" -m venv "$WORK/venv"
pip_in "$WORK/venv/bin/python" install -q torch==2.13.0
pip_in "$WORK/venv/bin/python" install -q "$wheel"

cd "$WORK"  # nothing of the checkout on sys.path from here on
where=$(venv/bin/python -c "import autoshard; print(autoshard.__file__)")
case "$where" in
  "$WORK"/venv/*) ;;
  *) echo "wheel_smoke: autoshard imported from $where, not the wheel" >&2; exit 1 ;;
esac

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
echo "wheel_smoke: passed (plan -s ppo and demo from the installed wheel)"
