"""A plan's placement on the terminal and as a figure: which table and shard went where, with
its HBM rows, price and memory (``plan`` and ``evaluate``).

By device (the default), each device's shards, dearest first; ``--by table`` the reverse: each
table's sharding, devices and summed figures. Small plans are listed whole; a large one shows
its dearest devices (those that set the step cost) with their dearest shards, or its dearest
tables, and says how many more there are (``--all-tables`` lists everything). Every table fits
an 80-column terminal. ``--plot FILE`` draws each device's cost stacked by part beside its HBM
fill (matplotlib, the ``plots`` extra, imported when asked).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table as RichTable

from autoshard.cli.common import console
from autoshard.errors import InputError
from autoshard.extras import require
from autoshard.pricing.evaluator import CostReport
from autoshard.pricing.shard_costs import ShardCost, TableCost, by_device, by_table

#: Plans of at most this many shards (or tables, by table) are listed whole.
FULL_LIST = 40
#: In a large plan: devices shown (the dearest), shards shown per device, tables shown.
DEVICES_SHOWN, SHARDS_SHOWN, TABLES_SHOWN = 8, 3, 20
#: Views of a placement.
VIEWS = ("device", "table")

ByOpt = Annotated[str, typer.Option(
    "--by", help="The placement by 'device' (each device's tables and shards) or by 'table' "
    "(each table's sharding and devices).")]
AllTablesOpt = Annotated[bool, typer.Option(
    "--all-tables", help="List every shard (or table) of a large plan, not only the dearest.")]
PlotOpt = Annotated[Path | None, typer.Option(
    "--plot", help="Also draw the placement to this image (PNG, SVG or PDF: each device's "
    "cost stacked by part and its HBM fill; needs the plots extra).")]


@dataclass(frozen=True)
class View:
    """How a command shows a placement: ``by`` device or table, ``every`` shard of a large
    plan, and the figure to draw (None: none)."""

    by: str = "device"
    every: bool = False
    plot: Path | None = None

    def show(self, shards: tuple[ShardCost, ...], devices: int, written: bool = False
             ) -> None:
        """Prints the placement (:func:`show_placement`), then, if ``written``, where the
        figure went."""
        show_placement(shards, devices, self.by, self.every)
        if written and self.plot is not None:
            console.print(f"wrote {self.plot}", markup=False)

    def draw(self, report: CostReport, title: str) -> None:
        """Draws the figure, when one is asked for (:func:`write_plot`)."""
        if self.plot is not None:
            write_plot(report, self.plot, title)


def check_view(by: str, plot: Path | None) -> None:
    """Rejects an unknown ``--by`` and, before any work, a plot without matplotlib.

    Raises:
        InputError: ``--by`` is not a view. PlannerError: matplotlib is missing.
    """
    if by not in VIEWS:
        raise InputError(f"must be one of {', '.join(VIEWS)}", source="command line",
                         field="--by", value=by)
    if plot is not None:
        require("matplotlib", "plots")


def show_placement(shards: tuple[ShardCost, ...], devices: int, by: str = "device",
                   every: bool = False) -> None:
    """Prints the placement ``by`` device or table (module docstring)."""
    if by == "table":
        _show_tables(by_table(shards), every)
    else:
        _show_devices(by_device(shards, devices), every or len(shards) <= FULL_LIST)


def _table(title: str, columns: tuple[str, ...]) -> RichTable:
    """A compact table: a rule under the header, no side borders, numbers right-aligned."""
    table = RichTable(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                      show_edge=False, title_justify="left")
    for col in columns:
        left = col in ("table", "kind", "shard", "devices")
        table.add_column(col, justify="left" if left else "right",
                         overflow="fold" if col == "table" else "ellipsis",
                         no_wrap=col != "table", min_width=6 if col == "table" else None)
    return table


def _show_devices(held: list[list[ShardCost]], every: bool) -> None:
    """Each device's shards, dearest first; a large plan its dearest devices and shards."""
    totals = [sum(s.total_ms for s in shards) for shards in held]
    order = list(range(len(held))) if every else sorted(
        range(len(held)), key=lambda d: -totals[d])[:DEVICES_SHOWN]
    title = ("placement by device: each device's shards, dearest first" if every else
             f"placement by device: the {len(order)} dearest devices, their dearest shards")
    table = _table(title, ("dev", "table", "kind", "shard", "in HBM", "ms", "HBM GiB"))
    for d in order:
        shards = held[d] if every else held[d][:SHARDS_SHOWN]
        for i, s in enumerate(shards):
            table.add_row(str(d) if i == 0 else "", s.table, s.sharding.abbreviation,
                          _shard_words(s), f"{s.hbm_share:.0%}", f"{s.total_ms:.3f}",
                          f"{s.hbm_bytes / 2**30:.2f}")
        rest = held[d][len(shards):]
        if rest:
            table.add_row("", f"... and {len(rest)} more", "", "", "",
                          f"{sum(s.total_ms for s in rest):.3f}",
                          f"{sum(s.hbm_bytes for s in rest) / 2**30:.2f}")
        elif not shards:
            table.add_row(str(d), "(nothing)", "", "", "", "0.000", "0.00")
    console.print(table)
    notes = ["kind: TW whole table, RW/TWRW row shards, CW column blocks, DP replica, GRID "
             "blocks of row shards; in HBM: the share of the shard's rows kept in HBM; ms: "
             "its price per step"]
    if not every:
        notes.append(f"{len(held) - len(order)} more devices; --all-tables lists every shard, "
                     "--by table each table")
    for note in notes:
        console.print(f"[dim]{note}[/]")


def _show_tables(tables: list[TableCost], every: bool) -> None:
    """Each table's sharding, devices and figures, dearest first; a large plan its dearest."""
    shown = tables if every or len(tables) <= FULL_LIST else tables[:TABLES_SHOWN]
    title = ("placement by table, dearest first" if len(shown) == len(tables) else
             f"placement by table: the {len(shown)} dearest of {len(tables)}")
    table = _table(title, ("table", "kind", "devices", "in HBM", "ms", "HBM GiB",
                           "host GiB"))
    for t in shown:
        table.add_row(t.table, t.sharding.abbreviation, device_list(t.devices),
                      f"{t.hbm_share:.0%}", f"{t.total_ms:.3f}", f"{t.hbm_bytes / 2**30:.2f}",
                      f"{t.host_bytes / 2**30:.2f}")
    console.print(table)
    if len(shown) < len(tables):
        console.print(f"[dim]... and {len(tables) - len(shown)} more tables; --all-tables "
                      "lists every one[/]")


def _shard_words(s: ShardCost) -> str:
    """What part of its table a shard holds: ``whole``, ``replica``, ``rows 0-1.2M``,
    ``cols 64-128`` or both."""
    if s.sharding.replicated:
        return "replica"
    parts = []
    if s.sharding.splits_rows:
        parts.append(f"rows {_count(s.row_start)}-{_count(s.row_end)}")
    if s.sharding.splits_cols:
        parts.append(f"cols {s.col_start}-{s.col_end}")
    return " ".join(parts) or "whole"


def _count(n: int) -> str:
    """A row count in a few characters: 950, 12.5K, 3.2M."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def device_list(devices: tuple[int, ...], width: int = 14) -> str:
    """Devices as ranges (``0-3,6``), or their count where that runs past ``width``."""
    ranks = sorted(set(devices))
    runs: list[str] = []
    start = prev = ranks[0]
    for d in [*ranks[1:], None]:
        if d is not None and d == prev + 1:
            prev = d
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if d is not None:
            start = prev = d
    text = ",".join(runs)
    return text if len(text) <= width else f"{len(ranks)} devices"


def write_plot(report: CostReport, path: Path, title: str) -> None:
    """Each device's cost stacked by part (HBM, UVM, communication), beside its HBM fill
    (weights, reserved for the runtime, free), to ``path``."""
    matplotlib = require("matplotlib", "plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autoshard.fileio import save_figure

    devices = report.per_device
    x = [d.device for d in devices]
    width = 1.0 if len(x) > 32 else 0.8
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    _stack(axes[0], x, width, [("HBM work", [d.hbm_ms for d in devices], "tab:green"),
                                ("UVM work", [d.uvm_ms for d in devices], "tab:red"),
                                ("communication", [d.comm_ms for d in devices], "tab:gray")])
    axes[0].axhline(report.lower_bound_ms, color="k", linestyle="--", linewidth=1,
                    label=f"lower bound {report.lower_bound_ms:.3f} ms")
    axes[0].set(xlabel="device", ylabel="ms per step",
                title=f"cost per device (step cost {report.step_cost_ms:.3f} ms)")
    gib = 2.0 ** 30
    _stack(axes[1], x, width, [
        ("weights", [d.hbm_bytes / gib for d in devices], "tab:blue"),
        ("reserved", [d.hbm_reserved_bytes / gib for d in devices], "tab:orange"),
        ("free", [d.hbm_free_bytes / gib for d in devices], "whitesmoke")])
    axes[1].set(xlabel="device", ylabel="GiB", title="HBM fill")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _stack(ax: Any, x: list[int], width: float,
           parts: list[tuple[str, list[float], str]]) -> None:
    """Bars of ``parts`` stacked at ``x``."""
    bottom = [0.0] * len(x)
    for label, values, color in parts:
        ax.bar(x, values, bottom=bottom, width=width, color=color, label=label,
               edgecolor="lightgray" if color == "whitesmoke" else None)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
