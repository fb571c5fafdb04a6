"""N placement episodes stepped at once: a Stable-Baselines3 ``VecEnv`` whose step is numpy over
the batch.

:class:`BatchedPlacementEnv` plays exactly the episodes of N copies of ``autoshard/Placement-v0``
in SB3's ``DummyVecEnv`` with the same seeds: the same observations, masks, rewards,
terminations and ``info`` entries, step by step, auto-reset included. Each slot keeps its own
:class:`autoshard.envs.placement.PlacementEnv` for what happens once per episode (drawing the
task from its own random generator, pricing it, the first observation, the final plan and
report); every step in between runs on (N, devices, buckets) arrays: the placement's memory and load
bookkeeping (:class:`autoshard.layout.placement.PlacementState`'s arithmetic), the observation of
:class:`autoshard.policy.episode.PlacementEpisode` and the pricing of the "fill" bucket,
in one cost-model call for the batch when the model can price rows of several tasks at once
(:meth:`autoshard.pricing.analytical.AnalyticalCostModel.price_terms`), else one call per episode.

MaskablePPO reads the masks through ``env_method("action_masks")``, which is answered from the
batch's mask array without touching the slots.

With ``split=True`` the slots play choice episodes (the split choice in the actions,
:mod:`autoshard.policy.choice`), stepped by
:class:`autoshard.envs.batched_choice.ChoiceArrays`, exactly as that many
``PlacementEnv(split=True)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from autoshard.envs.batched_arrays import EpisodeArrays
from autoshard.envs.batched_choice import ChoiceArrays
from autoshard.envs.placement import ILLEGAL_PENALTY, PlacementEnv, final_info
from autoshard.envs.sampler import TaskSampler
from autoshard.errors import InputError, PlannerError, gib
from autoshard.layout.plan import Plan
from autoshard.policy.buckets import MULTIPLIERS
from autoshard.policy.episode import LIMIT, PlacementEpisode
from autoshard.policy.features import nearest_legal
from autoshard.policy.observation import bounded
from autoshard.pricing.cost import CostModel, load_cost_model


class BatchedPlacementEnv(VecEnv):
    """``num_envs`` placement episodes as one SB3 vectorised environment.

    Args:
        num_envs: Episodes stepped at once (the batch).
        sampler, cost_model, max_devices, multipliers, report, sharder_name, split: As for
            :class:`autoshard.envs.placement.PlacementEnv` (one sampler and one cost model
            serve every slot).
    """

    def __init__(self, num_envs: int, sampler: TaskSampler | None = None,
                 cost_model: CostModel | str | None = None, max_devices: int | None = None,
                 multipliers: tuple[float, ...] = MULTIPLIERS, report: bool = True,
                 sharder_name: str = "env", split: bool = False) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        model = (cost_model if cost_model is not None and not isinstance(cost_model, str)
                 else load_cost_model(cost_model))
        sampler = sampler if sampler is not None else TaskSampler()
        if set(sampler.overheads) != {"none"}:
            raise InputError("the batched environment plays tasks without HBM reserved per "
                             "table; play these in PlacementEnv (SB3's DummyVecEnv)",
                             field="overheads", value=sampler.overheads)
        self.envs = [PlacementEnv(sampler, model, max_devices, multipliers, report, sharder_name,
                                  split) for _ in range(num_envs)]
        first = self.envs[0]
        self.cost_model, self.layout, self.buckets = model, first.layout, first.buckets
        super().__init__(num_envs, first.observation_space, first.action_space)
        self.split = split
        self.arrays = (ChoiceArrays if split else EpisodeArrays)(num_envs, self.layout,
                                                                 self.buckets, model)
        self._actions = np.zeros(num_envs, dtype=np.int64)

    # -- VecEnv --------------------------------------------------------------------------------

    def reset(self) -> VecEnvObs:
        out = np.empty((self.num_envs, self.layout.size), dtype=np.float32)
        for n in range(self.num_envs):
            out[n] = self._start(n, self._seeds[n], self._options[n] or None)
        self._reset_seeds()
        self._reset_options()
        return out

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions).reshape(self.num_envs).astype(np.int64)

    def step_wait(self) -> VecEnvStepReturn:
        arr, size = self.arrays, self.layout.max_devices * self.layout.buckets
        wanted = self._actions
        outside = np.flatnonzero((wanted < 0) | (wanted >= size))
        if outside.size:
            a = int(wanted[outside[0]])
            raise ValueError(f"action {a} of episode {outside[0]} is outside [0, {size})")
        illegal = ~arr.mask[np.arange(self.num_envs), wanted]
        played = wanted.copy()
        for slot in np.flatnonzero(illegal).tolist():
            played[slot] = nearest_legal(int(wanted[slot]), arr.mask[slot],
                                         arr.options[slot, :arr.devices[slot]], self.layout)
        rewards = arr.place(played) - np.where(illegal, ILLEGAL_PENALTY, 0.0)
        done = arr.step == arr.tables
        self._observe(done)
        out = bounded(arr.obs, LIMIT)
        masks = arr.mask.copy()
        infos: list[dict[str, Any]] = [
            {"action_mask": masks[n], "illegal_action": bad, "action": a,
             "TimeLimit.truncated": False}
            for n, (bad, a) in enumerate(zip(illegal.tolist(), played.tolist(), strict=True))]
        for n in np.flatnonzero(done).tolist():
            rewards[n] -= self._finish(n, infos[n])
            infos[n]["terminal_observation"] = out[n].copy()
            out[n] = self._start(n, None, None)
        return out, rewards.astype(np.float32), done, infos

    def action_masks(self) -> np.ndarray:
        """The allowed actions of every episode, [num_envs, actions] (a copy)."""
        return self.arrays.mask.copy()

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        """``action_masks`` is answered from the batch's arrays; other methods run on the
        slots' environments, which hold each episode's task but not its progress."""
        idx = list(self._get_indices(indices))
        if method_name == "action_masks":
            return list(self.arrays.mask[idx].copy())
        return [getattr(self.envs[i], method_name)(*method_args, **method_kwargs) for i in idx]

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [getattr(self.envs[i], attr_name) for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for i in self._get_indices(indices):
            setattr(self.envs[i], attr_name, value)

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None for _ in range(self.num_envs)]

    def close(self) -> None:
        for env in self.envs:
            env.close()

    # -- episodes ------------------------------------------------------------------------------

    def _start(self, n: int, seed: int | None, options: dict[str, Any] | None) -> np.ndarray:
        """Starts slot ``n``'s next episode through its environment; returns its observation."""
        obs, info = self.envs[n].reset(seed=seed, options=options)
        episode = self.envs[n].episode
        assert isinstance(episode, PlacementEpisode)
        self.arrays.load(n, episode)
        self.reset_infos[n] = info
        return obs

    def _finish(self, n: int, info: dict[str, Any]) -> float:
        """Adds slot ``n``'s final plan (and report) to ``info``; returns the last reward's
        settlement (see :class:`autoshard.envs.placement.PlacementEnv`)."""
        arr, env = self.arrays, self.envs[n]
        episode = env.episode
        assert episode is not None
        task, t, d = episode.task, arr.tables[n], arr.devices[n]
        if isinstance(arr, ChoiceArrays):
            plan = arr.layout_of(n).to_plan(task, env.sharder_name)
        else:
            plan = Plan.from_arrays(task, arr.placed_device[n, :t].copy(),
                                    arr.placed_rows[n, :t].copy(), env.sharder_name)
        summed = float(arr.load_ms[n, :d].max())
        lb = float(arr.lower_bound[n])
        info.update(final_info(task, plan, summed, lb, self.cost_model, env.report))
        return float((info["step_cost_ms"] - summed) / lb)

    def _observe(self, done: np.ndarray) -> None:
        """Writes every episode's observation and mask for its next table (cleared where the
        episode is over)."""
        arr = self.arrays
        arr.observe_summary()
        live = ~done
        arr.gather_current(live)
        arr.offer_fill(live)
        fits = arr.fits()
        allowed = fits.any(axis=(1, 2))
        if isinstance(arr, ChoiceArrays):
            arr.offer_split(live)
            allowed |= arr.split_fits.any(axis=(1, 2))
        stuck = np.flatnonzero(live & ~allowed)
        if stuck.size:
            n = int(stuck[0])
            task, t = self.envs[n].task, int(arr.current_table[n])
            assert task is not None
            raise PlannerError("capacity", f"table '{task.tables[t].name}' fits on no device "
                               f"(largest free host memory "
                               f"{gib(arr.free_host[n, :arr.devices[n]].max())})")
        arr.observe_options(fits)
        arr.clear(done)

