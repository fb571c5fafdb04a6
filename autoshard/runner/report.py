"""Measured reports in the shape of :class:`autoshard.pricing.evaluator.CostReport`, and the
comparison with a cost model's figures for the same plan."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from autoshard.layout.plan import Plan
from autoshard.pricing.evaluator import CostReport, DeviceReport
from autoshard.runner.config import RunConfig
from autoshard.task import ShardingTask


@dataclass(frozen=True)
class MeasuredDeviceReport(DeviceReport):
    """A rank's medians over the timed steps, ms.

    The :class:`DeviceReport` fields hold: ``hbm_ms``/``uvm_ms`` the forward plus backward and
    optimizer time of each tier's rows (a replica's pooling, gradient and dense update count in
    the fast tier, where all its rows are), ``comm_ms`` both all-to-alls and the replicas'
    gradient all-reduce (as the cost models count it), ``total_ms`` the rank's own work (the
    step less the waits for other ranks and the dense stand-in), bytes the weights and optimizer
    state allocated per tier, ``lookups``/``uvm_lookups`` those issued per step (a replica's:
    the rank's own samples'). Added: ``lookup_ms`` (forward pooling), ``backward_optimizer_ms``,
    ``allreduce_ms`` (the replicas' gradient all-reduce alone, part of ``comm_ms``; 0 when the
    plan replicates nothing), ``wait_ms`` (barriers before the all-to-all and before the
    all-reduce: time waiting for slower ranks), ``step_ms`` (wall time of the whole step), the
    rank's table names (replicas included) and their HBM rows, ``replicas`` (the replicated
    tables it holds), ``compute_cpu_ms`` (CPU time of the lookups, backward and optimizer; on a
    shared host it does not grow when other processes take the cores; None on CUDA, where
    kernels run asynchronously) and where the rank ran.
    """

    lookup_ms: float
    backward_optimizer_ms: float
    allreduce_ms: float
    wait_ms: float
    step_ms: float
    table_names: tuple[str, ...]
    hbm_rows: tuple[int, ...]
    replicas: tuple[str, ...]
    compute_cpu_ms: float | None
    where: str


@dataclass(frozen=True)
class MeasuredReport:
    """A plan's measured cost, with :class:`CostReport`'s keys plus the run's settings.

    ``step_cost_ms`` is the max over ranks of their own work (the evaluator's definition);
    ``step_wall_ms`` the max over ranks of the median wall-clock step, waits included. There is no
    lower bound for a measurement: ``lower_bound_ms`` and ``cost_ratio`` are None.
    """

    sharder: str
    cost_model: str
    mode: str
    batch_size: int
    step_cost_ms: float
    lower_bound_ms: float | None
    cost_ratio: float | None
    load_balance: float
    uvm_lookup_share: float
    per_device: tuple[MeasuredDeviceReport, ...]
    access_assumptions: dict[str, int]
    step_wall_ms: float
    backend: str
    kernel: str
    lookups_from: str
    iterations: int
    warmup: int
    note: str
    measured: bool = True
    weights_bound_ms: float | None = None
    reservation: str = "none"
    shardings: dict[str, int] | None = None  # tables per sharding kind

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["per_device"] = [asdict(d) for d in self.per_device]
        return doc


@dataclass(frozen=True)
class RunResult:
    """Measured and modelled reports of one plan, and measured / modelled ratios."""

    measured: MeasuredReport
    modelled: CostReport

    @property
    def step_ratio(self) -> float:
        return _ratio(self.measured.step_cost_ms, self.modelled.step_cost_ms)

    @property
    def device_ratios(self) -> list[float]:
        return [_ratio(m.total_ms, c.total_ms)
                for m, c in zip(self.measured.per_device, self.modelled.per_device, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured.to_dict(), "modelled": self.modelled.to_dict(),
                "ratio": {"step_cost": self.step_ratio, "per_device_total": self.device_ratios}}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def tier_note(backend: str, devices: list[str]) -> str:
    """What the two tiers physically were in this run."""
    if all(d.startswith("cuda") for d in devices):
        return (f"{backend}: HBM rows in GPU memory, host rows in pinned host memory "
                "(staged over PCIe by the torch kernel, UVM for fbgemm)")
    return (f"{backend} on CPU: both tiers are host DRAM and ranks are processes sharing this "
            "machine's cores, so the HBM/host split does not change the cost of a lookup")


def measured_report(results: list[dict[str, Any]], plan: Plan, task: ShardingTask,
                    config: RunConfig) -> MeasuredReport:
    """Builds the report from every rank's medians (rank 0's gather)."""
    results = sorted(results, key=lambda r: r["rank"])
    dev = task.device_arrays
    per_device = []
    for r in results:
        m = r["median_ms"]
        d = r["rank"]
        per_device.append(MeasuredDeviceReport(
            device=d, tables=len(r["tables"]), hbm_ms=m["hbm"], uvm_ms=m["uvm"], comm_ms=m["comm"],
            total_ms=m["work"], hbm_bytes=int(r["bytes"]["hbm"]),
            host_bytes=int(r["bytes"]["uvm"]), hbm_capacity_bytes=int(dev.hbm_capacity[d]),
            host_capacity_bytes=int(dev.host_capacity[d]), lookups=r["lookups"],
            uvm_lookups=r["uvm_lookups"], lookup_ms=m["lookup"],
            backward_optimizer_ms=m["backward_optimizer"], allreduce_ms=m["allreduce"],
            wait_ms=m["waits"], step_ms=m["step"], table_names=tuple(r["tables"]),
            hbm_rows=tuple(r["hbm_rows"]), replicas=tuple(r["replicas"]),
            compute_cpu_ms=None if r["device"].startswith("cuda") else m["compute_cpu"],
            where=f"{r['host']}:{r['device']}"))
    totals = np.array([p.total_ms for p in per_device])
    lookups = sum(p.lookups for p in per_device)
    devices = [r["device"] for r in results]
    return MeasuredReport(
        sharder=plan.sharder, cost_model="measured", mode=config.mode,
        batch_size=config.batch_size, step_cost_ms=float(totals.max()), lower_bound_ms=None,
        cost_ratio=None, load_balance=float(totals.max() / max(totals.mean(), 1e-12)),
        uvm_lookup_share=sum(p.uvm_lookups for p in per_device) / max(lookups, 1e-12),
        per_device=tuple(per_device),
        access_assumptions={"trace": task.num_tables} if config.trace else
        _assumptions(task), step_wall_ms=max(p.step_ms for p in per_device),
        backend=results[0]["backend"], kernel=config.kernel,
        lookups_from=config.trace or "synthetic", iterations=config.iterations,
        warmup=config.warmup, note=tier_note(results[0]["backend"], devices),
        reservation=task.reservation.name, shardings=plan.sharding_counts())


def _assumptions(task: ShardingTask) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in task.tables:
        out[t.access_source] = out.get(t.access_source, 0) + 1
    return out
