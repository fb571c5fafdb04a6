"""The public models' plans under TorchRec's estimators for both of its training pipelines.

TorchRec prices an HBM cache by the pipeline that runs it (:mod:`autoshard.torchrec.estimate`):
without prefetch (its default) a cached lookup runs at a bandwidth blended by the load factor,
whatever the skew; with its prefetch pipeline lookups run at HBM speed and the expected misses
(from the access curves) are fetched ahead. This prices, under both, with TorchRec's storage
estimate for each pipeline and beside our cost model's figure:

- the committed plans of ``split_lookup_greedy`` and ``ppo`` for the public-model
  suites (``results/torchrec/<suite>.plans``, written by
  ``benchmarks/bench_torchrec_storage.py``), made for TorchRec's default pipeline;
- plans made here for each pipeline (the task reserving that pipeline's HBM; ``-prefetch``:
  ``overhead="torchrec-prefetch"``, which the ``torchrec`` sharder also reads as its
  pipeline): TorchRec's planner (``torchrec``, ``torchrec-prefetch``; ``--time-limit``),
  ``recshard`` and ``recshard-prefetch`` for our model, and ``recshard`` planning for our
  model and TorchRec's estimator of that pipeline at once (``recshard+torchrec``,
  ``recshard+torchrec-prefetch``: ``RecShard(also_for="torchrec")``,
  :mod:`autoshard.sharders.recshard_blend`; ``--recshard-time-limit``).

    .venv/bin/python benchmarks/bench_torchrec_pipelines.py [--suites a,b] [--time-limit 60]
        [--recshard-time-limit 60]

Writes ``results/torchrec/pipelines.md`` and ``pipelines.csv``.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from autoshard.compare.suites import get_suite
from autoshard.fileio import atomic_write_text
from autoshard.layout.plan import Plan
from autoshard.machine import describe_machine
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.reservation import get_reservation
from autoshard.sharders.recshard import RecShard
from autoshard.torchrec.estimate import estimate_plan
from autoshard.torchrec.runtime_memory import PIPELINES, pipeline_of
from autoshard.torchrec.sharder import TorchRecSharder

SUITES = ("dcnv2-8", "dcnv2-16", "criteo1tb-8")
COMMITTED = ("split_lookup_greedy", "ppo")
OUT = Path(__file__).resolve().parents[1] / "results" / "torchrec"
FIELDS = ("suite", "task", "sharder", "ours_ms", "none_ms", "none_fits", "none_hbm_fill",
          "prefetch_ms", "prefetch_fits", "prefetch_hbm_fill")
#: The pipelines, and the suffix of the plans made for each.
SUFFIX = {"none": "", "prefetch": "-prefetch"}


def rows_for(suite: str, time_limit: float, recshard_limit: float) -> list[dict[str, Any]]:
    """Every plan of ``suite`` (module docstring) priced under both pipelines."""
    model = AnalyticalCostModel()
    rows = []
    for spec in get_suite(suite):
        task = spec.build()
        plans = {name: Plan.load(OUT / f"{suite}.plans" / spec.name / f"{name}.json")
                 for name in COMMITTED}
        for pipeline, suffix in SUFFIX.items():
            made = replace(task, reservation=get_reservation(f"torchrec{suffix}"))
            assert pipeline_of(made.reservation) == pipeline
            plans[f"torchrec{suffix}"] = TorchRecSharder(time_limit=time_limit).shard(made,
                                                                                     model)
            plans[f"recshard{suffix}"] = RecShard(time_limit=recshard_limit).shard(made, model)
            plans[f"recshard+torchrec{suffix}"] = RecShard(
                time_limit=recshard_limit, also_for="torchrec").shard(made, model)
        for name, plan in plans.items():
            row: dict[str, Any] = {
                "suite": suite, "task": spec.name, "sharder": name,
                "ours_ms": evaluate(plan, task, model).step_cost_ms}
            for pipeline in PIPELINES:
                e = estimate_plan(plan, task, pipeline=pipeline)
                row.update({f"{pipeline}_ms": e.step_ms, f"{pipeline}_fits": e.fits,
                            f"{pipeline}_hbm_fill": e.hbm_fill})
            rows.append(row)
            print(f"{suite} {spec.name} {name}: ours {row['ours_ms']:.3f} ms, TorchRec "
                  f"{row['none_ms']:.3f} / {row['prefetch_ms']:.3f} ms", flush=True)
    return rows


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = ["# TorchRec's estimate of the public models' plans, per training pipeline", "",
             f"Command: `{command}`  ", f"Machine: {describe_machine()}; torchrec 1.8.0 "
             "estimators on a simulated topology of the same hardware", "",
             "`none`: TorchRec's default pipeline (a cached lookup at "
             "(f x HBM + (1 - f) x host link) / 10 for load factor f). `prefetch`: its "
             "prefetch pipeline (lookups at HBM bandwidth plus the expected misses' fetch, "
             "read from the access curves; three input and seven prefetch buffers per cached "
             "shard). Plans named with `-prefetch` were made for `prefetch` (HBM kept for its "
             "buffers), the others for `none`; `split_lookup_greedy` and `ppo` are the "
             "committed plans of `bench_torchrec_storage.py`, the others made here "
             "(`recshard+torchrec`: `RecShard(also_for=\"torchrec\")`, planning for our model "
             "and TorchRec's estimate of that pipeline at once). Fill: the fullest rank's HBM "
             "under that pipeline's storage estimate.", "",
             "| suite | task | sharder | ours ms | TorchRec ms, none | fits | fill | "
             "TorchRec ms, prefetch | fits | fill |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['suite']} | {r['task']} | {r['sharder']} | {r['ours_ms']:.3f} | "
            f"{r['none_ms']:.3f} | {'yes' if r['none_fits'] else 'no'} | "
            f"{r['none_hbm_fill']:.3f} | {r['prefetch_ms']:.3f} | "
            f"{'yes' if r['prefetch_fits'] else 'no'} | {r['prefetch_hbm_fill']:.3f} |")
    lines += ["", "Against `torchrec`, each plan made for the pipeline it is priced in "
              "(ms; TorchRec's figures count only where both fit that pipeline's storage "
              "estimate). `recshard` plans for our model; `recshard+torchrec` for our model "
              "and TorchRec's estimate at once, and is compared under both:", ""]
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = {r["sharder"]: r for r in rows if r["task"] == task}
        for pipeline, suffix in SUFFIX.items():
            theirs = mine[f"torchrec{suffix}"]
            for name in (f"recshard{suffix}", f"recshard+torchrec{suffix}"):
                ours = mine[name]
                a, b = ours[f"{pipeline}_ms"], theirs[f"{pipeline}_ms"]
                fit = ours[f"{pipeline}_fits"] and theirs[f"{pipeline}_fits"]
                verdict = ("at or below" if a <= b and fit else "ABOVE" if fit
                           else "does not fit")
                line = (f"- {task}, {pipeline}: {name} {a:.3f} vs torchrec {b:.3f} under "
                        f"TorchRec's estimate ({verdict})")
                if "+" in name:
                    x, y = ours["ours_ms"], theirs["ours_ms"]
                    line += (f"; {x:.3f} vs {y:.3f} under ours "
                             f"({'at or below' if x <= y else 'ABOVE'})")
                lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="TorchRec's planner, s (as the comparison suites)")
    parser.add_argument("--recshard-time-limit", type=float, default=60.0,
                        help="recshard, s (as the comparison suites)")
    args = parser.parse_args(argv)
    rows = [r for suite in args.suites.split(",")
            for r in rows_for(suite, args.time_limit, args.recshard_time_limit)]
    command = "python benchmarks/bench_torchrec_pipelines.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(OUT / "pipelines.csv", buffer.getvalue())
    atomic_write_text(OUT / "pipelines.md", markdown(rows, command.strip()))


if __name__ == "__main__":
    main()
