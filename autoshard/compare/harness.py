"""The comparison harness: every registered sharder on every task of a suite, priced alike.

Rows are appended to the suite's CSV as each (task, sharder) finishes, so an interrupted run
resumes where it stopped: rows already in the file are kept and not recomputed. A row is reused
only when it was made by the same sharder options and the same cost model, named by its path
and the digest of its files (every learned model calls itself ``lightgbm``); a row of the same
task, sharder and model made with other options is stale and is recomputed, and so is a row
with a non-finite figure or a skipped one (whether a sharder can run is this machine's
question). Rows can also be reused from another results folder without writing there.

Every row records the machine and the time it was measured; a row the run that wrote the file
did not measure names the CSV it was reused from (``reused_from``). A CSV the harness did not
write is never replaced, nor are the Markdown, plots and breakdown beside one.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, cast

from autoshard import planning
from autoshard.compare.rows import (
    BESIDE,
    COLUMNS,
    FIGURES,
    CompareRow,
    append_row,
    check_outputs,
    finite,
    read_rows,
    rewrite_rows,
    utc_now,
)
from autoshard.errors import InputError, PlannerError
from autoshard.fileio import read_structured, write_structured
from autoshard.layout.plan import Plan
from autoshard.layout.plan_context import SUITE_PREFIX, PlanContext
from autoshard.machine import describe_machine
from autoshard.pricing.cost import CostModel
from autoshard.pricing.evaluator import CostReport
from autoshard.sharders import (
    check_sharder_options,
    common_options,
    sharder_info,
    sharder_names,
)
from autoshard.task import ShardingTask

#: Rows and their files live in :mod:`autoshard.compare.rows`; they are the harness's API too.
__all__ = ["BESIDE", "COLUMNS", "CompareRow", "FixedTask", "Resumed", "TaskSource",
           "check_outputs", "options_key", "read_rows", "resume", "run_one",
           "run_suite", "sharder_options"]


class TaskSource(Protocol):
    """A named task: a suite's :class:`autoshard.compare.suites.TaskSpec`, or :class:`FixedTask`."""

    @property
    def name(self) -> str: ...

    def build(self) -> ShardingTask: ...


@dataclass(frozen=True)
class FixedTask:
    """An already built task under a name (e.g. the demo's profiled workload); ``tables``:
    where its tables can be read again (a table file), which its plans record, if known."""

    name: str
    task: ShardingTask
    tables: str | None = None

    def build(self) -> ShardingTask:
        return self.task


def options_key(options: dict[str, object]) -> str:
    """The sharder options a row was made with, as canonical JSON."""
    return json.dumps(options, sort_keys=True, default=str)


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
    unavailability become rows, not exceptions. Every row names this machine and time.

    Raises:
        InputError: An option the sharder does not take (a caller's mistake, not a failure of
            the sharder; harnesses pass common settings through :func:`common_options`).
    """
    with contextlib.suppress(PlannerError):  # not importable here: a skipped row below
        check_sharder_options(name, options)
    base = dict(suite=suite, task=spec.name, tables=task.num_tables, devices=task.num_devices,
                mode=task.workload.mode, sharder=name, cost_model=cost_model.name,
                cost_model_id=cost_model_id or cost_model.name, options=options_key(options),
                machine=describe_machine(), measured_at=utc_now())
    reason = sharder_info(name, **options).unavailable
    if reason:
        return CompareRow(status="skipped", reason=reason, **base), None, None  # type: ignore
    context = _context(suite, spec, task, cost_model_id or cost_model.name)
    start = time.perf_counter()
    try:  # every sharder's cost over the same bound, not over its own
        planned = planning.plan(task, name, cost_model, bound_ms=bound_ms, own_bound=False,
                                context=context, **cast(dict[str, Any], options))
    except (PlannerError, InputError) as exc:
        return CompareRow(status="failed", reason=str(exc), plan_seconds=time.perf_counter()
                          - start, **base), None, None  # type: ignore[arg-type]
    report, found = planned.report, planned.plan
    found_by = "" if found.provenance is None else found.provenance.summary()
    row = CompareRow(status="ok", step_cost_ms=report.step_cost_ms,
                     lower_bound_ms=report.lower_bound_ms, cost_ratio=report.cost_ratio,
                     load_balance=report.load_balance, uvm_lookup_share=report.uvm_lookup_share,
                     plan_seconds=planned.seconds, found_by=found_by,
                     notes="; ".join(planned.notes), **base)  # type: ignore[arg-type]
    return row, found, report


@dataclass(frozen=True)
class Resumed:
    """What a run starts from.

    Args:
        rows: Rows of earlier runs kept in the CSV, each marked reused (``reused_from``).
        notes: One line per row not kept for a reason the user should hear (a figure that
            is not finite), saying whether it is recomputed.
        breakdown: Per-device costs of the kept rows of the suite's first task, by sharder.
    """

    rows: list[CompareRow]
    notes: list[str] = field(default_factory=list)
    breakdown: dict[str, Any] = field(default_factory=dict)


def resume(suite: str, out_dir: Path, tasks: list[str], per_sharder: dict[str, dict[str, object]],
           model_id: str, fresh: bool = False, reuse: Path | None = None) -> Resumed:
    """The rows a run keeps: those of ``out_dir``'s CSV, then those of ``reuse``'s CSV that this
    run would make (its tasks, sharders, options and cost model) and ``out_dir`` lacks.

    Rows of a sharder run now with the same cost model and other options are stale, skipped
    ones are checked again, and ``fresh`` drops every row of a sharder run now; a row with a
    figure that is not finite is never kept. Nothing is written.

    Raises:
        InputError: A CSV that the harness did not write, in either folder, or no CSV of the
            suite in ``reuse``.
    """
    own_path = out_dir / f"{suite}.csv"
    own = check_outputs(out_dir, suite)
    kept, notes = _keep(own, per_sharder, model_id, fresh, own_path)
    reused: list[CompareRow] = []
    if reuse is not None and reuse.resolve() != out_dir.resolve():
        reuse_path = reuse / f"{suite}.csv"
        if not reuse_path.is_file():
            raise InputError(f"no comparison of suite '{suite}' there to reuse (no "
                             f"{reuse_path.name})", field="reuse", value=str(reuse))
        have = {(r.task, r.sharder, r.cost_model_id) for r in kept}
        wanted = [r for r in check_outputs(reuse, suite) if r.task in tasks
                  and r.sharder in per_sharder and r.cost_model_id == model_id
                  and (r.task, r.sharder, model_id) not in have]
        reused, more = _keep(wanted, per_sharder, model_id, fresh, reuse_path)
        notes += more
    rows = kept + [replace(r, suite=suite) for r in reused]
    from_reuse = {(r.task, r.sharder) for r in reused}
    breakdown: dict[str, Any] = {}
    if tasks:  # each kept row's per-device costs, from the folder the row came from
        here = _read_breakdown(out_dir / f"{suite}.devices.json", tasks[0], model_id)
        there = (_read_breakdown(reuse / f"{suite}.devices.json", tasks[0], model_id)
                 if reuse is not None and reused else {})
        for r in rows:
            entry = (there if (r.task, r.sharder) in from_reuse else here).get(r.sharder)
            if r.task == tasks[0] and r.cost_model_id == model_id and entry:
                breakdown[r.sharder] = entry
    return Resumed(rows, notes, breakdown)


def _keep(rows: list[CompareRow], per_sharder: dict[str, dict[str, object]], model_id: str,
          fresh: bool, path: Path) -> tuple[list[CompareRow], list[str]]:
    """The rows of ``path`` to keep, marked as reused from it (unless they already name where
    they came from), and a note for each one dropped for a figure that is not finite."""
    kept, notes = [], []
    for r in rows:
        now = r.sharder in per_sharder
        if not finite(r):
            bad = next(f for f in FIGURES if not math.isfinite(getattr(r, f)))
            again = now and r.cost_model_id == model_id
            notes.append(f"{r.task} {r.sharder}: {bad} is {getattr(r, bad)} in {path}; not "
                         f"reused{', computed again' if again else ''}")
            continue
        same_model = now and r.cost_model_id == model_id
        stale = same_model and r.options != options_key(per_sharder[r.sharder])
        if (now and fresh) or stale or (same_model and r.status == "skipped"):
            continue
        kept.append(r if r.reused_from else replace(r, reused_from=str(path)))
    return kept, notes


def _read_breakdown(path: Path, task: str, model_id: str) -> dict[str, Any]:
    """The per-device costs of ``task`` in a breakdown file, by sharder, for ``model_id``
    (entries written before the model was recorded are taken as its)."""
    doc = read_structured(path) if path.is_file() else {}
    if not isinstance(doc, dict):
        return {}
    return {name: entry for name, entry in doc.items() if isinstance(entry, dict)
            and entry.get("task") == task and entry.get("cost_model_id", model_id) == model_id}


def run_suite(suite: str, specs: Iterable[TaskSource], cost_model: CostModel, out_dir: Path,
              sharders: list[str] | None = None, options: dict[str, object] | None = None,
              bound: Callable[[ShardingTask, CostModel], float] | None = None,
              on_row: Callable[[CompareRow], None] | None = None,
              fresh: bool = False, save_plans: bool = False,
              given: dict[str, dict[str, object]] | None = None,
              cost_model_id: str | None = None, reuse: Path | None = None,
              on_note: Callable[[str], None] | None = None) -> list[CompareRow]:
    """Runs every sharder on every task, appending rows to ``out_dir/<suite>.csv`` as they
    finish, and returns all rows, old and new. The first task's per-device breakdown of each
    plan goes to ``<suite>.devices.json``.

    Args:
        suite: Suite name, also the file stem.
        specs: The tasks.
        cost_model: Prices every plan.
        out_dir: Results folder; rows already there are kept as :func:`resume` says.
        sharders: Registry names to run (default: all registered).
        options: Common settings, passed to every sharder that takes them (seed, time_limit).
        bound: Optional extra lower bound per task (the larger bound is reported).
        on_row: Called with each row of this run in task order: a reused row (marked) as it
            is taken, a new one as it finishes.
        fresh: Recompute the selected sharders' rows (rows of other sharders are kept).
        save_plans: Also write each plan to ``<suite>.plans/<task>/<sharder>.json``.
        given: Options for one sharder each (``{"recshard": {"time_limit": 5.0}}``), strict.
        cost_model_id: The cost model's identity (:func:`autoshard.pricing.cost.model_identity`);
            default its name.
        reuse: Another results folder to reuse rows from (:func:`resume`); never written.
        on_note: Called with each earlier row not reused for a figure that is not finite.

    Raises:
        InputError: An option a sharder does not take, or a file in either folder that the
            harness did not write; nothing is run or written.
    """
    names = sharders or sharder_names()
    per_sharder = sharder_options(names, options or {}, given)
    model_id = cost_model_id or cost_model.name
    specs = list(specs)
    start = resume(suite, out_dir, [s.name for s in specs], per_sharder, model_id, fresh, reuse)
    breakdown = _begin(out_dir, suite, start, on_note)
    kept = {(r.task, r.sharder, r.cost_model_id): r for r in start.rows}
    rows = list(start.rows)
    show = on_row or (lambda _: None)
    for i, spec in enumerate(specs):
        todo = [n for n in names if (spec.name, n, model_id) not in kept]
        for name in (n for n in names if n not in todo):
            show(kept[spec.name, name, model_id])
        if not todo:
            continue
        task = spec.build()
        extra = bound(task, cost_model) if bound else None
        for name in todo:
            row, plan, report = run_one(suite, spec, task, name, cost_model, extra,
                                        per_sharder[name], model_id)
            _record(out_dir, suite, row, plan if save_plans else None,
                    breakdown if i == 0 else None, report)
            rows.append(row)
            show(row)
    return rows


def _begin(out_dir: Path, suite: str, start: Resumed,
           on_note: Callable[[str], None] | None) -> dict[str, Any]:
    """Says the notes, writes the kept rows and their breakdown; returns the breakdown."""
    for note in start.notes:
        if on_note:
            on_note(note)
    out_dir.mkdir(parents=True, exist_ok=True)
    rewrite_rows(out_dir / f"{suite}.csv", start.rows)
    devices_path = out_dir / f"{suite}.devices.json"
    if start.breakdown or devices_path.is_file():
        write_structured(devices_path, start.breakdown)
    return dict(start.breakdown)


def _context(suite: str, spec: TaskSource, task: ShardingTask, model_id: str
             ) -> PlanContext | None:
    """The context a plan of ``spec`` records: a suite task's tables are read again from the
    suite (``suite:<suite>/<task>``), a fixed task's from its table file; None when there is
    none to read them from."""
    from autoshard.compare.suites import TaskSpec

    source = (f"{SUITE_PREFIX}{suite}/{spec.name}" if isinstance(spec, TaskSpec)
              else getattr(spec, "tables", None))
    if source is None:
        return None
    return PlanContext.of(task, source, {"suite": suite, "task": spec.name}, model_id)


def _record(out_dir: Path, suite: str, row: CompareRow, plan: Plan | None,
            breakdown: dict[str, Any] | None, report: CostReport | None) -> None:
    """Appends ``row`` to the suite's CSV, writes ``plan`` beside it when given, and adds the
    plan's per-device costs to ``breakdown`` (the first task's) when given."""
    if plan is not None:
        plan.save(out_dir / f"{suite}.plans" / row.task / f"{row.sharder}.json")
    append_row(out_dir / f"{suite}.csv", row)
    if breakdown is not None and report is not None:
        breakdown[row.sharder] = _breakdown(row.task, row.cost_model_id, report)
        write_structured(out_dir / f"{suite}.devices.json", breakdown)


def _breakdown(task: str, model_id: str, report: CostReport) -> dict[str, object]:
    """A plan's per-device costs by tier, for the stacked-bar plot."""
    return {"task": task, "cost_model_id": model_id, "per_device": [
        {"hbm_ms": d.hbm_ms, "uvm_ms": d.uvm_ms, "comm_ms": d.comm_ms}
        for d in report.per_device]}
