"""scripts/gpu_validate.sh without a GPU: the GPU run's commands are well formed, and a tiny dry
run on CPU writes every output where the script says."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs_commands import Command, check_command

from autoshard.torchrec import torchrec_unavailable

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/gpu_validate.sh"
STEPS = ("grid", "fit", "compare", "eval", "calibrate", "tiers", "summary")

needs_fbgemm = pytest.mark.skipif(
    torchrec_unavailable(load=True) is not None,
    reason=f"fbgemm/torchrec not importable: {torchrec_unavailable(load=True)}")


def script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)


def problems(line: str) -> list[str]:
    """What check_command finds wrong with one command line of the script (the interpreter
    named as the documents name it)."""
    words = shlex.split(line)
    words = [".venv/bin/python" if w == sys.executable else w for w in words]
    return check_command(Command(tuple(words), 1))


def test_the_gpu_runs_commands_are_well_formed_and_fit_eight_minutes() -> None:
    done = script("--print-commands")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(STEPS)
    assert {line: problems(line) for line in lines} == {line: [] for line in lines}
    assert "bench --grid gpu --device cuda" in lines[0]
    assert "tiers --device cuda" in lines[5] and "--model results/gpu/GPU/model" in lines[5]
    limits = [int(shlex.split(line)[1]) for line in lines]
    assert sum(limits) <= 8 * 60 - 15


def test_an_unknown_option_is_refused() -> None:
    done = script("--gpu")
    assert done.returncode == 2 and "unknown option --gpu" in done.stderr


@pytest.mark.slow
@needs_fbgemm
def test_the_dry_run_writes_every_output_where_documented(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = dict(os.environ, PY=sys.executable, OMP_NUM_THREADS="1")
    done = script("--dry-run", "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr + (out / "log.txt").read_text()
    steps = (out / "steps.txt").read_text().splitlines()
    assert [s.split()[0] for s in steps] == list(STEPS)
    assert all(" rc=0 " in s for s in steps), steps
    commands = (out / "commands.txt").read_text().strip().splitlines()
    assert len(commands) == len(STEPS)
    assert {c: problems(c) for c in commands} == {c: [] for c in commands}
    assert "dry run" in (out / "machine.txt").read_text()
    assert len((out / "grid.csv").read_text().splitlines()) > 1
    assert (out / "model" / "metadata.json").is_file()
    assert (out / "compare" / "metrics.json").is_file()
    assert "all" in json.loads((out / "committed_model_on_grid.json").read_text())
    cv = json.loads((out / "calibration.json").read_text())["cross_validated_mape"]
    assert math.isfinite(cv["base"]) and math.isfinite(cv["scales"])
    tiers = json.loads((out / "tiers" / "tiers.json").read_text())
    assert tiers["dry_run"] and [r["hbm_share"] for r in tiers["rows"]] == [
        0, 0.001, 0.01, 0.05, 0.2, 1]
    assert all(r["step_ms"] > 0 and r["modelled"]["analytical"]["compute_ms"] > 0
               for r in tiers["rows"])
    # The analytical model prices more HBM rows cheaper: compute falls as the share grows.
    compute = [r["modelled"]["analytical"]["compute_ms"] for r in tiers["rows"]]
    assert compute == sorted(compute, reverse=True) and compute[0] > compute[-1]
    assert "DRY RUN" in (out / "tiers" / "tiers.md").read_text()
    readme = (out / "README.md").read_text()
    assert readme.startswith("# GPU validation on dry-run (CPU)") and "tiers/tiers.md" in readme
