"""The batched step of choice episodes (:class:`autoshard.policy.choice.ChoiceEpisode`):
:class:`autoshard.envs.batched_arrays.EpisodeArrays` with the second option grid, which splits
the next table and places its first shard.

Each slot's items are its task's tables, then the shards its offer prices (the choice
episode's item indices). A slot's sequence arrays follow its own item order, which grows when a
table is split: the table's row becomes its shards' rows, the rows after it move on. Grid 1 is
worked out per slot, for the slots whose next item is an offered table (a few steps of an
episode); grid 0, the placement and the observation stay numpy over the batch. As the batched
environment it serves, it plays tasks without HBM reserved per table (no reservation), and
offers without shards bound to devices (table-row-wise).
"""

from __future__ import annotations

import numpy as np

from autoshard.envs.batched_arrays import (
    BYTES_LEFT,
    DIM,
    ORDER,
    PER_ROW,
    ROWS,
    SUMMARY,
    EpisodeArrays,
)
from autoshard.layout.shards import ShardGeometry, ShardLayout, whole_tables
from autoshard.policy.choice import GRIDS, ChoiceEpisode, SplitOffer
from autoshard.policy.episode import PlacementEpisode, PricedTask, fill_parts
from autoshard.policy.features import ObsLayout, StaticOptions
from autoshard.policy.observation import write_fill_option
from autoshard.pricing.cost import CostModel


class ChoiceArrays(EpisodeArrays):
    """:class:`EpisodeArrays` of choice episodes (two option grids per device).

    Args:
        n: Episodes.
        layout: The choice layout (``GRIDS x buckets`` options per device).
        buckets: Buckets per grid.
        cost_model: As for :class:`EpisodeArrays`.
    """

    def __init__(self, n: int, layout: ObsLayout, buckets: int, cost_model: CostModel) -> None:
        super().__init__(n, layout, buckets, cost_model)
        m, k = layout.max_devices, buckets
        # The split option of every slot's next item: offered, its fill and value buckets.
        self.offered = np.zeros(n, dtype=bool)
        self.split_fill_rows = np.zeros((n, m), dtype=np.int64)
        self.split_fill_parts, self.split_fill_total = np.zeros((n, m, 3)), np.zeros((n, m))
        self.split_parts = np.zeros((n, m, k - 1, 3))
        self.split_fits = np.zeros((n, m, k), dtype=bool)
        self.whole = np.zeros(n, dtype=np.int64)  # tables of each slot's task
        self.offers: list[SplitOffer | None] = [None] * n
        self.order: list[list[int]] = [[] for _ in range(n)]  # each slot's items, in order
        self.pos: list[list[int]] = [[] for _ in range(n)]  # each item's table position
        self.split_done: list[list[int]] = [[] for _ in range(n)]
        self._items_f: list[np.ndarray] = [np.zeros((0, 5))] * n
        self._items_i: list[np.ndarray] = [np.zeros((0, 3), dtype=np.int64)] * n
        self._items_curves: list[np.ndarray] = [np.zeros((0, 1))] * n
        self._items_feats: list[np.ndarray] = [np.zeros((0, 1))] * n
        self._items_static: list[StaticOptions | None] = [None] * n
        self._items_parts: list[np.ndarray] = [np.zeros((0, 1))] * n

    def _option_grid(self) -> np.ndarray:
        """The options of grid 0 of every slot ([n, devices, buckets, OPTION] view)."""
        return self.options[:, :, :self.buckets]

    # -- episodes ------------------------------------------------------------------------------

    def load(self, n: int, ep: PlacementEpisode) -> None:
        """Takes over a freshly reset choice episode as slot ``n``."""
        assert isinstance(ep, ChoiceEpisode)
        offer, p = ep.offer, ep.priced
        if offer is not None and ep._node_bound is not None and ep._node_bound.any():
            raise NotImplementedError("the batched environment keeps no shard on a device "
                                      "set (table-row-wise splits)")
        t = p.task.num_tables
        items = t + (offer.geometry.num_shards if offer is not None else 0)
        if items > self._capacity:
            self._grow(items)
        self.offers[n], self.whole[n] = offer, t
        self.order[n], self.pos[n], self.split_done[n] = list(ep.order), list(ep._pos), []
        sources = [p] if offer is None else [p, offer.pieces]
        arrays = [s.task.table_arrays for s in sources]
        self._items_f[n] = np.concatenate([np.stack(
            [a.memory_bytes_per_row, a.lookups, a.row_bytes, a.optimizer_bytes, a.dim], axis=1)
            for a in arrays])
        self._items_i[n] = np.concatenate([np.concatenate(
            [np.stack([a.rows, a.rows_used], axis=1), s.rows], axis=1)
            for a, s in zip(arrays, sources, strict=True)])
        self._items_curves[n] = np.concatenate([a.curves for a in arrays])
        feats = np.empty((t, p.table_feats.shape[1]))
        feats[p.order] = p.table_feats
        self._items_feats[n] = (feats if offer is None
                                else np.concatenate([feats, offer.pieces.table_feats]))
        self._items_static[n] = StaticOptions.concat([s.static for s in sources])
        self._items_parts[n] = np.concatenate([s.parts for s in sources])
        super().load(n, ep)
        self.tables[n] = len(ep.order)
        d = ep.task.num_devices
        self.split_fill_rows[n], self.split_fill_parts[n], self.split_fill_total[n] = 0, 0, 0
        self.split_fill_rows[n, :d] = ep._fill_rows[1]
        self.split_fill_parts[n, :d] = ep._fill_parts[1]
        self.split_fill_total[n, :d] = ep._fill_total[1]
        self.fill_rows[n, :d] = ep._fill_rows[0]
        self.fill_parts[n, :d] = ep._fill_parts[0]
        self.fill_total[n, :d] = ep._fill_total[0]
        self.split_parts[n] = 0
        self.offered[n] = offer is not None and offer.shards(ep.order[0]).size > 0
        if self.offered[n]:
            assert offer is not None
            first = int(offer.shards(ep.order[0])[0]) - t
            self.split_parts[n, :d] = offer.pieces.parts[first]

    def _load_sequences(self, n: int, p: PricedTask) -> None:
        self._write_sequence(n, 0)
        self.placed_device[n] = -1
        self.placed_rows[n] = 0

    def _write_sequence(self, n: int, start: int) -> None:
        """Slot ``n``'s sequence rows from step ``start`` on, from its item order."""
        p = self.priced[n]
        assert p is not None
        items = np.array(self.order[n][start:], dtype=np.int64)
        pos = np.array(self.pos[n][start:], dtype=np.int64)
        stop = start + items.size
        f, i = self.seq_f[n], self.seq_i[n]
        s, tb = len(self.layout.summary), len(self.layout.table)
        f[start:stop, PER_ROW:DIM + 1] = self._items_f[n][items]
        f[start:stop, BYTES_LEFT] = p.bytes_left[pos]
        f[start:stop, SUMMARY:SUMMARY + s] = p.summary[pos]
        f[start:stop, SUMMARY + s:SUMMARY + s + tb] = self._items_feats[n][items]
        f[stop, BYTES_LEFT] = p.bytes_left[-1]  # the row read once every item is placed
        f[stop, SUMMARY:SUMMARY + s] = p.summary[-1]
        i[start:stop, ORDER] = items
        i[start:stop, ROWS:] = self._items_i[n][items]
        self.curves[n, start:stop] = self._items_curves[n][items]

    # -- the step ------------------------------------------------------------------------------

    def gather_current(self, live: np.ndarray) -> None:
        """As :meth:`EpisodeArrays.gather_current`, for items of either source."""
        ar = self._ar
        self._i = np.minimum(self.step, self.tables - 1)
        self.current_table = self.seq_i[ar, self._i, ORDER]
        s, tb = len(self.layout.summary), len(self.layout.table)
        self.table_obs[:] = self.seq_f[ar, self._i, SUMMARY + s:SUMMARY + s + tb]
        options, parts = self._option_grid(), self.cur_parts
        items, devices = self.current_table.tolist(), self.devices.tolist()
        for n in np.flatnonzero(live).tolist():
            u, d = items[n], devices[n]
            static = self._items_static[n]
            assert static is not None
            static.write(options[n, :d, :-1], u, self.layout)
            parts[n, :d] = self._items_parts[n][u]

    def _source(self, n: int, u: int) -> tuple[PricedTask, int]:
        """The priced task of slot ``n`` holding item ``u``, and its index there."""
        if u < self.whole[n]:
            p = self.priced[n]
            assert p is not None
            return p, u
        offer = self.offers[n]
        assert offer is not None
        return offer.pieces, u - int(self.whole[n])

    def _price(self, new: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """As :meth:`EpisodeArrays._price`; shards are priced per slot on their own task."""
        nn, dd = np.nonzero(new)
        shard = self.current_table[nn] >= self.whole[nn]
        out = np.empty((nn.size, 3))
        if (~shard).any():
            plain = self.plain.copy()
            self.plain[:] = plain & (self.current_table < self.whole)
            keep = new.copy()
            keep[nn[shard], dd[shard]] = False
            out[~shard] = super()._price(keep, rows)
            self.plain[:] = plain
        for n in np.unique(nn[shard]).tolist():
            at = np.flatnonzero((nn == n) & shard)
            src, x = self._source(n, int(self.current_table[n]))
            p = self.cost_model.price(src.task, np.full(at.size, x), dd[at], rows[n, dd[at]])
            out[at] = np.array((p.hbm_ms, p.uvm_ms, p.comm_ms)).T
        return out

    def offer_split(self, live: np.ndarray) -> None:
        """Works out grid 1 of every live slot whose next item is an offered table: its first
        shard's value buckets, fill bucket and fits."""
        self.offered[:] = False
        self.split_fits[:] = False
        for n in np.flatnonzero(live).tolist():
            offer, u = self.offers[n], int(self.current_table[n])
            if offer is None or u >= self.whole[n]:
                continue
            shards = offer.shards(u)
            if not shards.size:
                continue
            self.offered[n] = True
            src, x = self._source(n, int(shards[0]))
            d = int(self.devices[n])
            a = src.task.table_arrays
            per_row = a.memory_bytes_per_row[x]
            fit = np.floor(np.maximum(self.free_hbm[n, :d], 0.0) / per_row)
            rows = np.minimum(np.minimum(fit, a.rows[x]).astype(np.int64), a.rows_used[x])
            parts = fill_parts(src, x, rows, np.arange(d))
            self.split_fill_rows[n, :d], self.split_fill_parts[n, :d] = rows, parts
            self.split_fill_total[n, :d] = parts.sum(axis=-1)
            self.split_parts[n, :d] = src.parts[x]
            hbm_rows = np.empty((self.buckets, d), dtype=np.int64)
            hbm_rows[:-1] = src.rows[x][:, None]
            hbm_rows[-1] = rows
            fits = ((hbm_rows * per_row <= self.free_hbm[n, :d] + 1e-6)
                    & ((a.rows[x] - hbm_rows) * per_row <= self.free_host[n, :d] + 1e-6))
            self.split_fits[n, :d] = fits.T
            src.static.write(self.options[n, :d, self.buckets:2 * self.buckets - 1], x,
                             self.layout)

    def observe_options(self, fits: np.ndarray) -> None:
        """The option features of both grids, and the mask (grid 1 zero where not offered)."""
        k, lb, ov = self.buckets, self.lower_bound[:, None], self.options
        for grid, (total, rows, per_row) in enumerate((
                (self.fill_total, self.fill_rows, self.seq_f[self._ar, self._i, PER_ROW]),
                (self.split_fill_total, self.split_fill_rows, self._split_per_row()))):
            write_fill_option(ov[:, :, (grid + 1) * k - 1], total, rows * per_row[:, None], lb,
                              self.hbm_cap, self.layout)
        both = np.concatenate([fits, self.split_fits], axis=2)
        self.write_dynamic(both)
        ov[~self.offered, :, k:] = 0.0
        self.mask[:] = both.reshape(self.n, -1)

    def _split_per_row(self) -> np.ndarray:
        """Per slot, the bytes per row of its offered first shard (1 where none)."""
        out = np.ones(self.n)
        for n in np.flatnonzero(self.offered).tolist():
            offer = self.offers[n]
            assert offer is not None
            first = int(offer.shards(int(self.current_table[n]))[0] - self.whole[n])
            out[n] = offer.pieces.task.table_arrays.memory_bytes_per_row[first]
        return out

    def place(self, played: np.ndarray) -> np.ndarray:
        """Splits the tables of the slots that chose grid 1, then places every slot's item."""
        k = self.buckets
        d, j = np.divmod(played, GRIDS * k)
        grid, bucket = np.divmod(j, k)
        for n in np.flatnonzero(grid == 1).tolist():
            self._split(n)
        return super().place(d * k + bucket)

    def _split(self, n: int) -> None:
        """Slot ``n``'s next table becomes its shards; grid 1's prices become the next item's."""
        offer, i = self.offers[n], int(self.step[n])
        assert offer is not None
        t = self.order[n][i]
        shards = offer.shards(t).tolist()
        self.order[n][i:i + 1] = shards
        self.pos[n][i:i + 1] = [self.pos[n][i]] * len(shards)
        self.split_done[n].append(t)
        self.tables[n] = len(self.order[n])
        self._write_sequence(n, i)
        self.cur_parts[n] = self.split_parts[n]
        self.fill_rows[n] = self.split_fill_rows[n]
        self.fill_parts[n] = self.split_fill_parts[n]
        self.fill_total[n] = self.split_fill_total[n]

    def layout_of(self, n: int) -> ShardLayout:
        """Slot ``n``'s finished plan as shards (as :meth:`ChoiceEpisode.shard_layout`)."""
        p, offer, t = self.priced[n], self.offers[n], int(self.whole[n])
        assert p is not None
        split = np.zeros(t, dtype=bool)
        split[self.split_done[n]] = True
        whole = np.flatnonzero(~split)
        parts, items = [whole_tables(p.task, whole)], [whole]
        if offer is not None:
            shards = np.flatnonzero(np.isin(offer.geometry.table, self.split_done[n]))
            parts.append(offer.geometry.take(shards))
            items.append(t + shards)
        idx = np.concatenate(items)
        return ShardLayout(ShardGeometry.concat(parts), self.placed_device[n, idx].copy(),
                           self.placed_rows[n, idx].copy())
