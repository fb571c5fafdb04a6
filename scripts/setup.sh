#!/usr/bin/env bash
# Creates .venv and installs autoshard with its dev and torchrec extras (CPU builds).
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
# torch is pinned: 2.13.0 is a CPU build; an unpinned torch pulls a multi-GB CUDA build.
pip install -q torch==2.13.0
pip install -q -e '.[dev]'
# The torchrec extra: fbgemm-gpu-cpu must match torch exactly; torchrec's own metadata asks for
# the CUDA fbgemm-gpu, so it is installed without dependencies and its needs are listed here.
pip install -q fbgemm-gpu-cpu==1.8.0
pip install -q --no-deps torchrec==1.8.0
pip install -q tensordict torchmetrics==1.0.3 tqdm pyre-extensions
echo "autoshard installed in .venv"
