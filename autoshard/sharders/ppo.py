"""The learned sharder: a trained MaskablePPO placement policy, one policy call per table.

The policy is read safely: a JSON config and a plain state dict of tensors
(``torch.load(weights_only=True)``), never a pickle. By default it is the policy committed
as package data under ``autoshard/data/ppo_policy``; ``policy=`` names another folder (e.g. the
``policy`` folder of an ``autoshard train`` run).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, ClassVar

import autoshard
from autoshard.cost import CostModel
from autoshard.errors import InputError
from autoshard.plan import Plan
from autoshard.task import ShardingTask

#: The committed policy, shipped as package data (``autoshard train --export`` writes one).
DEFAULT_POLICY = Path(autoshard.__file__).resolve().parent / "data" / "ppo_policy"


def _missing(folder: Path) -> str | None:
    """Why no policy can be loaded from ``folder`` (None if the files are there)."""
    for module in ("torch", "gymnasium"):
        if importlib.util.find_spec(module) is None:
            return f"the '{module}' package is not installed"
    for name in ("config.json", "weights.pt"):
        if not (folder / name).is_file():
            return (f"no trained policy: {folder / name} is missing (train one with "
                    f"`autoshard train --export results/ppo`, or pass policy=<folder>)")
    return None


class PPOSharder:
    """Plans with a trained placement policy: tables costliest first, each placed on the
    (device, HBM-split bucket) with the highest allowed logit; deterministic. The policy is
    loaded when the sharder is made.

    Args:
        policy: Folder with ``config.json`` and ``weights.pt`` (default: the committed one).
        threads: torch threads for the policy (1: one CPU core).
    """

    name: ClassVar[str] = "ppo"
    summary: ClassVar[str] = "learned MaskablePPO placement policy (one policy call per table)"

    def __init__(self, policy: str | Path | None = None, threads: int = 1) -> None:
        self.policy = Path(policy) if policy is not None else DEFAULT_POLICY
        self.threads = threads
        self._net: Any = None
        self._multipliers: tuple[float, ...] = ()
        self._load()  # load (and import torch) now, so that shard() is planning only

    @classmethod
    def unavailable(cls, policy: str | Path | None = None) -> str | None:
        """Why the policy in ``policy`` (default: the committed one) cannot be loaded here."""
        return _missing(Path(policy) if policy is not None else DEFAULT_POLICY)

    def _load(self) -> None:
        reason = _missing(self.policy)
        if reason:
            raise InputError(reason, field="policy", value=str(self.policy))
        from training.policy import load_policy

        self._net, self._multipliers, _ = load_policy(self.policy)

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        import torch

        from training.evaluation import plan_task

        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return plan_task(self._net, self._multipliers, task, cost_model, self.name)
        finally:
            torch.set_num_threads(before)
