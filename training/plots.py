"""Figures of a training run: the training curve and the final comparison of sharders."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.compare.harness import CompareRow
from autoshard.fileio import save_figure


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def training_curve(history: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Held-out mean cost ratio of the policy (as the ``ppo-policy`` sharder plans with it:
    the figure of ``summary.json`` and ``eval.csv``) against the best greedy, and the training
    episodes' mean cost ratio, over environment steps."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    train = [h for h in history if "train_ratio" in h]
    evals = [h for h in history if h.get("eval_ratio") is not None]  # None: a task failed
    greedy = [h["greedy_ratio"] for h in history if h.get("greedy_ratio") is not None]
    if train:
        ax.plot([h["step"] for h in train], [h["train_ratio"] for h in train], color="0.6",
                lw=1, label="training episodes (mean, train tables)")
    if evals:
        ax.plot([h["step"] for h in evals], [h["eval_ratio"] for h in evals], "o-",
                color="C0", label="policy as ppo-policy, held-out tasks (mean)")
    if greedy:
        ax.axhline(greedy[-1], color="C3", ls="--", label="best greedy, held-out tasks (mean)")
    ax.axhline(1.0, color="k", lw=0.8, ls=":", label="lower bound")
    ax.set_yscale("log")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("step cost / lower bound")
    ax.set_title(title or "MaskablePPO placement policy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def comparison(results: list[CompareRow], path: Path, title: str = "") -> Path:
    """Mean cost ratio per sharder for every (tables, devices) group, log scale."""
    plt = _pyplot()
    groups = sorted({(r.tables, r.devices) for r in results})
    sharders = list(dict.fromkeys(r.sharder for r in results))
    values: dict[tuple[str, tuple[int, int]], list[float]] = defaultdict(list)
    for r in results:
        values[r.sharder, (r.tables, r.devices)].append(
            r.cost_ratio if r.status == "ok" else np.nan)
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(groups) + 3), 4))
    width = 0.8 / max(len(sharders), 1)
    x = np.arange(len(groups))
    for i, name in enumerate(sharders):
        ax.bar(x + i * width, [np.nanmean(values[name, g]) if values[name, g] else np.nan
                               for g in groups], width, label=name)
    ax.set_xticks(x + 0.4 - width / 2, [f"{t} tables\n{d} devices" for t, d in groups],
                  fontsize=8)
    ax.set_yscale("log")
    ax.axhline(1.0, color="k", lw=0.8, ls=":")
    ax.set_ylabel("step cost / lower bound")
    ax.set_title(title or "held-out tasks")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def imitation_curves(history: list[dict[str, Any]], path: Path) -> Path:
    """An imitation run (:mod:`autoshard.training.imitate_run`): the set loss per epoch over
    its rounds, and the validation mean cost ratio of the policy alone (with and without
    TorchRec's room) after each round."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    losses = [x for h in history if "losses" in h for x in h["losses"]]
    left.plot(range(1, len(losses) + 1), losses, color="C0")
    left.set_xlabel("epoch (all rounds)")
    left.set_ylabel("-log P(expert's actions)")
    evals = [h for h in history if "validation_mean" in h]
    names = [str(h["round"]) for h in evals]
    for key, label, color in (("validation_mean", "all validation tasks", "C0"),
                              ("validation_room_mean", "with TorchRec's room", "C3")):
        right.plot(names, [h[key] if h[key] is not None else np.nan for h in evals], "o-",
                   color=color, label=label)
    right.set_xlabel("round (start: the committed policy)")
    right.set_ylabel("policy alone: step cost / bound (mean)")
    right.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path
