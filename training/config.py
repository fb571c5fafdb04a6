"""The training configuration: one dataclass with one line of documentation per field, and the
range of every number it holds (:data:`LIMITS`), checked whenever a config is made, so a bad
value is refused before a run folder exists."""

from __future__ import annotations

import functools
import inspect
import re
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.limits import (
    MAX_BATCH_SIZE,
    POLICY_HIDDEN,
    SEED,
    THREADS,
    Range,
    is_finite,
    is_int,
)
from autoshard.policy.refill import MODES as REFILL_MODES
from autoshard.reservation import check_reservation_names
from autoshard.task import MODES
from autoshard.tracking import check_wandb_mode

VEC_ENVS = ("batched", "dummy", "subproc")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on; saved with the run and logged to W&B.

    Every number lies in its range of :data:`LIMITS`; a pair ``(min, max)`` is ordered.

    Raises:
        InputError: A field of the wrong type or out of its range, naming the field, the value
            and the range.
    """

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
    fill: bool = False  # the last reward prices the plan with each device's HBM water-filled
    refill: str = "none"  # 'none', 'device' (each placement water-fills its device) or 'level'
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
        for f in fields(self):
            _check_field(f.name, _hints()[f.name], getattr(self, f.name))
        check_wandb_mode(self.wandb_mode)
        if self.vec_env not in VEC_ENVS:
            raise InputError(f"must be one of {', '.join(VEC_ENVS)}", field="vec_env",
                             value=self.vec_env)
        _check_names(self)
        if self.vec_env == "batched" and self.fill:
            raise InputError("the batched environment prices the plan as the episode left it; "
                             "use vec_env 'dummy' or 'subproc'", field="fill", value=self.fill)
        if self.refill not in REFILL_MODES:
            raise InputError(f"must be one of {', '.join(REFILL_MODES)}", field="refill",
                             value=self.refill)
        if self.vec_env == "batched" and self.refill != "none":
            raise InputError("the batched environment does not water-fill devices while it "
                             "places; use vec_env 'dummy' or 'subproc'", field="refill",
                             value=self.refill)
        if self.vec_env == "batched" and set(self.overheads) != {"none"}:
            raise InputError("the batched environment plays tasks without HBM reserved per "
                             "table; use vec_env 'dummy' or 'subproc'", field="overheads",
                             value=self.overheads)
        if max(self.train_devices) > self.max_devices:
            raise InputError(f"a training task has more devices than max_devices "
                             f"{self.max_devices}", field="train_devices",
                             value=self.train_devices)
        if self.rollout_steps * self.max_devices > MAX_ROLLOUT_SLOTS:
            raise InputError(f"n_envs x n_steps x max_devices is {self.rollout_steps:,} x "
                             f"{self.max_devices:,}, over {MAX_ROLLOUT_SLOTS:,} (the rollout "
                             "buffer holds one device block per slot and step, about 1 GB at "
                             "that size); lower n_steps", field="n_steps", value=self.n_steps)

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    @property
    def rollout_steps(self) -> int:
        """Steps of one rollout, all environments together: PPO collects whole rollouts."""
        return self.n_envs * self.n_steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any, source: str = "<config>") -> TrainConfig:
        """The config saved as ``doc`` (a run's ``config.json``); lists become tuples and
        missing fields keep their defaults.

        Raises:
            InputError: Not a mapping, an unknown field, or a bad value (named, with
                ``source``).
        """
        if not isinstance(doc, dict):
            raise InputError("expected a mapping of training config fields", source=source)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise InputError("unknown field", source=source, field=unknown[0])
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in doc.items()}
        try:
            return cls(**values)
        except InputError as exc:
            raise exc.located(source) from None


#: Slots of the training environment (the observation grows with them) and device counts of
#: evaluation tasks.
MAX_SLOTS = 1024
#: Tables of one training or evaluation task (each family's pool holds 2,800).
MAX_TASK_TABLES = 10_000
#: Steps of a run, and between evaluations or checkpoints.
MAX_STEPS = 10**9
#: Device slots of one rollout (n_envs x n_steps x max_devices): the observations SB3's rollout
#: buffer holds (about 65 floats a slot; 32x the default run's).
MAX_ROLLOUT_SLOTS = 1 << 22


def _ints(low: int, high: int) -> Range:
    return Range(low, high, integer=True)


#: The range of every number of :class:`TrainConfig` (for a tuple, of each element).
LIMITS: dict[str, Range] = {
    "seed": SEED,
    "timesteps": _ints(1, MAX_STEPS),
    "train_tables": _ints(1, MAX_TASK_TABLES),
    "train_devices": _ints(1, MAX_SLOTS),
    "hbm_fraction": Range(0, 100, open_low=True),
    "batch_sizes": _ints(1, MAX_BATCH_SIZE),
    "max_devices": _ints(1, MAX_SLOTS),
    "eval_tables": _ints(1, MAX_TASK_TABLES),
    "eval_devices": _ints(1, MAX_SLOTS),
    "eval_hbm_fraction": Range(0, 100, open_low=True),
    "eval_repeats": _ints(1, 100),
    "n_envs": _ints(1, 1024),
    "n_steps": _ints(1, 100_000),
    "batch_size": _ints(2, 1_000_000),  # advantages are normalised over a minibatch
    "n_epochs": _ints(1, 1000),
    "learning_rate": Range(0, 1, open_low=True),
    "gamma": Range(0, 1),
    "gae_lambda": Range(0, 1),
    "clip_range": Range(0, 1, open_low=True),
    "ent_coef": Range(0, 1),
    "vf_coef": Range(0, 10),
    "hidden": POLICY_HIDDEN,
    "torch_threads": THREADS,
    "eval_every": _ints(1, MAX_STEPS),
    "checkpoint_every": _ints(1, MAX_STEPS),
    "patience": _ints(1, 1_000_000),
    "min_delta": Range(0, 100),
}


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _kind_ok(kind: Any, value: Any) -> bool:
    """Whether ``value`` is of the scalar type ``kind`` (a float field takes an integer)."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return is_int(value)
    if kind is float:
        return is_finite(value)
    return isinstance(value, kind)


def _expected(kind: Any, limit: Range | None) -> str:
    """What a value of ``kind`` within ``limit`` is, in words."""
    if limit is not None:
        return str(limit)
    return {bool: "true or false", int: "an integer", float: "a number", str: "text"}[kind]


def _allowed(kind: Any, limit: Range | None, value: Any) -> bool:
    return _kind_ok(kind, value) and (limit is None or value in limit)


def _check_field(name: str, hint: Any, value: Any) -> None:
    """Fails unless ``value`` has the field's type and lies in its range; a pair (two
    elements) is a (min, max) range and must be ordered."""
    limit = LIMITS.get(name)
    if typing.get_origin(hint) is not tuple:
        if not _allowed(hint, limit, value):
            raise InputError(f"must be {_expected(hint, limit)}", field=name, value=value)
        return
    args = typing.get_args(hint)
    kind, pair = args[0], args[-1] is not Ellipsis
    what = "a (min, max) pair" if pair else "one or more values"
    if not isinstance(value, tuple) or not value or (pair and len(value) != len(args)):
        raise InputError(f"must be {what}, each {_expected(kind, limit)}", field=name,
                         value=value)
    if not all(_allowed(kind, limit, item) for item in value):
        raise InputError(f"each value must be {_expected(kind, limit)}", field=name,
                         value=value)
    if pair and value[0] > value[1]:
        raise InputError("the minimum exceeds the maximum", field=name, value=value)


def _check_names(cfg: TrainConfig) -> None:
    """Fails unless every named choice (modes, table styles, reservations) is known."""
    from autoshard.envs.sampler import STYLES

    for name, allowed in (("modes", MODES), ("eval_styles", STYLES)):
        unknown = [v for v in getattr(cfg, name) if v not in allowed]
        if unknown:
            raise InputError(f"each must be one of {', '.join(allowed)}", field=name,
                             value=getattr(cfg, name))
    check_reservation_names(cfg.overheads)


def field_help() -> dict[str, str]:
    """Each field's one-line documentation: the comment on its line of :class:`TrainConfig`."""
    source = inspect.getsource(TrainConfig)
    found = dict(re.findall(r"^    (\w+): [^=]+=.*?  # (.+)$", source, flags=re.M))
    return {f.name: found.get(f.name, "") for f in fields(TrainConfig)}
