"""Every sharder's plans on the comparison suites under TorchRec's own estimators.

Runs ``autoshard compare --suite S --torchrec --out results/torchrec`` for each suite (every
registered sharder; resumable, rows kept), then summarises ``results/torchrec/*.torchrec.csv``
per suite and sharder: how many plans overfill some rank's HBM under TorchRec's storage
estimate as planned, the fullest rank's fill, how many exported (fitted) plans fit every rank
(checked with TorchRec's EmbeddingStorageEstimator itself, not our mirror of it), and what the
fit costs under our cost model (step cost exported / as planned, geometric mean).

    .venv/bin/python benchmarks/bench_torchrec_storage.py [--suites a,b] [--time-limit 20]
        [--summary-only] [--fresh]

Every suite's task reserves in HBM what TorchRec's runtime adds per table or shard
(the ``torchrec`` reservation, :mod:`autoshard.torchrec.runtime_memory`), so "overfilled as
planned" counts plans that overfill TorchRec's count before the export lowers any cache, and
"tables lowered" the tables whose caches the export had to lower.
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
from autoshard.torchrec.opinion import OpinionRow, read_opinions

SUITES = ("tiny", "constrained-50x4", "constrained-100x8", "rich-100x8", "infer-100x8",
          "dcnv2-8", "dcnv2-16", "criteo1tb-8", "constrained-856x128")
OUT = Path(__file__).resolve().parents[1] / "results" / "torchrec"
RESERVED = (
    "What every sharder keeps room for in HBM (the suites' tasks keep the `torchrec` "
    "reservation, `autoshard/torchrec/runtime_memory.py`): in training, per table or shard "
    "wherever it lives, TorchRec's "
    "input and output buffers (8 B per input id it receives, 4 B per pooled output element, "
    "global batch), 4 B of cache index per row, and one row plus 64 B for TorchRec's "
    "rounding; per row kept in HBM, its weights, the larger of our and TorchRec's optimizer "
    "state, and 16 B of cache state. In inference, one row plus 64 B per table or shard. "
    "Split tables keep one share of rows in HBM on all their shards (TorchRec's one cache "
    "load factor per table).")


def summary(rows_by_suite: dict[str, list[OpinionRow]]) -> str:
    lines = ["| suite | sharder | plans | overfilled as planned | fullest HBM as planned | "
             "tables lowered at export | exported plans that fit | "
             "our step cost, exported / planned |",
             "|---|---|---|---|---|---|---|---|"]
    total = fits = failed = over = lowered = 0
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
            over += sum(r.torchrec_hbm_fill > 1 for r in ok)
            lowered += sum(r.fitted_tables for r in ok)
            lines.append(f"| {suite} | {name} | {len(ok)} | "
                         f"{sum(r.torchrec_hbm_fill > 1 for r in ok)} | "
                         f"{max(r.torchrec_hbm_fill for r in ok):.3f} | "
                         f"{sum(r.fitted_tables for r in ok)} | "
                         f"{sum(r.exported_fits for r in ok)} / {len(ok)} | {ratio:.3f} |")
    return "\n".join(lines) + (
        f"\n\nIn all: {fits} of {total} exported plans fit every rank, {over} overfilled "
        f"some rank as planned, {lowered} table(s) had their caches lowered at export; "
        f"{failed} plan(s) could not be exported.\n")


def _drop(out: Path, suite: str) -> None:
    """Removes a suite's opinion rows and saved plans from ``out``."""
    import shutil

    (out / f"{suite}.torchrec.csv").unlink(missing_ok=True)
    shutil.rmtree(out / f"{suite}.plans", ignore_errors=True)


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--summary-only", action="store_true",
                        help="Only summarise the rows already in --out.")
    parser.add_argument("--fresh", action="store_true",
                        help="Replan every suite's tasks instead of resuming (drops their rows "
                             "and saved plans first).")
    args = parser.parse_args()
    suites = [s for s in args.suites.split(",") if s]
    for suite in [] if args.summary_only else suites:
        argv = ["compare", "--suite", suite, "--torchrec", "--out", str(args.out),
                "--time-limit", f"{args.time_limit:g}", "--wandb-mode", "disabled"]
        if args.fresh:
            _drop(args.out, suite)
            argv.append("--fresh")
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
            f"`results/torchrec/SUITE.torchrec.md`.\n\n{RESERVED}\n\n{summary(rows)}")
    atomic_write_text(args.out / "storage.md", text)
    print(text)


if __name__ == "__main__":
    run()
