"""Trains the placement policy with MaskablePPO on ``autoshard/Placement-v0``.

Reads top to bottom: configuration and run folder (everything a run reads is checked before
the folder is made), one seeding block, environments and held-out tasks, the model (new or
resumed from the last checkpoint), the learning loop with its callbacks, then the final
comparison against the greedy sharders (:mod:`autoshard.training.report`).
"""

from __future__ import annotations

import math
import random
import signal
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from autoshard.envs import ENV_ID, TaskSampler
from autoshard.errors import InputError
from autoshard.fileio import check_finite, output_folder, read_structured, write_structured
from autoshard.policy.buckets import MULTIPLIERS, N_BUCKETS
from autoshard.policy.choice import GRIDS
from autoshard.policy.network import PlacementNet, load_policy, regrid, save_policy
from autoshard.pricing.cost import CostModel, load_cost_model
from autoshard.progress import ProgressFactory, no_progress
from autoshard.training.callbacks import (
    CheckpointCallback,
    CurveCallback,
    HeldOutEvalCallback,
    ProgressCallback,
    RunState,
)
from autoshard.training.checkpoint import load_checkpoint, read_state, save_checkpoint
from autoshard.training.config import TrainConfig
from autoshard.training.evaluation import GREEDY, EvalTask, compare, eval_tasks
from autoshard.training.report import TrainResult, copy_policy, export_run, finish
from autoshard.training.wandb_runs import training_tracker

__all__ = ["RESUMABLE", "TrainResult", "make_env", "make_vec", "planned_steps",
           "resumed_config", "train"]

#: Fields that may differ between a run and its resumption (the vectorised environments all
#: play the same episodes; the run folder may have moved).
RESUMABLE = ("timesteps", "wandb_mode", "patience", "vec_env", "out")


@dataclass(frozen=True)
class Inputs:
    """What a run reads, each checked before its folder is made."""

    state: RunState
    done_steps: int
    start: PlacementNet | None
    cost_model: CostModel
    sampler: TaskSampler
    tasks: list[EvalTask]


def make_env(sampler: TaskSampler, cost_model: str, max_devices: int, split: bool = False,
             fill: bool = False, refill: str = "none") -> gym.Env:
    """One training environment through the registered id (importable in subprocesses)."""
    import autoshard.envs  # noqa: F401  (registers the id)

    return gym.make(ENV_ID, sampler=sampler, cost_model=cost_model, max_devices=max_devices,
                    report=False, split=split, fill=fill, refill=refill)


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
    return make_vec_env(partial(make_env, sampler, cfg.cost_model, cfg.max_devices, cfg.split,
                                cfg.fill, cfg.refill),
                        n_envs=cfg.n_envs, seed=seed,
                        vec_env_cls=SubprocVecEnv if cfg.vec_env == "subproc" else DummyVecEnv)


def planned_steps(cfg: TrainConfig, done: int) -> int:
    """The steps a run reaching ``cfg.timesteps`` from ``done`` ends at: PPO collects whole
    rollouts of ``n_envs x n_steps`` steps, so the request is rounded up to whole rollouts
    (the step size's schedule then spans exactly the steps run)."""
    if done >= cfg.timesteps:
        return done
    return done + math.ceil((cfg.timesteps - done) / cfg.rollout_steps) * cfg.rollout_steps


def _read_inputs(cfg: TrainConfig, resume: bool, outputs: tuple[Path | None, ...]) -> Inputs:
    """Checks and reads everything the run needs before anything is written: the checkpoint
    and config of a resumed run, the starting policy, the cost model, the tasks, and that the
    export folders can be folders."""
    for path in (cfg.out_dir, *outputs):
        if path is not None and path.exists() and not path.is_dir():
            raise InputError("is a file; give a folder", source=str(path))
    state, done = _run_state(cfg, resume)
    start = _start_policy(cfg) if cfg.init_policy and not resume else None
    if resume and (cfg.out_dir / "policy").exists():  # the kept policy is evaluated at the end
        load_policy(cfg.out_dir / "policy")
    cost_model = load_cost_model(cfg.cost_model)
    sampler = TaskSampler(family="train", tables=cfg.train_tables, devices=cfg.train_devices,
                          hbm_fraction=cfg.hbm_fraction, batch_sizes=cfg.batch_sizes,
                          modes=cfg.modes, overheads=cfg.overheads)
    tasks = eval_tasks(cfg.eval_tables, cfg.eval_devices, cfg.eval_hbm_fraction,
                       cfg.eval_repeats, family="validation", styles=cfg.eval_styles,
                       overheads=cfg.overheads)
    return Inputs(state, done, start, cost_model, sampler, tasks)


def _run_state(cfg: TrainConfig, resume: bool) -> tuple[RunState, int]:
    """The saved state and step count to resume from, or a fresh state."""
    ckpt = cfg.out_dir / "checkpoints"
    if not resume:
        if (ckpt / "state.json").exists():
            raise InputError("the run folder already holds a checkpoint; pass --resume to "
                             "continue it or choose another --out", field="out", value=cfg.out)
        return RunState(), 0
    doc = read_state(ckpt)
    path = cfg.out_dir / "config.json"
    saved_doc = read_structured(path)
    check_finite(saved_doc, str(path))
    saved = TrainConfig.from_dict(saved_doc, source=str(path))
    for name, value in cfg.to_dict().items():
        if name not in RESUMABLE and getattr(saved, name) != value:
            raise InputError(f"differs from the run being resumed ({getattr(saved, name)!r})",
                             field=name, value=value)
    return RunState.from_dict(doc, source=str(ckpt / "state.json")), doc["num_timesteps"]


def resumed_config(given: dict[str, Any]) -> TrainConfig:
    """The config of the run being resumed in ``given['out']`` (default: the default run
    folder): its saved ``config.json``, with the fields ``given`` overriding it (checked
    against the run by :func:`train`: only :data:`RESUMABLE` fields may differ).

    Raises:
        InputError: The run folder has no config, or it or a given field is bad (named).
    """
    out = Path(given.get("out", TrainConfig().out))
    path = out / "config.json"
    if not path.is_file():
        raise InputError("no run to resume here (no config.json); train it first, without "
                         "--resume", source=str(out), field="out", value=str(out))
    saved = read_structured(path)
    check_finite(saved, str(path))
    TrainConfig.from_dict(saved, source=str(path))  # the saved config is checked as such
    if not isinstance(saved, dict):
        raise InputError("expected a mapping", source=str(path))
    return TrainConfig.from_dict({**saved, **given, "out": str(out)}, source="<config>")


def _start_policy(cfg: TrainConfig) -> PlacementNet:
    """The policy a new run starts from, on the run's option grids; it must have the run's
    buckets and width."""
    net, multipliers, _ = load_policy(cfg.init_policy)
    if net.hidden != cfg.hidden or multipliers != MULTIPLIERS or net.buckets != N_BUCKETS:
        raise InputError(f"a policy of width {net.hidden} over {net.buckets} buckets; the run "
                         f"trains width {cfg.hidden} (--hidden) over {N_BUCKETS}",
                         field="init_policy", value=cfg.init_policy)
    return regrid(net, GRIDS if cfg.split else 1)


def _build_model(cfg: TrainConfig, vec: Any, resume: bool, seed: int,
                 start: PlacementNet | None) -> Any:
    """A new MaskablePPO model, started from ``start`` if given; when resuming, its policy,
    optimizer and counters are restored from the run's tensor checkpoint (never from a
    pickle)."""
    from sb3_contrib import MaskablePPO

    from autoshard.training.sb3_policy import PlacementPolicy

    model = MaskablePPO(
        PlacementPolicy, vec, learning_rate=_schedule(cfg), n_steps=cfg.n_steps,
        batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda, clip_range=cfg.clip_range, ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef,
        policy_kwargs={"buckets": N_BUCKETS, "hidden": cfg.hidden,
                       "grids": GRIDS if cfg.split else 1, "refill": cfg.refill},
        seed=seed, device="cpu", verbose=0)
    if resume:
        load_checkpoint(model, cfg.out_dir / "checkpoints")
    elif start is not None:
        policy = model.policy
        assert isinstance(policy, PlacementPolicy)
        policy.net.load_state_dict(start.state_dict())
    return model


def _schedule(cfg: TrainConfig) -> Any:
    """The learning rate, or SB3's schedule of it (progress goes from 1 to 0)."""
    if not cfg.anneal_lr:
        return cfg.learning_rate
    return partial(_linear, cfg.learning_rate)


def _linear(start: float, progress_remaining: float) -> float:
    return start * max(progress_remaining, 0.0)  # never negative, whatever SB3 passes


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def train(cfg: TrainConfig, resume: bool = False, export: Path | None = None,
          export_policy: Path | None = None, progress: ProgressFactory = no_progress
          ) -> TrainResult:
    """Trains (or resumes) a run in ``cfg.out``; see the module docstring.

    ``export`` receives the run's curve, history, evaluation and figures; ``export_policy`` its
    best policy (``autoshard/data/ppo_policy`` to replace the committed one); ``progress``
    is told the environment steps done, rollout by rollout.

    Raises:
        InputError: Bad input (a checkpoint, config or policy file, an option); raised before
            the run folder of a new run is made, so nothing is left behind.
    """
    from stable_baselines3.common.callbacks import CallbackList

    run_dir, inputs = cfg.out_dir, _read_inputs(cfg, resume, (export, export_policy))
    state = inputs.state
    with output_folder(run_dir):  # a new run's folder goes again if setting up fails
        if not resume:
            write_structured(run_dir / "config.json", cfg.to_dict())
        seed = _seed_everything(cfg, inputs.done_steps)
        vec = make_vec(cfg, inputs.sampler, seed)
        try:  # (a resumed run's checkpoint is checked here, before the tracker writes)
            model = _build_model(cfg, vec, resume, seed, inputs.start)
        except BaseException:
            vec.close()
            raise
        name = f"{cfg.experiment}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        tracker = training_tracker(cfg, run_dir, name)
        greedy = compare(inputs.tasks, inputs.cost_model, GREEDY)
    policy_dir = run_dir / "policy"
    evaluator = HeldOutEvalCallback(cfg, state, tracker, inputs.tasks, greedy,
                                    inputs.cost_model, MULTIPLIERS, policy_dir)
    checkpoints = CheckpointCallback(cfg.checkpoint_every, run_dir / "checkpoints", state,
                                     {"run_name": name})
    if inputs.start is not None:  # the starting policy is the curve's first point
        evaluator.init_callback(model)
        evaluator.evaluate()
    remaining = planned_steps(cfg, model.num_timesteps) - model.num_timesteps
    wall_before, started = state.wall_seconds, time.perf_counter()
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        if remaining > 0 and not state.stopped_early:
            with progress("training (environment steps)", remaining) as advance:
                model.learn(total_timesteps=remaining, reset_num_timesteps=False,
                            callback=CallbackList([CurveCallback(state, tracker), evaluator,
                                                   checkpoints, ProgressCallback(advance)]))
    finally:
        signal.signal(signal.SIGTERM, previous)
        state.wall_seconds = wall_before + time.perf_counter() - started
        save_checkpoint(model, run_dir / "checkpoints", {**state.to_dict(), "run_name": name})
        vec.close()
    result = finish(cfg, _kept(cfg, model, inputs, policy_dir), inputs.tasks, greedy,
                    inputs.cost_model, state, tracker)
    if export is not None:
        export_run(run_dir, export)
    if export_policy is not None:
        copy_policy(policy_dir, export_policy)
    return result


def _kept(cfg: TrainConfig, model: Any, inputs: Inputs, policy_dir: Path) -> TrainResult:
    """What the run keeps: the best evaluated policy, else (none kept) the last one, saved now;
    the result says which step's it is."""
    state, steps = inputs.state, int(model.num_timesteps)
    if not (policy_dir / "weights.pt").exists():  # no evaluation kept one: keep the last
        save_policy(model.policy.net, policy_dir, MULTIPLIERS,
                    {"trained": {"steps": steps, "config": cfg.to_dict()}})
    kept = state.best_step if state.best_ratio is not None else steps
    return TrainResult(cfg.out_dir, steps, cfg.timesteps, inputs.done_steps,
                       state.wall_seconds, state.stopped_early, state.best_ratio, policy_dir,
                       kept_step=kept)


def _seed_everything(cfg: TrainConfig, done_steps: int) -> int:
    """Seeds every generator from one seed (a resumed run moves on) and returns it."""
    seed = cfg.seed + done_steps
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(cfg.torch_threads)
    return seed
