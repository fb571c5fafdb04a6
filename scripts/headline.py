"""Prints README's headline tables from the committed comparison results (results/compare/*.csv):
the pool suites, then the published-model suites (step cost in ms and cost / bound per task).

Usage: .venv/bin/python scripts/headline.py [results/compare]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from autoshard.compare.harness import read_rows
from autoshard.compare.report import summarize

SUITES = ("constrained-50x4", "constrained-100x8", "constrained-200x8", "constrained-856x128",
          "rich-100x8", "infer-100x8")
SHARDERS = ("random", "size_greedy", "lookup_greedy", "size_lookup_greedy", "torchrec",
            "recshard", "ppo")
MODEL_SUITES = ("dcnv2-8", "dcnv2-16", "criteo1tb-8")
MODEL_SHARDERS = ("random", "lookup_greedy", "split_lookup_greedy", "torchrec", "recshard",
                  "ppo")


def cell(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def main(folder: Path) -> None:
    head = "| suite | " + " | ".join(SHARDERS) + " |"
    print("Step cost / lower bound, mean over the suite's tasks (1.000 = provably optimal):\n")
    print(head)
    print("|---" * (len(SHARDERS) + 1) + "|")
    times = []
    for suite in SUITES:
        path = folder / f"{suite}.csv"
        if not path.is_file():
            continue
        summaries = {s.sharder: s for s in summarize(read_rows(path))}
        ratio = [cell(summaries[n].mean_cost_ratio, ".3f") if n in summaries else "-"
                 for n in SHARDERS]
        seconds = [cell(summaries[n].plan_seconds, ".3g") if n in summaries else "-"
                   for n in SHARDERS]
        print(f"| {suite} | " + " | ".join(ratio) + " |")
        times.append(f"| {suite} | " + " | ".join(seconds) + " |")
    print("\nTime to plan, seconds (mean per task):\n")
    print(head)
    print("|---" * (len(SHARDERS) + 1) + "|")
    print("\n".join(times))
    models(folder)


def models(folder: Path) -> None:
    """Step cost, ms (and cost / lower bound) of each sharder on the published-model suites."""
    print("\nPublished-model suites: step cost ms (cost / lower bound), one task each:\n")
    print("| suite | " + " | ".join(MODEL_SHARDERS) + " |")
    print("|---" * (len(MODEL_SHARDERS) + 1) + "|")
    for suite in MODEL_SUITES:
        path = folder / f"{suite}.csv"
        if not path.is_file():
            continue
        rows = {r.sharder: r for r in read_rows(path) if r.status == "ok"}
        cells = [f"{rows[n].step_cost_ms:.3f} ({rows[n].cost_ratio:.2f})" if n in rows else "-"
                 for n in MODEL_SHARDERS]
        print(f"| {suite} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("results/compare"))
