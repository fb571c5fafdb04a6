"""Summaries, Markdown tables and plots of comparison results."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoshard.compare import CompareRow

GREEDY = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")


@dataclass(frozen=True)
class SharderSummary:
    """One sharder over a suite. Ratios are means over the tasks it planned."""

    sharder: str
    ok: int
    failed: int
    skipped: int
    reason: str
    mean_cost_ratio: float
    worst_cost_ratio: float
    vs_best_greedy: float  # geometric mean of step cost / best greedy's step cost, per task
    load_balance: float
    uvm_lookup_share: float
    plan_seconds: float


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize(rows: list[CompareRow]) -> list[SharderSummary]:
    """Per-sharder summary, in first-appearance order."""
    by_sharder: dict[str, list[CompareRow]] = defaultdict(list)
    best_greedy: dict[str, float] = {}
    for r in rows:
        by_sharder[r.sharder].append(r)
        if r.status == "ok" and r.sharder in GREEDY:
            best_greedy[r.task] = min(best_greedy.get(r.task, math.inf), r.step_cost_ms)
    out = []
    for name, group in by_sharder.items():
        ok = [r for r in group if r.status == "ok"]
        logs = [math.log(r.step_cost_ms / best_greedy[r.task]) for r in ok
                if r.task in best_greedy]
        reasons = sorted({r.reason for r in group if r.status != "ok" and r.reason})
        out.append(SharderSummary(
            sharder=name, ok=len(ok),
            failed=sum(r.status == "failed" for r in group),
            skipped=sum(r.status == "skipped" for r in group),
            reason="; ".join(reasons)[:200],
            mean_cost_ratio=_mean([r.cost_ratio for r in ok]),
            worst_cost_ratio=max((r.cost_ratio for r in ok), default=float("nan")),
            vs_best_greedy=math.exp(_mean(logs)) if logs else float("nan"),
            load_balance=_mean([r.load_balance for r in ok]),
            uvm_lookup_share=_mean([r.uvm_lookup_share for r in ok]),
            plan_seconds=_mean([r.plan_seconds for r in ok]),
        ))
    return out


def _fmt(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def markdown_table(summaries: list[SharderSummary]) -> str:
    """A Markdown table of the summaries, best mean cost ratio first."""
    head = ("| sharder | tasks ok / failed / skipped | cost / lower bound (mean, worst) | "
            "step cost vs best greedy | load balance | UVM lookup share | time to plan (s) |\n"
            "|---|---|---|---|---|---|---|\n")
    order = sorted(summaries, key=lambda s: (math.isnan(s.mean_cost_ratio), s.mean_cost_ratio))
    lines = []
    for s in order:
        status = f"{s.ok} / {s.failed} / {s.skipped}"
        if s.reason and not s.ok:
            status += f" ({s.reason})"
        lines.append(
            f"| {s.sharder} | {status} | {_fmt(s.mean_cost_ratio, '.3f')}, "
            f"{_fmt(s.worst_cost_ratio, '.3f')} | {_fmt(s.vs_best_greedy, '.3f')} | "
            f"{_fmt(s.load_balance, '.2f')} | {_fmt(s.uvm_lookup_share, '.2%')} | "
            f"{_fmt(s.plan_seconds, '.3g')} |")
    return head + "\n".join(lines) + "\n"


def write_plots(rows: list[CompareRow], breakdown: dict[str, Any], out_dir: Path,
                suite: str) -> list[Path]:
    """Cost / lower bound and time-to-plan bars per sharder, and per-device stacked cost bars for
    the suite's first task. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = [s for s in summarize(rows) if s.ok]
    names = [s.sharder for s in summaries]
    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].bar(names, [s.mean_cost_ratio for s in summaries], color="tab:blue")
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_ylabel("step cost / lower bound (mean)")
    axes[0].set_yscale("log")
    axes[1].bar(names, [max(s.plan_seconds, 1e-4) for s in summaries], color="tab:orange")
    axes[1].set_ylabel("time to plan (s)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.tick_params(axis="x", rotation=60)
    fig.suptitle(f"suite {suite}")
    fig.tight_layout()
    paths.append(out_dir / f"{suite}.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    if breakdown:
        paths.append(_device_bars(plt, breakdown, out_dir, suite))
    return paths


def _device_bars(plt: Any, breakdown: dict[str, Any], out_dir: Path, suite: str) -> Path:
    from matplotlib.ticker import MaxNLocator

    names = list(breakdown)
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False,
                             sharey=True)
    for ax, name in zip(axes.ravel(), names, strict=False):
        devs = breakdown[name]["per_device"]
        x = range(len(devs))
        bottom = [0.0] * len(devs)
        for key, color in (("hbm_ms", "tab:green"), ("uvm_ms", "tab:red"),
                           ("comm_ms", "tab:gray")):
            vals = [d[key] for d in devs]
            ax.bar(x, vals, bottom=bottom, color=color, label=key.removesuffix("_ms"),
                   width=1.0 if len(devs) > 16 else 0.8)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("device")
    for ax in axes.ravel()[len(names):]:
        ax.axis("off")
    axes[0][0].set_ylabel("ms per step")
    axes[0][0].legend(fontsize=7)
    task = next(iter(breakdown.values()))["task"]
    fig.suptitle(f"per-device cost, task {task}")
    fig.tight_layout()
    path = out_dir / f"{suite}.devices.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
