"""Summaries, Markdown tables and plots of comparison results."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoshard.compare.harness import CompareRow
from autoshard.fileio import save_figure

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
    reused: int = 0  # rows taken from earlier runs (each names its machine and date)


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
            reused=sum(r.reused for r in group),
        ))
    return out


def _fmt(value: float, spec: str) -> str:
    return format(value, spec) if math.isfinite(value) else "-"


HEADERS = ("sharder", "tasks ok / failed / skipped", "cost / lower bound (mean, worst)",
           "step cost vs best greedy", "load balance", "UVM lookup share", "time to plan (s)")
#: The terminal table's headers: a column of its own for the reused rows, and the mean cost
#: ratio only (the Markdown report gives the worst too).
SHORT_HEADERS = ("sharder", "ok / failed / skipped", "reused", "cost / bound", "vs best greedy",
                 "balance", "UVM share", "plan (s)")


def _ordered(summaries: list[SharderSummary]) -> list[SharderSummary]:
    """Best mean cost ratio first; sharders that planned nothing last."""
    return sorted(summaries, key=lambda s: (not math.isfinite(s.mean_cost_ratio),
                                            s.mean_cost_ratio))


def _cells(s: SharderSummary) -> list[str]:
    """One summary's cells: sharder, status, reused rows, mean and worst cost ratio, then the
    other figures."""
    return [s.sharder, f"{s.ok} / {s.failed} / {s.skipped}", str(s.reused),
            _fmt(s.mean_cost_ratio, ".3f"), _fmt(s.worst_cost_ratio, ".3f"),
            _fmt(s.vs_best_greedy, ".3f"), _fmt(s.load_balance, ".2f"),
            _fmt(s.uvm_lookup_share, ".2%"), _fmt(s.plan_seconds, ".3g")]


def markdown_table(summaries: list[SharderSummary]) -> str:
    """A Markdown table of the summaries, best mean cost ratio first; the reason of a sharder
    that planned nothing and the count of reused rows go in the status cell."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|---" * len(HEADERS) + "|"]
    for s in _ordered(summaries):
        name, status, reused, mean, worst, *rest = _cells(s)
        if s.reason and not s.ok:
            status += f" ({s.reason})"
        if s.reused:
            status += f"; {reused} reused"
        lines.append("| " + " | ".join([name, status, f"{mean}, {worst}", *rest]) + " |")
    return "\n".join(lines) + "\n"


def summary_table(summaries: list[SharderSummary], title: str | None = None) -> Any:
    """The summaries as a rich table for the terminal, best mean cost ratio first; print it at
    its natural width (no figure is cut short or wrapped). Reasons are left to
    :func:`reasons`."""
    from rich import box
    from rich.table import Table

    table = Table(*SHORT_HEADERS, title=title, title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False)
    table.columns[0].no_wrap = True
    for column in table.columns[1:]:
        column.justify = "right"
        column.no_wrap = True
    for cells in map(_cells, _ordered(summaries)):
        table.add_row(*cells[:4], *cells[5:])
    return table


def reasons(summaries: list[SharderSummary]) -> list[str]:
    """Why each sharder that planned nothing did not: one line each."""
    return [f"{s.sharder}: {s.reason}" for s in _ordered(summaries) if s.reason and not s.ok]


def reused_lines(rows: list[CompareRow]) -> list[str]:
    """One line per group of reused rows (same file and machine) saying when they were
    measured, for the terminal."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in rows:
        if r.reused:
            groups[r.reused_from, r.machine or "an unrecorded machine"].append(r.measured_at)
    lines = []
    for (source, machine), times in groups.items():
        known = sorted(t for t in times if t)
        when = ("at an unrecorded time" if not known else f"at {known[0]}"
                if known[0] == known[-1] else f"from {known[0]} to {known[-1]}")
        if known and len(known) < len(times):
            when += f" ({len(times) - len(known)} at an unrecorded time)"
        lines.append(f"{len(times)} row(s) reused from {source}: measured on {machine} {when}")
    return lines


def suite_markdown(suite: str, command: str, machine: str, model: str,
                   rows: list[CompareRow], seconds: float) -> str:
    """The suite's Markdown report. Its header names this machine only for the rows this run
    measured; reused rows are marked in the tables and listed with their machine and date."""
    measured = [r for r in rows if not r.reused]
    reused = [r for r in rows if r.reused]
    if not reused:
        where = f"Machine: {machine}"
    elif measured:
        where = (f"Machine: {machine}, for the {len(measured)} row(s) this run measured; "
                 f"{len(reused)} row(s) were reused from earlier runs (marked *, listed under "
                 "[Reused rows](#reused-rows) with their machine and date)")
    else:
        where = (f"Machine: none; this run measured no row. All {len(reused)} rows were "
                 "reused from earlier runs (listed under [Reused rows](#reused-rows) with "
                 "their machine and date)")
    return (f"# Comparison: suite `{suite}`\n\nCommand: `{command}`  \n{where}  \n"
            f"Cost model: {model}; this run took {seconds:.1f} s (rows kept from earlier runs "
            f"are not re-timed).\n\n## Per sharder\n\n{markdown_table(summarize(rows))}\n"
            f"## Step cost / lower bound per task\n\n{_per_task(rows)}{_found_by(rows)}"
            f"{_reused_section(reused)}")


def _per_task(rows: list[CompareRow]) -> str:
    tasks = sorted({r.task for r in rows})
    names = list(dict.fromkeys(r.sharder for r in rows))
    cell = {(r.task, r.sharder): (_fmt(r.cost_ratio, ".3f") if r.status == "ok" else r.status)
            + (" *" if r.reused else "") for r in rows}
    lines = ["| task | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {t} | " + " | ".join(cell.get((t, n), "") for n in names) + " |"
              for t in tasks]
    note = "\n\n\\* reused from an earlier run (see below)." if any(r.reused for r in rows) else ""
    return "\n".join(lines) + note + "\n"


def _found_by(rows: list[CompareRow]) -> str:
    found = [f"| {r.task} | {r.sharder} | {r.found_by} |" for r in rows if r.found_by]
    if not found:
        return ""
    return ("\n## How the plans were found\n\nThe winning candidate of each sharder that "
            "weighs several (its source: the learned policy, the policy over a split of the "
            "dominant tables, a rival sharder, the MILP) and what each search step took off "
            "its step cost.\n\n| task | sharder | found by |\n|---|---|---|\n"
            + "\n".join(found) + "\n")


def _reused_section(reused: list[CompareRow]) -> str:
    if not reused:
        return ""
    lines = [f"| {r.task} | {r.sharder} | {r.machine or 'unrecorded'} | "
             f"{r.measured_at or 'unrecorded'} | {r.reused_from} |" for r in reused]
    return ("\n## Reused rows\n\nRows this run took from earlier runs instead of measuring "
            "them: their figures, time to plan included, are those of the machine and date "
            "given.\n\n| task | sharder | measured on | measured at (UTC) | reused from |\n"
            "|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


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
    reused = sum(r.reused for r in rows)
    fig.suptitle(f"suite {suite}" + (f" ({reused} of {len(rows)} rows reused from earlier "
                                      f"runs: see {suite}.md)" if reused else ""))
    fig.tight_layout()
    paths.append(out_dir / f"{suite}.png")
    save_figure(fig, paths[-1])
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
    save_figure(fig, path)
    plt.close(fig)
    return path
