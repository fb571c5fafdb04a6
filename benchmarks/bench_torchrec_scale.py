"""The `torchrec` sharder on large tasks: options TorchRec enumerates and time to plan.

Per task: the tables offered the split sharding types (all of them up to
``FULL_STRENGTH_CELLS`` tables x devices, else the dominant ones), the sharding options and
shards TorchRec enumerates at its default cache load factor, the wall time of a whole plan under
``--time-limit`` and what the sharder said when the limit cut its search. Written to
results/torchrec/scale.md.

    .venv/bin/python benchmarks/bench_torchrec_scale.py [--suites a,b] [--time-limit 60]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from autoshard.compare.suites import get_suite
from autoshard.fileio import atomic_write_text
from autoshard.machine import describe_machine
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.torchrec.sharder import FULL_STRENGTH_CELLS, TorchRecSharder

SUITES = ("dcnv2-16", "constrained-856x128")
OUT = Path(__file__).resolve().parents[1] / "results" / "torchrec" / "scale.md"


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    model = AnalyticalCostModel()
    lines = ["| task | tables x devices | tables offered splits | options | shards | "
             "enumerate s | plan s | split tables in plan | notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for suite in args.suites.split(","):
        spec = get_suite(suite)[0]
        task = spec.build()
        sharder = TorchRecSharder(time_limit=args.time_limit)
        start = time.perf_counter()
        options = sharder.search_space(task, model)
        enumerate_s = time.perf_counter() - start
        offered = len({o.name for o in options if o.sharding_type != "table_wise"})
        start = time.perf_counter()
        sharded = sharder.solve(task, model)
        plan_s = time.perf_counter() - start
        plan = sharded.plan
        split = sum(p.is_split for p in plan.placements)
        lines.append(f"| {spec.name} | {task.num_tables} x {task.num_devices} | {offered} | "
                     f"{len(options)} | {sum(len(o.shards) for o in options)} | "
                     f"{enumerate_s:.1f} | {plan_s:.1f} | {split} | "
                     f"{'; '.join(sharded.notes) or '-'} |")
        print(lines[-1], flush=True)
    text = (f"# The `torchrec` sharder on large tasks\n\nCommand: `python "
            f"benchmarks/bench_torchrec_scale.py --suites {args.suites} --time-limit "
            f"{args.time_limit:g}`  \nMachine: {describe_machine()}; torchrec 1.8.0. Tasks of "
            f"more than {FULL_STRENGTH_CELLS} tables x devices offer the split sharding types "
            f"to dominant tables only; `options` and `shards` are what TorchRec enumerates "
            f"at its default cache load factor; `plan s` is the whole `shard` call.\n\n"
            + "\n".join(lines) + "\n")
    atomic_write_text(OUT, text)
    print(text)


if __name__ == "__main__":
    run()
