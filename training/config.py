"""The training configuration: one dataclass, one line of documentation per field."""

from __future__ import annotations

import inspect
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.reservation import check_reservation_names
from autoshard.tracking import check_wandb_mode

VEC_ENVS = ("batched", "dummy", "subproc")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on; saved with the run and logged to W&B."""

    experiment: str = "ppo"  # run name prefix (runs are named experiment-seed-time)
    seed: int = 0  # seeds Python, NumPy, torch and the environments
    timesteps: int = 300_000  # total environment steps (all environments together)
    out: str = "runs/ppo"  # run folder: checkpoints, history, policy, plots, W&B files
    # -- tasks (training draws the "train" family, selection the "validation" one) -----------
    train_tables: tuple[int, int] = (4, 1000)  # tables per training task (min, max; log-uniform)
    train_devices: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16, 24, 32)  # device counts drawn
    hbm_fraction: tuple[float, float] = (0.05, 3.0)  # share of a task's bytes its HBM holds
    batch_sizes: tuple[int, ...] = (4096, 16384, 65536, 262144)  # global batch sizes drawn
    modes: tuple[str, ...] = ("train", "infer")  # workload modes drawn
    overheads: tuple[str, ...] = ("none",)  # HBM reserved per table drawn ('torchrec': its buffers)
    max_devices: int = 32  # device slots of the training environment
    eval_tables: tuple[int, ...] = (50, 200)  # tables per evaluation task (validation family)
    eval_devices: tuple[int, ...] = (4, 16, 64)  # device counts of evaluation tasks (64 unseen)
    eval_hbm_fraction: float = 0.3  # HBM share of evaluation tasks
    eval_repeats: int = 2  # evaluation tasks per (tables, devices) pair
    eval_styles: tuple[str, ...] = ("mixed", "profiled")  # table styles of evaluation tasks
    cost_model: str = "analytical"  # 'analytical' or a learned cost model folder
    split: bool = False  # actions also choose which dominant tables to split
    # -- PPO -----------------------------------------------------------------------------------
    n_envs: int = 16  # episodes played at once (the batch of 'batched', else one env each)
    vec_env: str = "batched"  # 'batched' (numpy over all episodes), 'dummy' or 'subproc'
    n_steps: int = 256  # steps per environment per rollout
    batch_size: int = 256  # minibatch size
    n_epochs: int = 4  # passes over each rollout
    learning_rate: float = 3e-4  # Adam step size (at the start)
    anneal_lr: bool = True  # decay the step size linearly to 0 over the run's timesteps
    gamma: float = 1.0  # discount (1: the return is exactly -cost/bound)
    gae_lambda: float = 0.95  # GAE smoothing
    clip_range: float = 0.2  # PPO ratio clip
    ent_coef: float = 0.01  # entropy bonus
    vf_coef: float = 0.5  # value loss weight
    hidden: int = 64  # width of the policy network's hidden layers
    init_policy: str = ""  # policy folder whose weights a new run starts from ('': random)
    torch_threads: int = 1  # torch intra-op threads of the learner
    # -- evaluation, checkpoints, early stop ---------------------------------------------------
    eval_every: int = 20_000  # steps between evaluations on the held-out tasks
    checkpoint_every: int = 20_000  # steps between checkpoints (resume point)
    patience: int = 6  # evaluations without improvement before stopping early
    min_delta: float = 0.002  # improvement of the mean cost ratio that counts
    wandb_mode: str = "offline"  # W&B tracking: offline (default), online or disabled
    wandb_project: str = "autoshard"  # W&B project name

    def __post_init__(self) -> None:
        check_wandb_mode(self.wandb_mode)
        if self.vec_env not in VEC_ENVS:
            raise InputError(f"must be one of {', '.join(VEC_ENVS)}", field="vec_env",
                             value=self.vec_env)
        for name in ("timesteps", "n_envs", "n_steps", "batch_size", "n_epochs", "eval_every",
                     "checkpoint_every", "max_devices", "hidden"):
            if getattr(self, name) < 1:
                raise InputError("must be >= 1", field=name, value=getattr(self, name))
        check_reservation_names(self.overheads)
        if self.vec_env == "batched" and set(self.overheads) != {"none"}:
            raise InputError("the batched environment plays tasks without HBM reserved per "
                             "table; use vec_env 'dummy' or 'subproc'", field="overheads",
                             value=self.overheads)
        if max(self.train_devices) > self.max_devices:
            raise InputError(f"a training task has more devices than max_devices "
                             f"{self.max_devices}", field="train_devices",
                             value=self.train_devices)

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], source: str = "<config>") -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise InputError("unknown field", source=source, field=unknown[0])
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in doc.items()}
        return cls(**values)



def field_help() -> dict[str, str]:
    """Each field's one-line documentation: the comment on its line of :class:`TrainConfig`."""
    source = inspect.getsource(TrainConfig)
    found = dict(re.findall(r"^    (\w+): [^=]+=.*?  # (.+)$", source, flags=re.M))
    return {f.name: found.get(f.name, "") for f in fields(TrainConfig)}
