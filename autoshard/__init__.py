"""autoshard: places the embedding tables of recommendation models on devices and memory tiers.

From Python (docs/library.md): load tables and hardware, build a :class:`ShardingTask`, then
:func:`plan` it (a :class:`Planned` value: the plan and its cost report) and :func:`export` the
plan for a training framework; re-plan from the plan in use with ``plan(..., previous=...,
move_budget=MoveBudget(...))``. ``plan``, ``Planned``, ``export`` and ``MoveBudget`` are
imported when first used, so that ``import autoshard`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from autoshard.errors import InputError, PlannerError
from autoshard.hardware import HardwareProfile, load_hardware
from autoshard.layout.plan import Placement, Plan
from autoshard.tables import Table, load_tables
from autoshard.task import ShardingTask, Workload

__version__ = "0.1.0"

#: Names imported from their owner module when first used.
_LAZY = {"plan": "autoshard.planning", "Planned": "autoshard.planning",
         "export": "autoshard.exporting", "MoveBudget": "autoshard.replan.budget"}

__all__ = [
    "HardwareProfile",
    "InputError",
    "MoveBudget",
    "Placement",
    "Plan",
    "Planned",
    "PlannerError",
    "ShardingTask",
    "Table",
    "Workload",
    "export",
    "load_hardware",
    "load_tables",
    "plan",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autoshard' has no attribute {name!r}")
