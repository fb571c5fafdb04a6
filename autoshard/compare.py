"""The comparison harness: every registered sharder on every task of a suite, priced alike.

Rows are appended to the suite's CSV as each (task, sharder) finishes, so an interrupted run
resumes where it stopped: rows already in the file are kept and not recomputed.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Protocol

from autoshard.cost import CostModel
from autoshard.errors import InputError, PlannerError
from autoshard.evaluator import CostReport, evaluate
from autoshard.fileio import atomic_write_text, csv_text, read_structured, write_structured
from autoshard.limits import check_finite_costs
from autoshard.plan import Plan
from autoshard.sharders import get_sharder, sharder_info, sharder_names
from autoshard.task import ShardingTask


class TaskSource(Protocol):
    """A named task: a suite's :class:`autoshard.suites.TaskSpec`, or :class:`FixedTask`."""

    @property
    def name(self) -> str: ...

    def build(self) -> ShardingTask: ...


@dataclass(frozen=True)
class FixedTask:
    """An already built task under a name (e.g. the demo's profiled workload)."""

    name: str
    task: ShardingTask

    def build(self) -> ShardingTask:
        return self.task


@dataclass(frozen=True)
class CompareRow:
    """One sharder on one task: ``status`` is ok, failed (with the reason) or skipped."""

    suite: str
    task: str
    tables: int
    devices: int
    mode: str
    sharder: str
    status: str
    reason: str = ""
    step_cost_ms: float = float("nan")
    lower_bound_ms: float = float("nan")
    cost_ratio: float = float("nan")
    load_balance: float = float("nan")
    uvm_lookup_share: float = float("nan")
    plan_seconds: float = float("nan")
    cost_model: str = ""


COLUMNS = [f.name for f in fields(CompareRow)]
_FLOATS = {f.name for f in fields(CompareRow) if f.type in ("float", float)}


def read_rows(path: Path) -> list[CompareRow]:
    """Rows of a results CSV; a truncated last line (interrupted write) is dropped."""
    if not path.is_file():
        return []
    rows = []
    with path.open(newline="") as fh:
        for raw in csv.DictReader(fh):
            if None in raw.values() or set(raw) != set(COLUMNS):
                continue
            try:
                values = {k: (float(v) if k in _FLOATS else v) for k, v in raw.items()}
                values["tables"] = int(raw["tables"])
                values["devices"] = int(raw["devices"])
            except ValueError:
                continue
            rows.append(CompareRow(**values))  # type: ignore[arg-type]
    return rows


def _append(path: Path, row: CompareRow) -> None:
    new = not path.is_file() or path.stat().st_size == 0
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(asdict(row))
        fh.flush()


def _rewrite(path: Path, rows: Iterable[CompareRow]) -> None:
    """Rewrites the CSV with only complete rows (drops a torn last line before appending)."""
    atomic_write_text(path, csv_text((asdict(r) for r in rows), COLUMNS))


def run_one(suite: str, spec: TaskSource, task: ShardingTask, name: str, cost_model: CostModel,
            bound_ms: float | None, options: dict[str, object]) -> tuple[CompareRow, Plan | None,
                                                                        CostReport | None]:
    """Runs one sharder on one task; failures and unavailability become rows, not exceptions."""
    base = dict(suite=suite, task=spec.name, tables=task.num_tables, devices=task.num_devices,
                mode=task.workload.mode, sharder=name, cost_model=cost_model.name)
    reason = sharder_info(name).unavailable
    if reason:
        return CompareRow(status="skipped", reason=reason, **base), None, None  # type: ignore
    start = time.perf_counter()
    try:
        sharder = get_sharder(name, **options)  # loading (a policy, say) is not planning time
        start = time.perf_counter()
        plan = sharder.shard(task, cost_model)
        seconds = time.perf_counter() - start
        report = evaluate(plan, task, cost_model, bound_ms=bound_ms)
        check_finite_costs({"step_cost_ms": report.step_cost_ms,
                            "lower_bound_ms": report.lower_bound_ms}, f"{name}'s plan")
    except (PlannerError, InputError) as exc:
        return CompareRow(status="failed", reason=str(exc), plan_seconds=time.perf_counter()
                          - start, **base), None, None  # type: ignore[arg-type]
    row = CompareRow(status="ok", step_cost_ms=report.step_cost_ms,
                     lower_bound_ms=report.lower_bound_ms, cost_ratio=report.cost_ratio,
                     load_balance=report.load_balance, uvm_lookup_share=report.uvm_lookup_share,
                     plan_seconds=seconds, **base)  # type: ignore[arg-type]
    return row, plan, report


def run_suite(suite: str, specs: Iterable[TaskSource], cost_model: CostModel, out_dir: Path,
              sharders: list[str] | None = None, options: dict[str, object] | None = None,
              bound: Callable[[ShardingTask, CostModel], float] | None = None,
              on_row: Callable[[CompareRow], None] | None = None,
              fresh: bool = False, save_plans: bool = False) -> list[CompareRow]:
    """Runs every sharder on every task, appending rows to ``out_dir/<suite>.csv`` as they finish.

    The first task's per-device breakdown of each plan goes to ``<suite>.devices.json`` (for the
    stacked-bar plot).

    Args:
        suite: Suite name, also the file stem.
        specs: The tasks.
        cost_model: Prices every plan.
        out_dir: Results folder; rows already there (same task, sharder, cost model) are kept.
        sharders: Registry names to run (default: all registered).
        options: Constructor options passed to every sharder (e.g. seed, time_limit).
        bound: Optional extra lower bound per task (the larger bound is reported).
        on_row: Called with each new row (progress display).
        fresh: Recompute the selected sharders' rows instead of keeping them (rows of other
            sharders are kept).
        save_plans: Also write each plan to ``<suite>.plans/<task>/<sharder>.json``.

    Returns:
        All rows, old and new.
    """
    names = sharders or sharder_names()
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / f"{suite}.csv"
    devices_path = out_dir / f"{suite}.devices.json"
    old = read_rows(csv_path)
    if fresh:
        old = [r for r in old if r.sharder not in names]
    _rewrite(csv_path, old)
    breakdown = read_structured(devices_path) if devices_path.is_file() else {}
    if fresh:
        breakdown = {k: v for k, v in breakdown.items() if k not in names}
    done = {(r.task, r.sharder, r.cost_model) for r in old}
    rows = list(old)
    for i, spec in enumerate(specs):
        todo = [n for n in names if (spec.name, n, cost_model.name) not in done]
        if not todo:
            continue
        task = spec.build()
        extra = bound(task, cost_model) if bound else None
        for name in todo:
            row, plan, report = run_one(suite, spec, task, name, cost_model, extra,
                                        options or {})
            if save_plans and plan is not None:
                plan.save(out_dir / f"{suite}.plans" / spec.name / f"{name}.json")
            _append(csv_path, row)
            rows.append(row)
            if i == 0 and report is not None:
                breakdown[name] = {"task": spec.name, "per_device": [
                    {"hbm_ms": d.hbm_ms, "uvm_ms": d.uvm_ms, "comm_ms": d.comm_ms}
                    for d in report.per_device]}
                write_structured(devices_path, breakdown)
            if on_row:
                on_row(row)
    return rows
