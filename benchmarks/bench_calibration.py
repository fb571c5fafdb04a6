"""Calibrating the committed cost model to this machine: MAPE before and after, held out.

1. ``autoshard cost-model calibrate`` of the committed model (``autoshard/data/cost_model``,
   measured on another machine) with its default budget, writing ``<out>/model``;
2. two fresh held-out samples measured here after it: the ``quick`` grid (other table sizes
   than the default grid's) and a stratified sample of the default grid disjoint from the
   calibration sample;
3. the committed and the calibrated model scored on both (MAPE, Spearman), next to the
   committed model's own held-out figures on the machine that measured it.

Every sweep resumes (rows are flushed as measured), so an interrupted run loses nothing.

    .venv/bin/python benchmarks/bench_calibration.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.cost_models.calibrate import SAMPLE_FILE, stratified_sample
from autoshard.cost_models.evaluate import metrics
from autoshard.cost_models.features import dataset
from autoshard.cost_models.microbench import Timing, done_ids, sweep
from autoshard.fileio import atomic_write_text
from autoshard.machine import machine_record
from autoshard.pricing.cost import load_cost_model

COMMITTED = Path("autoshard/data/cost_model")
COMMITTED_METRICS = Path("results/cost_model/metrics.json")


def _cli(*args: str) -> None:
    cmd = [sys.executable, "-m", "autoshard", *args]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


def score(model_dir: Path, csv: Path, stat: str) -> dict[str, Any]:
    """Metrics of a model on a sample, and its level shift: the median ratio measured /
    modelled (how much faster or slower the machine ran than the model expects)."""
    import pandas as pd

    model: Any = load_cost_model(str(model_dir))
    X, y, _ = dataset(pd.read_csv(csv), source=str(csv), stat=stat)
    pred = model.predict(X)
    return dict(metrics(pred, y), level_shift=float(np.exp(np.median(np.log(y / pred)))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/cost_model/calibration"))
    parser.add_argument("--heldout", type=int, default=120, help="default-grid configurations")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="calibration budget (default: the command's own)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    model_dir = args.out / "model"
    load_before = os.getloadavg()
    start = time.perf_counter()
    budget = [] if args.budget_s is None else ["--budget-s", str(args.budget_s), "--size", "2000"]
    _cli("cost-model", "calibrate", str(COMMITTED), "-o", str(model_dir), "--no-progress",
         *budget)
    calibrate_s = time.perf_counter() - start
    quick = args.out / "heldout_quick.csv"
    _cli("bench", "--grid", "quick", "--no-progress", "-o", str(quick))
    repeat = args.out / "heldout_quick_repeat.csv"
    _cli("bench", "--grid", "quick", "--no-progress", "-o", str(repeat))
    sample = args.out / "heldout_default.csv"
    used = done_ids(model_dir / SAMPLE_FILE)
    sweep(stratified_sample("default", args.heldout, seed=1, exclude=used), sample,
          timing=Timing(), progress=False)
    meta = json.loads((model_dir / "metadata.json").read_text())
    stat = meta["calibration"]["stat"]
    rows = {}
    for name, csv in (("quick grid (fresh)", quick), ("quick grid (fresh, second sweep)", repeat),
                      ("default grid, held-out sample", sample)):
        rows[name] = {"before": score(COMMITTED, csv, stat), "after": score(model_dir, csv, stat)}
    import pandas as pd

    from autoshard.cost_models.evaluate import repeatability

    noise = repeatability(pd.read_csv(quick), pd.read_csv(repeat), stat)
    own = json.loads(COMMITTED_METRICS.read_text())["models"]["lightgbm"]
    command = " ".join([".venv/bin/python", "benchmarks/bench_calibration.py",
                        *(argv if argv is not None else sys.argv[1:])])
    doc = {"command": command,
           "machine": machine_record(), "committed_model_machine": meta["machines"]["base"],
           "calibration": meta["calibration"], "calibrate_wall_s": round(calibrate_s, 1),
           "scales": meta["scales"], "heldout": rows, "quick_grid_noise_floor": noise,
           "committed_own_heldout": {"mape": own["mape"], "spearman": own["spearman"]},
           "load_average": {"start": [round(v, 2) for v in load_before],
                            "end": [round(v, 2) for v in os.getloadavg()]}}
    atomic_write_text(args.out / "results.json", json.dumps(doc, indent=2) + "\n")
    atomic_write_text(args.out / "results.md", markdown(doc))
    print(markdown(doc))


def _load(doc: dict[str, Any], when: str) -> str:
    return ", ".join(f"{v:.2f}" for v in doc["load_average"][when])


def markdown(doc: dict[str, Any]) -> str:
    cal = doc["calibration"]
    cv = cal["cross_validated_mape"]
    lines = [
        "# Calibrating the committed cost model to this machine", "",
        f"Command: `{doc['command']}`", "",
        f"Machine: {doc['machine']['description']} (fingerprint {doc['machine']['fingerprint']})."
        f" The committed model was measured on {doc['committed_model_machine']['cpu_model']}."
        f" Load average (1, 5, 15 min) at the start {_load(doc, 'start')}, at the end "
        f"{_load(doc, 'end')}.", "",
        f"`autoshard cost-model calibrate` measured {cal['configurations']} configurations of "
        f"the `{cal['grid']}` grid (stratified by operator, tables per operator, partition, "
        "table size and batch) "
        f"in {cal['measure_seconds']} s ({doc['calibrate_wall_s']} s in all, fit included); "
        "5-fold cross-validated MAPE on that sample: "
        + ", ".join(f"{k} {100 * v:.1f}%" for k, v in cv.items() if k != "folds")
        + f" (correction kept: {cal['residual'] or 'none'}). Scales (measured / committed model, "
        "per operator and mode): "
        + ", ".join(f"{k} {np.exp(v):.2f}x" for k, v in doc["scales"].items()) + ".", "",
        "Held out (measured here after calibrating, none of the calibration configurations):",
        "", "| sample | configurations x modes | MAPE before | MAPE after | Spearman before | "
        "Spearman after | measured / modelled after (median) |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in doc["heldout"].items():
        b, a = r["before"], r["after"]
        lines.append(f"| {name} | {a['samples']} | {100 * b['mape']:.1f}% | "
                     f"{100 * a['mape']:.1f}% | {b['spearman']:.3f} | {a['spearman']:.3f} | "
                     f"{a['level_shift']:.2f} |")
    noise = doc["quick_grid_noise_floor"]
    lines += ["", f"Noise floor: the quick grid measured twice in this run (`heldout_quick.csv`, "
              f"`heldout_quick_repeat.csv`) disagrees with itself by {100 * noise['mape']:.1f}% "
              f"MAPE (median {100 * noise['median_ape']:.1f}%, Spearman "
              f"{noise['spearman']:.3f}): no model can be expected to predict a single "
              "measurement here more closely. The last column is the held-out sample's median "
              "ratio of measured to modelled latency: away from 1.00, the machine ran slower "
              "(or faster) while measuring it than while measuring the calibration sample "
              "minutes before, an error no correction fitted to that sample can remove."]
    own = doc["committed_own_heldout"]
    lines += ["", f"The committed model on its own machine's held-out configurations "
              f"(`results/cost_model/metrics.md`): MAPE {100 * own['mape']:.2f}%, Spearman "
              f"{own['spearman']:.3f}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
