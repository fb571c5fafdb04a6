"""Every sharder's plans on the comparison suites under TorchRec's own estimators.

Runs ``autoshard compare --suite S --torchrec --out results/torchrec`` for each suite (every
registered sharder; resumable, rows kept), then summarises ``results/torchrec/*.torchrec.csv``
per suite and sharder: how many plans overfill some rank's HBM under TorchRec's storage
estimate as planned, the fullest rank's fill, how many exported (fitted) plans fit every rank
(checked with TorchRec's EmbeddingStorageEstimator itself, not our mirror of it), and what the
fit costs under our cost model (step cost exported / as planned, geometric mean).

    .venv/bin/python benchmarks/bench_torchrec_storage.py [--suites a,b] [--time-limit 20]
        [--summary-only]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

from autoshard.cli import main as cli
from autoshard.fileio import atomic_write_text
from autoshard.machine import describe_machine
from autoshard.torchrec_compare import OpinionRow, read_opinions

SUITES = ("tiny", "constrained-50x4", "constrained-100x8", "rich-100x8", "infer-100x8",
          "dcnv2-8", "dcnv2-16", "criteo1tb-8")
OUT = Path(__file__).resolve().parents[1] / "results" / "torchrec"


def summary(rows_by_suite: dict[str, list[OpinionRow]]) -> str:
    lines = ["| suite | sharder | plans | overfilled as planned | fullest HBM as planned | "
             "exported plans that fit | our step cost, exported / planned |",
             "|---|---|---|---|---|---|---|"]
    total = fits = failed = 0
    for suite, rows in rows_by_suite.items():
        by_sharder: dict[str, list[OpinionRow]] = defaultdict(list)
        for r in rows:
            by_sharder[r.sharder].append(r)
        for name, rs in by_sharder.items():
            ok = [r for r in rs if r.status == "ok"]
            for r in rs:
                if r.status != "ok":
                    failed += 1
                    lines.append(f"| {suite} | {name} | {r.task} | not exportable: "
                                 f"{r.reason[:90]} | | | |")
            if not ok:
                continue
            ratio = math.exp(sum(math.log(r.exported_ours_ms / r.ours_ms) for r in ok)
                             / len(ok))
            total += len(ok)
            fits += sum(r.exported_fits for r in ok)
            lines.append(f"| {suite} | {name} | {len(ok)} | "
                         f"{sum(r.torchrec_hbm_fill > 1 for r in ok)} | "
                         f"{max(r.torchrec_hbm_fill for r in ok):.3f} | "
                         f"{sum(r.exported_fits for r in ok)} / {len(ok)} | {ratio:.3f} |")
    return "\n".join(lines) + (f"\n\nIn all: {fits} of {total} exported plans fit every rank; "
                                f"{failed} plan(s) could not be exported.\n")


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--summary-only", action="store_true",
                        help="Only summarise the rows already in --out.")
    args = parser.parse_args()
    suites = [s for s in args.suites.split(",") if s]
    for suite in [] if args.summary_only else suites:
        argv = ["compare", "--suite", suite, "--torchrec", "--out", str(args.out),
                "--time-limit", f"{args.time_limit:g}", "--wandb-mode", "disabled"]
        sys.argv = ["autoshard", *argv]  # the command the results files name
        try:
            cli(argv)
        except SystemExit as exc:
            if exc.code:
                raise
    rows = {s: read_opinions(args.out / f"{s}.torchrec.csv") for s in suites}
    text = (f"# Exported plans under TorchRec's storage estimator\n\nCommand: `python "
            f"benchmarks/bench_torchrec_storage.py --suites {','.join(suites)} --time-limit "
            f"{args.time_limit:g}`  \nMachine: {describe_machine()}; torchrec 1.8.0 estimators "
            f"on a simulated topology of the same hardware. Per plan: "
            f"`results/torchrec/SUITE.torchrec.md`.\n\n{summary(rows)}")
    atomic_write_text(args.out / "storage.md", text)
    print(text)


if __name__ == "__main__":
    run()
