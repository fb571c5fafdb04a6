"""Trains the placement policy with MaskablePPO on ``autoshard/Placement-v0``.

Reads top to bottom: configuration and run folder, one seeding block, environments and held-out
tasks, the model (new or resumed from the last checkpoint), the learning loop with its
callbacks, then the final comparison against the greedy sharders.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from autoshard.compare import COLUMNS, CompareRow
from autoshard.cost import load_cost_model
from autoshard.envs import ENV_ID, TaskSampler
from autoshard.errors import InputError
from autoshard.fileio import atomic_write_text, csv_text
from autoshard.machine import describe_machine
from autoshard.policy.buckets import MULTIPLIERS, N_BUCKETS
from autoshard.policy.choice import GRIDS
from autoshard.policy.network import load_policy, regrid, save_policy
from autoshard.training.callbacks import (
    CheckpointCallback,
    CurveCallback,
    HeldOutEvalCallback,
    RunState,
)
from autoshard.training.checkpoint import load_checkpoint, read_state, save_checkpoint
from autoshard.training.config import TrainConfig
from autoshard.training.evaluation import GREEDY, compare, eval_tasks
from autoshard.training.plots import comparison, training_curve
from autoshard.training.tracking import Tracker, training_tracker

#: Fields that may differ between a run and its resumption (the vectorised environments all
#: play the same episodes).
RESUMABLE = ("timesteps", "wandb_mode", "patience", "vec_env")


@dataclass
class TrainResult:
    """What a training run produced."""

    run_dir: Path
    steps: int
    wall_seconds: float
    stopped_early: bool
    best_ratio: float
    policy_dir: Path
    results: list[CompareRow] = field(default_factory=list)


def make_env(sampler: TaskSampler, cost_model: str, max_devices: int, split: bool = False
             ) -> gym.Env:
    """One training environment through the registered id (importable in subprocesses)."""
    import autoshard.envs  # noqa: F401  (registers the id)

    return gym.make(ENV_ID, sampler=sampler, cost_model=cost_model, max_devices=max_devices,
                    report=False, split=split)


def make_vec(cfg: TrainConfig, sampler: TaskSampler, seed: int) -> Any:
    """The training environments: ``cfg.n_envs`` episodes, slot ``i`` seeded ``seed + i``, in
    the batched environment (one process, numpy over the batch) or one registered environment
    each in SB3's DummyVecEnv / SubprocVecEnv; all three play the same episodes."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor

    if cfg.vec_env == "batched":
        from autoshard.envs.batched import BatchedPlacementEnv

        vec = VecMonitor(BatchedPlacementEnv(cfg.n_envs, sampler, cfg.cost_model,
                                             cfg.max_devices, report=False, split=cfg.split))
        vec.seed(seed)
        return vec
    return make_vec_env(partial(make_env, sampler, cfg.cost_model, cfg.max_devices, cfg.split),
                        n_envs=cfg.n_envs, seed=seed,
                        vec_env_cls=SubprocVecEnv if cfg.vec_env == "subproc" else DummyVecEnv)


def _run_state(cfg: TrainConfig, resume: bool) -> tuple[RunState, int]:
    """The saved state and step count to resume from, or a fresh state."""
    ckpt = cfg.out_dir / "checkpoints"
    if not resume:
        if (ckpt / "state.json").exists():
            raise InputError("the run folder already holds a checkpoint; pass --resume to "
                             "continue it or choose another --out", field="out", value=cfg.out)
        return RunState(), 0
    doc = read_state(ckpt)
    saved = TrainConfig.from_dict(json.loads((cfg.out_dir / "config.json").read_text()),
                                  source=str(cfg.out_dir / "config.json"))
    for name, value in cfg.to_dict().items():
        if name not in RESUMABLE and getattr(saved, name) != value:
            raise InputError(f"differs from the run being resumed ({getattr(saved, name)!r})",
                             field=name, value=value)
    return RunState.from_dict(doc), int(doc["num_timesteps"])


def _build_model(cfg: TrainConfig, vec: Any, resume: bool, seed: int) -> Any:
    """A new MaskablePPO model; when resuming, its policy, optimizer and counters are restored
    from the run's tensor checkpoint (never from a pickle)."""
    from sb3_contrib import MaskablePPO

    from autoshard.training.sb3_policy import PlacementPolicy

    grids = GRIDS if cfg.split else 1
    model = MaskablePPO(
        PlacementPolicy, vec, learning_rate=_schedule(cfg), n_steps=cfg.n_steps,
        batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda, clip_range=cfg.clip_range, ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef,
        policy_kwargs={"buckets": N_BUCKETS, "hidden": cfg.hidden, "grids": grids},
        seed=seed, device="cpu", verbose=0)
    if resume:
        load_checkpoint(model, cfg.out_dir / "checkpoints")
    elif cfg.init_policy:
        net, _, _ = load_policy(cfg.init_policy)
        policy = model.policy
        assert isinstance(policy, PlacementPolicy)
        try:
            policy.net.load_state_dict(regrid(net, grids).state_dict())
        except RuntimeError as exc:
            raise InputError(f"does not match the network ({str(exc)[:200]})",
                             field="init_policy", value=cfg.init_policy) from exc
    return model


def _schedule(cfg: TrainConfig) -> Any:
    """The learning rate, or SB3's schedule of it (progress goes from 1 to 0)."""
    if not cfg.anneal_lr:
        return cfg.learning_rate
    return partial(_linear, cfg.learning_rate)


def _linear(start: float, progress_remaining: float) -> float:
    return start * progress_remaining


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def train(cfg: TrainConfig, resume: bool = False, export: Path | None = None,
          export_policy: Path | None = None) -> TrainResult:
    """Trains (or resumes) a run in ``cfg.out``; see the module docstring.

    ``export`` receives the run's curve, history, evaluation and figures; ``export_policy`` its
    best policy (``autoshard/data/ppo_policy`` to replace the committed one).
    """
    from stable_baselines3.common.callbacks import CallbackList

    run_dir = cfg.out_dir
    state, done_steps = _run_state(cfg, resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        atomic_write_text(run_dir / "config.json", json.dumps(cfg.to_dict(), indent=1) + "\n")
    seed = _seed_everything(cfg, done_steps)
    name = f"{cfg.experiment}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    tracker = training_tracker(cfg, run_dir, name)
    cost_model = load_cost_model(cfg.cost_model)
    sampler = TaskSampler(family="train", tables=cfg.train_tables, devices=cfg.train_devices,
                          hbm_fraction=cfg.hbm_fraction, batch_sizes=cfg.batch_sizes,
                          modes=cfg.modes, overheads=cfg.overheads)
    vec = make_vec(cfg, sampler, seed)
    tasks = eval_tasks(cfg.eval_tables, cfg.eval_devices, cfg.eval_hbm_fraction,
                       cfg.eval_repeats, family="validation", styles=cfg.eval_styles,
                       overheads=cfg.overheads)
    greedy_results = compare(tasks, cost_model, GREEDY)
    greedy = _ratios(greedy_results)
    model = _build_model(cfg, vec, resume, seed)
    policy_dir = run_dir / "policy"
    evaluator = HeldOutEvalCallback(cfg, state, tracker, tasks, greedy, cost_model, MULTIPLIERS,
                                    policy_dir)
    checkpoints = CheckpointCallback(cfg.checkpoint_every, run_dir / "checkpoints", state,
                                     {"run_name": name})
    if not resume and cfg.init_policy:  # the starting policy is the curve's first point
        evaluator.init_callback(model)
        evaluator.evaluate()
    remaining = cfg.timesteps - model.num_timesteps
    wall_before, started = state.wall_seconds, time.perf_counter()
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        if remaining > 0 and not state.stopped_early:
            model.learn(total_timesteps=remaining, reset_num_timesteps=False,
                        callback=CallbackList([CurveCallback(state, tracker), evaluator,
                                               checkpoints]))
    finally:
        signal.signal(signal.SIGTERM, previous)
        state.wall_seconds = wall_before + time.perf_counter() - started
        save_checkpoint(model, run_dir / "checkpoints", {**state.to_dict(), "run_name": name})
        vec.close()
    if not (policy_dir / "weights.pt").exists():  # no evaluation ran: keep the last policy
        save_policy(model.policy.net, policy_dir, MULTIPLIERS,
                    {"trained": {"steps": int(model.num_timesteps), "config": cfg.to_dict()}})
    result = TrainResult(run_dir, int(model.num_timesteps), state.wall_seconds,
                         state.stopped_early, state.best_ratio, policy_dir)
    result.results = _finish(cfg, result, tasks, greedy_results, cost_model, state, tracker)
    if export is not None:
        export_run(run_dir, export)
    if export_policy is not None:
        copy_policy(policy_dir, export_policy)
    return result


def _seed_everything(cfg: TrainConfig, done_steps: int) -> int:
    """Seeds every generator from one seed (a resumed run moves on) and returns it."""
    seed = cfg.seed + done_steps
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(cfg.torch_threads)
    return seed


def _ratios(rows: list[CompareRow]) -> dict[str, dict[str, float]]:
    """Each task's cost / bound per sharder (infinite where it failed)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        out.setdefault(r.task, {})[r.sharder] = r.cost_ratio if r.status == "ok" else float("inf")
    return out


def _finish(cfg: TrainConfig, result: TrainResult, tasks: list, greedy_results: list[CompareRow],
            cost_model: Any, state: RunState, tracker: Tracker) -> list[CompareRow]:
    """Final comparison of the best policy (its own greedy decode) with the greedy sharders;
    figures and logs."""
    options = {"policy": result.policy_dir, "samples": 0, "candidates": False}
    results = compare(tasks, cost_model, ("ppo",), options) + greedy_results
    run_dir = result.run_dir
    atomic_write_text(run_dir / "history.json", json.dumps(state.history, indent=1) + "\n")
    summary = {"steps": result.steps, "wall_seconds": round(result.wall_seconds, 1),
               "stopped_early": result.stopped_early, "best_held_out_ratio": result.best_ratio,
               "n_envs": cfg.n_envs, "vec_env": cfg.vec_env, "machine": describe_machine()}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    atomic_write_text(run_dir / "eval.csv", results_csv(results))
    curve = training_curve(state.history, run_dir / "training_curve.png",
                           f"{cfg.experiment}, seed {cfg.seed}: {result.steps:,} steps")
    plot = comparison(results, run_dir / "comparison.png", "validation tasks (held-out tables)")
    step = result.steps
    tracker.table("final/cost_ratio_by_sharder", COLUMNS,
                  [list(asdict(r).values()) for r in results], step)
    tracker.image("final/comparison", plot, step)
    tracker.image("final/training_curve", curve, step)
    ppo = float(np.mean([r.cost_ratio for r in results if r.sharder == "ppo"]))
    tracker.summary({"final/ppo_cost_ratio": ppo, "steps": step,
                     "wall_seconds": result.wall_seconds, "stopped_early": result.stopped_early})
    tracker.finish()
    return results


def results_csv(results: list[CompareRow]) -> str:
    return csv_text((asdict(r) for r in results), COLUMNS)


def export_run(run_dir: Path, dest: Path) -> None:
    """Copies the history, evaluation and figures of a run to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("history.json", "training_curve.png", "comparison.png", "eval.csv",
                 "config.json", "summary.json"):
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, dest / ("train_" + name if name != "training_curve.png"
                                                 else name))


def copy_policy(policy_dir: Path, dest: Path) -> None:
    """Copies a policy folder's files (``weights.pt``, ``config.json``) into ``dest``."""
    load_policy(policy_dir)  # refuse to export anything that would not load
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("weights.pt", "config.json"):
        tmp = dest / (name + ".tmp")
        shutil.copy2(policy_dir / name, tmp)
        tmp.replace(dest / name)
