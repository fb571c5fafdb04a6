"""Callbacks of a training run: training curves, held-out evaluation with early stop, and
checkpoints that a resumed run continues from."""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from autoshard.compare.harness import CompareRow
from autoshard.errors import InputError
from autoshard.limits import int_in, is_finite
from autoshard.policy.network import save_policy
from autoshard.pricing.cost import CostModel
from autoshard.progress import Advance
from autoshard.training.checkpoint import save_checkpoint
from autoshard.training.config import TrainConfig
from autoshard.training.evaluation import (
    POLICY_SHARDER,
    EvalTask,
    best_greedy_ratio,
    evaluate_policy,
    mean_ratio,
)
from autoshard.training.sb3_policy import PlacementPolicy
from autoshard.training.wandb_runs import Tracker


@dataclass
class RunState:
    """What a run has done so far; saved with every checkpoint.

    Args:
        history: Training and evaluation points ({"step", "train_ratio"} or {"step",
            "eval_ratio", "greedy_ratio"}; an evaluation's ratio is None where the policy
            found no plan for some task, the greedy one where no greedy sharder did).
        best_ratio: Best held-out mean cost ratio so far (None: no evaluation has given one).
        stale_evals: Evaluations since the last improvement.
        stopped_early: Whether early stopping ended the run.
        wall_seconds: Training wall time over all sessions of the run.
        best_step: The step of the evaluation that gave ``best_ratio`` (its policy is the one
            kept; 0: the starting policy of a fine-tuning run); None: none did.
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    best_ratio: float | None = None
    stale_evals: int = 0
    stopped_early: bool = False
    wall_seconds: float = 0.0
    best_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], source: str = "<state>") -> RunState:
        """The state saved in a checkpoint's ``state.json``, every field checked.

        Raises:
            InputError: A field of the wrong type or out of range, naming it.
        """
        best = doc.get("best_ratio")
        best_step = doc.get("best_step")
        checks = (("history", _history_ok(doc.get("history", [])), "a list of points, each "
                   "a mapping of its step (an integer >= 0) to finite figures"),
                  ("best_ratio", best is None or (is_finite(best) and best > 0),
                   "null or a number > 0"),
                  ("stale_evals", int_in(doc.get("stale_evals", 0), 0, 10**9),
                   "an integer >= 0"),
                  ("stopped_early", isinstance(doc.get("stopped_early", False), bool),
                   "true or false"),
                  ("wall_seconds", is_finite(doc.get("wall_seconds", 0.0))
                   and doc.get("wall_seconds", 0.0) >= 0, "a number >= 0"),
                  ("best_step", best_step is None or int_in(best_step, 0, 10**12),
                   "null or an integer >= 0"))
        for name, ok, expected in checks:
            if not ok:
                raise InputError(f"must be {expected}", source=source, field=name,
                                 value=doc.get(name))
        return cls(list(doc.get("history", [])), None if best is None else float(best),
                   doc.get("stale_evals", 0), doc.get("stopped_early", False),
                   float(doc.get("wall_seconds", 0.0)), best_step)


def _history_ok(history: Any) -> bool:
    """Whether ``history`` is a list of points: a step (integer >= 0) and finite figures or
    null."""
    if not isinstance(history, list):
        return False
    for point in history:
        if not isinstance(point, dict) or not int_in(point.get("step"), 0, 10**10):
            return False
        if not all(v is None or is_finite(v) for k, v in point.items() if k != "step"):
            return False
    return True


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
        if not math.isfinite(ratio):
            return
        self.state.history.append({"step": self.num_timesteps, "train_ratio": ratio})
        self.tracker.log({"charts/train_cost_ratio": ratio,
                          "charts/episode_length": float(np.mean([e["l"] for e in episodes]))},
                         self.num_timesteps)


class ProgressCallback(BaseCallback):
    """After every rollout, tells ``advance`` how many environment steps it added (a
    progress display: :mod:`autoshard.progress`)."""

    def __init__(self, advance: Advance) -> None:
        super().__init__()
        self.advance = advance
        self.reported = 0

    def _init_callback(self) -> None:
        self.reported = self.model.num_timesteps

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.advance(self.num_timesteps - self.reported)
        self.reported = self.num_timesteps


class HeldOutEvalCallback(BaseCallback):
    """Every ``cfg.eval_every`` steps, evaluates the current policy on the held-out tasks as
    the ``ppo-policy`` sharder plans with it (:func:`evaluate_policy`, the evaluation the run's
    final comparison makes too), logs its mean cost ratio against the best greedy's, keeps the
    best policy in ``policy_dir`` and stops after ``cfg.patience`` evaluations without an
    improvement of ``cfg.min_delta``."""

    def __init__(self, cfg: TrainConfig, state: RunState, tracker: Tracker,
                 tasks: list[EvalTask], greedy: list[CompareRow], cost_model: CostModel,
                 multipliers: tuple[float, ...], policy_dir: Path) -> None:
        super().__init__()
        self.cfg, self.state, self.tracker = cfg, state, tracker
        self.tasks, self.greedy, self.cost_model = tasks, greedy, cost_model
        self.greedy_ratio = best_greedy_ratio(greedy)
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
        with tempfile.TemporaryDirectory(prefix="autoshard-eval-") as folder:
            save_policy(policy.net, folder, self.multipliers)
            rows = evaluate_policy(folder, self.tasks, self.cost_model)
        mean, step = mean_ratio(rows), self.num_timesteps
        self._log(rows, mean, step)
        best = self.state.best_ratio
        if mean is not None and (best is None or mean < best - self.cfg.min_delta):
            self.state.best_ratio, self.state.stale_evals = mean, 0
            self.state.best_step = step
            save_policy(policy.net, self.policy_dir, self.multipliers,
                        {"trained": {"steps": step, "held_out_cost_ratio": mean,
                                     "held_out_sharder": POLICY_SHARDER,
                                     "config": self.cfg.to_dict()}})
        else:
            self.state.stale_evals += 1
        if self.state.stale_evals >= self.cfg.patience:
            self.state.stopped_early = True
            return False
        return True

    def _log(self, rows: list[CompareRow], mean: float | None, step: int) -> None:
        """Records one evaluation in the history and the tracker (figures only where there
        is one: a failed task leaves the policy's mean out)."""
        greedy = self.greedy_ratio
        failed = sum(r.status != "ok" for r in rows)
        point: dict[str, Any] = {"step": step, "eval_ratio": mean, "greedy_ratio": greedy}
        if failed:
            point["failed_tasks"] = failed
        self.state.history.append(point)
        figures = {"eval/policy_cost_ratio": mean, "eval/best_greedy_cost_ratio": greedy,
                   "eval/policy_over_best_greedy": None if mean is None or greedy is None
                   else mean / greedy, "eval/policy_failed_tasks": float(failed)}
        self.tracker.log({k: v for k, v in figures.items() if v is not None}, step)
        table = [[r.task, r.sharder, r.cost_ratio] for r in rows + self.greedy
                 if r.status == "ok"]
        self.tracker.table("eval/cost_ratio_by_sharder", ["task", "sharder", "cost_ratio"],
                           table, step)


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

