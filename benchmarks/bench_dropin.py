"""AutoshardPlanner as a drop-in for TorchRec's planner on a model of many collections.

A model of ``--ebcs`` EmbeddingBagCollections holding ``--tables`` tables (one or two features
each, 10^4 to 2 x 10^7 rows, dims 32 to 256, a pooling factor of 1 to 30 per feature given as
``ParameterConstraints``), built on the meta device, on 2 nodes of 8 GPUs whose HBM
(``--hbm-gib`` each) holds a small share of the tables. Both planners run with their defaults:

- ``AutoshardPlanner(topology, constraints=...)``: ``recshard``, 60 s limit, TorchRec's default
  storage reservation (``HeuristicalStorageReservation(percentage=0.15)``);
- TorchRec's ``EmbeddingShardingPlanner(topology, constraints=...)``, in a child process that
  is stopped after ``--torchrec-cap-s`` (its time is then reported as more than that).

Each plan is rated as TorchRec's planner rates its own
(:func:`autoshard.torchrec.planner_stats.stats_of`: TorchRec's enumerator and estimators on the
model, every rank's shards against what a fresh ``HeuristicalStorageReservation(0.15)``
leaves it). The report, with AutoshardPlanner's statistics table, goes to
results/torchrec/dropin/.

    .venv/bin/python benchmarks/bench_dropin.py [--ebcs 300] [--tables 330] [--hbm-gib 8]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autoshard.fileio import atomic_write_text
from autoshard.machine import describe_machine

OUT = Path(__file__).resolve().parents[1] / "results" / "torchrec" / "dropin"
_ROWS = (4.0, 7.3)  # log10 of the rows' range
_DIMS = (32, 64, 128, 256)


def build_model(ebcs: int, tables: int, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """The model (meta device) and its tables' ``ParameterConstraints`` (pooling factors)."""
    import numpy as np
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.planner import ParameterConstraints

    rng = np.random.default_rng(seed)
    model, constraints = torch.nn.Module(), {}
    for e, names in enumerate(np.array_split(np.arange(tables), ebcs)):
        configs = []
        for i in names:
            features = [f"f{i}_{j}" for j in range(int(rng.integers(1, 3)))]
            constraints[f"t{i}"] = ParameterConstraints(
                pooling_factors=[float(rng.uniform(1, 30)) for _ in features])
            configs.append(EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=int(rng.choice(_DIMS)),
                num_embeddings=int(10 ** rng.uniform(*_ROWS)), feature_names=features))
        model.add_module(f"ebc{e}", EmbeddingBagCollection(tables=configs,
                                                           device=torch.device("meta")))
    return model, constraints


def topology(hbm_gib: float) -> Any:
    """2 nodes of 8 GPUs, ``hbm_gib`` of HBM each (TorchRec's other defaults)."""
    from torchrec.distributed.planner import Topology

    return Topology(world_size=16, local_world_size=8, compute_device="cuda",
                    hbm_cap=int(hbm_gib * 2**30))


def rated(plan: Any, model: Any, constraints: dict[str, Any], hbm_gib: float, by: str,
          seconds: float) -> Any:
    """The plan's statistics under a fresh ``HeuristicalStorageReservation(0.15)``."""
    from torchrec.distributed.planner.storage_reservations import (
        HeuristicalStorageReservation,
    )
    from torchrec.distributed.sharding_plan import get_default_sharders

    from autoshard.torchrec.planner_stats import stats_of

    return stats_of(plan, model, get_default_sharders(), topology(hbm_gib),
                    constraints=constraints,
                    storage_reservation=HeuristicalStorageReservation(percentage=0.15),
                    planned_by=by, seconds=seconds)


def summary(stats: Any) -> dict[str, Any]:
    fullest = max(stats.ranks, key=lambda r: r.hbm_bytes / max(r.hbm_left_bytes, 1))
    return {"seconds": stats.seconds, "step_ms": stats.step_ms, "fits": stats.fits,
            "ranks_over": sum(not r.fits for r in stats.ranks),
            "fullest_hbm_gib": fullest.hbm_bytes / 2**30,
            "left_hbm_gib": fullest.hbm_left_bytes / 2**30}


def run_ours(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """AutoshardPlanner with its defaults: the summary and its statistics table."""
    from torchrec.distributed.sharding_plan import get_default_sharders

    from autoshard.torchrec.autoshard_planner import AutoshardPlanner

    model, constraints = build_model(args.ebcs, args.tables)
    began = time.perf_counter()
    planner = AutoshardPlanner(topology(args.hbm_gib), constraints=constraints)
    plan = planner.plan(model, get_default_sharders())
    seconds = time.perf_counter() - began
    assert planner.plan_stats is not None
    table = planner.plan_stats.render(debug=True)
    return summary(rated(plan, model, constraints, args.hbm_gib, "AutoshardPlanner",
                         seconds)), table


def torchrec_child(args: argparse.Namespace) -> None:
    """TorchRec's planner with its defaults; its summary as one JSON line on stdout."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.sharding_plan import get_default_sharders

    model, constraints = build_model(args.ebcs, args.tables)
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    began = time.perf_counter()
    planner = EmbeddingShardingPlanner(topology(args.hbm_gib), constraints=constraints)
    plan = planner.plan(model, get_default_sharders())
    seconds = time.perf_counter() - began
    print(json.dumps(summary(rated(plan, model, constraints, args.hbm_gib,
                                   "EmbeddingShardingPlanner", seconds))), flush=True)


def run_torchrec(args: argparse.Namespace) -> dict[str, Any] | None:
    """TorchRec's planner in a child process (None: stopped at the cap)."""
    command = [sys.executable, __file__, "--torchrec-child", "--ebcs", str(args.ebcs),
               "--tables", str(args.tables), "--hbm-gib", str(args.hbm_gib)]
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=args.torchrec_cap_s)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"TorchRec's planner failed: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def report(args: argparse.Namespace, ours: dict[str, Any], theirs: dict[str, Any] | None,
           loads: tuple[float, float]) -> str:
    """The report in markdown."""
    lines = ["| planner | plan s | TorchRec's rating, ms (slowest rank) | every rank fits | "
             "fullest rank's HBM, GiB (of left) |", "|---|---|---|---|---|"]
    for name, s in (("AutoshardPlanner", ours), ("EmbeddingShardingPlanner", theirs)):
        if s is None:
            lines.append(f"| {name} | more than {args.torchrec_cap_s:g} (stopped: the child "
                         f"process's whole run, imports included) | - | - | - |")
            continue
        fits = "yes" if s["fits"] else f"no ({s['ranks_over']} ranks over)"
        lines.append(f"| {name} | {s['seconds']:.1f} | {s['step_ms']:.3f} | {fits} | "
                     f"{s['fullest_hbm_gib']:.3f} ({s['left_hbm_gib']:.3f}) |")
    ratio = ("" if theirs is None else
             f"\nTorchRec's planner took {theirs['seconds'] / ours['seconds']:.1f}x as long; "
             f"TorchRec's rating of AutoshardPlanner's plan is "
             f"{ours['step_ms'] / theirs['step_ms']:.3f}x its rating of its own (above 1: "
             f"TorchRec rates its own faster).\n")
    return (f"# AutoshardPlanner as a drop-in for TorchRec's planner\n\n"
            f"Command: `python benchmarks/bench_dropin.py --ebcs {args.ebcs} --tables "
            f"{args.tables} --hbm-gib {args.hbm_gib:g} --torchrec-cap-s "
            f"{args.torchrec_cap_s:g}`  \nMachine: {describe_machine()}, torchrec 1.8.0 (CPU "
            f"build; the topology is simulated). The machine is shared and was busy: load "
            f"average (1 min) {loads[0]:.1f} at the start, {loads[1]:.1f} at the end, so the "
            f"times are wall times under load.\n\n"
            f"Model: {args.tables} tables in {args.ebcs} EmbeddingBagCollections on the meta "
            f"device; 2 nodes x 8 GPUs of {args.hbm_gib:g} GiB HBM. Both planners ran with "
            f"their defaults and the same ParameterConstraints (pooling factors). Each plan is "
            f"rated by TorchRec's enumerator and estimators on the model, each rank's shards "
            f"against what HeuristicalStorageReservation(0.15) leaves it.\n\n"
            + "\n".join(lines) + "\n" + ratio +
            "\nAutoshardPlanner's statistics table: [stats.txt](stats.txt).\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ebcs", type=int, default=300)
    parser.add_argument("--tables", type=int, default=330)
    parser.add_argument("--hbm-gib", type=float, default=8.0)
    parser.add_argument("--torchrec-cap-s", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--torchrec-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torchrec_child:
        torchrec_child(args)
        return
    start = os.getloadavg()[0]
    ours, table = run_ours(args)
    print(json.dumps(ours), flush=True)
    theirs = run_torchrec(args)
    print(json.dumps(theirs), flush=True)
    text = report(args, ours, theirs, (start, os.getloadavg()[0]))
    atomic_write_text(args.out / "stats.txt", table + "\n")
    atomic_write_text(args.out / "dropin.md", text)
    print(text)


if __name__ == "__main__":
    main()
