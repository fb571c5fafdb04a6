"""The comparison harness: every registered sharder on every task of a suite, priced alike.

Rows are appended to the suite's CSV as each (task, sharder) finishes, so an interrupted run
resumes where it stopped: rows already in the file are kept and not recomputed. A row is reused
only when it was made by the same sharder options and the same cost model, named by its path
and the digest of its files (every learned model calls itself ``lightgbm``); a row of the same
task, sharder and model made with other options is stale and is recomputed.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Protocol

from autoshard.cost import CostModel, builtin_model
from autoshard.errors import InputError, PlannerError
from autoshard.evaluator import CostReport, evaluate
from autoshard.fileio import (
    append_csv_row,
    atomic_write_text,
    csv_text,
    read_structured,
    write_structured,
)
from autoshard.limits import check_finite_costs
from autoshard.plan import Plan
from autoshard.sharders import (
    check_sharder_options,
    common_options,
    get_sharder,
    sharder_info,
    sharder_names,
)
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
    cost_model_id: str = ""
    options: str = ""
    found_by: str = ""


COLUMNS = [f.name for f in fields(CompareRow)]
_FLOATS = {f.name for f in fields(CompareRow) if f.type in ("float", float)}
#: Columns added after the first results were written, which older files lack, and the value
#: such a row reads as (a column's name: that column's value).
_LATER = {"cost_model_id": "cost_model", "options": "", "found_by": ""}


def model_identity(spec: str | None) -> str:
    """What a cost model is, for resuming: ``analytical``, ``torchrec@<version>`` (TorchRec's
    estimator), or a learned model's resolved folder and the SHA-256 (first 16 hex digits) of
    the names and contents of the files in it."""
    builtin = builtin_model(spec)
    if builtin == "analytical":
        return "analytical"
    if builtin == "torchrec":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"torchrec@{version('torchrec')}"
        except PackageNotFoundError:
            return "torchrec"
    assert spec is not None  # None is the analytical model
    folder = Path(spec).resolve()
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes())
    return f"{folder}@sha256:{digest.hexdigest()[:16]}"


def options_key(options: dict[str, object]) -> str:
    """The sharder options a row was made with, as canonical JSON."""
    return json.dumps(options, sort_keys=True, default=str)


def read_rows(path: Path) -> list[CompareRow]:
    """Rows of a results CSV; a truncated last line (interrupted write) is dropped."""
    if not path.is_file():
        return []
    rows = []
    with path.open(newline="") as fh:
        for raw in csv.DictReader(fh):
            missing = set(COLUMNS) - set(raw)
            if missing <= set(_LATER):  # written before those columns
                raw = dict(raw, **{k: raw.get(_LATER[k], "") if _LATER[k] else ""
                                   for k in missing})
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
    append_csv_row(path, asdict(row), COLUMNS)


def _rewrite(path: Path, rows: Iterable[CompareRow]) -> None:
    """Rewrites the CSV with only complete rows (drops a torn last line before appending)."""
    atomic_write_text(path, csv_text((asdict(r) for r in rows), COLUMNS))


def sharder_options(names: Iterable[str], common: dict[str, object],
                    given: dict[str, dict[str, object]] | None = None
                    ) -> dict[str, dict[str, object]]:
    """Each sharder's options: the common settings it takes, then those given for it.

    Args:
        names: Registry names.
        common: Settings applied to every sharder that takes them (``seed``, ``time_limit``).
        given: Options for one sharder each, checked strictly.

    Raises:
        InputError: A given option the sharder does not take (or of the wrong type).
    """
    given = given or {}
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise InputError(f"options given for a sharder not run (running: {', '.join(names)})",
                         field="sharder", value=unknown[0])
    out: dict[str, dict[str, object]] = {}
    for name in names:
        out[name] = dict(common_options(name, common), **given.get(name, {}))
        with contextlib.suppress(PlannerError):  # not importable here: run_one says so
            check_sharder_options(name, out[name])
    return out


def run_one(suite: str, spec: TaskSource, task: ShardingTask, name: str, cost_model: CostModel,
            bound_ms: float | None, options: dict[str, object],
            cost_model_id: str | None = None) -> tuple[CompareRow, Plan | None,
                                                       CostReport | None]:
    """Runs one sharder, made with exactly ``options``, on one task; failures and
    unavailability become rows, not exceptions.

    Raises:
        InputError: An option the sharder does not take (a caller's mistake, not a failure of
            the sharder; harnesses pass common settings through :func:`common_options`).
    """
    with contextlib.suppress(PlannerError):  # not importable here: a skipped row below
        check_sharder_options(name, options)
    base = dict(suite=suite, task=spec.name, tables=task.num_tables, devices=task.num_devices,
                mode=task.workload.mode, sharder=name, cost_model=cost_model.name,
                cost_model_id=cost_model_id or cost_model.name, options=options_key(options))
    reason = sharder_info(name, **options).unavailable
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
    found_by = "" if plan.provenance is None else plan.provenance.summary()
    row = CompareRow(status="ok", step_cost_ms=report.step_cost_ms,
                     lower_bound_ms=report.lower_bound_ms, cost_ratio=report.cost_ratio,
                     load_balance=report.load_balance, uvm_lookup_share=report.uvm_lookup_share,
                     plan_seconds=seconds, found_by=found_by, **base)  # type: ignore[arg-type]
    return row, plan, report


def run_suite(suite: str, specs: Iterable[TaskSource], cost_model: CostModel, out_dir: Path,
              sharders: list[str] | None = None, options: dict[str, object] | None = None,
              bound: Callable[[ShardingTask, CostModel], float] | None = None,
              on_row: Callable[[CompareRow], None] | None = None,
              fresh: bool = False, save_plans: bool = False,
              given: dict[str, dict[str, object]] | None = None,
              cost_model_id: str | None = None) -> list[CompareRow]:
    """Runs every sharder on every task, appending rows to ``out_dir/<suite>.csv`` as they
    finish, and returns all rows, old and new. The first task's per-device breakdown of each
    plan goes to ``<suite>.devices.json``.

    Args:
        suite: Suite name, also the file stem.
        specs: The tasks.
        cost_model: Prices every plan.
        out_dir: Results folder; rows already there (same task, sharder, cost model identity
            and options) are kept.
        sharders: Registry names to run (default: all registered).
        options: Common settings, passed to every sharder that takes them (seed, time_limit).
        bound: Optional extra lower bound per task (the larger bound is reported).
        on_row: Called with each new row (progress display).
        fresh: Recompute the selected sharders' rows instead of keeping them (rows of other
            sharders are kept).
        save_plans: Also write each plan to ``<suite>.plans/<task>/<sharder>.json``.
        given: Options for one sharder each (``{"recshard": {"time_limit": 5.0}}``), strict.
        cost_model_id: The cost model's identity (:func:`model_identity`); default its name.

    Raises:
        InputError: An option a sharder does not take; nothing is run or written.
    """
    names = sharders or sharder_names()
    per_sharder = sharder_options(names, options or {}, given)
    model_id = cost_model_id or cost_model.name
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / f"{suite}.csv"
    devices_path = out_dir / f"{suite}.devices.json"
    old = _kept_rows(read_rows(csv_path), per_sharder, model_id, fresh)
    _rewrite(csv_path, old)
    breakdown = read_structured(devices_path) if devices_path.is_file() else {}
    if fresh:
        breakdown = {k: v for k, v in breakdown.items() if k not in names}
    done = {(r.task, r.sharder, r.cost_model_id) for r in old}
    rows = list(old)
    for i, spec in enumerate(specs):
        todo = [n for n in names if (spec.name, n, model_id) not in done]
        if not todo:
            continue
        task = spec.build()
        extra = bound(task, cost_model) if bound else None
        for name in todo:
            row, plan, report = run_one(suite, spec, task, name, cost_model, extra,
                                        per_sharder[name], model_id)
            _record(out_dir, suite, spec.name, row, plan if save_plans else None)
            rows.append(row)
            if i == 0 and report is not None:
                breakdown[name] = _breakdown(spec.name, report)
                write_structured(devices_path, breakdown)
            if on_row:
                on_row(row)
    return rows


def _record(out_dir: Path, suite: str, task: str, row: CompareRow, plan: Plan | None) -> None:
    """Appends ``row`` to the suite's CSV, and writes ``plan`` beside it when given."""
    if plan is not None:
        plan.save(out_dir / f"{suite}.plans" / task / f"{row.sharder}.json")
    _append(out_dir / f"{suite}.csv", row)


def _kept_rows(rows: list[CompareRow], per_sharder: dict[str, dict[str, object]],
               model_id: str, fresh: bool) -> list[CompareRow]:
    """The rows of an earlier run to keep: not those of a sharder run now with the same cost
    model and other options (stale), nor, ``fresh``, any of a sharder run now."""
    kept = [r for r in rows if not (
        r.sharder in per_sharder and r.cost_model_id == model_id
        and r.options != options_key(per_sharder[r.sharder]))]
    return [r for r in kept if r.sharder not in per_sharder] if fresh else kept


def _breakdown(task: str, report: CostReport) -> dict[str, object]:
    """A plan's per-device costs by tier, for the stacked-bar plot."""
    return {"task": task, "per_device": [
        {"hbm_ms": d.hbm_ms, "uvm_ms": d.uvm_ms, "comm_ms": d.comm_ms}
        for d in report.per_device]}
