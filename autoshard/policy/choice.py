"""Placement episodes in which the policy also chooses which dominant tables to split.

Every device block of the observation holds two option grids of the same (bucket) layout, so
the policy's shared option scorer reads both:

- grid 0 places the next item as it is: a whole table, or the next queued shard of a table
  split earlier;
- grid 1, offered only while the next item is a table that dominates (a table the split
  heuristic :func:`autoshard.layout.splitting.split_heavy_tables` splits), places the first of its
  shards instead: the table is split as the heuristic splits it, that shard is placed, and its
  other shards are placed next, one step each (they then take grid 0 only).

An action is ``device * (2 x buckets) + grid * buckets + bucket``. The shards are priced once,
with the task (:class:`SplitOffer`), so every step stays numpy. Items are indices into the
offer's union task: the task's tables, then the shards; the one not chosen of each pair (the
table, or its shards) is never placed. Shards of a table split table-row-wise stay on one node,
one per device, as in :class:`autoshard.policy.episode.PlacementEpisode`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import numpy as np

from autoshard.errors import PlannerError
from autoshard.layout.placement import PlacementState
from autoshard.layout.plan import Plan
from autoshard.layout.shards import (
    ShardGeometry,
    ShardLayout,
    ShardTask,
    shard_task,
    whole_tables,
)
from autoshard.policy.episode import (
    PlacementEpisode,
    PricedTask,
    bound_shards,
    fill_parts,
)
from autoshard.policy.features import ObsLayout
from autoshard.policy.refill import checked_mode
from autoshard.pricing.cost import CostModel
from autoshard.task import ShardingTask, TableArrays

#: Option grids per device: the next item as it is, and the first shard of its split.
GRIDS = 2


@dataclass(frozen=True, eq=False)
class SplitOffer:
    """The splits an episode may choose: the shards of the dominant tables, priced.

    Args:
        geometry: The shards of the tables that may be split ([S]; each table's contiguous).
        pieces: Those shards priced in the whole task's units (its bound, its mean lookups);
            only their buckets, prices and table features are read (``summary`` and
            ``bytes_left`` are the split task's).
        union: The items: the task's tables, then the shards (memory bookkeeping).
        rank: Each shard's row in ``pieces.table_feats`` (which is in ``pieces.order``).
    """

    geometry: ShardGeometry
    pieces: PricedTask
    union: ShardTask
    rank: np.ndarray

    @classmethod
    def prepare(cls, priced: PricedTask, geometry: ShardGeometry, layout: ObsLayout
                ) -> SplitOffer | None:
        """The offer of the split tables of ``geometry`` (None where it splits none).

        The shards' value buckets are those of the task split as ``geometry`` splits it (the
        rows its relaxation gives each shard beside the other tables), so the task is priced
        once more with every offered table split, and the shards' rows kept.
        """
        task = priced.task
        idx = np.flatnonzero(geometry.parts > 1)
        if not idx.size:
            return None
        split = shard_task(task, geometry)
        full = PricedTask.prepare(split, priced.cost_model, layout, priced.multipliers,
                                  lower_bound=priced.lower_bound,
                                  mean_lookups=float(task.table_arrays.lookups.mean()))
        shards = shard_task(task, geometry.take(idx))
        rank = np.argsort(full.order)  # full.table_feats is in placement order
        pieces = replace(full, task=shards, rows=full.rows[idx], parts=full.parts[idx],
                         total=full.total[idx], static=full.static.take(idx),
                         table_feats=full.table_feats[rank[idx]], order=np.arange(idx.size))
        return cls(geometry.take(idx), pieces, _union(task, shards), np.arange(idx.size))

    def shards(self, table: int) -> np.ndarray:
        """Item indices of ``table``'s shards, in order (empty when it is not offered)."""
        return self.base + np.flatnonzero(self.geometry.table == table)

    @property
    def base(self) -> int:
        """Item index of the first shard (the task's table count)."""
        parent = self.union.parent
        assert parent is not None
        return parent.num_tables


def _union(task: ShardingTask, shards: ShardTask) -> ShardTask:
    """The task whose items are ``task``'s tables (their own columns, unchanged) and then
    ``shards``' shards."""
    n = task.num_tables
    assert shards.geometry is not None and shards.a2a_scale is not None
    assert shards.reduce_scale is not None
    a, b = task.table_arrays, shards.table_arrays
    arrays = TableArrays(**{f.name: np.concatenate([getattr(a, f.name), getattr(b, f.name)])
                            for f in fields(TableArrays)})
    union = ShardTask(task.tables + shards.tables, task.hardware, task.workload, task.reservation,
                      parent=task, geometry=ShardGeometry.concat([whole_tables(task),
                                                                  shards.geometry]),
                      a2a_scale=np.concatenate([np.ones(n), shards.a2a_scale]),
                      reduce_scale=np.concatenate([np.zeros(n), shards.reduce_scale]))
    union.__dict__["table_arrays"] = arrays
    return union


def choice_layout(max_devices: int, buckets: int) -> ObsLayout:
    """The observation layout of :class:`ChoiceEpisode` (``buckets`` per grid)."""
    return ObsLayout(max_devices, GRIDS * buckets)


class ChoiceEpisode(PlacementEpisode):
    """Places a task's tables costliest first, choosing per dominant table whether to place
    it whole or split (see the module docstring); one action per placed item.

    Without an offer (no table dominates) it plays the episode of
    :class:`~autoshard.policy.episode.PlacementEpisode` with grid 1 masked: the same
    observations in grid 0, the same rewards.

    Args:
        priced: The task, priced.
        layout: :func:`choice_layout` (its ``max_devices`` >= the task's devices).
        offer: The splits offered (:meth:`SplitOffer.prepare`), or None.
        refill: As :class:`~autoshard.policy.episode.PlacementEpisode`'s.
    """

    def __init__(self, priced: PricedTask, layout: ObsLayout, offer: SplitOffer | None,
                 refill: str = "none") -> None:
        task = priced.task
        self.refill = checked_mode(refill)
        buckets = len(priced.multipliers) + 1
        if layout.buckets != GRIDS * buckets:
            raise ValueError(f"layout has {layout.buckets} options per device; expected "
                             f"{GRIDS} x {buckets}")
        if task.num_devices > layout.max_devices:
            raise ValueError(f"task has {task.num_devices} devices; this environment has "
                             f"{layout.max_devices} device slots (max_devices)")
        self.priced, self.layout, self.task, self.offer = priced, layout, task, offer
        n_t, n_d = task.num_tables, task.num_devices
        self.buckets = buckets
        self.lower_bound = priced.lower_bound
        self.order: list[int] = priced.order.tolist()  # items; a split inserts its shards
        self._pos: list[int] = list(range(n_t))  # each step's table in the task's order
        self.step_index = 0
        self.top = 0.0
        union = offer.union if offer is not None else task
        self.state = PlacementState(union, priced.cost_model)
        self.state.active[n_t:] = False
        self.state._pending = float(task.table_arrays.hbm_reserved_bytes.sum())
        self._fill_rows = np.zeros((GRIDS, n_d), dtype=np.int64)
        self._fill_parts = np.zeros((GRIDS, n_d, 3))
        self._fill_total = np.zeros((GRIDS, n_d))
        self._fill_want = np.zeros((GRIDS, n_d), dtype=np.int64)
        self._fill_shown = np.zeros((GRIDS, n_d))
        self._level = np.zeros(n_d)
        self._bucket_rows = np.empty((buckets, n_d), dtype=np.int64)
        self._devices = np.arange(n_d)
        self._hbm_cap = np.maximum(task.device_arrays.hbm_capacity, 1.0)
        self._geometry, self._node_bound = bound_shards(union)
        self._init_observation(n_t, n_d)
        self._observe()

    # -- public --------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.step_index == len(self.order)

    @property
    def split_tables(self) -> list[int]:
        """The tables split so far (task indices)."""
        n = self.task.num_tables
        return np.flatnonzero(~self.state.active[:n]).tolist()

    def step(self, action: int) -> float:
        """Places the next item (splitting its table first on a grid-1 action); returns the
        reward."""
        d, j = divmod(action, GRIDS * self.buckets)
        grid, k = divmod(j, self.buckets)
        i = self.step_index
        if grid == 1:
            assert self.offer is not None
            t = self.order[i]
            shards = self.offer.shards(t)
            self._split(t, shards)
            self.order[i:i + 1] = shards.tolist()
            self._pos[i:i + 1] = [self._pos[i]] * shards.size
        u = self.order[i]
        src, x = self._source(u)
        fill = k == self.buckets - 1
        price = float(self._fill_total[grid, d] if fill else src.total[x, d, k])
        rows = int(self._fill_rows[grid, d] if fill else src.rows[x, k])
        before = self.top
        self.state.place(u, d, rows, price=price)
        self._update_device(d, price, self._fill_parts[grid, d] if fill else src.parts[x, d, k])
        self.step_index += 1
        self._observe()
        return -(self.top - before) / self.lower_bound

    def shard_layout(self) -> ShardLayout:
        """The finished episode's plan as shards: whole tables, and the shards of split ones."""
        n, state = self.task.num_tables, self.state
        whole = np.flatnonzero(state.active[:n])
        parts = [whole_tables(self.task, whole)]
        items = [whole]
        if self.offer is not None:
            shards = np.flatnonzero(state.active[n:])
            parts.append(self.offer.geometry.take(shards))
            items.append(n + shards)
        idx = np.concatenate(items)
        return ShardLayout(ShardGeometry.concat(parts), state.device[idx].copy(),
                           state.hbm_rows[idx].copy())

    def plan(self, sharder: str) -> Plan:
        return self.shard_layout().to_plan(self.task, sharder)

    def rows_of(self, t: int, d: int, k: int) -> int:
        raise NotImplementedError("a choice episode's rows depend on the grid: see step()")

    def illegal_reason(self, a: int) -> str:
        """Why action ``a`` is not allowed."""
        outside, expected = self._outside(a)
        if outside:
            return outside
        d, j = divmod(a, GRIDS * self.buckets)
        grid, k = divmod(j, self.buckets)
        what = "split" if grid else "place"
        return (f"action {a} = ({what}, device {d}, bucket {k}) for item "
                f"'{self.state.task.tables[self.table].name}' is not allowed; {expected}")

    # -- internals -----------------------------------------------------------------------------

    def _source(self, u: int) -> tuple[PricedTask, int]:
        """The priced task holding item ``u``, and its index there."""
        n = self.task.num_tables
        if u < n:
            return self.priced, u
        assert self.offer is not None
        return self.offer.pieces, u - n

    def _split(self, t: int, shards: np.ndarray) -> None:
        """Makes ``shards`` the items of table ``t`` (the table itself is no longer placed)."""
        state = self.state
        reserved = state.task.table_arrays.hbm_reserved_bytes
        state.active[t] = False
        state.active[shards] = True
        state._pending += float(reserved[shards].sum() - reserved[t])

    def _unsplit(self, t: int, shards: np.ndarray) -> None:
        state = self.state
        reserved = state.task.table_arrays.hbm_reserved_bytes
        state.active[t] = True
        state.active[shards] = False
        state._pending -= float(reserved[shards].sum() - reserved[t])

    @contextlib.contextmanager
    def _trial_split(self, t: int, shards: np.ndarray) -> Iterator[None]:
        self._split(t, shards)
        try:
            yield
        finally:
            self._unsplit(t, shards)

    def _observe(self) -> None:
        """Writes the observation and the mask of both grids for the next item."""
        n, i = self.task.num_tables, self.step_index
        self._write_summary(self._pos[i] if not self.done else n)
        if self.done:
            self._clear()
            return
        u = self.order[i]
        src, x = self._source(u)
        self.obs[:len(self.layout.table)] = (
            self.priced.table_feats[self._pos[i]] if self.offer is None or u < n
            else src.table_feats[self.offer.rank[x]])
        fits = self._item_fits(u, 0)
        shards = self.offer.shards(u) if self.offer is not None and u < n else np.empty(0, int)
        split_fits = np.zeros_like(fits)
        if shards.size:
            with self._trial_split(u, shards):
                split_fits = self._item_fits(int(shards[0]), 1)
        if not fits.any() and not split_fits.any():
            with contextlib.suppress(PlannerError):
                self.state.make_room(u)
                fits = self._item_fits(u, 0)
        if not fits.any() and not split_fits.any():
            self._no_room(u)
        k = self.buckets
        self._write_item(0, u, fits)
        if shards.size:
            self._write_item(1, int(shards[0]), split_fits)
        else:
            self._opt_view[:, k:] = 0.0
        n_d = self.task.num_devices
        grids = self.mask[:n_d * GRIDS * k].reshape(n_d, GRIDS, k)
        grids[:, 0] = fits
        grids[:, 1] = split_fits

    def _write_item(self, grid: int, u: int, fits: np.ndarray) -> None:
        """Writes grid ``grid``'s option features for item ``u``."""
        src, x = self._source(u)
        k = self.buckets
        per_row = self.state.task.table_arrays.memory_bytes_per_row[u]
        self._write_options(self._opt_view[:, grid * k:(grid + 1) * k], src.static, x,
                            self._fill_shown[grid], self._fill_want[grid] * per_row, fits)

    def _item_fits(self, u: int, grid: int) -> np.ndarray:
        """Offers item ``u``'s fill bucket in grid ``grid`` and tests every bucket on every
        device; returns where each fits, [devices, buckets]."""
        src, x = self._source(u)
        rows, self._fill_want[grid], shown = self._fill_offer(u)
        self._fill_rows[grid] = rows
        self._fill_parts[grid] = fill_parts(src, x, rows, self._devices)
        self._fill_total[grid] = self._fill_parts[grid].sum(axis=-1)
        self._fill_shown[grid] = self._fill_total[grid] if shown is None else shown
        hbm_rows = self._bucket_rows
        hbm_rows[:-1] = src.rows[x][:, None]
        hbm_rows[-1] = rows
        fits: np.ndarray = self.state.fits(u, hbm_rows).T
        if self._node_bound is not None and self._node_bound[u]:
            fits &= self._node_devices(u)[:, None]
        return fits


def split_offer(priced: PricedTask, layout: ObsLayout, cost_model: CostModel | None = None,
                node_local: bool = False) -> SplitOffer | None:
    """The offer of the tables that dominate ``priced``'s task, split as
    :func:`autoshard.layout.splitting.split_heavy_tables` splits them (None when none dominates)."""
    from autoshard.layout.splitting import split_heavy_tables

    choice = split_heavy_tables(priced.task, cost_model or priced.cost_model,
                                node_local=node_local)
    return SplitOffer.prepare(priced, choice.geometry, layout)


def choice_episode(task: ShardingTask, cost_model: CostModel, multipliers: tuple[float, ...],
                   max_devices: int | None = None) -> ChoiceEpisode:
    """A fresh choice episode on ``task`` (priced, with its offer)."""
    layout = choice_layout(max_devices or task.num_devices, len(multipliers) + 1)
    base = ObsLayout(layout.max_devices, len(multipliers) + 1)
    priced = PricedTask.prepare(task, cost_model, base, multipliers)
    return ChoiceEpisode(priced, layout, split_offer(priced, base))


__all__ = ["GRIDS", "ChoiceEpisode", "SplitOffer", "choice_episode", "choice_layout",
           "split_offer"]
