"""Weights & Biases tracking, offline by default; wandb is imported only when tracking is on."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, cast

from autoshard.errors import InputError

WANDB_MODES = ("offline", "online", "disabled")


def run_name(experiment: str, seed: int | None = None) -> str:
    """Runs are named by experiment, seed and time: ``ppo-s0-20261129-201500``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{experiment}-s{seed}-{stamp}" if seed is not None else f"{experiment}-{stamp}"


def start_run(experiment: str, config: dict[str, Any], mode: str, directory: Path,
              seed: int | None = None, project: str = "autoshard") -> Any | None:
    """Starts a W&B run (None when ``mode`` is disabled). Offline runs need no account.

    Args:
        experiment: Experiment name (job type and name prefix).
        config: The whole configuration, logged once.
        mode: ``offline`` (default elsewhere), ``online`` or ``disabled``.
        directory: Folder under which W&B writes its ``wandb/`` run directory.
        seed: Seed, part of the run name.
        project: W&B project.
    """
    if mode not in WANDB_MODES:
        raise InputError(f"must be one of {', '.join(WANDB_MODES)}", field="wandb_mode",
                         value=mode)
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    directory.mkdir(parents=True, exist_ok=True)
    return wandb.init(project=project, name=run_name(experiment, seed), job_type=experiment,
                      config=config, mode=cast(Any, mode), dir=str(directory),
                      reinit="finish_previous")
