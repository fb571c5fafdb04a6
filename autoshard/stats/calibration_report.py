"""The calibration run behind ``autoshard calibrate``: fit or check, simulate, write results."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.fileio import atomic_write_text, output_folder, save_figure, write_structured
from autoshard.progress import ProgressFactory
from autoshard.stats.synth_fit import (
    LocalityStats,
    distances,
    expected_reuse,
    fit_config,
    read_locality_stats,
    simulate_reuse,
)
from autoshard.stats.table_stats import merged_reuse
from autoshard.synth import DEFAULT_BATCH, DEFAULT_COUNT, SynthConfig, draw_tables

#: Where the Nelder-Mead fit starts (a first guess by hand; ``--fit`` refits from here).
FIT_START = SynthConfig(log10_rows=(5.3, 1.2), lookups_sigma=1.2, alpha=(0.6, 1.3))
DEFAULT_TABLES = Path(__file__).resolve().parents[1] / "data" / "default_tables.json"
#: Points of each access curve in the default table file (keeps the package data small).
DEFAULT_CURVE_POINTS = 24


def run_calibration(reference: Path, out: Path, fit: bool, write_default: bool, seed: int,
                    progress: ProgressFactory, log: Callable[[str], None]) -> dict[str, float]:
    """Fits (optionally) and checks the generator; writes calibration.json/.md and a plot."""
    start = time.perf_counter()
    targets = read_locality_stats(reference)
    target = targets[0]
    cfg = SynthConfig()
    if fit:
        with progress("fitting", None) as step:
            cfg, _ = fit_config(target, DEFAULT_COUNT, DEFAULT_BATCH, seed, FIT_START,
                                on_step=lambda _: step(1))
        log(f"fitted: {cfg}")
    tables = draw_tables(DEFAULT_COUNT, seed, cfg)
    rng = np.random.default_rng(seed)
    normal, uniform = rng.standard_normal((2, DEFAULT_COUNT)), rng.random(DEFAULT_COUNT)
    from autoshard.synth import table_parameters

    rows, per_sample, alpha = table_parameters(cfg, normal, uniform)
    expected = distances(*expected_reuse(rows, per_sample * DEFAULT_BATCH, alpha), target)
    total = sum(t.pooling_factor * t.coverage for t in tables) * DEFAULT_BATCH
    with progress("synthesising and profiling", total) as step:
        profiles = simulate_reuse(tables, DEFAULT_BATCH, seed, step)
    rows_hist, lookups_hist = merged_reuse(profiles)
    measured = distances(rows_hist, lookups_hist, target)
    doc = _document(cfg, target, targets, rows_hist, lookups_hist, expected, measured,
                    [sum(p.lookups for p in profiles), sum(p.rows_used for p in profiles)],
                    fit, seed, time.perf_counter() - start)
    with output_folder(out):  # a failure leaves no new folder behind
        write_structured(out / "calibration.json", doc)
        atomic_write_text(out / "calibration.md", _markdown(doc))
        _plot(doc, out / "reuse_cdf.png")
    if write_default:
        from autoshard.tables import save_tables

        save_tables(DEFAULT_TABLES, [p.to_table(t.dim, DEFAULT_CURVE_POINTS)
                                     for p, t in zip(profiles, tables, strict=True)])
        log(f"wrote {DEFAULT_TABLES}")
    return {"rows": measured[0], "lookups": measured[1]}


def _document(cfg: SynthConfig, target: LocalityStats, targets: list[LocalityStats],
              rows_hist: np.ndarray, lookups_hist: np.ndarray, expected: tuple[float, float],
              measured: tuple[float, float], totals: list[int], fit: bool, seed: int,
              seconds: float) -> dict[str, Any]:
    from autoshard.machine import describe_machine

    others = {t.name: dict(zip(("rows", "lookups"), distances(rows_hist, lookups_hist, t),
                               strict=True)) for t in targets[1:]}
    bins = ["(0, 1]"] + [f"({2**(i - 1)}, {2**i}]" for i in range(1, 16)] + ["32768+"]
    return {
        "command": "autoshard calibrate" + (" --fit" if fit else "") + f" --seed {seed}",
        "machine": describe_machine(), "seconds": round(seconds, 1),
        "target": target.name, "tables": DEFAULT_COUNT, "batch_size": DEFAULT_BATCH,
        "config": asdict(cfg),
        "distance": {"rows": round(measured[0], 4), "lookups": round(measured[1], 4)},
        "distance_expected": {"rows": round(expected[0], 4), "lookups": round(expected[1], 4)},
        "lookups": {"target": target.lookups, "synthetic": totals[0]},
        "distinct_rows": {"target": target.distinct, "synthetic": totals[1]},
        "histograms": [{"bin": b, "rows_target": target.rows_hist[i],
                        "rows_synthetic": round(float(rows_hist[i]), 4),
                        "lookups_target": target.lookups_hist[i],
                        "lookups_synthetic": round(float(lookups_hist[i]), 4)}
                       for i, b in enumerate(bins)],
        "distance_to_other_traces": {k: {m: round(v, 4) for m, v in d.items()}
                                     for k, d in others.items()},
    }


def _markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Calibration of the synthetic workload",
        "",
        f"Command: `{doc['command']}` (from the repository root; takes {doc['seconds']} s).",
        f"Machine: {doc['machine']}. Python {sys.version.split()[0]}.",
        "",
        f"Target: `{doc['target']}` of Meta's open DLRM dataset (locality stats 2021, all "
        f"tables merged). Synthetic: {doc['tables']} tables, one batch of {doc['batch_size']} "
        "samples, generated and profiled like a trace.",
        "",
        "Distance = max over bins of |CDF(synthetic) - CDF(target)|:",
        "",
        "| histogram | measured on the synthetic batch | expected (Poisson model) |",
        "| --- | --- | --- |",
        f"| share of distinct rows | {doc['distance']['rows']:.4f} | "
        f"{doc['distance_expected']['rows']:.4f} |",
        f"| share of lookups | {doc['distance']['lookups']:.4f} | "
        f"{doc['distance_expected']['lookups']:.4f} |",
        "",
        f"Lookups: target {doc['lookups']['target']:,}, synthetic "
        f"{doc['lookups']['synthetic']:,}. Distinct rows: target "
        f"{doc['distinct_rows']['target']:,}, synthetic {doc['distinct_rows']['synthetic']:,}.",
        "",
        "| reuse bin | rows: target | rows: synthetic | lookups: target | lookups: synthetic |",
        "| --- | --- | --- | --- | --- |",
    ]
    for h in doc["histograms"]:
        lines.append(f"| {h['bin']} | {h['rows_target']:.3f} | {h['rows_synthetic']:.3f} | "
                     f"{h['lookups_target']:.3f} | {h['lookups_synthetic']:.3f} |")
    lines += ["", f"Generator settings: `{doc['config']}`", "", "![reuse CDFs](reuse_cdf.png)",
              ""]
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = doc["histograms"]
    x = np.arange(len(hist))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "rows", "share of distinct rows"),
                           (axes[1], "lookups", "share of lookups")):
        ax.plot(x, np.cumsum([h[f"{key}_target"] for h in hist]), "o-", label=doc["target"])
        ax.plot(x, np.cumsum([h[f"{key}_synthetic"] for h in hist]), "s--",
                label=f"synthetic (distance {doc['distance'][key]:.3f})")
        ax.set_xticks(x, [h["bin"] for h in hist], rotation=70, fontsize=7)
        ax.set_ylabel(f"cumulative {title}")
        ax.set_xlabel("times a row is accessed in the batch")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Reuse CDFs, {doc['tables']} tables, batch {doc['batch_size']}")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
