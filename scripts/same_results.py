"""Runs comparison suites on an earlier revision and on the working tree, and says whether every
(task, sharder) gives the same step cost and lower bound (to the last digit the CSV keeps).

For checking that a change which should keep behaviour does: deterministic sharders must agree
exactly; a time-limited sharder (``recshard``, ``torchrec``) may differ where its limit, not its
search, stopped it, and the report shows by how much.

Usage:
    .venv/bin/python scripts/same_results.py REV [--suites tiny,dcnv2-8] [--sharders a,b]
        [--time-limit 10] [--out runs/same-results]

REV is checked out in a temporary git worktree (or, when REV is a folder, that checkout is
used) and run with this virtual environment's packages (its own ``autoshard`` first on the
path); nothing in the checkout is changed.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("status", "step_cost_ms", "lower_bound_ms")


def run_suites(tree: Path, out: Path, suites: list[str], sharders: str, time_limit: float
               ) -> None:
    """Runs ``autoshard compare`` from ``tree`` for each suite, into ``out``."""
    env = dict(os.environ, PYTHONPATH=str(tree), WANDB_MODE="disabled")
    for suite in suites:
        cmd = [sys.executable, "-m", "autoshard", "compare", "--suite", suite, "--fresh",
               "--time-limit", str(time_limit), "--out", str(out), "--wandb-mode", "disabled"]
        if sharders:
            cmd += ["--sharders", sharders]
        print(f"[{tree.name}] {' '.join(cmd[2:])}", flush=True)
        subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)


def rows(out: Path, suite: str) -> dict[tuple[str, str], dict[str, str]]:
    with (out / f"{suite}.csv").open(newline="") as fh:
        return {(r["task"], r["sharder"]): {c: r[c] for c in COLUMNS}
                for r in csv.DictReader(fh)}


def compare(before: Path, after: Path, suites: list[str]) -> int:
    """Prints one line per (suite, task, sharder) that differs and a total; returns how many
    differ."""
    differ = same = 0
    for suite in suites:
        old, new = rows(before, suite), rows(after, suite)
        for key in sorted(set(old) & set(new)):
            if old[key] == new[key]:
                same += 1
                continue
            differ += 1
            a, b = old[key], new[key]
            print(f"DIFFERS {suite} {key[0]} {key[1]}: step {a['step_cost_ms']} -> "
                  f"{b['step_cost_ms']}, bound {a['lower_bound_ms']} -> {b['lower_bound_ms']}")
    print(f"{same} (task, sharder) rows identical, {differ} differ")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev")
    parser.add_argument("--suites", default="tiny,constrained-50x4,dcnv2-8,criteo1tb-8")
    parser.add_argument("--sharders", default="")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "same-results")
    args = parser.parse_args()
    suites = [s for s in args.suites.split(",") if s]
    if Path(args.rev).is_dir():
        run_suites(Path(args.rev).resolve(), args.out / "before", suites, args.sharders,
                   args.time_limit)
    else:
        _run_revision(args.rev, args.out / "before", suites, args.sharders, args.time_limit)
    run_suites(ROOT, args.out / "after", suites, args.sharders, args.time_limit)
    sys.exit(1 if compare(args.out / "before", args.out / "after", suites) else 0)


def _run_revision(rev: str, out: Path, suites: list[str], sharders: str, time_limit: float
                  ) -> None:
    """Runs the suites on ``rev``, checked out in a temporary worktree."""
    with tempfile.TemporaryDirectory(prefix="autoshard-rev-") as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
        try:
            run_suites(tree, out, suites, sharders, time_limit)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)


if __name__ == "__main__":
    main()
