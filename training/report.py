"""What a training run reports: the final comparison of its kept policy with the greedy
sharders, the files of the run folder (summary, history, evaluation, figures), the tracker's
summary and the line the command prints.

Every figure is finite: where no evaluation ran, or the policy found no plan for some task,
the figure is null in the files and said in words on the terminal.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from autoshard.compare.harness import COLUMNS, CompareRow
from autoshard.fileio import atomic_write_text, csv_text, write_structured
from autoshard.machine import describe_machine
from autoshard.policy.network import load_policy
from autoshard.pricing.cost import CostModel
from autoshard.training.callbacks import RunState
from autoshard.training.config import TrainConfig
from autoshard.training.evaluation import (
    POLICY_SHARDER,
    EvalTask,
    best_greedy_ratio,
    evaluate_policy,
    mean_ratio,
)
from autoshard.training.plots import comparison, training_curve
from autoshard.training.wandb_runs import Tracker


@dataclass(frozen=True)
class TrainResult:
    """What a training run produced.

    Args:
        run_dir: The run folder.
        steps: Environment steps the run has done (all sessions).
        steps_asked: The steps asked for (``timesteps``).
        steps_before: Steps done before this session (a resumed run's).
        wall_seconds: Training wall time over all sessions.
        stopped_early: Whether early stopping ended the run.
        best_ratio: The best held-out figure of the evaluations during training (None: none
            gave one).
        policy_dir: The kept policy: the best evaluated one, else the last.
        held_out_ratio: The kept policy's held-out figure in the final comparison (None: it
            found no plan for some task); the best figure again when an evaluation kept it.
        held_out_tasks: Held-out tasks of each figure.
        steps_note: Why ``steps`` differs from ``steps_asked`` ('' where it does not).
        held_out_note: Why a held-out figure is None ('' where none is).
        results: The final comparison's rows (the policy's, then the greedy sharders').
        kept_step: The step whose policy is kept: the best evaluation's (0: the starting
            policy of a fine-tuning run, which no later evaluation beat), else the last step;
            None where unknown (a run resumed from a checkpoint that did not record it).
    """

    run_dir: Path
    steps: int
    steps_asked: int
    steps_before: int
    wall_seconds: float
    stopped_early: bool
    best_ratio: float | None
    policy_dir: Path
    held_out_ratio: float | None = None
    held_out_tasks: int = 0
    steps_note: str = ""
    held_out_note: str = ""
    results: list[CompareRow] = field(default_factory=list)
    kept_step: int | None = None


def finish(cfg: TrainConfig, result: TrainResult, tasks: list[EvalTask],
           greedy_results: list[CompareRow], cost_model: CostModel, state: RunState,
           tracker: Tracker) -> TrainResult:
    """Final comparison of the kept policy (as :data:`POLICY_SHARDER` plans with it, the
    evaluation made during training) with the greedy sharders; writes the run's files and
    closes the tracker. Returns ``result`` with the comparison and the notes."""
    policy_rows = evaluate_policy(result.policy_dir, tasks, cost_model)
    results = policy_rows + greedy_results
    result = replace(result, held_out_ratio=mean_ratio(policy_rows), held_out_tasks=len(tasks),
                     results=results)
    evaluated = any("eval_ratio" in h for h in state.history)
    result = replace(result, steps_note=steps_note(cfg, result),
                     held_out_note=held_out_note(cfg, result, evaluated))
    run_dir = result.run_dir
    write_structured(run_dir / "history.json", state.history)
    write_structured(run_dir / "summary.json",
                     summary(cfg, result, best_greedy_ratio(greedy_results)))
    atomic_write_text(run_dir / "eval.csv", results_csv(results))
    curve = training_curve(state.history, run_dir / "training_curve.png",
                           f"{cfg.experiment}, seed {cfg.seed}: {result.steps:,} steps")
    plot = comparison(results, run_dir / "comparison.png",
                      f"validation tasks (held-out tables); policy as {POLICY_SHARDER}")
    step = result.steps
    tracker.table("final/cost_ratio_by_sharder", COLUMNS, [_cells(r) for r in results], step)
    tracker.image("final/comparison", plot, step)
    tracker.image("final/training_curve", curve, step)
    final = {"final/policy_cost_ratio": result.held_out_ratio, "steps": step,
             "wall_seconds": result.wall_seconds, "stopped_early": result.stopped_early}
    tracker.summary({k: v for k, v in final.items() if v is not None})
    tracker.finish()
    return result


def summary(cfg: TrainConfig, result: TrainResult, greedy: float | None) -> dict[str, Any]:
    """The run's ``summary.json``: steps run and asked, and the held-out figures (null, with
    a note, where there is none)."""
    return {"steps": result.steps, "steps_asked": result.steps_asked,
            "rollout_steps": cfg.rollout_steps, "steps_note": result.steps_note,
            "wall_seconds": round(result.wall_seconds, 1), "stopped_early": result.stopped_early,
            "held_out_sharder": POLICY_SHARDER, "held_out_tasks": result.held_out_tasks,
            "held_out_measure": "mean over the tasks of step cost / lower bound",
            "best_held_out_ratio": result.best_ratio, "held_out_ratio": result.held_out_ratio,
            "kept_policy_step": result.kept_step, "kept_policy": kept_words(cfg, result),
            "best_greedy_held_out_ratio": greedy, "held_out_note": result.held_out_note,
            "n_envs": cfg.n_envs, "vec_env": cfg.vec_env, "machine": describe_machine()}


def steps_note(cfg: TrainConfig, result: TrainResult) -> str:
    """Why the steps run differ from those asked ('' where they do not)."""
    asked = f"{result.steps_asked:,} asked"
    if result.steps == result.steps_asked:
        return ""
    if result.steps_before >= result.steps_asked:
        return f"{asked}; the run had already done {result.steps_before:,}"
    if result.stopped_early:
        return f"{asked}; stopped early after {cfg.patience} evaluations without improvement"
    if result.steps > result.steps_asked:
        return (f"{asked}; PPO collects whole rollouts of {cfg.n_envs} x {cfg.n_steps} = "
                f"{cfg.rollout_steps:,} steps, so the request was rounded up")
    return f"{asked}; interrupted"


def held_out_note(cfg: TrainConfig, result: TrainResult, evaluated: bool) -> str:
    """Why a held-out figure is missing ('' where both are there); ``evaluated``: whether
    any evaluation ran during training."""
    notes = []
    if result.best_ratio is None and not evaluated:
        notes.append(f"no evaluation ran during training (one every {cfg.eval_every:,} "
                     f"steps), so the kept policy is the last one")
    elif result.best_ratio is None:
        notes.append("no evaluation during training found a plan for every held-out task, "
                     "so the kept policy is the last one")
    if result.held_out_ratio is None:
        notes.append(f"the kept policy found no plan for some held-out task as "
                     f"{POLICY_SHARDER}")
    return "; ".join(notes)


def kept_words(cfg: TrainConfig, result: TrainResult) -> str:
    """Which step's policy is kept, and why, in words."""
    step = result.kept_step
    if step is None:
        return "the best evaluated policy (its step not recorded)"
    if result.best_ratio is None:
        return f"the last policy, of step {step:,}"
    if step == 0:
        if result.steps - result.steps_before < cfg.eval_every:
            return ("the starting policy (step 0), unchanged: no evaluation ran during "
                    f"training (one every {cfg.eval_every:,} steps)")
        return ("the starting policy (step 0), unchanged: no evaluation during training "
                f"improved on it by min_delta {cfg.min_delta:g}")
    later = "" if step == result.steps else (
        f"; later evaluations did not improve on it by min_delta {cfg.min_delta:g}")
    return f"the best evaluated policy, of step {step:,}{later}"


def describe(result: TrainResult, cfg: TrainConfig | None = None) -> str:
    """The line ``autoshard train`` prints: steps run (and why they differ from those asked),
    time, the held-out figure or why there is none, and where the policy is."""
    steps = f"trained {result.steps:,} steps"
    if result.steps_note:
        steps += f" ({result.steps_note})"
    steps += f" in {result.wall_seconds:.0f} s"
    tasks = f"{result.held_out_tasks} held-out task{'s' if result.held_out_tasks != 1 else ''}"
    over = f"({POLICY_SHARDER}, mean over {tasks})"
    if result.best_ratio is not None:
        figure = f"best held-out cost ratio {result.best_ratio:.3f} {over}"
        figure += f"; {result.held_out_note}" if result.held_out_note else ""
    elif result.held_out_ratio is not None:
        figure = f"{result.held_out_note}: held-out cost ratio {result.held_out_ratio:.3f} {over}"
    else:
        figure = result.held_out_note
    kept = f"; kept {kept_words(cfg, result)}" if cfg is not None else ""
    return f"{steps}; {figure}{kept}; policy in {result.policy_dir}"


def results_csv(results: list[CompareRow]) -> str:
    """The comparison as CSV; a figure a failed row lacks is an empty cell, never NaN."""
    return csv_text((dict(zip(COLUMNS, _cells(r), strict=True)) for r in results), COLUMNS)


def _cells(row: CompareRow) -> list[Any]:
    """A row's values in :data:`COLUMNS` order, non-finite figures as empty cells."""
    return ["" if isinstance(v, float) and not math.isfinite(v) else v
            for v in asdict(row).values()]


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
