"""The `ppo` sharder per held-out family against the greedy sharders and `recshard`, and its
speed.

Families (none seen in training, which draws the ``train`` family of
:mod:`autoshard.envs.families`):

- ``test``: the held-out domain-randomised family (mixed and profiled tables), 50 and 200
  tables on 4, 16 and 64 devices (64 is beyond the 16 device slots of training);
- ``pool``: tables of the suites' generated 856-table pool (never in training), 50/100/200
  tables on 4, 8 and 16 devices;
- ``profiled``: ``autoshard demo``'s task (100 tables profiled from an 8,192-sample synthetic
  trace, 8 devices, HBM 30% of the bytes, batch 65,536) for seeds 0 (the demo's own), 1, 2;
- ``public``: the 26 tables of DLRM on Criteo 1TB (one-hot) and of DLRM-DCNv2 (multi-hot),
  :mod:`autoshard.public_models` (five of 40 M rows; Zipf 1.05 assumed), on 4, 8 and 16
  devices.

Every task's HBM holds 30% of its tables' bytes. Per family: mean step cost / lower bound of
``ppo`` (its default: greedy decode and the greedy sharders' plans, the decodes over whole
tables, over the shards of the dominant tables, and one in which the policy chooses which
dominant tables to split (``ppo-choice-greedy``), no sampled rollout, the cheapest then
polished by :mod:`autoshard.search.polish`, re-split and kicked where tables dominate, and
re-solved by groups of devices on tasks of up to 20,000 pairs), of ``ppo`` without that
improvement stage
(``polish=False``), of the policy alone (``samples=0, candidates=False, polish=False``: its
greedy decodes, whole and split, each keeping the policy's devices with its HBM water-filled per
device), of the best greedy
sharder per task (of the five, ``split_lookup_greedy`` included), of ``recshard`` (which may
split dominant tables) and of ``recshard`` kept table-wise (``split=False``); ``ppo`` and the
policy alone against the best greedy per task (worst case and share of tasks at or below),
against both ``recshard`` (mean of per-task ratios; the worst against ``recshard``), which
candidate won, and the mean time to plan.

Every sharder (``ppo`` in each form too) plans under the same ``--time-limit``.

Speed (process CPU time, pinned to one core): ``ppo`` (default and policy alone) planning 856
tables on 128 devices, and ``ppo`` against ``recshard`` on the ``constrained-200x8`` suite at
the same ``--time-limit``.

Usage: ``python benchmarks/bench_ppo.py [--time-limit 10] [--samples K] [--out results/ppo]
[--policy FOLDER]`` (``--samples K``: ``ppo`` and ``ppo`` without polish with K sampled
rollouts; ``--policy``: another policy than the committed one).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from autoshard.compare.harness import COLUMNS, CompareRow, FixedTask, run_one
from autoshard.compare.suites import get_suite
from autoshard.fileio import atomic_write_text, csv_text
from autoshard.machine import describe_machine
from autoshard.planning import plan
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.public_models import MODEL_TABLES, model_tables
from autoshard.reservation import get_reservation
from autoshard.sharders import common_options, get_sharder
from autoshard.sharders.ppo import PPOSharder
from autoshard.sharders.ppo.candidates import CANDIDATES
from autoshard.tables import Table
from autoshard.task import ShardingTask
from autoshard.training.evaluation import BENCH_SEED, eval_tasks
from autoshard.training.plots import comparison
from autoshard.workloads import POOL_SIZE, constrained_task, default_pools, dlrm_tables

MODEL = AnalyticalCostModel()
#: recshard restricted to table-wise plans.
TABLEWISE = "recshard (table-wise)"
#: ppo without its improvement stage.
PLAIN = "ppo (without polish)"
FRACTION = 0.3


#: The policy folder the ``ppo`` sharders read (None: the committed one); ``--policy``.
POLICY: dict[str, str] = {}


def ppo(**options: object) -> PPOSharder:
    """The ``ppo`` sharder with ``options``, on the benchmark's policy."""
    sharder = get_sharder("ppo", **POLICY, **options)
    assert isinstance(sharder, PPOSharder)
    return sharder


def policy_alone(**options: object) -> PPOSharder:
    """The policy alone (the ``ppo-policy`` sharder): its greedy decodes, nothing else."""
    sharder = get_sharder("ppo-policy", **POLICY, samples=0, **options)
    assert isinstance(sharder, PPOSharder)
    return sharder


@dataclass(frozen=True)
class Item:
    family: str
    name: str
    task: ShardingTask


def families(quick: bool, overhead: str = "none") -> list[Item]:
    """The held-out tasks of every family (fewer with ``quick``), each reserving ``overhead``
    in HBM (``torchrec``: TorchRec's buffers, with the row splits its runtime routes, as the
    CLI plans by default)."""
    items = [replace(item, task=replace(item.task, reservation=get_reservation(overhead)))
             for item in _families(quick)]
    plannable = [_plannable(i.task) for i in items]
    DROPPED[:] = [i.name for i, ok in zip(items, plannable, strict=True) if not ok]
    return [i for i, ok in zip(items, plannable, strict=True) if ok]


#: Tasks left out because some table's reserved HBM alone exceeds every device's HBM.
DROPPED: list[str] = []


def _plannable(task: ShardingTask) -> bool:
    """Whether every table's HBM reservation fits some device's HBM (with TorchRec's buffers
    kept, a small HBM share of many devices may not hold a big-pooling table's buffers)."""
    reserved = task.table_arrays.hbm_reserved_bytes
    return bool((reserved <= task.device_arrays.hbm_capacity.max()).all())


def _families(quick: bool) -> list[Item]:
    items = [Item("test", t.name, t.task) for t in eval_tasks(
        (50, 200), (4, 16) if quick else (4, 16, 64), FRACTION, repeats=2, family="test",
        seed=BENCH_SEED, styles=("mixed", "profiled"))]
    _, test = default_pools()
    rng = np.random.default_rng(BENCH_SEED)
    for count in (50, 100, 200):
        for devices in (4, 8, 16):
            idx = np.sort(rng.choice(len(test), size=count, replace=False))
            task = constrained_task([test[i] for i in idx], devices, FRACTION)
            items.append(Item("pool", f"pool-{count}x{devices}", task))
    for seed in (0,) if quick else (0, 1, 2):
        task = constrained_task(profiled_demo_tables(seed), 8, FRACTION)
        items.append(Item("profiled", f"demo-100x8-s{seed}", task))
    for model in MODEL_TABLES:
        for devices in (4, 8, 16):
            task = constrained_task(model_tables(model), devices, FRACTION)
            items.append(Item("public", f"{model}-26x{devices}", task))
    return items


def profiled_demo_tables(seed: int, count: int = 100, samples: int = 8192) -> list[Table]:
    """The tables ``autoshard demo --seed SEED`` profiles (same generator, trace and profiler)."""
    from autoshard.stats.table_stats import profile_table
    from autoshard.synth import draw_tables, iter_lookups

    specs = draw_tables(count, seed)
    out = []
    for spec, (idx, lengths) in zip(specs, iter_lookups(specs, samples, seed), strict=True):
        profile = profile_table(spec.name, idx, lengths, spec.rows)
        out.append(profile.to_table(spec.dim) if profile.lookups else spec.to_table())
    return out


def run(items: list[Item], time_limit: float, samples: int | None = None
        ) -> tuple[list[CompareRow], list[dict]]:
    """Every item with ppo (``samples`` sampled rollouts; None: its default), ppo without
    polish, the policy alone, the greedy sharders and recshard."""
    limit = {"time_limit": time_limit}  # every sharder at the same limit
    main, plain = ppo(samples=samples, **limit), ppo(samples=samples, polish=False, **limit)
    alone = policy_alone(**limit)
    rows, choices = [], []
    for item in items:
        fixed = FixedTask(item.name, item.task)
        for label, sharder in (("ppo", main), (PLAIN, plain), ("ppo (policy alone)", alone)):
            assert isinstance(sharder, PPOSharder)
            planned = plan(item.task, sharder, MODEL)
            report = planned.report
            rows.append(CompareRow(item.family, item.name, item.task.num_tables,
                                   item.task.num_devices, item.task.workload.mode, label, "ok",
                                   step_cost_ms=report.step_cost_ms,
                                   lower_bound_ms=report.lower_bound_ms,
                                   cost_ratio=report.cost_ratio,
                                   load_balance=report.load_balance,
                                   uvm_lookup_share=report.uvm_lookup_share,
                                   plan_seconds=planned.seconds, cost_model=MODEL.name))
            choices.append({"family": item.family, "task": item.name,
                            "sharder": label, "winner": planned.details.winner})
        common = {"time_limit": time_limit, "seed": 0}
        for name in (*CANDIDATES, "recshard"):
            rows.append(run_one(item.family, fixed, item.task, name, MODEL, None,
                                common_options(name, common))[0])
        tablewise = run_one(item.family, fixed, item.task, "recshard", MODEL, None,
                            {**common_options("recshard", common), "split": False})[0]
        rows.append(replace(tablewise, sharder=TABLEWISE))
    return rows, choices


def summary(rows: list[CompareRow], choices: list[dict]) -> list[str]:
    """Per family: the must-show figures (see the module docstring)."""
    by: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for r in rows:
        by[r.suite, r.task][r.sharder] = r.cost_ratio if r.status == "ok" else np.inf
    seconds: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        seconds[r.suite, r.sharder].append(r.plan_seconds)
    lines = ["| family | tasks | ppo | ppo without polish | policy alone | best greedy | "
             "recshard | recshard table-wise | ppo / best greedy (worst) | policy alone <= best "
             "greedy | ppo / recshard (worst) | ppo without polish / recshard (worst) | policy "
             "alone / recshard | ppo / recshard table-wise | ppo won by | policy alone won by | "
             "ppo s | ppo without polish s | recshard s |",
             "| --- |" + " ---: |" * 13 + " --- | --- | ---: | ---: | ---: |"]
    for family in dict.fromkeys(r.suite for r in rows):
        tasks = [v for (f, _), v in by.items() if f == family]
        best = np.array([min(v[g] for g in CANDIDATES) for v in tasks])
        ppo = np.array([v["ppo"] for v in tasks])
        plain = np.array([v[PLAIN] for v in tasks])
        own = np.array([v["ppo (policy alone)"] for v in tasks])
        rec = np.array([v["recshard"] for v in tasks])
        flat = np.array([v[TABLEWISE] for v in tasks])
        won = Counter(c["winner"] for c in choices
                      if c["family"] == family and c["sharder"] == "ppo")
        alone_won = Counter(c["winner"] for c in choices
                            if c["family"] == family and c["sharder"] == "ppo (policy alone)")
        lines.append(
            f"| {family} | {len(tasks)} | {ppo.mean():.3f} | {plain.mean():.3f} | "
            f"{own.mean():.3f} | {best.mean():.3f} | {rec.mean():.3f} | {flat.mean():.3f} | "
            f"{np.max(ppo / best):.3f} | {np.mean(own <= best * (1 + 1e-9)):.0%} | "
            f"{np.mean(ppo / rec):.3f} ({np.max(ppo / rec):.3f}) | "
            f"{np.mean(plain / rec):.3f} ({np.max(plain / rec):.3f}) | "
            f"{np.mean(own / rec):.3f} | {np.mean(ppo / flat):.3f} | "
            + ", ".join(f"{k} {v}" for k, v in won.most_common()) + " | "
            + ", ".join(f"{k} {v}" for k, v in alone_won.most_common()) + " | "
            f"{np.mean(seconds[family, 'ppo']):.3f} | {np.mean(seconds[family, PLAIN]):.3f} | "
            f"{np.mean(seconds[family, 'recshard']):.2f} |")
    return lines


def cpu_seconds(fn: object, repeats: int = 3) -> float:
    """Median process CPU seconds of ``fn()`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()  # type: ignore[operator]
        times.append(time.process_time() - start)
    return float(np.median(times))


def speed(time_limit: float, samples: int | None = None) -> dict[str, float]:
    """CPU seconds: ppo at 856 x 128, and ppo vs recshard on the 200-table suite."""
    big = constrained_task(dlrm_tables(POOL_SIZE, seed=0), 128, hbm_fraction=0.5)
    limit = {"time_limit": time_limit}  # every sharder at the same limit
    main, plain = ppo(samples=samples, **limit), ppo(samples=samples, polish=False, **limit)
    alone = policy_alone(**limit)
    recshard = get_sharder("recshard", time_limit=time_limit)
    main.shard(big, MODEL)  # warm-up
    out = {f"ppo, {POOL_SIZE} x 128": cpu_seconds(lambda: main.shard(big, MODEL)),
           f"ppo without polish, {POOL_SIZE} x 128": cpu_seconds(lambda: plain.shard(big, MODEL)),
           f"policy alone, {POOL_SIZE} x 128": cpu_seconds(lambda: alone.shard(big, MODEL))}
    suite = [spec.build() for spec in get_suite("constrained-200x8")]
    out["ppo, constrained-200x8 (mean)"] = float(np.mean(
        [cpu_seconds(lambda t=t: main.shard(t, MODEL), 1) for t in suite]))
    out["ppo without polish, constrained-200x8 (mean)"] = float(np.mean(
        [cpu_seconds(lambda t=t: plain.shard(t, MODEL), 1) for t in suite]))
    out["recshard, constrained-200x8 (mean)"] = float(np.mean(
        [cpu_seconds(lambda t=t: recshard.shard(t, MODEL), 1) for t in suite]))
    return out


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run."""
    return (".venv/bin/python benchmarks/bench_ppo.py --time-limit " + f"{args.time_limit:g}"
            + (" --quick" if args.quick else "")
            + (f" --samples {args.samples}" if args.samples is not None else "")
            + (f" --policy {args.policy}" if args.policy is not None else "")
            + (f" --overhead {args.overhead}" if args.overhead != "none" else "")
            + (f" --out {args.out}" if args.out != Path("results/ppo") else ""))


def _header(command: str, overhead: str) -> list[str]:
    """The report's title and the description of its columns."""
    lines = ["# ppo on held-out families", "",
             f"Machine: {describe_machine()}, one core. Command: `{command}`.", "",
             "Step cost / lower bound (1.000 = provably optimal), mean per family; the "
             "cluster's HBM holds 30% of the tables' bytes (8xH100-80GB links and "
             "bandwidths, batch 65,536, train mode), with HBM reserved per table or shard: "
             f"`{overhead}`" + (" (TorchRec's buffers; row splits one shard per device, as "
             "the CLI plans by default)" if overhead == "torchrec" else "")
             + (f"; left out, as a table's reserved HBM alone exceeds every device's HBM: "
                f"{', '.join(DROPPED)}" if DROPPED else "")
             + ". `ppo` is the sharder as registered (best of its greedy decode and the "
             "greedy sharders' plans, no sampled rollout, each decode "
             "over whole tables and, where tables dominate, over the shards of the project's "
             "split choice, and one where the policy itself chooses which dominant tables to "
             "split (`ppo-choice-greedy`); each decode is also played in the two refill modes "
             "the policy was not trained in, `-refill` and `-level`, "
             "`autoshard/policy/refill.py`; on tasks that keep HBM room per table each is "
             "also played by the tuned policy, `-tuned`, `autoshard/data/ppo_policy_tuned`; "
             "each decode keeps the devices the policy chose, its "
             "HBM water-filled per device over the items placed there; the cheapest candidate, "
             "and the cheapest of each split choice, then go through the improvement stage, "
             "`autoshard/search/polish.py`, winning as `<candidate>+polish` where that "
             "lowers their cost; where tables dominate, the two cheapest candidates of "
             "distinct decodes then have their heaviest tables split again, "
             "`autoshard/search/resplit.py`, `+resplit`, and are kicked, "
             "`autoshard/search/kick.py`, `+kick`; on tasks of up to 20,000 table-device "
             "pairs the winner then goes through `recshard`'s group re-solve, "
             "`autoshard/search/lns.py`, `+lns`); `ppo without polish` is the "
             "same without that stage; `policy "
             "alone` is the learned policy's own greedy decodes (whole tables and shards, in "
             "the three refill modes, each with its HBM water-filled, the cheapest). Per-task "
             "rows: `eval.csv`.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0,
                        help="recshard's time limit (s), in the families and the speed test")
    parser.add_argument("--quick", action="store_true", help="fewer tasks (a smoke run)")
    parser.add_argument("--samples", type=int, default=None,
                        help="ppo's sampled rollouts (default: the sharder's own default)")
    parser.add_argument("--out", type=Path, default=Path("results/ppo"))
    parser.add_argument("--overhead", choices=("none", "torchrec"), default="none",
                        help="HBM the families' tasks reserve (torchrec: as the CLI's default)")
    parser.add_argument("--policy", type=Path, default=None,
                        help="policy folder (default: the committed autoshard/data/ppo_policy)")
    args = parser.parse_args()
    if args.policy is not None:
        POLICY["policy"] = str(args.policy)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    rows, choices = run(families(args.quick, args.overhead), args.time_limit, args.samples)
    seconds = speed(args.time_limit, args.samples)
    ratio = (seconds["recshard, constrained-200x8 (mean)"]
             / seconds["ppo, constrained-200x8 (mean)"])
    command = _command(args)
    lines = _header(command, args.overhead) + summary(rows, choices)
    lines += ["", "## Planning time (process CPU seconds, one core)", "",
              "| what | seconds |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.3f} |" for k, v in seconds.items()]
    lines += ["", f"recshard / ppo on constrained-200x8 at --time-limit {args.time_limit:g}: "
              f"{ratio:.1f}x."]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "eval.md", "\n".join(lines) + "\n")
    atomic_write_text(args.out / "eval.csv", csv_text((asdict(r) for r in rows), COLUMNS))
    atomic_write_text(args.out / "speed.json", json.dumps(
        {"seconds": seconds, "recshard_over_ppo_200x8": ratio, "choices": choices,
         "machine": describe_machine(), "command": command}, indent=2) + "\n")
    comparison(rows, args.out / "comparison.png", "held-out tasks: step cost / lower bound")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
