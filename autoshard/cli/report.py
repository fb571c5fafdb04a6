"""Rich rendering of cost reports."""

from __future__ import annotations

from rich import box
from rich.table import Table as RichTable

from autoshard.cli.common import console
from autoshard.pricing.evaluator import CostReport
from autoshard.torchrec.estimate import TorchRecEstimate


def show_report(report: CostReport, title: str = "") -> None:
    """Prints a per-device table and the plan summary."""
    table = RichTable(title=title or f"plan by {report.sharder or '?'} "
                      f"({report.cost_model} cost, {report.mode}, batch {report.batch_size})",
                      box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                      show_edge=False)
    for col in ("dev", "tables", "HBM\nms", "UVM\nms", "comm\nms", "total\nms",
                "HBM\nweights\nGiB", "HBM\nresv.\nGiB", "HBM\nfree\nGiB", "host\nGiB",
                "UVM\nlookups"):
        table.add_column(col, justify="right", no_wrap=True)
    for d in report.per_device:
        share = d.uvm_lookups / d.lookups if d.lookups else 0.0
        table.add_row(str(d.device), str(d.tables), f"{d.hbm_ms:.3f}", f"{d.uvm_ms:.3f}",
                      f"{d.comm_ms:.3f}", f"{d.total_ms:.3f}", f"{d.hbm_bytes / 2**30:.2f}",
                      f"{d.hbm_reserved_bytes / 2**30:.2f}", f"{d.hbm_free_bytes / 2**30:.2f}",
                      f"{d.host_bytes / 2**30:.2f}", f"{share:.1%}")
    console.print(table)
    console.print("[dim]ms per step; HBM GiB: the rows' weights (and optimizer state), what "
                  "the runtime reserves beside them (resv.), and what is free; UVM lookups: "
                  "the share served from host memory[/]")
    hbm = {d.hbm_capacity_bytes for d in report.per_device}
    host = {d.host_capacity_bytes for d in report.per_device}
    if len(hbm) == 1 and len(host) == 1:
        console.print(f"capacity per device: HBM {hbm.pop() / 2**30:.2f} GiB, host "
                      f"{host.pop() / 2**30:.2f} GiB")
    assumptions = ", ".join(f"{n} {k}" for k, n in sorted(report.access_assumptions.items()))
    console.print(
        f"step cost [bold]{report.step_cost_ms:.3f} ms[/], lower bound "
        f"{report.lower_bound_ms:.3f} ms, cost / bound [bold]{report.cost_ratio:.3f}[/], "
        f"load balance {report.load_balance:.3f}, UVM lookup share "
        f"{report.uvm_lookup_share:.2%}; access curves: {assumptions}")
    if report.shardings:
        console.print("tables by sharding: " + ", ".join(
            f"{n} {kind}" for kind, n in report.shardings.items()), markup=False)
    console.print(_reservation_line(report), markup=False)


def _reservation_line(report: CostReport) -> str:
    """What the task keeps aside in HBM and which bound the ratio uses."""
    reserved = sum(d.hbm_reserved_bytes for d in report.per_device)
    if report.reservation == "none" or report.weights_bound_ms is None:
        return ("HBM reserved for a runtime: none (reservation 'none'); the lower bound counts "
                "the rows' weights")
    most = max(d.hbm_reserved_bytes for d in report.per_device)
    return (f"HBM reserved for the runtime ('{report.reservation}' reservation: I/O buffers, "
            f"cache state): {reserved / 2**30:.2f} GiB in all, at most {most / 2**30:.2f} GiB "
            f"on a device; the lower bound counts it (a weights-only bound, as if nothing "
            f"were reserved: {report.weights_bound_ms:.3f} ms)")


def show_torchrec_estimate(report: CostReport, estimate: TorchRecEstimate,
                           ours_per_table: dict[str, float], top: int = 10) -> None:
    """Prints TorchRec's per-rank perf and storage estimates next to our per-device cost, then
    the ``top`` tables TorchRec prices dearest, next to our price of each."""
    table = RichTable(title="the same plan under TorchRec's estimators (EmbeddingPerfEstimator, "
                      "EmbeddingStorageEstimator)")
    for col in ("rank", "ours\nms", "TorchRec\nms", "TorchRec HBM\nGiB", "HBM cap\nGiB",
                "TorchRec host\nGiB", "fits"):
        table.add_column(col, justify="right", no_wrap=True)
    for d, r in zip(report.per_device, estimate.per_rank, strict=True):
        table.add_row(str(r.rank), f"{d.total_ms:.3f}", f"{r.perf_ms:.3f}",
                      f"{r.hbm_bytes / 2**30:.2f}", f"{r.hbm_capacity / 2**30:.2f}",
                      f"{r.ddr_bytes / 2**30:.2f}", "yes" if r.fits else "[red]NO[/]")
    console.print(table)
    console.print(f"step cost: ours [bold]{report.step_cost_ms:.3f} ms[/], TorchRec's "
                  f"[bold]{estimate.step_ms:.3f} ms[/] (ratio "
                  f"{estimate.step_ms / max(report.step_cost_ms, 1e-12):.2f}); TorchRec's "
                  f"fullest HBM {estimate.hbm_fill:.1%} of capacity"
                  f"{'' if estimate.fits else ' [red](overfilled: export fits it)[/]'}")
    tables = RichTable(title=f"the {min(top, len(estimate.per_table))} tables TorchRec prices "
                       "dearest (all shards summed)")
    for col in ("table", "sharding", "kernel", "load\nfactor", "shards", "ours\nms",
                "TorchRec\nms"):
        tables.add_column(col, justify="right", no_wrap=True)
    for t in sorted(estimate.per_table, key=lambda t: -t.perf_ms)[:top]:
        clf = "-" if t.cache_load_factor is None else f"{t.cache_load_factor:.3f}"
        tables.add_row(t.table, t.sharding_type, t.compute_kernel, clf, str(t.shards),
                       f"{ours_per_table[t.table]:.3f}", f"{t.perf_ms:.3f}")
    console.print(tables)
