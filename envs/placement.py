"""A Gymnasium environment that places a task's tables one by one on devices and memory tiers."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from autoshard.bounds import lower_bound_ms
from autoshard.cost import CostModel, load_cost_model
from autoshard.errors import PlannerError, gib
from autoshard.evaluator import evaluate
from autoshard.placement import PlacementState
from autoshard.task import ShardingTask
from envs.buckets import MULTIPLIERS, bucket_rows
from envs.observation import DEVICE, OPTION, SUMMARY, TABLE, ObsLayout
from envs.sampler import TaskSampler

#: Costs and bytes in the observation are clipped to this magnitude (in units of the bound or
#: of a device's capacity), so that one huge table cannot dominate a policy's input.
CLIP = 10.0
#: Bound of every observation entry (the observation space's box).
LIMIT = 100.0


class PlacementEnv(gym.Env[np.ndarray, np.int64]):
    """Places the tables of one sharding task per episode, costliest first.

    Each step places the next table with one discrete action ``device * buckets + bucket``:
    the device, and the HBM-split bucket that decides how many of its hottest rows stay in HBM,
    the rest living in the device's host memory. The buckets are the value buckets of
    :mod:`envs.buckets` (none, ..., all rows) and a last "fill" bucket: as many hottest rows
    as the device's free HBM holds (the greedy sharders' split), priced when it is offered.
    Only placements that fit are allowed (:meth:`action_masks`, also ``info["action_mask"]``);
    any other action raises ValueError. The reward is the increase of the step cost (max over
    devices) divided by the task's lower bound, negated, so an episode's return is -(step cost /
    lower bound).

    Memory and cost bookkeeping is :class:`autoshard.placement.PlacementState`; every price
    comes from ``cost_model`` in one vectorised call at reset. At the end of an episode ``info``
    holds the ``plan`` and its evaluator ``report``.

    Args:
        sampler: Draws a task at every reset without ``options={"task": ...}``.
        cost_model: A :class:`autoshard.cost.CostModel`, or ``"analytical"`` / a model folder.
        max_devices: Device slots in the observation and action space (default: the sampler's
            largest device count, 8 without a sampler); tasks may use fewer.
        multipliers: The buckets' HBM value multipliers (see :mod:`envs.buckets`).
        report: Whether to run the evaluator at the end of each episode.
        sharder_name: Name recorded in the final plan.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(self, sampler: TaskSampler | None = None,
                 cost_model: CostModel | str | None = None, max_devices: int | None = None,
                 multipliers: tuple[float, ...] = MULTIPLIERS, report: bool = True,
                 sharder_name: str = "env") -> None:
        self._sampler = sampler
        self.cost_model = (cost_model if cost_model is not None and not isinstance(cost_model, str)
                           else load_cost_model(cost_model))
        self.max_devices = int(max_devices or (sampler.max_devices if sampler else 8))
        if self.max_devices < 1:
            raise ValueError(f"max_devices must be >= 1, got {self.max_devices}")
        self.multipliers = tuple(float(m) for m in multipliers)
        self.buckets = len(self.multipliers) + 1  # the value buckets, then "fill"
        self.report = report
        self.sharder_name = sharder_name
        self.layout = ObsLayout(self.max_devices, self.buckets)
        self.action_space = spaces.Discrete(self.max_devices * self.buckets)
        self.observation_space = spaces.Box(-LIMIT, LIMIT, (self.layout.size,), np.float32)
        self.task: ShardingTask | None = None
        self._obs = np.zeros(self.layout.size, dtype=np.float32)
        self._mask = np.zeros(self.action_space.n, dtype=bool)

    # -- episode -------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode on ``options["task"]`` if given, else on a sampled task."""
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            task = self.sampler.sample(self.np_random)
        elif not isinstance(task, ShardingTask):
            raise ValueError(f"options['task'] must be a ShardingTask, got {type(task).__name__}")
        if task.num_devices > self.max_devices:
            raise ValueError(f"task has {task.num_devices} devices; this environment has "
                             f"{self.max_devices} device slots (max_devices)")
        self._start(task)
        return self._observe(), {"action_mask": self._mask.copy()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.task is None or self._i >= self.task.num_tables:
            raise RuntimeError("the episode is over (or never started): call reset()")
        a = int(action)
        if not (0 <= a < self._mask.size and self._mask[a]):
            raise ValueError(self._illegal(a))
        d, k = divmod(a, self.buckets)
        t = self._order_list[self._i]
        before = self._top
        price = float(self._total[t, d, k])
        self._state.place(t, d, self._rows_of(t, d, k), price=price)
        self._update_device(d, price, self._parts[t, d, k])
        reward = -(self._top - before) / self._lb
        self._i += 1
        done = self._i == self.task.num_tables
        obs = self._observe()
        info: dict[str, Any] = {"action_mask": self._mask.copy()}
        if done:
            info.update(self._final())
        return obs, reward, done, False, info

    def action_masks(self) -> np.ndarray:
        """Allowed actions for the next table: devices of the task where the bucket fits."""
        return self._mask.copy()

    @property
    def sampler(self) -> TaskSampler:
        """The task sampler (the default one is built on first use)."""
        if self._sampler is None:
            self._sampler = TaskSampler()
        return self._sampler

    @property
    def lower_bound(self) -> float:
        """The task's lower bound (ms), the reward's unit."""
        return self._lb

    # -- internals -----------------------------------------------------------------------------

    def _start(self, task: ShardingTask) -> None:
        """Prices every (table, device, bucket) once and resets the bookkeeping."""
        model = self.cost_model
        n_t, n_d, n_k = task.num_tables, task.num_devices, self.buckets
        n_v = n_k - 1  # value buckets, priced now; the fill bucket is priced when offered
        rows = bucket_rows(task, model, self.multipliers)
        t_idx = np.repeat(np.arange(n_t), n_d * n_v)
        d_idx = np.tile(np.repeat(np.arange(n_d), n_v), n_t)
        k_rows = np.broadcast_to(rows[:, None, :], (n_t, n_d, n_v)).ravel()
        p = model.price(task, t_idx, d_idx, k_rows)
        self._parts = np.zeros((n_t, n_d, n_k, 3))
        self._parts[:, :, :n_v] = np.stack([p.hbm_ms, p.uvm_ms, p.comm_ms], axis=-1).reshape(
            n_t, n_d, n_v, 3)
        self._total = self._parts.sum(axis=-1)
        self._fill_rows = np.zeros(n_d, dtype=np.int64)
        self._bucket_rows = np.empty((n_k, n_d), dtype=np.int64)  # HBM rows each fit test asks
        self._devices = np.arange(n_d)
        self._lb = max(lower_bound_ms(task, model), 1e-12)
        self.task, self._rows, self._i = task, rows, 0
        self._state = PlacementState(task, model)
        dev = task.device_arrays
        self._hbm_cap = np.maximum(dev.hbm_capacity, 1.0)
        self._host_cap = np.maximum(dev.host_capacity, 1.0)
        # Per device, unnormalised: load by component (3), load, free HBM, free host, tables,
        # costliest table; times _dev_scale gives the DEVICE features but the last (slack).
        self._dev_raw = np.zeros((n_d, 8))
        self._dev_raw[:, 4] = dev.hbm_capacity
        self._dev_raw[:, 5] = dev.host_capacity
        self._dev_scale = np.empty((n_d, 8))
        self._dev_scale[:, [0, 1, 2, 3, 7]] = 1.0 / self._lb
        self._dev_scale[:, 4] = 1.0 / self._hbm_cap
        self._dev_scale[:, 5] = 1.0 / self._host_cap
        self._dev_scale[:, 6] = 1.0 / n_t
        bytes_k = rows * task.table_arrays.memory_bytes_per_row[:, None]
        # The option features that do not change during the episode, per table: its price and
        # HBM bytes of every (device, bucket), normalised.
        self._static = np.zeros((n_t, n_d, n_k, len(OPTION)), dtype=np.float32)
        self._static[..., 0] = np.minimum(self._total / self._lb, CLIP)
        self._static[:, :, :n_v, 3] = np.clip(
            bytes_k[:, None, :] / self._hbm_cap[None, :, None], 0, CLIP)
        self._set_order_and_features(task, rows, bytes_k)
        head = self.layout.head
        self._obs[:] = 0.0
        self._mask[:] = False
        devices = self._obs[head:].reshape(self.max_devices, self.layout.device_block)
        devices[:n_d, 0] = 1.0
        self._dev_view = devices[:n_d, 1:1 + len(DEVICE)]
        self._opt_view = devices[:n_d, 1 + len(DEVICE):].reshape(n_d, n_k, len(OPTION))
        self._top = 0.0
        self._dev_view[:, :8] = self._dev_raw * self._dev_scale

    def _set_order_and_features(self, task: ShardingTask, rows: np.ndarray,
                                bytes_k: np.ndarray) -> None:
        """Orders tables by their relaxation cost (descending) and precomputes their features."""
        ref = self.multipliers.index(1.0) if 1.0 in self.multipliers else self.buckets // 2
        ref_cost = self._total[:, :, ref].mean(axis=1)
        self._order = np.argsort(-ref_cost, kind="stable")
        self._order_list: list[int] = self._order.tolist()
        a = task.table_arrays
        mean_cap = float(self._hbm_cap.mean())
        idx = np.arange(task.num_tables)
        feats = np.stack([
            np.log10(a.rows) / 8.0,
            a.dim / 256.0,
            np.log1p(a.lookups / max(float(a.lookups.mean()), 1e-12)),
            np.log1p(a.rows * a.memory_bytes_per_row / mean_cap),
            ref_cost / self._lb,
            np.log1p(bytes_k[:, ref] / mean_cap),
            self._total[:, :, self.buckets - 2].mean(axis=1) / self._lb,  # all rows
            self._total[:, :, 0].mean(axis=1) / self._lb,
            task.hbm_share(idx, np.ceil(0.01 * a.rows)),
            task.hbm_share(idx, np.ceil(0.1 * a.rows)),
            a.rows_used / a.rows,
        ], axis=1)
        assert feats.shape[1] == len(TABLE)
        self._table_feats = np.minimum(feats[self._order], CLIP)
        # Work and bytes still to place from step i on (relaxation estimates), suffix sums.
        self._work_left = np.append(np.cumsum(ref_cost[self._order][::-1])[::-1], 0.0)
        self._bytes_left = np.append(np.cumsum(bytes_k[self._order, ref][::-1])[::-1], 0.0)
        # The SUMMARY entries that depend on the step alone (the others are set at each step).
        n_t, n_d = task.num_tables, task.num_devices
        step = np.arange(n_t + 1)
        self._summary = np.zeros((n_t + 1, len(SUMMARY)))
        self._summary[:, 0] = (n_t - step) / n_t
        self._summary[:, 1] = self._work_left / (n_d * self._lb)
        self._summary[:, 5] = n_d / 16.0
        self._summary[:, 6] = 1.0 / n_d
        self._summary[:, 7] = step / n_t

    def _update_device(self, d: int, price: float, parts: np.ndarray) -> None:
        """Refreshes device ``d``'s observation row after a table was placed on it."""
        state, raw = self._state, self._dev_raw[d]
        raw[0:3] += parts
        raw[3] = state.load_ms[d]
        raw[4] = state.free_hbm[d]
        raw[5] = state.free_host[d]
        raw[6] += 1.0
        raw[7] = max(raw[7], price)
        self._top = max(self._top, raw[3])
        np.multiply(raw, self._dev_scale[d], out=self._dev_view[d, :8])

    def _observe(self) -> np.ndarray:
        """Writes the observation and the action mask for the next table."""
        task, state, lb = self.task, self._state, self._lb
        assert task is not None
        n_t, n_d, i = task.num_tables, task.num_devices, self._i
        dv = self._dev_view
        load = dv[:, 3]
        top = self._top / lb
        np.subtract(top, load, out=dv[:, 8])
        n_tab = len(TABLE)
        summary = self._obs[n_tab:self.layout.head]
        summary[:] = self._summary[i]
        summary[2] = min(self._bytes_left[i] / max(float(state.free_hbm.sum()), 1.0), CLIP)
        summary[3] = top
        summary[4] = float(state.load_ms.sum()) / (n_d * lb)
        if i == n_t:
            self._mask[:] = False
            self._obs[:n_tab] = 0.0
            self._opt_view[:] = 0.0
            return self._bounded()
        t = self._order_list[i]
        self._obs[:n_tab] = self._table_feats[i]
        fits = self._fits(t)
        if not fits.any():
            self._mask[:] = False
            raise PlannerError("capacity", f"table '{task.tables[t].name}' fits on no device "
                               f"(largest free host memory {gib(state.free_host.max())})")
        ov = self._opt_view
        ov[:] = self._static[t]
        after, increase, free_after = ov[:, :, 1], ov[:, :, 2], ov[:, :, 4]
        np.add(load[:, None], ov[:, :, 0], out=after)
        np.minimum(after, CLIP, out=after)
        np.subtract(after, top, out=increase)
        np.maximum(increase, 0.0, out=increase)
        np.subtract(dv[:, 4:5], ov[:, :, 3], out=free_after)
        np.maximum(free_after, -CLIP, out=free_after)
        ov[:, :, 5] = fits
        self._mask[:n_d * self.buckets] = fits.ravel()  # beyond the task's devices: False
        return self._bounded()

    def _bounded(self) -> np.ndarray:
        """A copy of the observation with every entry within [-LIMIT, LIMIT] (np.clip's result,
        without its per-call overhead)."""
        out = np.minimum(self._obs, LIMIT)
        np.maximum(out, -LIMIT, out=out)
        return out

    def _fits(self, t: int) -> np.ndarray:
        """Offers the fill bucket of table ``t`` and tests every bucket on every device in one
        call; returns where each fits, [devices, buckets]."""
        hbm_rows = self._bucket_rows
        hbm_rows[:-1] = self._rows[t][:, None]
        hbm_rows[-1] = self._offer_fill(t)
        fits: np.ndarray = self._state.fits(t, hbm_rows).T
        return fits

    def _offer_fill(self, t: int) -> np.ndarray:
        """Prices the fill bucket of table ``t`` on every device (the most hottest rows its
        free HBM holds), writes its static option features and returns its HBM rows.

        Where those rows are one of the table's value buckets (all rows where the whole table
        fits, none where HBM is full, ...), that bucket's price is taken; only the other
        devices are priced, in one call to the cost model.
        """
        assert self.task is not None
        rows = self._state.max_hbm_rows(t)
        self._fill_rows = rows
        same = rows[:, None] == self._rows[t]  # [devices, value buckets]
        bucket = same.argmax(axis=1)  # the first equal one, or 0 where none is
        parts = self._parts[t]
        parts[:, -1] = parts[self._devices, bucket]
        new = (~same[self._devices, bucket]).nonzero()[0]
        if new.size:
            p = self.cost_model.price(self.task, np.full(new.size, t), new, rows[new])
            parts[new, -1] = np.array((p.hbm_ms, p.uvm_ms, p.comm_ms)).T
        total = parts[:, -1].sum(axis=-1)
        self._total[t, :, -1] = total
        per_row = self.task.table_arrays.memory_bytes_per_row[t]
        static = self._static[t, :, -1]
        static[:, 0] = np.minimum(total / self._lb, CLIP)
        static[:, 3] = np.minimum(rows * per_row / self._hbm_cap, CLIP)
        return rows

    def _rows_of(self, t: int, d: int, k: int) -> int:
        """HBM rows of bucket ``k`` of table ``t`` on device ``d``."""
        return int(self._fill_rows[d] if k == self.buckets - 1 else self._rows[t, k])

    def _final(self) -> dict[str, Any]:
        """The finished plan, its step cost and, if enabled, its evaluator report."""
        plan = self._state.to_plan(self.sharder_name)
        step = float(self._state.load_ms.max())
        info: dict[str, Any] = {"plan": plan, "step_cost_ms": step, "lower_bound_ms": self._lb,
                                "cost_ratio": step / self._lb}
        if self.report:
            assert self.task is not None
            info["report"] = evaluate(plan, self.task, self.cost_model)
        return info

    def _illegal(self, a: int) -> str:
        """Why action ``a`` is not allowed, with the expected and actual values."""
        n = self._mask.size
        allowed = np.flatnonzero(self._mask)
        expected = f"expected one of {allowed[:12].tolist()}{'...' if allowed.size > 12 else ''}"
        if not 0 <= a < n:
            return f"action {a} is outside [0, {n}); {expected}"
        d, k = divmod(a, self.buckets)
        assert self.task is not None
        t = int(self._order[self._i])
        name = self.task.tables[t].name
        if d >= self.task.num_devices:
            return (f"action {a} = (device {d}, bucket {k}) for table '{name}': the task has "
                    f"{self.task.num_devices} devices; {expected}")
        per_row = self.task.table_arrays.memory_bytes_per_row[t]
        rows = self._rows_of(t, d, k)
        hbm, host = rows * per_row, (self.task.tables[t].rows - rows) * per_row
        return (f"action {a} = (device {d}, bucket {k}) for table '{name}' does not fit: needs "
                f"{gib(hbm)} HBM ({gib(self._state.free_hbm[d])} free) and {gib(host)} host "
                f"memory ({gib(self._state.free_host[d])} free); {expected}")
