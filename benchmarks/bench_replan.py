"""Re-planning after the statistics drift: step cost against bytes moved, over move budgets,
for `recshard` and `ppo`.

Two tasks, each planned on day k's statistics and then priced and re-planned on day k+1's:

- ``generated``: 200 DLRM-like tables (:func:`autoshard.workloads.dlrm_tables`, seed 1) on 8
  H100s whose HBM holds 30% of the tables' bytes (:func:`autoshard.workloads.constrained_task`);
  on day k+1 every table's pooling factor is multiplied by a lognormal factor (sigma 0.1,
  seed 7);
- ``criteo1tb``: the 26 tables of DLRM on Criteo 1TB (MLPerf's one-hot model: its hash sizes,
  dim 128), their statistics profiled (``autoshard profile``) from two days of generated
  Criteo-format data whose columns drift from one day to the next (each column's Zipf exponent
  and share of missing values; :func:`criteo_day`); 8 H100s, HBM for 30% of the bytes.

For each task and sharder (each plans its own day-k plan): the plan in use on day k+1, a
re-plan from scratch, and re-plans from the plan in use within each budget of :data:`BUDGETS`
(:func:`autoshard.replan.drift.drift`). Rows go to ``<out>/replan.jsonl`` as each (task,
sharder) finishes (a rerun resumes; ``--fresh`` starts over); ``<out>/replan.png`` (cost / bound
against the share of bytes copied) and ``<out>/results.md`` are written at the end, with the
checks: within 10% of the bytes, the re-plan is within 1% of the cheaper unconstrained re-plan
and copies at most 10%; with a zero budget it is the plan in use.

Usage: ``.venv/bin/python benchmarks/bench_replan.py [--time-limit 30] [--out results/replan]
[--fresh] [--tasks generated,criteo1tb] [--sharders recshard,ppo]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import autoshard
from autoshard.cli import main as cli
from autoshard.fileio import atomic_write_text
from autoshard.machine import describe_machine
from autoshard.pricing.cost import load_cost_model
from autoshard.public_models import CRITEO_1TB_ROWS
from autoshard.replan.budget import MoveBudget
from autoshard.replan.drift import drift
from autoshard.tables import load_tables
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

#: The budgets swept, as ``--move-budget`` takes them.
BUDGETS = ("0", "1%", "2%", "5%", "10%", "20%", "50%", "none")
#: Samples of generated Criteo-format data per day.
CRITEO_SAMPLES = 100_000


def generated() -> tuple[ShardingTask, ShardingTask]:
    """Day k and day k+1 of the generated task (module docstring)."""
    tables = dlrm_tables(200, seed=1)
    day_k = constrained_task(tables, 8, hbm_fraction=0.3)
    factor = np.random.default_rng(7).lognormal(0.0, 0.1, len(tables))
    grown = tuple(replace(t, pooling_factor=t.pooling_factor * float(f))
                  for t, f in zip(tables, factor, strict=True))
    return day_k, ShardingTask(grown, day_k.hardware, day_k.workload, day_k.reservation)


def criteo_day(path: Path, samples: int, seed: int, day: int) -> None:
    """A day of Criteo-format data (label, I1-I13, C1-C26, tab-separated): each categorical
    column Zipf-distributed over its values (exponent drawn in [1.1, 1.8]) with a share of
    values missing (drawn in [0, 0.4]); from one day to the next, each exponent moves by a
    lognormal factor (sigma 0.05 a day, at least 1.05) and each missing share by a normal step
    (sigma 0.05 a day, within [0, 0.9])."""
    base = np.random.default_rng(seed)
    alpha, missing = base.uniform(1.1, 1.8, 26), base.uniform(0.0, 0.4, 26)
    if day:
        step = np.random.default_rng([seed, day])
        alpha = np.maximum(alpha * np.exp(step.normal(0.0, 0.05 * day, 26)), 1.05)
        missing = np.clip(missing + step.normal(0.0, 0.05 * day, 26), 0.0, 0.9)
    vocab = np.minimum(np.array(CRITEO_1TB_ROWS) * 2, 10**6)
    rng = np.random.default_rng([seed, day, 1])
    cats = np.stack([np.where(rng.random(samples) < missing[c], -1,
                              rng.zipf(alpha[c], samples) % vocab[c]) for c in range(26)], 1)
    dense = rng.integers(0, 100, (samples, 13))
    with path.open("w") as out:
        for i in range(samples):
            out.write("\t".join([str(i % 2), *map(str, dense[i]),
                                 *("" if x < 0 else f"{x:08x}" for x in cats[i])]) + "\n")


def criteo(work: Path) -> tuple[ShardingTask, ShardingTask]:
    """Day k and day k+1 of the Criteo task, profiled by ``autoshard profile`` (module
    docstring)."""
    sizes = ",".join(f"C{i + 1}={rows}" for i, rows in enumerate(CRITEO_1TB_ROWS))
    days = []
    for day in (0, 1):
        data, tables = work / f"criteo_day{day}.tsv", work / f"criteo_day{day}.json"
        if not tables.is_file():
            criteo_day(data, CRITEO_SAMPLES, seed=0, day=day)
            cli(["profile", str(data), "--format", "criteo", "--hash-size", sizes, "--dim",
                 "128", "--jobs", "1", "-o", str(tables)])
            data.unlink()
        days.append(load_tables(tables))
    day_k = constrained_task(days[0], 8, hbm_fraction=0.3)
    return day_k, ShardingTask(days[1], day_k.hardware, day_k.workload, day_k.reservation)


def run(task_name: str, days: tuple[ShardingTask, ShardingTask], sharder: str,
        time_limit: float) -> list[dict[str, Any]]:
    """The rows of one task and sharder (module docstring)."""
    model = load_cost_model("analytical")
    day_k, day_next = days
    old = autoshard.plan(day_k, sharder, model, time_limit=time_limit)
    budgets = [MoveBudget.parse(b) for b in BUDGETS]
    found = drift(old.plan, day_next, sharder, model, budgets, old.report.step_cost_ms,
                  time_limit=time_limit)
    rows = []
    for spec, r in zip(("in use", "scratch", *BUDGETS), found.rows, strict=True):
        m = r.move
        rows.append({"task": task_name, "sharder": sharder, "row": spec, "name": r.name,
                     "cost_ms": r.cost_ms, "cost_ratio": r.cost_ratio, "bound_ms": found.bound_ms,
                     "day_k_cost_ms": old.report.step_cost_ms,
                     "day_k_ratio": old.report.cost_ratio, "copied_bytes": m.copied_bytes,
                     "copied_share": m.copied_share, "total_bytes": m.total_bytes,
                     "move_s": m.seconds, "payback_steps": m.payback_steps,
                     "tables_moved": m.tables_moved, "tables_changed": m.tables_changed,
                     "links": [dict(link=x.link, bytes=x.bytes, weight_bytes=x.weight_bytes)
                               for x in m.links],
                     "budget_bound_ms": m.budget_bound_ms, "plan_s": r.seconds,
                     "notes": list(m.notes), "load": os.getloadavg()[0]})
    return rows


def checks(rows: list[dict[str, Any]]) -> list[str]:
    """The claims of the module docstring, one line each per task and sharder."""
    out = []
    for key in sorted({(r["task"], r["sharder"]) for r in rows}):
        mine = {r["row"]: r for r in rows if (r["task"], r["sharder"]) == key}
        if not {"10%", "0", "none", "scratch", "in use"} <= set(mine):
            continue
        free = min(mine["none"]["cost_ms"], mine["scratch"]["cost_ms"])
        ten, zero, in_use = mine["10%"], mine["0"], mine["in use"]
        near = "within 1%" if ten["cost_ms"] <= 1.01 * free else "NOT within 1%"
        bound = ten["budget_bound_ms"]
        proven = (f"; the MILP's bound within the budget: {ten['cost_ms'] / bound:.4f} of it"
                  if bound else "")
        most = "at most" if ten["copied_share"] <= 0.1 + 1e-9 else "MORE than"
        same = (zero["cost_ms"] == in_use["cost_ms"]
                and zero["copied_bytes"] == in_use["copied_bytes"])
        out.append(f"{key[0]} / {key[1]}: within 10% the cost is {ten['cost_ms'] / free:.4f} "
                   f"of the cheaper unconstrained re-plan's ({near}{proven}), copying "
                   f"{ten['copied_share']:.2%} of the bytes ({most} 10%); a zero budget "
                   f"{'returns' if same else 'does NOT return'} the plan in use "
                   f"({zero['cost_ms']:.4f} ms, {zero['copied_bytes']:.0f} B copied)")
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Cost / bound against the share of bytes copied, one panel per task, one marker per
    sharder and budget (labelled with the budget); dashed: the sharder's re-plan from
    scratch, dotted: its plan in use."""
    from autoshard.extras import require

    require("matplotlib", "plots")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    for ax, name in zip(axes[0], tasks, strict=True):
        for i, sharder in enumerate(sorted({r["sharder"] for r in rows if r["task"] == name})):
            mine = {r["row"]: r for r in rows if (r["task"], r["sharder"]) == (name, sharder)}
            swept = [mine[b] for b in BUDGETS if b in mine]
            color = f"C{i}"
            ax.plot([100 * r["copied_share"] for r in swept], [r["cost_ratio"] for r in swept],
                    "o", color=color, label=f"{sharder}: within a budget")
            for r, b in zip(swept, [b for b in BUDGETS if b in mine], strict=True):
                ax.annotate(b, (100 * r["copied_share"], r["cost_ratio"]), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
            for row, style, what in (("scratch", "--", "from scratch"),
                                     ("in use", ":", "plan in use")):
                if row in mine:
                    ax.axhline(mine[row]["cost_ratio"], color=color, linestyle=style,
                               label=f"{sharder}: {what} ({100 * mine[row]['copied_share']:.0f}"
                               "% copied)")
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(left=0.0)
        ax.set_xlabel("bytes copied, % of the tables' bytes (weights and optimizer state)")
        ax.set_ylabel("step cost / lower bound on day k+1")
        ax.set_title(name)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The results page: each task and sharder's rows, the checks, the command and machine."""
    lines = ["# Re-planning after the statistics drift", "",
             "Made by `benchmarks/bench_replan.py` (its docstring says what runs):", "",
             "```bash", meta["command"], "```", "",
             f"Machine: {meta['machine']}; shared with other jobs and busy while this ran (the "
             f"1-minute load average between {min(r['load'] for r in rows):.1f} and "
             f"{max(r['load'] for r in rows):.1f} as the rows were recorded, on "
             f"{os.cpu_count()} cores), so the planning times, and what a time limit lets a "
             f"sharder do, are those of a loaded machine. Time limit {meta['time_limit']:g} s "
             "per plan; analytical cost model; costs on day k+1's statistics over its lower "
             "bound.",
             "", "![cost against bytes copied](replan.png)", ""]
    for name, sharder in sorted({(r["task"], r["sharder"]) for r in rows}):
        mine = [r for r in rows if (r["task"], r["sharder"]) == (name, sharder)]
        lines += [f"## {name}, {sharder}", "",
                  f"Its day-k plan: {mine[0]['day_k_cost_ms']:.4f} ms "
                  f"({mine[0]['day_k_ratio']:.3f} of day k's bound) on day k's statistics.", "",
                  "| plan | step ms | cost / bound | copied | of the bytes | tables moved | "
                  "move s | payback steps | planned in s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            payback = "-" if r["payback_steps"] is None else f"{r['payback_steps']:,.0f}"
            lines.append(f"| {r['name']} | {r['cost_ms']:.4f} | {r['cost_ratio']:.4f} | "
                         f"{r['copied_bytes'] / 2**30:.3f} GiB | {r['copied_share']:.2%} | "
                         f"{r['tables_moved']} | {r['move_s']:.4f} | {payback} | "
                         f"{r['plan_s']:.1f} |")
        lines.append("")
    lines += ["## Checks", "", *(f"- {c}" for c in checks(rows)), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path("results/replan"))
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--tasks", default="generated,criteo1tb")
    parser.add_argument("--sharders", default="recshard,ppo")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "replan.jsonl"
    if args.fresh and log.exists():
        log.unlink()
    rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    makers = {"generated": generated, "criteo1tb": lambda: criteo(args.out)}
    for name in args.tasks.split(","):
        wanted = [s for s in args.sharders.split(",")
                  if not any((r["task"], r["sharder"]) == (name, s) for r in rows)]
        days = makers[name]() if wanted else None
        for sharder in wanted:
            assert days is not None
            began = time.perf_counter()
            found = run(name, days, sharder, args.time_limit)
            with log.open("a") as out:
                out.writelines(json.dumps(r) + "\n" for r in found)
            rows += found
            print(f"{name} / {sharder}: {len(found)} rows in {time.perf_counter() - began:.0f} s",
                  flush=True)
    plot(rows, args.out / "replan.png")
    meta = {"command": ".venv/bin/python benchmarks/bench_replan.py --time-limit "
                       f"{args.time_limit:g} --out {args.out}",
            "machine": describe_machine(), "time_limit": args.time_limit}
    atomic_write_text(args.out / "results.md", markdown(rows, meta))
    atomic_write_text(args.out / "meta.json", json.dumps(meta, indent=1) + "\n")
    for line in checks(rows):
        print(line)


if __name__ == "__main__":
    main()
