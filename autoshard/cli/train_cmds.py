"""`autoshard train`: trains the placement policy of the `ppo` sharder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoshard.cli import app
from autoshard.cli.common import CostModelOpt, console


@app.command()
def train(
    timesteps: Annotated[int, typer.Option(help="Total environment steps.")] = 300_000,
    seed: Annotated[int, typer.Option(help="Seed of everything random in the run.")] = 0,
    out: Annotated[Path, typer.Option(help="Run folder (checkpoints, policy, logs).")] = Path(
        "runs/ppo"),
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the run in --out from its last checkpoint.")] = False,
    wandb_mode: Annotated[str, typer.Option(
        help="W&B tracking: offline (default, no account needed), online or disabled.")
    ] = "offline",
    export: Annotated[Path | None, typer.Option(
        help="Also copy the best policy, curve and evaluation here (e.g. results/ppo).")
    ] = None,
    experiment: Annotated[str, typer.Option(help="Run name prefix.")] = "ppo",
    n_envs: Annotated[int, typer.Option(help="Parallel environments.")] = 2,
    vec_env: Annotated[str, typer.Option(help="dummy (in process) or subproc.")] = "dummy",
    n_steps: Annotated[int, typer.Option(help="Steps per environment per rollout.")] = 256,
    batch_size: Annotated[int, typer.Option(help="PPO minibatch size.")] = 256,
    eval_every: Annotated[int, typer.Option(help="Steps between held-out evaluations.")
                          ] = 20_000,
    checkpoint_every: Annotated[int, typer.Option(help="Steps between checkpoints.")] = 20_000,
    patience: Annotated[int, typer.Option(
        help="Evaluations without improvement before stopping early.")] = 6,
    train_tables: Annotated[tuple[int, int], typer.Option(
        help="Tables per training task: min max.")] = (20, 100),
    train_devices: Annotated[list[int] | None, typer.Option(
        help="Device counts of training tasks (repeatable).")] = None,
    max_devices: Annotated[int | None, typer.Option(
        help="Device slots of the training environment.")] = None,
    eval_tables: Annotated[list[int] | None, typer.Option(
        help="Tables per evaluation task (repeatable).")] = None,
    eval_devices: Annotated[list[int] | None, typer.Option(
        help="Devices per evaluation task (repeatable).")] = None,
    cost_model: CostModelOpt = "analytical",
) -> None:
    """Train the `ppo` sharder's policy with MaskablePPO on autoshard/Placement-v0."""
    from training.config import TrainConfig, default_field
    from training.train import train as run_training

    cfg = TrainConfig(
        experiment=experiment, seed=seed, timesteps=timesteps, out=str(out),
        wandb_mode=wandb_mode, n_envs=n_envs, vec_env=vec_env, n_steps=n_steps,
        batch_size=batch_size,
        eval_every=eval_every, checkpoint_every=checkpoint_every, patience=patience,
        train_tables=(train_tables[0], train_tables[1]),
        train_devices=tuple(train_devices) if train_devices else default_field("train_devices"),
        max_devices=max_devices or max(train_devices or default_field("train_devices")),
        eval_tables=tuple(eval_tables) if eval_tables else default_field("eval_tables"),
        eval_devices=tuple(eval_devices) if eval_devices else default_field("eval_devices"),
        cost_model=cost_model)
    result = run_training(cfg, resume=resume, export=export)
    console.print(f"trained {result.steps:,} steps in {result.wall_seconds:.0f} s"
                  f"{' (stopped early)' if result.stopped_early else ''}; best held-out cost "
                  f"ratio {result.best_ratio:.3f}; policy in {result.policy_dir}"
                  + (f"; exported to {export}" if export else ""))
