"""Serving results as CSV, Markdown and plots (written together, atomically, at the end)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.fileio import atomic_write_text, csv_text, save_figure

SWEEP_COLUMNS = ("qps", "strategy", "servers", "total_servers", "main_replicas", "replicas", "cost",
                 "p50_ms", "p90_ms", "p99_ms", "p99_lo_ms", "p99_hi_ms", "p99_max_ms",
                 "p99_sample_hi_ms", "meets", "marginal", "feasible", "validation_p99_ms",
                 "p99_overhead", "calls_per_request", "compute_us_per_request",
                 "compute_overhead", "max_utilisation", "max_nic_utilisation", "memory_gb_max",
                 "memory_gb_main", "allocated_gb", "samples", "note", "error")
BENCH_COLUMNS = ("strategy", "servers", "replicas", "main_replicas", "qps", "mode", "requests",
                 "rounds", "measured_p50_ms", "measured_p90_ms", "measured_p99_ms",
                 "measured_p99_lo_ms", "measured_p99_hi_ms", "simulated_p50_ms",
                 "simulated_p90_ms", "simulated_p99_ms", "simulated_p99_lo_ms",
                 "simulated_p99_hi_ms", "p99_ratio", "calls_per_request", "max_utilisation",
                 "below_ceiling", "late_p99_us")


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.4g}"
    return str(value).replace("|", "/")


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    atomic_write_text(path, csv_text([{c: r.get(c, "") for c in columns} for r in rows],
                                     columns))


#: Marker and line style per strategy of a plot, so that strategies with equal figures stay
#: apart (each is also shifted a little along the x axis).
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINES = ("-", "--", "-.", ":")


def plot_p99_vs_servers(rows: Sequence[dict[str, Any]], path: Path, title: str,
                        target_ms: float | None = None) -> None:
    """P99 with its 95% interval (left) and the total servers it takes (right) against the
    sparse shards swept, a line per strategy and rate. Strategies are shifted apart along the
    x axis and drawn with their own marker and line style, so that equal figures do not hide
    one another."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ok = [r for r in rows if not r.get("error")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    keys = sorted({(r["strategy"], r["qps"]) for r in ok}, key=lambda k: (k[1], k[0]))
    width = 0.3  # the spread of the strategies around each shard count
    for i, (strategy, qps) in enumerate(keys):
        pts = sorted((r["servers"], r["p99_ms"], r["total_servers"], r["p99_lo_ms"],
                      r["p99_hi_ms"]) for r in ok if r["strategy"] == strategy
                     and r["qps"] == qps)
        shards, p99, total, lo, hi = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
        x = shards + (width * (i / max(len(keys) - 1, 1) - width / 2) if len(keys) > 1 else 0)
        style = {"marker": _MARKERS[i % len(_MARKERS)], "markersize": 4,
                 "linestyle": _LINES[i % len(_LINES)] if len(x) > 1 else "none",
                 "label": f"{strategy} @ {qps:g} qps"}
        axes[0].errorbar(x, p99, yerr=[p99 - lo, hi - p99], capsize=2, **style)
        axes[1].plot(x, total, **style)
    if target_ms is not None:
        axes[0].axhline(target_ms, color="grey", linestyle="--", linewidth=1, label="P99 target")
    axes[0].set(xlabel="sparse shards", ylabel="simulated P99 latency (ms), 95% interval",
                title=title)
    axes[1].set(xlabel="sparse shards", ylabel="servers (main tier and shard replicas)",
                title="servers each deployment takes")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_measured_vs_simulated(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Measured against simulated P99 (log-log), a point per (strategy, rate), each with its
    range over rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for strategy, reps in sorted({(r["strategy"], r.get("replicas", "")) for r in rows}):
        pts = [r for r in rows if r["strategy"] == strategy and r.get("replicas", "") == reps]
        xs, ys = (np.array([r[f"{k}_p99_ms"] for r in pts]) for k in ("simulated", "measured"))
        span = [[r.get(f"{k}_p99_{e}_ms", r[f"{k}_p99_ms"]) for r in pts]
                for k in ("simulated", "measured") for e in ("lo", "hi")]
        ax.errorbar(xs, ys, xerr=[xs - span[0], np.array(span[1]) - xs],
                    yerr=[ys - span[2], np.array(span[3]) - ys], fmt="o", capsize=2,
                    markersize=4, label=f"{strategy} ({pts[0]['servers']} shards x {reps})")
        for r in pts:
            ax.annotate(f"{r['qps']:g}", (r["simulated_p99_ms"], r["measured_p99_ms"]),
                        fontsize=6)
    ax.set(xscale="log", yscale="log", xlabel="simulated P99 (ms)", ylabel="measured P99 (ms)",
           title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)
