"""Rich rendering of cost reports."""

from __future__ import annotations

from rich.table import Table as RichTable

from autoshard.cli.common import console
from autoshard.evaluator import CostReport


def show_report(report: CostReport, title: str = "") -> None:
    """Prints a per-device table and the plan summary."""
    table = RichTable(title=title or f"plan by {report.sharder or '?'} "
                      f"({report.cost_model} cost, {report.mode}, batch {report.batch_size})")
    for col in ("device", "tables", "HBM ms", "UVM ms", "comm ms", "total ms", "HBM GiB",
                "host GiB", "UVM lookups"):
        table.add_column(col, justify="right")
    for d in report.per_device:
        share = d.uvm_lookups / d.lookups if d.lookups else 0.0
        table.add_row(str(d.device), str(d.tables), f"{d.hbm_ms:.3f}", f"{d.uvm_ms:.3f}",
                      f"{d.comm_ms:.3f}", f"{d.total_ms:.3f}",
                      f"{d.hbm_bytes / 2**30:.2f}/{d.hbm_capacity_bytes / 2**30:.1f}",
                      f"{d.host_bytes / 2**30:.2f}/{d.host_capacity_bytes / 2**30:.1f}",
                      f"{share:.1%}")
    console.print(table)
    assumptions = ", ".join(f"{n} {k}" for k, n in sorted(report.access_assumptions.items()))
    console.print(
        f"step cost [bold]{report.step_cost_ms:.3f} ms[/], lower bound "
        f"{report.lower_bound_ms:.3f} ms, cost / bound [bold]{report.cost_ratio:.3f}[/], "
        f"load balance {report.load_balance:.3f}, UVM lookup share "
        f"{report.uvm_lookup_share:.2%}; access curves: {assumptions}")
