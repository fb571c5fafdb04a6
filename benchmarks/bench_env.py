"""Placement environment throughput: steps per second for 100 tables on 8 devices, one core.

Measured in one run, in thread CPU time (so other processes on the machine do not count):

- ``env.step``: the environment's step alone (random allowed actions; the agent's own time and
  the reset are not counted);
- ``episodes``: whole episodes, reset (pricing every table, device and bucket, the lower bound
  and the buckets) included, with and without the evaluator report at the end;
- baseline ``PlacementState loop``: the bare shared bookkeeping the environment wraps (the fit
  tests of all buckets, pricing the fill bucket, then ``place``) for the same actions, i.e.
  the least any environment built on it can cost per step;
- the batched environment (:class:`autoshard.envs.batched.BatchedPlacementEnv`) at N = 16, 64, 256
  episodes: total environment steps per second (N x batched steps per second) of
  ``VecEnv.step`` with its auto-resets taken out (the same measure as ``env.step only``), and
  with them (the same measure as ``episodes incl. reset``), random allowed actions from its
  mask array.

Usage: ``python benchmarks/bench_env.py [--episodes N] [--batch-episodes E] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from autoshard.envs import PlacementEnv, TaskSampler
from autoshard.envs.batched import BatchedPlacementEnv
from autoshard.fileio import atomic_write_text
from autoshard.layout.placement import PlacementState
from autoshard.machine import describe_machine

TABLES, DEVICES = 100, 8
BATCHES = (16, 64, 256)
#: Environment steps per core the step should reach (100 tables, 8 devices).
TARGET = 20_000


class TimedResets(BatchedPlacementEnv):
    """The batched environment, counting the thread time of its episode starts."""

    reset_seconds = 0.0

    def _start(self, n: int, seed: int | None, options: dict | None) -> np.ndarray:
        t0 = time.thread_time()
        obs = super()._start(n, seed, options)
        self.reset_seconds += time.thread_time() - t0
        return obs


def run_batched(sampler: TaskSampler, n: int, batched_steps: int, seed: int,
                max_devices: int | None = None) -> tuple[float, float, int]:
    """(seconds in step without the auto-resets, seconds in step, environment steps) of
    ``batched_steps`` steps of the batched environment of ``n`` episodes."""
    env = TimedResets(n, sampler, max_devices=max_devices, report=False)
    env.seed(seed)
    env.reset()
    env.reset_seconds = 0.0
    rng = np.random.default_rng(seed)
    in_step = 0.0
    for _ in range(batched_steps):
        masks = env.action_masks()
        actions = (rng.random(masks.shape) * masks).argmax(axis=1)  # uniform over allowed
        t0 = time.thread_time()
        env.step(actions)
        in_step += time.thread_time() - t0
    return in_step - env.reset_seconds, in_step, batched_steps * n


def run_env(env: PlacementEnv, episodes: int, seed: int) -> tuple[float, float, list]:
    """(seconds in step, seconds in all, actions taken per episode)."""
    rng = np.random.default_rng(seed)
    in_step, actions = 0.0, []
    start = time.thread_time()
    for e in range(episodes):
        env.reset(seed=seed + e)
        done, taken = False, []
        while not done:
            a = int(rng.choice(np.flatnonzero(env.action_masks())))
            t0 = time.thread_time()
            done = env.step(a)[2]
            in_step += time.thread_time() - t0
            taken.append(a)
        assert env.episode is not None
        p = env.episode.priced
        actions.append((env.task, p.order, p.rows, p.total, taken))
    return in_step, time.thread_time() - start, actions


def run_baseline(env: PlacementEnv, actions: list) -> float:
    """Seconds for the same placements through PlacementState and the cost model alone: the
    fit tests of every bucket, the pricing of the fill bucket, and ``place``."""
    k = env.buckets
    total = 0.0
    for task, order, rows, price, taken in actions:
        state = PlacementState(task, env.cost_model)
        devices = np.arange(task.num_devices)
        t0 = time.thread_time()
        for t, a in zip(order, taken, strict=True):
            d, b = divmod(a, k)
            state.fits(int(t), rows[t][:, None])
            fill = state.max_hbm_rows(int(t))
            fill_price = env.cost_model.price(task, np.full(devices.size, t), devices, fill)
            state.fits(int(t), fill)
            if b == k - 1:
                state.place(int(t), d, int(fill[d]), price=float(fill_price.total_ms[d]))
            else:
                state.place(int(t), d, int(rows[t, b]), price=float(price[t, d, b]))
        total += time.thread_time() - t0
    return total


def training_rows(episodes: int, n: int = 16) -> dict[str, object]:
    """Steps per second on the training distribution
    (:class:`autoshard.training.config.TrainConfig`'s defaults): the single environment over
    ``episodes`` episodes, the batched one of ``n`` episodes for twice the mean episode length
    of those (so each slot starts about two episodes on the way)."""
    from autoshard.training.config import TrainConfig

    cfg = TrainConfig()
    sampler = TaskSampler(family="train", tables=cfg.train_tables, devices=cfg.train_devices,
                          hbm_fraction=cfg.hbm_fraction, batch_sizes=cfg.batch_sizes,
                          modes=cfg.modes)
    env = PlacementEnv(sampler, max_devices=cfg.max_devices, report=False)
    step_s, all_s, actions = run_env(env, episodes, seed=0)
    steps = sum(len(a[-1]) for a in actions)
    without, with_resets, env_steps = run_batched(sampler, n, 2 * steps // episodes, 0,
                                                  cfg.max_devices)
    return {"tables": list(cfg.train_tables), "devices": list(cfg.train_devices),
            "device_slots": cfg.max_devices, "episodes": episodes, "batch": n,
            "steps_per_second": {
                "env.step only": steps / step_s,
                "episodes incl. reset, no report": steps / all_s,
                f"batched N={n}: step only (auto-resets taken out)": env_steps / without,
                f"batched N={n}: step incl. auto-resets, no report": env_steps / with_resets}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--batch-episodes", type=int, default=3,
                        help="episodes per slot of the batched environment")
    parser.add_argument("--train-episodes", type=int, default=20,
                        help="single-env episodes of the training distribution")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    load_before = os.getloadavg()
    sampler = TaskSampler(tables=(TABLES, TABLES), devices=(DEVICES,), hbm_fraction=(0.5, 0.5),
                          batch_sizes=(65536,), modes=("train",), styles=("mixed",))
    quiet = PlacementEnv(sampler, report=False)
    reported = PlacementEnv(sampler, report=True)
    run_env(quiet, 3, seed=1000)  # warm-up
    steps = args.episodes * TABLES
    step_s, all_s, actions = run_env(quiet, args.episodes, seed=0)
    _, all_report_s, _ = run_env(reported, args.episodes, seed=0)
    base_s = run_baseline(quiet, actions)
    rows = {
        "env.step only": steps / step_s,
        "episodes incl. reset, no report": steps / all_s,
        "episodes incl. reset and evaluator report": steps / all_report_s,
        "baseline: PlacementState loop (fits, fill price, place)": steps / base_s,
    }
    run_batched(sampler, 4, TABLES, seed=1000)  # warm-up
    for n in BATCHES:
        without, with_resets, env_steps = run_batched(sampler, n, args.batch_episodes * TABLES,
                                                      seed=0)
        rows[f"batched N={n}: step only (auto-resets taken out)"] = env_steps / without
        rows[f"batched N={n}: step incl. auto-resets, no report"] = env_steps / with_resets
    single = rows["env.step only"]
    best = max(v for k, v in rows.items() if k.endswith("taken out)"))
    doc = {"tables": TABLES, "devices": DEVICES, "episodes": args.episodes,
           "batch_episodes_per_slot": args.batch_episodes, "buckets": quiet.buckets,
           "steps_per_second": rows, "over_single_step": {k: v / single for k, v in rows.items()},
           "step_over_baseline_time": step_s / base_s, "target_steps_per_second": TARGET,
           "target_met": bool(min(v for k, v in rows.items() if k.endswith("taken out)"))
                              >= TARGET),
           "training_distribution": training_rows(args.train_episodes),
           "machine": describe_machine(),
           "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
           "command": "python benchmarks/bench_env.py"
                      + (f" --episodes {args.episodes}" if args.episodes != 60 else "")
                      + (f" --batch-episodes {args.batch_episodes}"
                         if args.batch_episodes != 3 else "")
                      + (f" --train-episodes {args.train_episodes}"
                         if args.train_episodes != 20 else "")}
    lines = _report(doc, args.episodes, quiet.buckets, step_s / base_s, best)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "env.md", "\n".join(lines) + "\n")
    atomic_write_text(args.out / "env.json", json.dumps(doc, indent=2) + "\n")
    print("\n".join(lines))


def _report(doc: dict, episodes: int, buckets: int, over_baseline: float,
            best: float) -> list[str]:
    """The Markdown report of a run."""
    load = doc["load_average_1_5_15"]
    lines = [f"# Placement environment throughput ({TABLES} tables, {DEVICES} devices)", "",
             f"Machine: {doc['machine']}, pinned to one core, thread CPU time; load average "
             f"(1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load['before'])} before, "
             f"{', '.join(f'{x:.2f}' for x in load['after'])} after. Command: "
             f"`{doc['command']}`.", "",
             f"Single environment: {episodes} episodes of {TABLES} steps; batched: "
             f"{doc['batch_episodes_per_slot']} episodes per slot. Random allowed actions, "
             f"{buckets} buckets x {DEVICES} devices = {buckets * DEVICES} actions.",
             "", "| measure | env steps/s | x env.step |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {v:,.0f} | {doc['over_single_step'][k]:.2f} |"
              for k, v in doc["steps_per_second"].items()]
    met = "met" if doc["target_met"] else "NOT met"
    lines += ["", f"One single-env step costs {over_baseline:.2f}x the bare PlacementState loop. "
              f"The batched step reaches {best:,.0f} env steps/s on one core at best; the target "
              f"of {TARGET:,} env steps/s per core is {met} at every batch size (step only). "
              "An episode start (drawing and pricing the task, same code as the single "
              "environment) is the larger cost once steps are batched: compare the rows "
              "with auto-resets."]
    train = doc["training_distribution"]
    t_lo, t_hi = train["tables"]
    lines += ["", f"Training distribution (`autoshard train`'s defaults: {t_lo}-{t_hi} tables, "
              f"{min(train['devices'])}-{max(train['devices'])} devices, "
              f"{train['device_slots']} device slots; {train['episodes']} single-env episodes, "
              "and the batched one for twice their mean length):", "",
              "| measure | env steps/s |", "| --- | ---: |"]
    lines += [f"| {k} | {v:,.0f} |" for k, v in train["steps_per_second"].items()]
    return lines


if __name__ == "__main__":
    main()
