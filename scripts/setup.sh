#!/usr/bin/env bash
# Creates .venv and installs autoshard with every extra (`all`: learned, costmodel, data, run,
# tracking, plots), the dev tools and the torchrec extra (CPU builds).
# Usage: scripts/setup.sh            (idempotent; rerun after pulling)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# shellcheck source=scripts/pip.sh
source scripts/pip.sh
pip() { pip_in .venv/bin/python "$@"; }
pip install -q --upgrade pip
# torch is pinned, and installed before the extras that need it: 2.13.0 is a CPU build; an
# unpinned torch pulls a multi-GB CUDA build.
pip install -q torch==2.13.0
# setuptools notes, as a warning, that this editable install finds autoshard.envs, .training and
# .cost_models (folders beside autoshard/) through an import hook; it is information, not a
# fault, and only that note is left out.
PYTHONWARNINGS="ignore:Editable installation" pip install -q -e '.[all,dev]'
# The torchrec extra: fbgemm-gpu-cpu must match torch exactly; torchrec's own metadata asks for
# the CUDA fbgemm-gpu, so torchrec is installed without dependencies and its needs are listed
# here. They go first and torchrec last: pip checks the installed packages' requirements after
# every install that resolves dependencies, and a check that saw torchrec would print
# "ERROR: pip's dependency resolver ... torchrec 1.8.0 requires fbgemm-gpu" (fbgemm-gpu-cpu
# provides it); an install with --no-deps runs no such check.
pip install -q fbgemm-gpu-cpu==1.8.0 tensordict torchmetrics==1.0.3 tqdm pyre-extensions
pip install -q --no-deps torchrec==1.8.0
echo "autoshard installed in .venv"
