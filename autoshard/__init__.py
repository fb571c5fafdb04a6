"""autoshard: places the embedding tables of recommendation models on devices and memory tiers."""

from autoshard.errors import InputError, PlannerError
from autoshard.hardware import HardwareProfile, load_hardware
from autoshard.layout.plan import Placement, Plan
from autoshard.tables import Table, load_tables
from autoshard.task import ShardingTask, Workload

__version__ = "0.1.0"

__all__ = [
    "HardwareProfile",
    "InputError",
    "Placement",
    "Plan",
    "PlannerError",
    "ShardingTask",
    "Table",
    "Workload",
    "load_hardware",
    "load_tables",
]
