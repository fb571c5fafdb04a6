"""The imitation run: expert plans of training tasks, behaviour cloning, DAgger rounds, each
round's policy evaluated alone on the validation family (with and without TorchRec's room) and
the best kept (:mod:`autoshard.training.imitation`).

Resumable: each task's expert plans are written as they are solved (``demos/<i>.npz``, the task
itself re-drawn from its seed), and each round's policy and history as it ends; a rerun with
the same settings skips what is there.

    .venv/bin/python -m autoshard.training.imitate_run --out runs/imitate
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from autoshard.envs.sampler import TaskSampler
from autoshard.fileio import atomic_write_text
from autoshard.layout.shards import pricing_task
from autoshard.machine import describe_machine
from autoshard.policy.network import PlacementNet, load_policy, regrid, save_policy
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.sharders.ppo import DEFAULT_POLICY
from autoshard.training.evaluation import eval_tasks, evaluate_policy, mean_ratio
from autoshard.training.imitation import (
    Demo,
    Samples,
    collect,
    demo_geometries,
    expert_demos,
    fit,
)
from autoshard.training.plots import imitation_curves

MODEL = AnalyticalCostModel()
MAX_DEVICES = 16


def sampler() -> TaskSampler:
    return TaskSampler(family="train", tables=(4, 200), devices=(2, 3, 4, 6, 8, 12, 16),
                       overheads=("none", "torchrec"))


def demos_of(i: int, seed: int, folder: Path, seconds: float) -> list[Demo]:
    """Task ``i``'s expert plans, solved now or read from ``folder``."""
    task = sampler().sample(np.random.default_rng([seed, i]), MAX_DEVICES)
    path = folder / f"{i}.npz"
    if not path.exists():
        demos = expert_demos(task, MODEL, seconds)
        arrays = {f"{k}_{j}": getattr(d, k) for j, d in enumerate(demos)
                  for k in ("device", "rows")}
        tmp = folder / f".{i}.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
        return demos
    stored = np.load(path, allow_pickle=False)
    return [Demo(pricing_task(task, g), stored[f"device_{j}"], stored[f"rows_{j}"])
            for j, g in enumerate(demo_geometries(task, MODEL))]


def write_back(wide: PlacementNet, narrow: PlacementNet) -> PlacementNet:
    """``wide`` (the policy file's grids) with ``narrow``'s (one grid) trained weights: the
    shared layers, and the first grid's bucket embeddings."""
    state = narrow.state_dict()
    bucket = wide.state_dict()["opt_bucket"].clone()
    bucket[:narrow.options] = state["opt_bucket"]
    state["opt_bucket"] = bucket
    out = PlacementNet(wide.buckets, wide.hidden, wide.grids, wide.refill)
    out.load_state_dict(state)
    out.eval()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/imitate"))
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0, help="expert time per solve")
    parser.add_argument("--rounds", type=int, default=3, help="1 = behaviour cloning only")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=None,
                        help="only draw the curves of this history.json (next to it)")
    args = parser.parse_args()
    if args.plot is not None:
        imitation_curves(json.loads(args.plot.read_text())["history"],
                         args.plot.with_suffix(".png"))
        return
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    folder = args.out / "demos"
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    demos = []
    for i in range(args.tasks):
        demos += demos_of(i, args.seed, folder, args.seconds)
    expert_s = time.perf_counter() - start
    history, best = train_rounds(args, demos, start)
    imitation_curves(history, args.out / "history.png")
    atomic_write_text(args.out / "history.json", json.dumps(
        {"machine": describe_machine(), "expert_s": round(expert_s, 1), "tasks": args.tasks,
         "demos": len(demos), "history": history, "best_validation_mean": best}, indent=1))


def train_rounds(args: argparse.Namespace, demos: list[Demo], start: float
                 ) -> tuple[list[dict[str, object]], float]:
    """The rounds of the module docstring from the committed policy; each round's policy is
    written to ``round-<r>`` and the best (or the committed one) to ``policy``. Returns the
    history and the best validation mean."""
    base, multipliers, _ = load_policy(DEFAULT_POLICY)
    net = regrid(base, 1)
    val = eval_tasks((20, 50), (4, 8, 16), 0.3, family="validation",
                     styles=("mixed", "dominant", "profiled"), repeats=2,
                     overheads=("none", "torchrec"))
    history: list[dict[str, object]] = []

    def evaluate(tag: str) -> float:
        folder = args.out / f"round-{tag}"
        save_policy(write_back(base, net), folder, multipliers,
                    {"trained": f"imitation of recshard, {tag}", "machine": describe_machine()})
        rows = evaluate_policy(folder, val, MODEL)
        ratio = mean_ratio(rows)
        room = [r.cost_ratio for r in rows if r.task.endswith("-torchrec")]
        history.append({"round": tag, "validation_mean": ratio,
                        "validation_room_mean": float(np.mean(room)) if room else None,
                        "seconds": round(time.perf_counter() - start, 1)})
        print(history[-1], flush=True)
        return ratio if ratio is not None else float("inf")

    best = evaluate("start")
    save_policy(base, args.out / "policy", multipliers)
    samples = Samples([], [], [])
    for r in range(args.rounds):
        more = collect(demos, MODEL, multipliers, MAX_DEVICES, None if r == 0 else net)
        for k in ("obs", "mask", "target"):
            getattr(samples, k).extend(getattr(more, k))
        losses = fit(net, samples, args.epochs, seed=args.seed + r)
        history.append({"round": r, "samples": len(samples), "losses": losses})
        ratio = evaluate(str(r))
        if ratio < best:
            best = ratio
            save_policy(write_back(base, net), args.out / "policy", multipliers,
                        {"trained": f"imitation of recshard, round {r}",
                         "machine": describe_machine()})
    return history, best


if __name__ == "__main__":
    main()
