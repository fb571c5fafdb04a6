"""The Python steps of ``scripts/gpu_validate.sh``: calibration on the GPU grid, the single-GPU
tier measurement, and the summary of the run.

- ``calibrate``: the committed cost model (measured on a CPU machine) scored on the GPU grid
  the script measured, then corrected per operator and mode (median log ratio, as
  ``autoshard cost-model calibrate`` does on a CPU), the correction cross-validated by group
  k-fold (``autoshard.cost_models.calibrate.cross_validate``): MAPE before and after;
- ``tiers``: one large skewed table on one GPU, FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen``
  with fused row-wise Adagrad, its rows in HBM (``DEVICE``), in host memory over UVM
  (``MANAGED``), or in host memory behind an HBM cache of the plan's HBM rows
  (``MANAGED_CACHING``, cache load factor = HBM rows / rows; FBGEMM's LRU cache finds the hot
  rows itself, where our model assumes the hottest rows pinned). Each size is timed
  (forward + backward with the fused optimizer, CUDA events, median of the timed steps after
  warm-up) beside the modelled figures of a one-table plan with that many HBM rows: the
  analytical model on the GPU's profile and, when given, the learned model fitted on the grid;
  Spearman of measured against modelled over the sizes. With ``--device cpu`` (the dry run)
  every size runs FBGEMM's CPU operator (``HOST``): the figures check the plumbing only;
- ``summary``: ``README.md`` of the run folder, naming the GPU and every output.

    .venv/bin/python benchmarks/gpu_validate.py tiers --device cuda --out results/gpu/X/tiers
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.fileio import atomic_write_text, write_structured

#: FBGEMM EmbeddingLocation of an HBM share: all rows, none, or a cache of that share.
DEVICE, MANAGED, CACHING, HOST = "DEVICE", "MANAGED", "MANAGED_CACHING", "HOST"


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation; None with fewer than 3 points or a constant side."""
    from scipy.stats import spearmanr

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(spearmanr(a, b)[0])


# --- calibration ----------------------------------------------------------------------------

def calibrate(data: Path, model_dir: Path) -> dict[str, Any]:
    """The model scored on ``data`` before and after a per-operator correction (cross-
    validated), and the correction fitted on all of it."""
    import pandas as pd

    from autoshard.cost_models.calibrate import cross_validate, fit_scales
    from autoshard.cost_models.features import dataset
    from autoshard.cost_models.model import LightGBMCostModel

    base = LightGBMCostModel.load(model_dir)
    stat = str(base.info_.get("stat", "p10"))
    X, y, groups = dataset(pd.read_csv(data), source=str(data), stat=stat)
    before = base.predict(X)
    cv = cross_validate(X, y, before, groups)
    return {"model": str(model_dir), "data": str(data), "stat": stat,
            "configurations": int(np.unique(groups).size), "samples": int(y.size),
            "cross_validated_mape": cv, "scales": fit_scales(X, np.log(y / before))}


# --- tiers ----------------------------------------------------------------------------------

def location(share: float, device: str) -> tuple[str, float | None]:
    """FBGEMM's EmbeddingLocation (and cache load factor) of a table with ``share`` of its
    rows in HBM."""
    if device == "cpu":
        return HOST, None
    if share >= 1.0:
        return DEVICE, None
    if share <= 0.0:
        return MANAGED, None
    return CACHING, share


def time_table(args: argparse.Namespace, share: float) -> dict[str, Any]:
    """Median forward, backward (fused optimizer) and step time of the table at one HBM share."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    from autoshard.runner.data import synthetic_batch

    where, clf = location(share, args.device)
    cuda = args.device == "cuda"
    extra: dict[str, Any] = {"device": torch.device("cuda")} if cuda else {}
    if clf is not None:
        extra["cache_load_factor"] = clf
    op = SplitTableBatchedEmbeddingBagsCodegen(
        [(args.rows, args.dim, EmbeddingLocation[where],
          ComputeDevice.CUDA if cuda else ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01, **extra)
    rng = np.random.default_rng(args.seed)
    hashed = rng.permutation(args.rows)
    batches = []
    for _ in range(4):
        drawn = synthetic_batch(table_of(args), args.batch, rng)
        offsets = np.concatenate(([0], np.cumsum(drawn.lengths)))
        batches.append((torch.from_numpy(hashed[drawn.indices]).to(extra.get("device", "cpu")),
                        torch.from_numpy(offsets).to(extra.get("device", "cpu"))))
    fwd: list[float] = []
    bwd: list[float] = []
    for step in range(args.warmup + args.iterations):
        f_ms, b_ms = _timed_step(op, *batches[step % len(batches)], cuda)
        if step >= args.warmup:
            fwd.append(f_ms)
            bwd.append(b_ms)
    return {"hbm_share": share, "hbm_rows": round(share * args.rows), "location": where,
            "cache_load_factor": clf, "fwd_ms": float(np.median(fwd)),
            "bwd_ms": float(np.median(bwd)),
            "step_ms": float(np.median(np.add(fwd, bwd)))}


def _timed_step(op: Any, indices: Any, offsets: Any, cuda: bool) -> tuple[float, float]:
    import torch

    if cuda:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        marks[0].record()
        out = op(indices, offsets)
        marks[1].record()
        out.backward(torch.ones_like(out))
        marks[2].record()
        torch.cuda.synchronize()
        return marks[0].elapsed_time(marks[1]), marks[1].elapsed_time(marks[2])
    t0 = time.perf_counter()
    out = op(indices, offsets)
    t1 = time.perf_counter()
    out.backward(torch.ones_like(out))
    return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3


def table_of(args: argparse.Namespace) -> Any:
    from autoshard.tables import Table

    return Table("big", args.rows, args.dim, pooling_factor=float(args.pooling),
                 zipf_alpha=args.alpha)


def modelled(args: argparse.Namespace, hbm_rows: int, model: Any) -> dict[str, Any]:
    """The model's figures for the table alone on one device of ``--hardware`` with
    ``hbm_rows`` of its hottest rows in HBM (an error's message instead when it fails)."""
    from autoshard.hardware import load_hardware
    from autoshard.layout.plan import Placement, Plan
    from autoshard.pricing.evaluator import evaluate
    from autoshard.task import ShardingTask, Workload

    hardware = load_hardware(args.hardware, devices=1)
    task = ShardingTask((table_of(args),), hardware, Workload(args.batch, "train"))
    plan = Plan((Placement("big", 0, hbm_rows),), "tier-check", task.workload, hardware.name)
    try:
        d = evaluate(plan, task, model).per_device[0]
    except Exception as exc:  # a learned model that cannot price this table: say so
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"hbm_ms": d.hbm_ms, "uvm_ms": d.uvm_ms, "compute_ms": d.hbm_ms + d.uvm_ms,
            "total_ms": d.total_ms}


def tiers(args: argparse.Namespace, done: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every HBM share measured and modelled, Spearman per model over the shares; ``done`` gets
    the document so far after each share (a run cut by its time limit keeps them)."""
    import torch

    from autoshard.pricing.cost import load_cost_model

    models = {"analytical": load_cost_model("analytical")}
    if args.model and Path(args.model).is_dir():
        models["learned"] = load_cost_model(str(args.model))
    doc: dict[str, Any] = {
        "device": args.device, "dry_run": args.device != "cuda",
        "table": {"rows": args.rows, "dim": args.dim, "pooling": args.pooling,
                  "alpha": args.alpha, "batch": args.batch},
        "hardware": args.hardware, "iterations": args.iterations, "warmup": args.warmup,
        "gpu": gpu_name(), "rows": [], "spearman_step_vs_modelled_compute": {}}
    for share in sorted(float(s) for s in args.hbm_shares.split(",")):
        row = time_table(args, share)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        row["modelled"] = {n: modelled(args, row["hbm_rows"], m) for n, m in models.items()}
        doc["rows"].append(row)
        for name in models:
            pairs = [(r["step_ms"], r["modelled"][name]["compute_ms"]) for r in doc["rows"]
                     if "compute_ms" in r["modelled"][name]]
            doc["spearman_step_vs_modelled_compute"][name] = spearman(
                [p[0] for p in pairs], [p[1] for p in pairs])
        print(f"share {share:g}: {row['step_ms']:.3f} ms", flush=True)
        done(doc)
    return doc


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)"


def tiers_markdown(doc: dict[str, Any]) -> str:
    t, models = doc["table"], list(doc["spearman_step_vs_modelled_compute"])
    lines = [f"# Tier check on {doc['gpu']}", "",
             f"One table of {t['rows']:,} rows x {t['dim']} (Zipf {t['alpha']}, pooling "
             f"{t['pooling']}, batch {t['batch']}), FBGEMM TBE with fused row-wise Adagrad; "
             f"median of {doc['iterations']} steps after {doc['warmup']} warm-up; modelled on "
             f"one {doc['hardware']} device." + (" DRY RUN on CPU: plumbing only." if
                                                  doc["dry_run"] else ""), "",
             "| HBM share | HBM rows | location | fwd ms | bwd ms | step ms | "
             + " | ".join(f"{n} compute ms" for n in models) + " |",
             "| " + " | ".join(["---"] * (6 + len(models))) + " |"]
    for r in doc["rows"]:
        figures = [f"{m['compute_ms']:.4f}" if "compute_ms" in m else "error"
                   for m in r["modelled"].values()]
        lines.append(f"| {r['hbm_share']:g} | {r['hbm_rows']:,} | {r['location']} | "
                     f"{r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | {r['step_ms']:.3f} | "
                     + " | ".join(figures) + " |")
    lines += ["", "Spearman of measured step against modelled compute over the HBM shares: "
              + ", ".join(f"{n} {'n/a' if v is None else f'{v:.3f}'}"
                          for n, v in doc["spearman_step_vs_modelled_compute"].items()), ""]
    return "\n".join(lines)


# --- summary --------------------------------------------------------------------------------

def summary(folder: Path, gpu: str) -> str:
    """README of a run folder: the GPU, the commands, and each output with its headline."""
    lines = [f"# GPU validation on {gpu}", "",
             f"Written {time.strftime('%Y-%m-%d %H:%M:%S')} on {platform.node() or '?'}, load "
             f"average {', '.join(f'{x:.2f}' for x in os.getloadavg())}. Commands: "
             "`commands.txt`; machine: `machine.txt`.", ""]
    grid = folder / "grid.csv"
    if grid.is_file():
        with grid.open(newline="") as fh:
            tiers_seen = [row["tier"] for row in csv.DictReader(fh)]
        lines.append(f"- `grid.csv`: {len(tiers_seen)} microbenchmark rows, tiers "
                     f"{', '.join(sorted(set(tiers_seen))) or 'none'}.")
    for name, what in (("model", "LightGBM model fitted on the grid"),
                       ("compare/metrics.md", "held-out comparison of model forms"),
                       ("committed_model_on_grid.json", "the committed (CPU) model scored on "
                                                        "the grid")):
        if (folder / name).exists():
            lines.append(f"- `{name}`: {what}.")
    cal = folder / "calibration.json"
    if cal.is_file():
        cv = json.loads(cal.read_text())["cross_validated_mape"]
        lines.append(f"- `calibration.json`: committed model MAPE {100 * cv['base']:.1f}% "
                     f"before, {100 * cv['scales']:.1f}% after per-operator scales "
                     "(cross-validated).")
    tier = folder / "tiers" / "tiers.json"
    if tier.is_file():
        corr = json.loads(tier.read_text())["spearman_step_vs_modelled_compute"]
        lines.append("- `tiers/tiers.md`: step time vs modelled over HBM cache sizes; "
                     "Spearman " + ", ".join(f"{n} {'n/a' if v is None else f'{v:.3f}'}"
                                             for n, v in corr.items()) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    cal = sub.add_parser("calibrate", help="the committed model corrected on the grid")
    cal.add_argument("--data", type=Path, required=True)
    cal.add_argument("--model", type=Path, default=Path("autoshard/data/cost_model"))
    cal.add_argument("--out", type=Path, required=True)
    tier = sub.add_parser("tiers", help="one large table at several HBM cache sizes")
    tier.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    tier.add_argument("--rows", type=int, default=5_000_000)
    tier.add_argument("--dim", type=int, default=128)
    tier.add_argument("--pooling", type=int, default=32)
    tier.add_argument("--alpha", type=float, default=1.05)
    tier.add_argument("--batch", type=int, default=65536)
    tier.add_argument("--hbm-shares", default="0,0.001,0.01,0.05,0.2,1")
    tier.add_argument("--iterations", type=int, default=20)
    tier.add_argument("--warmup", type=int, default=5)
    tier.add_argument("--seed", type=int, default=0)
    tier.add_argument("--hardware", default="8xH200-141GB")
    tier.add_argument("--model", type=Path, default=None)
    tier.add_argument("--out", type=Path, required=True)
    summ = sub.add_parser("summary", help="README.md of the run folder")
    summ.add_argument("--dir", type=Path, required=True)
    summ.add_argument("--gpu", required=True)
    args = parser.parse_args(argv)
    if args.step == "calibrate":
        write_structured(args.out, calibrate(args.data, args.model))
    elif args.step == "tiers":
        args.out.mkdir(parents=True, exist_ok=True)

        def done(doc: dict[str, Any]) -> None:
            write_structured(args.out / "tiers.json", doc)
            atomic_write_text(args.out / "tiers.md", tiers_markdown(doc))

        tiers(args, done)
    else:
        atomic_write_text(args.dir / "README.md", summary(args.dir, args.gpu))


if __name__ == "__main__":
    main()
