"""TorchRec's planner from its default cache load factor (0.2) against the `torchrec` sharder's
start from a cache that fits, under TorchRec's own perf estimate.

For each task both plan with every sharding type and TorchRec's cache search; the table gives
TorchRec's rating of its plan (its perf estimate of the slowest rank, ms), the starting load
factor, how many tables it keeps wholly in host memory (``fused_uvm``) and the time to plan.
Written to results/torchrec/cache_start.md.

    .venv/bin/python benchmarks/bench_torchrec_cache_start.py [--suites a,b]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from autoshard.compare.suites import get_suite
from autoshard.fileio import atomic_write_text
from autoshard.machine import describe_machine
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.torchrec.sharder import TorchRecSharder

SUITES = ("constrained-50x4", "constrained-100x8", "dcnv2-8", "dcnv2-16", "criteo1tb-8")
OUT = Path(__file__).resolve().parents[1] / "results" / "torchrec" / "cache_start.md"


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SUITES))
    args = parser.parse_args()
    lines = ["| task | start | load factor | TorchRec rating ms | tables wholly in host memory | "
             "plan s |", "|---|---|---|---|---|---|"]
    ratios = []
    for suite in args.suites.split(","):
        spec = get_suite(suite)[0]
        task = spec.build()
        rating = {}
        for label, clf in (("TorchRec default", 0.2), ("fitting, or 0.2 if rated better", None)):
            sharder = TorchRecSharder(cache_load_factor=clf)
            start = time.perf_counter()
            run = sharder.solve(task, AnalyticalCostModel()).details
            seconds = time.perf_counter() - start
            module_plan = run.sharding_plan.get_plan_for_module("")
            host = sum(ps.compute_kernel == "fused_uvm" for ps in module_plan.values())
            rating[label] = run.rated_ms()
            lines.append(f"| {spec.name} | {label} | {run.cache_load_factor:.3f} | "
                         f"{rating[label]:.2f} | {host} | {seconds:.1f} |")
            print(lines[-1], flush=True)
        ratios.append(rating["TorchRec default"] / rating["fitting, or 0.2 if rated better"])
    text = (f"# TorchRec's planner: default cache start against a fitting one\n\nCommand: "
            f"`python benchmarks/bench_torchrec_cache_start.py --suites {args.suites}`  \n"
            f"Machine: {describe_machine()}; torchrec 1.8.0, every sharding type, its cache "
            f"search on.\n\n" + "\n".join(lines) + "\n\nTorchRec's rating, default start / "
            "fitting start: " + ", ".join(f"{r:.2f}x" for r in ratios) + "\n")
    atomic_write_text(OUT, text)
    print(text)


if __name__ == "__main__":
    run()
