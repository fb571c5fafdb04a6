"""TorchRec's opinion of a comparison's plans: its estimators' step cost and HBM, before and
after the export fits each plan to TorchRec's HBM count.

For every plan a comparison saved (``<suite>.plans/<task>/<sharder>.json``) one row goes to
``<suite>.torchrec.csv``: TorchRec's perf estimate of the slowest rank and its fullest rank's HBM
as planned; the tables whose caches the export lowered to fit; and, for the plan as exported,
TorchRec's perf estimate, whether its storage estimate fits every rank, and our own step cost.
Rows are appended as they finish; a rerun keeps them.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from autoshard.compare.harness import TaskSource
from autoshard.errors import InputError, PlannerError
from autoshard.fileio import append_csv_row
from autoshard.layout.plan import Plan
from autoshard.pricing.cost import CostModel
from autoshard.pricing.evaluator import evaluate


@dataclass(frozen=True)
class OpinionRow:
    """One plan under TorchRec's estimators, as planned and as exported."""

    suite: str
    task: str
    sharder: str
    status: str
    reason: str = ""
    ours_ms: float = float("nan")
    torchrec_ms: float = float("nan")
    torchrec_hbm_fill: float = float("nan")
    fitted_tables: int = 0
    exported_ours_ms: float = float("nan")
    exported_torchrec_ms: float = float("nan")
    exported_hbm_fill: float = float("nan")
    exported_fits: bool = False


COLUMNS = [f.name for f in fields(OpinionRow)]


def opinion(suite: str, task_name: str, sharder: str, plan: Plan, task: object,
            cost_model: CostModel) -> OpinionRow:
    """TorchRec's estimates of ``plan`` as planned and as exported
    (:func:`autoshard.torchrec.exporter.export_plan`: fitted, no file written)."""
    from autoshard.task import ShardingTask
    from autoshard.torchrec.estimate import estimate_shardings
    from autoshard.torchrec.exporter import export_plan

    assert isinstance(task, ShardingTask)
    base = dict(suite=suite, task=task_name, sharder=sharder)
    try:
        exported = export_plan(plan, task)
        before = estimate_shardings(exported.planned, task)
        after = estimate_shardings(exported.shardings, task)
        ours = evaluate(plan, task, cost_model).step_cost_ms
        ours_exported = evaluate(exported.plan, task, cost_model).step_cost_ms
    except (PlannerError, InputError) as exc:
        return OpinionRow(status="failed", reason=str(exc), **base)  # type: ignore[arg-type]
    return OpinionRow(status="ok", ours_ms=ours, torchrec_ms=before.step_ms,
                      torchrec_hbm_fill=before.hbm_fill, fitted_tables=len(exported.changed),
                      exported_ours_ms=ours_exported, exported_torchrec_ms=after.step_ms,
                      exported_hbm_fill=after.hbm_fill, exported_fits=after.fits,
                      **base)  # type: ignore[arg-type]


def run_opinions(suite: str, specs: Iterable[TaskSource], out_dir: Path, sharders: list[str],
                 cost_model: CostModel) -> list[OpinionRow]:
    """One row per saved plan of the suite's tasks and ``sharders``, appended to
    ``out_dir/<suite>.torchrec.csv``; rows already there are kept."""
    path = out_dir / f"{suite}.torchrec.csv"
    rows = read_opinions(path)
    done = {(r.task, r.sharder) for r in rows}
    for spec in specs:
        todo = [n for n in sharders if (spec.name, n) not in done
                and (out_dir / f"{suite}.plans" / spec.name / f"{n}.json").is_file()]
        if not todo:
            continue
        task = spec.build()
        for name in todo:
            plan = Plan.load(out_dir / f"{suite}.plans" / spec.name / f"{name}.json")
            row = opinion(suite, spec.name, name, plan, task, cost_model)
            _append(path, row)
            rows.append(row)
    return rows


def read_opinions(path: Path) -> list[OpinionRow]:
    """Rows of an opinions CSV; a torn last line is dropped."""
    if not path.is_file():
        return []
    out = []
    with path.open(newline="") as fh:
        for raw in csv.DictReader(fh):
            if None in raw.values() or set(raw) != set(COLUMNS):
                continue
            try:
                values: dict[str, object] = dict(raw)
                for f in fields(OpinionRow):
                    if f.type in ("float", float):
                        values[f.name] = float(raw[f.name])
                values["fitted_tables"] = int(raw["fitted_tables"])
                values["exported_fits"] = raw["exported_fits"] == "True"
            except ValueError:
                continue
            out.append(OpinionRow(**values))  # type: ignore[arg-type]
    return out


def _append(path: Path, row: OpinionRow) -> None:
    append_csv_row(path, asdict(row), COLUMNS)


def opinions_markdown(rows: list[OpinionRow]) -> str:
    """A per-plan table: our and TorchRec's step cost, HBM as planned and as exported."""
    lines = ["| task | sharder | ours ms | TorchRec ms | TorchRec HBM fill | tables fitted | "
             "exported: ours ms | TorchRec ms | HBM fill | fits |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {r.task} | {r.sharder} | {r.status}: {r.reason[:60]} |"
                         + " |" * 7)
            continue
        lines.append(f"| {r.task} | {r.sharder} | {r.ours_ms:.3f} | {r.torchrec_ms:.3f} | "
                     f"{r.torchrec_hbm_fill:.3f} | {r.fitted_tables} | "
                     f"{r.exported_ours_ms:.3f} | {r.exported_torchrec_ms:.3f} | "
                     f"{r.exported_hbm_fill:.3f} | {'yes' if r.exported_fits else 'NO'} |")
    ok = [r for r in rows if r.status == "ok"]
    fits = sum(r.exported_fits for r in ok)
    over = sum(r.torchrec_hbm_fill > 1.0 for r in ok)
    lines.append("")
    lines.append(f"{fits} of {len(ok)} exported plans fit TorchRec's storage estimate on every "
                 f"rank; {over} of them overfilled some rank as planned.")
    return "\n".join(lines) + "\n"
