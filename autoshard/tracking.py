"""Weights & Biases tracking, offline by default; wandb is imported only when tracking is on."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any, cast

from autoshard.errors import InputError
from autoshard.extras import require

#: The W&B modes every command and the training configuration accept.
WANDB_MODES = ("offline", "online", "disabled")


def check_wandb_mode(mode: str) -> None:
    """Fails unless ``mode`` is one of :data:`WANDB_MODES`; the error names ``wandb_mode``."""
    if mode not in WANDB_MODES:
        raise InputError(f"must be one of {', '.join(WANDB_MODES)}", field="wandb_mode",
                         value=mode)


def run_name(experiment: str, seed: int | None = None) -> str:
    """Runs are named by experiment, seed and time: ``ppo-s0-20261129-201500``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{experiment}-s{seed}-{stamp}" if seed is not None else f"{experiment}-{stamp}"


class Tracker:
    """A W&B run; every method is a no-op when ``mode`` is ``disabled``. Offline runs need no
    account (``wandb sync`` uploads them later); :meth:`finish` prints where the run was saved
    and the command that uploads it, for every command that tracks.

    Args:
        mode: ``offline``, ``online`` or ``disabled``.
        directory: Folder under which W&B writes its ``wandb/`` run directory.
        name: The run's display name (see :func:`run_name`).
        config: The whole configuration, logged once.
        project: W&B project.
        job_type: Kind of run (``train``, ``compare``, ...).
    """

    def __init__(self, mode: str, directory: Path, name: str, config: dict[str, Any],
                 project: str = "autoshard", job_type: str | None = None) -> None:
        check_wandb_mode(mode)
        self.run: Any = None
        self.name = name
        if mode == "disabled":
            return
        os.environ["WANDB_DIR"] = str(directory)
        os.environ.setdefault("WANDB_SILENT", "true")
        wandb = require("wandb", "tracking", "or set wandb_mode to 'disabled' "
                        "(--wandb-mode disabled)")
        directory.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(console="off", x_disable_stats=True)
        self.run = wandb.init(project=project, name=name, job_type=job_type, config=config,
                              mode=cast(Any, mode), dir=str(directory), settings=settings)

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def table(self, key: str, columns: list[str], rows: list[list[Any]],
              step: int | None = None) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Table(columns=list[Any](columns), data=rows)}, step=step)

    def image(self, key: str, path: Path, step: int | None = None) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Image(str(path))}, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        if self.run is not None:
            for k, v in values.items():
                self.run.summary[k] = v

    def where(self) -> str | None:
        """Where the run went, for the user: an offline run's folder and the command that
        uploads it, or an online run's address; None when tracking is off."""
        if self.run is None:
            return None
        if self.run.settings.mode == "offline" or getattr(self.run, "offline", False):
            folder = _shown(Path(self.run.settings.sync_dir))
            return (f"W&B: offline run saved in {folder}; upload it with: "
                    f"wandb sync {shlex.quote(folder)}")
        return f"W&B: run at {self.run.url}" if self.run.url else None

    def finish(self) -> str | None:
        """Ends the run and prints (and returns) where it went (:meth:`where`)."""
        if self.run is None:
            return None
        import wandb

        notice = self.where()
        self.run.finish()
        self.run = None
        wandb.teardown()  # stops the W&B service, which flushes the run files
        if notice:
            print(notice, flush=True)
        return notice


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it lies below it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())
