"""One placement episode of the learned sharder: a task's tables placed one by one, costliest
first, each on a (device, HBM-split bucket), with the observation the policy reads.

This is the numpy core shared by the ``ppo`` sharder (which decodes a policy over it) and the
Gymnasium environment ``autoshard/Placement-v0`` (a thin wrapper around it). Every price comes
from the cost model: all (table, device, value bucket) options in one vectorised call when the
task is prepared (:class:`PricedTask`, shared by every episode on the same task), the "fill"
bucket when it is offered. Memory and load bookkeeping is :class:`autoshard.layout.placement.
PlacementState`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from autoshard.errors import PlannerError, gib
from autoshard.layout import kinds
from autoshard.layout.placement import PlacementState
from autoshard.layout.plan import Plan
from autoshard.layout.shards import ShardGeometry, one_per_device
from autoshard.policy.buckets import MULTIPLIERS, bucket_rows
from autoshard.policy.features import CLIP, ObsLayout, StaticOptions, nearest_legal
from autoshard.policy.observation import (
    LOAD_PARTS,
    RAW,
    SCALED,
    bounded,
    bucket_parts,
    initial_devices,
    record_placement,
    write_dynamic_options,
    write_fill_option,
    write_slack,
    write_summary,
)
from autoshard.policy.refill import checked_mode, level_offer, refill_device
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import Curves, device_kinds
from autoshard.task import ShardingTask

#: Bound of every observation entry (the observation space's box).
LIMIT = 100.0


@dataclass(frozen=True)
class PricedTask:
    """A task with every value bucket of every (table, device) priced, and the per-table
    features, order and suffix sums that do not depend on the episode's choices.

    Build it with :meth:`prepare`; episodes copy its mutable arrays, so one priced task serves
    any number of episodes (the sharder's greedy and sampled rollouts).
    """

    task: ShardingTask
    cost_model: CostModel
    multipliers: tuple[float, ...]
    rows: np.ndarray  # [T, value buckets] HBM rows
    parts: np.ndarray  # [T, D, K - 1, 3] hbm/uvm/comm ms of the value buckets
    total: np.ndarray  # [T, D, K - 1] their sums
    lower_bound: float  # ms, the reward's unit
    order: np.ndarray  # tables: those keeping rows in HBM, then costliest relaxation first
    table_feats: np.ndarray  # [T, TABLE] in placement order
    bytes_left: np.ndarray  # [T + 1] relaxation bytes still to place from step i on
    summary: np.ndarray  # [T + 1, SUMMARY], the entries that depend on the step alone
    static: StaticOptions  # option features fixed for the whole episode
    #: Cost curves of the items a re-filling episode places, by item count (the task's tables;
    #: a split choice's tables and offered shards), priced on first use.
    curves: dict[int, Curves] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def prepare(cls, task: ShardingTask, cost_model: CostModel, layout: ObsLayout,
                multipliers: tuple[float, ...] = MULTIPLIERS, lower_bound: float | None = None,
                mean_lookups: float | None = None) -> PricedTask:
        """Prices the task's value buckets in one call and precomputes its features.

        ``lower_bound`` (ms) and ``mean_lookups`` are the units of its cost and lookup
        features (default: this task's own), so that the shards of another task's tables can be
        priced in that task's units (:mod:`autoshard.policy.choice`).
        """
        n_t, n_d, n_k = task.num_tables, task.num_devices, len(multipliers) + 1
        n_v = n_k - 1
        rows = bucket_rows(task, cost_model, multipliers)
        # Devices of one kind price alike: each kind is priced once, on its representative.
        kinds = device_kinds(task)
        n_kind = kinds.count
        t_idx = np.repeat(np.arange(n_t), n_kind * n_v)
        d_idx = np.tile(np.repeat(kinds.representative, n_v), n_t)
        k_rows = np.broadcast_to(rows[:, None, :], (n_t, n_kind, n_v)).ravel()
        p = cost_model.price(task, t_idx, d_idx, k_rows)
        by_kind = np.stack([p.hbm_ms, p.uvm_ms, p.comm_ms], axis=-1).reshape(n_t, n_kind, n_v, 3)
        parts = by_kind[:, kinds.kind]
        total = parts.sum(axis=-1)
        lb = max(lower_bound_ms(task, cost_model) if lower_bound is None else lower_bound, 1e-12)
        ref = multipliers.index(1.0) if 1.0 in multipliers else n_v // 2
        ref_cost = total[:, :, ref].mean(axis=1)
        # Items that must keep rows in HBM (replicas, pinned one per device; constrained
        # tables) first, so that no other table's rows have taken their device's HBM; then
        # the costliest first.
        order = np.lexsort((-ref_cost, task.table_arrays.hbm_least <= 0))
        bytes_k = rows * task.table_arrays.memory_bytes_per_row[:, None]
        mean_cap = float(np.maximum(task.device_arrays.hbm_capacity, 1.0).mean())
        lookups = (float(task.table_arrays.lookups.mean()) if mean_lookups is None
                   else mean_lookups)
        feats = _table_features(task, layout, total, lb, ref, ref_cost, bytes_k, mean_cap,
                                lookups)
        work_left = np.append(np.cumsum(ref_cost[order][::-1])[::-1], 0.0)
        bytes_left = np.append(np.cumsum(bytes_k[order, ref][::-1])[::-1], 0.0)
        s = layout.summary
        step = np.arange(n_t + 1)
        summary = np.zeros((n_t + 1, len(s)))
        summary[:, s["tables_left"]] = (n_t - step) / n_t
        summary[:, s["work_left"]] = work_left / (n_d * lb)
        summary[:, s["devices"]] = n_d / 16.0
        summary[:, s["inv_devices"]] = 1.0 / n_d
        summary[:, s["progress"]] = step / n_t
        return cls(task, cost_model, tuple(multipliers), rows, parts, total, lb, order,
                   np.minimum(feats[order], CLIP), bytes_left, summary,
                   _static_options(task, rows, total, lb))


def _static_options(task: ShardingTask, rows: np.ndarray, total: np.ndarray,
                    lb: float) -> StaticOptions:
    """The option features of the value buckets that do not change during an episode."""
    return StaticOptions(np.minimum(total / lb, CLIP),
                         rows * task.table_arrays.memory_bytes_per_row[:, None],
                         np.maximum(task.device_arrays.hbm_capacity, 1.0))


def _table_features(task: ShardingTask, layout: ObsLayout, total: np.ndarray, lb: float,
                    ref: int, ref_cost: np.ndarray, bytes_k: np.ndarray,
                    mean_cap: float, mean_lookups: float) -> np.ndarray:
    """The TABLE features of every table (task order), each written under its name."""
    a = task.table_arrays
    idx = np.arange(task.num_tables)
    n_v = bytes_k.shape[1]
    values = {
        "log_rows": np.log10(a.rows) / 8.0,
        "dim": a.dim / 256.0,
        "lookups": np.log1p(a.lookups / max(mean_lookups, 1e-12)),
        "bytes": np.log1p(a.rows * a.memory_bytes_per_row / mean_cap),
        "ref_cost": ref_cost / lb,
        "ref_bytes": np.log1p(bytes_k[:, ref] / mean_cap),
        "cost_hbm": total[:, :, n_v - 1].mean(axis=1) / lb,  # all rows in HBM
        "cost_uvm": total[:, :, 0].mean(axis=1) / lb,  # no row in HBM
        "share_1pct": task.hbm_share(idx, np.ceil(0.01 * a.rows)),
        "share_10pct": task.hbm_share(idx, np.ceil(0.1 * a.rows)),
        "used_fraction": a.rows_used / a.rows,
    }
    feats = np.empty((task.num_tables, len(layout.table)))
    for name, col in layout.table.items():
        feats[:, col] = values[name]
    return feats


class PlacementEpisode:
    """Places the tables of one priced task, costliest first, one action per table.

    An action is ``device * buckets + bucket``. The buckets are the value buckets of
    :mod:`autoshard.policy.buckets` (no row, ..., all rows in HBM) and a last "fill"
    bucket: as many hottest rows as the device's free HBM holds (at most the rows ever used).
    :attr:`mask` says which
    actions fit; :attr:`obs` is the observation of the next table (see
    :mod:`autoshard.policy.features`). The reward of a step is the increase of the step
    cost (max over devices) over the task's lower bound, negated, so an episode's return is
    -(step cost / lower bound).

    Args:
        priced: The task, priced (:meth:`PricedTask.prepare`).
        layout: The observation layout (its ``max_devices`` >= the task's devices).
        refill: How the episode water-fills each device's HBM while it places
            (:data:`autoshard.policy.refill.MODES`).
    """

    def __init__(self, priced: PricedTask, layout: ObsLayout, refill: str = "none") -> None:
        task = priced.task
        self.refill = checked_mode(refill)
        if task.num_devices > layout.max_devices:
            raise ValueError(f"task has {task.num_devices} devices; this environment has "
                             f"{layout.max_devices} device slots (max_devices)")
        self.priced, self.layout, self.task = priced, layout, task
        n_t, n_d = task.num_tables, task.num_devices
        self.buckets = len(priced.multipliers) + 1
        self.lower_bound = priced.lower_bound
        self.order: list[int] = priced.order.tolist()
        self.step_index = 0
        self.top = 0.0  # step cost so far, ms
        self.state = PlacementState(task, priced.cost_model)
        # The fill bucket of the next table on every device: HBM rows, cost parts, total.
        self._fill_rows = np.zeros(n_d, dtype=np.int64)
        self._fill_parts = np.zeros((n_d, 3))
        self._fill_total = np.zeros(n_d)
        # The fill bucket's rows and price as the observation shows them (:meth:`_fill_offer`).
        self._fill_want, self._fill_shown = np.zeros(n_d, dtype=np.int64), np.zeros(n_d)
        self._level = np.zeros(n_d)  # each device's water level (ms per HBM byte)
        self._bucket_rows = np.empty((self.buckets, n_d), dtype=np.int64)
        self._devices = np.arange(n_d)
        dev = task.device_arrays
        self._hbm_cap = np.maximum(dev.hbm_capacity, 1.0)
        # Shards of a table split table_row_wise stay within one node, one per device; on a
        # task planned for TorchRec, row_wise ones too go one per device.
        self._geometry, self._node_bound = bound_shards(task)
        self._init_observation(n_t, n_d)
        self._observe()

    # -- public --------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.step_index == self.task.num_tables

    @property
    def table(self) -> int:
        """Task index of the table the next action places."""
        return self.order[self.step_index]

    def step(self, action: int) -> float:
        """Places the next table with a legal ``action``; returns the reward."""
        d, k = divmod(action, self.buckets)
        t = self.order[self.step_index]
        before = self.top
        fill = k == self.buckets - 1
        price = float(self._fill_total[d] if fill else self.priced.total[t, d, k])
        self.state.place(t, d, self.rows_of(t, d, k), price=price)
        self._update_device(d, price, self._fill_parts[d] if fill else self.priced.parts[t, d, k])
        self.step_index += 1
        self._observe()
        return -(self.top - before) / self.lower_bound

    def rows_of(self, t: int, d: int, k: int) -> int:
        """HBM rows of bucket ``k`` of table ``t`` on device ``d`` (now)."""
        return int(self._fill_rows[d] if k == self.buckets - 1 else self.priced.rows[t, k])

    def nearest_legal(self, action: int) -> int:
        """The legal action closest to ``action``: the allowed bucket of the same device nearest
        to the one asked (fewer HBM rows on a tie), else the allowed option that raises the
        step cost least (then the cheapest)."""
        return nearest_legal(action, self.mask, self._opt_view, self.layout)

    def plan(self, sharder: str) -> Plan:
        return self.state.to_plan(sharder)

    @property
    def step_cost_ms(self) -> float:
        return float(self.state.load_ms.max())

    def _outside(self, a: int) -> tuple[str | None, str]:
        """(why ``a`` is outside the action space, or None; the allowed actions, as text)."""
        allowed = np.flatnonzero(self.mask)
        expected = f"expected one of {allowed[:12].tolist()}{'...' if allowed.size > 12 else ''}"
        n = self.mask.size
        return (None if 0 <= a < n else f"action {a} is outside [0, {n}); {expected}"), expected

    def illegal_reason(self, a: int) -> str:
        """Why action ``a`` is not allowed, with the expected and actual values."""
        outside, expected = self._outside(a)
        if outside:
            return outside
        d, k = divmod(a, self.buckets)
        t = self.table
        name = self.task.tables[t].name
        if d >= self.task.num_devices:
            return (f"action {a} = (device {d}, bucket {k}) for table '{name}': the task has "
                    f"{self.task.num_devices} devices; {expected}")
        per_row = self.task.table_arrays.memory_bytes_per_row[t]
        rows = self.rows_of(t, d, k)
        hbm, host = rows * per_row, (self.task.tables[t].rows - rows) * per_row
        return (f"action {a} = (device {d}, bucket {k}) for table '{name}' does not fit: needs "
                f"{gib(hbm)} HBM ({gib(self.state.free_hbm[d])} free) and {gib(host)} host "
                f"memory ({gib(self.state.free_host[d])} free); {expected}")

    # -- internals -----------------------------------------------------------------------------

    def _init_observation(self, n_t: int, n_d: int) -> None:
        """The observation, the mask and their per-device views, before the first table (the
        layout's ``buckets`` options per device)."""
        layout = self.layout
        self._init_device_features(n_t, n_d)
        self.obs = np.zeros(layout.size, dtype=np.float32)
        self.mask = np.zeros(layout.max_devices * layout.buckets, dtype=bool)
        blocks = self.obs[layout.head:].reshape(layout.max_devices, layout.device_block)
        blocks[:n_d, 0] = 1.0
        n_dev = len(layout.device)
        self._dev_view = blocks[:n_d, 1:1 + n_dev]
        self._opt_view = blocks[:n_d, 1 + n_dev:].reshape(n_d, layout.buckets,
                                                          len(layout.option))
        self._dev_view[:, self._scaled] = self._dev_raw * self._dev_scale

    def _init_device_features(self, n_t: int, n_d: int) -> None:
        """Unnormalised device features (the :data:`SCALED` ones) and their per-device
        scales."""
        dev = self.task.device_arrays
        self._scaled = [self.layout.device[n] for n in SCALED]
        self._dev_raw, self._dev_scale = initial_devices(dev.hbm_capacity, dev.host_capacity,
                                                         n_t, self.lower_bound)

    def _update_device(self, d: int, price: float, parts: np.ndarray) -> None:
        """Refreshes device ``d``'s observation row after a table was placed on it."""
        state, raw = self.state, self._dev_raw[d]
        record_placement(raw, parts, price, state.load_ms[d], state.free_hbm[d],
                         state.free_host[d])
        if self.refill != "none":
            self._refill(d)
        self.top = max(self.top, raw[RAW["load"]])
        self._dev_view[d, self._scaled] = raw * self._dev_scale[d]

    def _refill(self, d: int) -> None:
        """Water-fills device ``d``'s HBM over its items (:mod:`autoshard.policy.refill`) and
        refreshes its raw features; the step cost so far is then the largest load."""
        state, raw = self.state, self._dev_raw[d]
        parts, self._level[d] = refill_device(state, self._item_curves(), d,
                                              float(state.kept_back()[d]))
        if parts is None:
            return
        raw[LOAD_PARTS] = parts
        raw[RAW["load"]] = state.load_ms[d]
        raw[RAW["free_hbm"]] = state.free_hbm[d]
        raw[RAW["free_host"]] = state.free_host[d]
        self.top = float(state.load_ms.max())

    def _item_curves(self) -> Curves:
        """The cost curves of the state's items (priced once per priced task)."""
        cache, items = self.priced.curves, self.state.task
        if items.num_tables not in cache:
            cache[items.num_tables] = Curves.price(items, self.priced.cost_model)
        return cache[items.num_tables]

    def _fill_offer(self, u: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Item ``u``'s fill bucket on every device: the HBM rows placed with it, the rows the
        observation shows, and the price it shows (None: the placed rows' price). In the
        ``level`` mode those shown are what the item holds once the device is water-filled
        (:func:`level_offer`); else the rows placed: the most hottest rows the free HBM
        holds, at most the rows ever used."""
        most = self.state.max_hbm_rows(u)
        if self.refill != "level":
            rows = self.state.task.table_arrays.fill_rows(u, most)
            return rows, rows, None
        want, shown, rows = level_offer(self.state, self._item_curves(), self._level, u, most)
        return rows, want, shown

    def _observe(self) -> None:
        """Writes the observation and the action mask for the next table."""
        self._write_summary(self.step_index)
        if self.done:
            self._clear()
            return
        t = self.order[self.step_index]
        self.obs[:len(self.layout.table)] = self.priced.table_feats[self.step_index]
        fits = self._fits(t)
        if not fits.any():  # room for the table's reserved HBM, from HBM rows placed earlier
            with contextlib.suppress(PlannerError):
                self.state.make_room(t)
                fits = self._fits(t)
        if not fits.any():
            self._no_room(t)
        self._write_options(self._opt_view, self.priced.static, t, self._fill_shown,
                            self._fill_want * self.task.table_arrays.memory_bytes_per_row[t],
                            fits)
        self.mask[:self.task.num_devices * self.buckets] = fits.ravel()  # beyond: False

    def _write_summary(self, i: int) -> None:
        """Writes the device slacks and the summary of the work left from step ``i`` on."""
        p, state, lb, lay = self.priced, self.state, self.lower_bound, self.layout
        top = self.top / lb
        write_slack(self._dev_view, top, lay)
        write_summary(self.obs[len(lay.table):lay.head], lay, p.summary[i], p.bytes_left[i],
                      float(state.free_hbm.sum()), float(state.load_ms.sum()), top,
                      self.task.num_devices, lb)

    def _clear(self) -> None:
        """The observation and mask once every table is placed."""
        self.mask[:] = False
        self.obs[:len(self.layout.table)] = 0.0
        self._opt_view[:] = 0.0

    def _no_room(self, t: int) -> None:
        """Raises the error of item ``t`` fitting on no device."""
        self.mask[:] = False
        state = self.state
        reserved = float(state.task.table_arrays.hbm_reserved_bytes[t])
        raise PlannerError("capacity", f"table '{state.task.tables[t].name}' fits on no "
                           f"device (it needs {gib(reserved)} of HBM reserved for TorchRec's "
                           f"buffers and cache state; largest free HBM "
                           f"{gib(state.free_hbm.max())}, largest free host memory "
                           f"{gib(state.free_host.max())})")

    def _write_options(self, ov: np.ndarray, static: StaticOptions, item: int,
                       fill_total: np.ndarray, fill_bytes: np.ndarray, fits: np.ndarray) -> None:
        """Writes the option features of ``item`` ([devices, buckets, OPTION] view ``ov``):
        its value buckets' ``static`` features, its fill bucket (price ``fill_total`` ms,
        ``fill_bytes`` of HBM per device) and what each option does to the devices."""
        static.write(ov[:, :-1], item, self.layout)
        write_fill_option(ov[:, -1], fill_total, fill_bytes, self.lower_bound, self._hbm_cap,
                          self.layout)
        write_dynamic_options(ov, self._dev_view, self.top / self.lower_bound, fits, self.layout)

    def bounded_obs(self) -> np.ndarray:
        """A copy of the observation with every entry within [-LIMIT, LIMIT] (np.clip's result,
        without its per-call overhead)."""
        return bounded(self.obs, LIMIT)

    def _fits(self, t: int) -> np.ndarray:
        """Offers the fill bucket of table ``t`` and tests every bucket on every device in one
        call; returns where each fits, [devices, buckets]."""
        hbm_rows = self._bucket_rows
        hbm_rows[:-1] = self.priced.rows[t][:, None]
        hbm_rows[-1] = self._offer_fill(t)
        fits: np.ndarray = self.state.fits(t, hbm_rows).T
        if self._node_bound is not None and self._node_bound[t]:
            fits &= self._node_devices(t)[:, None]
        return fits

    def _node_devices(self, t: int) -> np.ndarray:
        """[D]: where node-local shard ``t`` may go: any device while none of the shards of its
        column block (a table-row-wise table's all; a grid's of one block) is placed, then the
        devices of their node that hold none of them (another row shard: any device that holds
        none of its table's)."""
        g = self._geometry
        assert g is not None
        device = self.state.device
        block = (g.table == g.table[t]) & (g.col_start == g.col_start[t])
        placed = device[block & (device >= 0)]
        node = self.task.device_arrays.node
        if not placed.size:
            return np.ones(node.size, dtype=bool)
        ok = (node == node[placed[0]] if kinds.node_local(g.kind[t])
              else np.ones(node.size, dtype=bool))
        ok[placed] = False
        return ok

    def _offer_fill(self, t: int) -> np.ndarray:
        """Prices the fill bucket of table ``t`` on every device (the most hottest rows its
        free HBM holds, at most the rows ever used) and returns its HBM rows."""
        rows, self._fill_want, shown = self._fill_offer(t)
        self._fill_rows = rows
        self._fill_parts = fill_parts(self.priced, t, rows, self._devices)
        self._fill_total = self._fill_parts.sum(axis=-1)
        self._fill_shown = self._fill_total if shown is None else shown
        return rows


def bound_shards(task: ShardingTask) -> tuple[ShardGeometry | None, np.ndarray | None]:
    """The shards of ``task`` (a :class:`autoshard.layout.shards.ShardTask`; None for whole tables)
    and which of them go one per device (table-row-wise ones, and a grid's of each column
    block, within one node; on a task planned for TorchRec, row-wise ones too)."""
    g = getattr(task, "geometry", None)
    return (None, None) if g is None else (g, one_per_device(task, g))


def fill_parts(priced: PricedTask, t: int, rows: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """The cost parts [devices, 3] (HBM, host, communication ms) of item ``t`` of ``priced``
    with ``rows[d]`` rows in HBM on each device.

    Where those rows are one of the item's value buckets (all rows where the whole table fits,
    none where HBM is full, ...), that bucket's price is taken; only the other devices are
    priced, in one call to the cost model.
    """
    parts, unmatched = bucket_parts(rows, priced.rows[t], priced.parts[t, devices])
    new = unmatched.nonzero()[0]
    if new.size:
        p = priced.cost_model.price(priced.task, np.full(new.size, t), new, rows[new])
        parts[new] = np.array((p.hbm_ms, p.uvm_ms, p.comm_ms)).T
    return parts
