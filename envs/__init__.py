"""Gymnasium environments for sharding decisions; ``autoshard/Placement-v0`` is registered on
import."""

from gymnasium.envs.registration import register, registry

from autoshard.envs.placement import PlacementEnv
from autoshard.envs.sampler import TaskSampler

ENV_ID = "autoshard/Placement-v0"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="autoshard.envs.placement:PlacementEnv")

__all__ = ["ENV_ID", "PlacementEnv", "TaskSampler"]
