"""Callbacks of a training run: training curves, held-out evaluation with early stop, and
checkpoints that a resumed run continues from."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from autoshard.cost import CostModel
from autoshard.evaluator import evaluate
from autoshard.policy.network import save_policy
from autoshard.training.checkpoint import save_checkpoint
from autoshard.training.config import TrainConfig
from autoshard.training.evaluation import EvalTask, plan_task
from autoshard.training.sb3_policy import PlacementPolicy
from autoshard.training.tracking import Tracker


@dataclass
class RunState:
    """What a run has done so far; saved with every checkpoint.

    Args:
        history: Training and evaluation points ({"step", "train_ratio"} or {"step",
            "eval_ratio", "greedy_ratio"}).
        best_ratio: Best held-out mean cost ratio so far.
        stale_evals: Evaluations since the last improvement.
        stopped_early: Whether early stopping ended the run.
        wall_seconds: Training wall time over all sessions of the run.
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    best_ratio: float = float("inf")
    stale_evals: int = 0
    stopped_early: bool = False
    wall_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["best_ratio"] = None if np.isinf(self.best_ratio) else self.best_ratio
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RunState:
        best = doc.get("best_ratio")
        return cls(list(doc.get("history", [])), float("inf") if best is None else float(best),
                   int(doc.get("stale_evals", 0)), bool(doc.get("stopped_early", False)),
                   float(doc.get("wall_seconds", 0.0)))


class CurveCallback(BaseCallback):
    """After every rollout, records the training episodes' mean cost ratio (= -return)."""

    def __init__(self, state: RunState, tracker: Tracker) -> None:
        super().__init__()
        self.state, self.tracker = state, tracker

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        episodes = self.model.ep_info_buffer
        if not episodes:
            return
        ratio = -float(np.mean([e["r"] for e in episodes]))
        self.state.history.append({"step": self.num_timesteps, "train_ratio": ratio})
        self.tracker.log({"charts/train_cost_ratio": ratio,
                          "charts/episode_length": float(np.mean([e["l"] for e in episodes]))},
                         self.num_timesteps)


class HeldOutEvalCallback(BaseCallback):
    """Every ``cfg.eval_every`` steps, plans the held-out tasks with the current policy, logs
    its mean cost ratio against the best greedy's, keeps the best policy in ``policy_dir`` and
    stops after ``cfg.patience`` evaluations without an improvement of ``cfg.min_delta``."""

    def __init__(self, cfg: TrainConfig, state: RunState, tracker: Tracker,
                 tasks: list[EvalTask], greedy: dict[str, dict[str, float]],
                 cost_model: CostModel, multipliers: tuple[float, ...],
                 policy_dir: Path) -> None:
        super().__init__()
        self.cfg, self.state, self.tracker = cfg, state, tracker
        self.tasks, self.greedy, self.cost_model = tasks, greedy, cost_model
        self.multipliers, self.policy_dir = multipliers, policy_dir
        self.next_eval = 0

    def _init_callback(self) -> None:
        every = self.cfg.eval_every
        self.next_eval = (self.model.num_timesteps // every + 1) * every

    def _on_step(self) -> bool:
        if self.num_timesteps < self.next_eval:
            return True
        self.next_eval += self.cfg.eval_every
        return self.evaluate()

    def evaluate(self) -> bool:
        """Runs one evaluation; False when the run should stop early."""
        policy = self.model.policy
        assert isinstance(policy, PlacementPolicy)
        ratios = {t.name: evaluate(plan_task(policy.net, self.multipliers, t.task,
                                             self.cost_model), t.task, self.cost_model).cost_ratio
                  for t in self.tasks}
        best_greedy = {t: min(v.values()) for t, v in self.greedy.items()}
        mean = float(np.mean(list(ratios.values())))
        greedy = float(np.mean([best_greedy[t] for t in ratios]))
        step = self.num_timesteps
        self.state.history.append({"step": step, "eval_ratio": mean, "greedy_ratio": greedy})
        self.tracker.log({"eval/ppo_cost_ratio": mean, "eval/best_greedy_cost_ratio": greedy,
                          "eval/ppo_over_best_greedy": mean / greedy}, step)
        rows = [[t, "ppo", r] for t, r in ratios.items()]
        rows += [[t, s, r] for t, v in self.greedy.items() for s, r in v.items()]
        self.tracker.table("eval/cost_ratio_by_sharder", ["task", "sharder", "cost_ratio"], rows,
                           step)
        if mean < self.state.best_ratio - self.cfg.min_delta:
            self.state.best_ratio, self.state.stale_evals = mean, 0
            save_policy(policy.net, self.policy_dir, self.multipliers,
                        {"trained": {"steps": step, "held_out_cost_ratio": mean,
                                     "config": self.cfg.to_dict()}})
        else:
            self.state.stale_evals += 1
        if self.state.stale_evals >= self.cfg.patience:
            self.state.stopped_early = True
            return False
        return True


class CheckpointCallback(BaseCallback):
    """Every ``every`` steps, saves the model and the run state (the resume point)."""

    def __init__(self, every: int, folder: Path, state: RunState, extra: dict[str, Any]) -> None:
        super().__init__()
        self.every, self.folder, self.state, self.extra = every, folder, state, extra
        self.next_save = 0
        self._wall_before, self._start = state.wall_seconds, time.perf_counter()

    def _init_callback(self) -> None:
        self.next_save = (self.model.num_timesteps // self.every + 1) * self.every
        self._wall_before, self._start = self.state.wall_seconds, time.perf_counter()

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next_save:
            self.next_save += self.every
            self.save()
        return True

    def save(self) -> None:
        self.state.wall_seconds = self._wall_before + time.perf_counter() - self._start
        save_checkpoint(self.model, self.folder, {**self.state.to_dict(), **self.extra})

