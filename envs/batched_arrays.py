"""The state of a batch of placement episodes as (episodes, ...) arrays, and its step.

Slot ``n`` of every array is one :class:`autoshard.policy.episode.PlacementEpisode`, taken
over right after its reset (:meth:`EpisodeArrays.load`) and then stepped here for the whole
batch at once, with the episode's arithmetic operation for operation, so that each slot's
numbers are bit for bit the single episode's. Devices beyond an episode's task are padding:
their memory is zero, so nothing fits there, and their observation blocks stay zero.

Per-table data that a step reads (the table of each step, its rows, bytes, access curve, the
summary entries that depend on the step alone) is laid out in placement order in "sequence"
arrays, so that a step gathers the next table of every episode with one index.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoshard.access import GRID
from autoshard.policy.episode import PlacementEpisode, PricedTask
from autoshard.policy.features import ObsLayout
from autoshard.policy.observation import (
    RAW,
    SCALED,
    bucket_parts,
    record_placement,
    write_dynamic_options,
    write_fill_option,
    write_slack,
    write_summary,
)
from autoshard.pricing.cost import CostModel
from autoshard.task import ShardingTask, curve_share

# Columns of the float sequence array: per-row memory bytes, lookups per step, row bytes,
# optimizer bytes per row, row elements, relaxation bytes left, then the summary and the table
# features.
PER_ROW, LOOKUPS, ROW_BYTES, OPT_BYTES, DIM, BYTES_LEFT, SUMMARY = range(7)
# Columns of the integer sequence array: task index of the table, its rows, rows ever used,
# then the value buckets' HBM rows.
ORDER, ROWS, USED, BUCKETS = range(4)


class EpisodeArrays:
    """Every episode's memory, loads, observation and mask, as arrays over the batch.

    Args:
        n: Episodes.
        layout: The observation layout (``max_devices`` device slots).
        buckets: Buckets per device (the value buckets and "fill").
        cost_model: Prices the fill bucket; a model with a ``price_terms`` method (the
            analytical model) prices every episode's new fill options in one call.
    """

    def __init__(self, n: int, layout: ObsLayout, buckets: int, cost_model: CostModel) -> None:
        m, k = layout.max_devices, buckets
        self.n, self.layout, self.buckets, self.values = n, layout, buckets, k - 1
        self.cost_model = cost_model
        self._batched_price = callable(getattr(cost_model, "price_terms", None))
        self._ar, self._dev_idx = np.arange(n), np.arange(m)
        self.obs = np.zeros((n, layout.size), dtype=np.float32)
        n_table, n_dev = len(layout.table), len(layout.device)
        self.table_obs = self.obs[:, :n_table]
        self.summary_obs = self.obs[:, n_table:layout.head]
        blocks = self.obs[:, layout.head:].reshape(n, m, layout.device_block)
        self.dev_obs = blocks[:, :, 1:1 + n_dev]
        # Options per device: the layout's (one grid of buckets; ChoiceArrays: two).
        self.options = blocks[:, :, 1 + n_dev:].reshape(n, m, layout.buckets,
                                                        len(layout.option))
        assert np.shares_memory(self.options, self.obs), "the option view must not copy"
        self.mask = np.zeros((n, m * layout.buckets), dtype=bool)
        self._scaled = np.array([layout.device[name] for name in SCALED])
        f = len(SCALED)
        # Devices ([n, m]); the features scaled into the observation and their scales.
        self.free_hbm, self.free_host, self.load_ms = (np.zeros((n, m)) for _ in range(3))
        self.hbm_cap = np.ones((n, m))
        self.raw, self.scale = np.zeros((n, m, f)), np.zeros((n, m, f))
        self.valid = np.zeros((n, m), dtype=bool)
        # The next table's fill bucket on every device, and its value buckets' prices.
        self.fill_rows = np.zeros((n, m), dtype=np.int64)
        self.fill_parts, self.fill_total = np.zeros((n, m, 3)), np.zeros((n, m))
        self.cur_parts = np.zeros((n, m, k - 1, 3))
        # Pricing terms of each device and episode (see AnalyticalCostModel.price_terms).
        self.dev_terms = {name: np.ones((n, m)) for name in
                          ("hbm_gbps", "host_gbps", "intra_share", "inter_share")}
        self.task_terms: dict[str, np.ndarray] = {
            "train": np.zeros(n, dtype=bool), "batch_size": np.ones(n, dtype=np.int64),
            "kernel_overhead_us": np.zeros(n), "intra_node_gbps": np.ones(n),
            "inter_node_gbps": np.ones(n)}
        # Episodes.
        self.top, self.lower_bound = np.zeros(n), np.ones(n)
        self.step, self.tables = np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)
        self.devices = np.ones(n, dtype=np.int64)
        self.plain = np.zeros(n, dtype=bool)  # whole tables (not a ShardTask): priced in batch
        self.current_table = np.zeros(n, dtype=np.int64)
        self.priced: list[PricedTask | None] = [None] * n
        self.tasks: list[ShardingTask | None] = [None] * n
        self._groups: list[tuple[int, np.ndarray]] | None = None
        self._i = np.zeros(n, dtype=np.int64)  # step index of each episode's next table
        self.seq_f: np.ndarray = np.zeros((n, 1, 1))
        self.seq_i: np.ndarray = np.zeros((n, 1, 1), dtype=np.int64)
        self.curves: np.ndarray = np.zeros((n, 1, 1))
        self.placed_device: np.ndarray = np.zeros((n, 0), dtype=np.int64)
        self.placed_rows: np.ndarray = np.zeros((n, 0), dtype=np.int64)
        self._capacity = 0
        self._grow(1)

    # -- episodes ------------------------------------------------------------------------------

    def _grow(self, tables: int) -> None:
        """Makes room for episodes of ``tables`` tables in the sequence arrays."""
        n, cap, old = self.n, max(tables, 2 * self._capacity), self._capacity
        n_f = SUMMARY + len(self.layout.summary) + len(self.layout.table)
        seq_f, seq_i = np.zeros((n, cap + 1, n_f)), np.zeros((n, cap + 1, BUCKETS + self.values),
                                                             dtype=np.int64)
        curves = np.zeros((n, cap + 1, GRID.size))
        placed = np.full((n, cap), -1, dtype=np.int64), np.zeros((n, cap), dtype=np.int64)
        if old:
            seq_f[:, :old + 1], seq_i[:, :old + 1] = self.seq_f, self.seq_i
            curves[:, :old + 1] = self.curves
            placed[0][:, :old], placed[1][:, :old] = self.placed_device, self.placed_rows
        self.seq_f, self.seq_i, self.curves = seq_f, seq_i, curves
        self.placed_device, self.placed_rows = placed
        self._capacity = cap

    def load(self, n: int, ep: PlacementEpisode) -> None:
        """Takes over a freshly reset episode as slot ``n``."""
        p, task = ep.priced, ep.task
        t, d = task.num_tables, task.num_devices
        if t > self._capacity:
            self._grow(t)
        self.priced[n], self.tasks[n] = p, task
        self.obs[n], self.mask[n] = ep.obs, ep.mask
        fill = (() if ep._fill_rows.ndim > 1  # a choice episode's: loaded by ChoiceArrays
                else (("fill_rows", ep._fill_rows), ("fill_parts", ep._fill_parts),
                      ("fill_total", ep._fill_total)))
        for name, value in (("free_hbm", ep.state.free_hbm), ("free_host", ep.state.free_host),
                            ("load_ms", ep.state.load_ms), ("raw", ep._dev_raw),
                            ("scale", ep._dev_scale), *fill,
                            ("cur_parts", p.parts[p.order[0]])):
            array = getattr(self, name)
            array[n] = 0
            array[n, :d] = value
        self.hbm_cap[n] = 1.0
        self.hbm_cap[n, :d] = ep._hbm_cap
        self.valid[n] = self._dev_idx < d
        self._load_terms(n, task)
        self.top[n], self.step[n], self.lower_bound[n] = ep.top, ep.step_index, ep.lower_bound
        self.tables[n], self.devices[n] = t, d
        self.current_table[n] = p.order[0]
        self._load_sequences(n, p)
        self._groups = None

    def _load_terms(self, n: int, task: ShardingTask) -> None:
        d, dev, hw = task.num_devices, task.device_arrays, task.hardware
        self.plain[n] = type(task) is ShardingTask
        for name, array in self.dev_terms.items():
            array[n] = 1.0
            array[n, :d] = getattr(dev, name)
        terms = self.task_terms
        terms["train"][n], terms["batch_size"][n] = task.workload.train, task.workload.batch_size
        terms["kernel_overhead_us"][n] = hw.kernel_overhead_us
        terms["intra_node_gbps"][n] = hw.intra_node_gbps
        terms["inter_node_gbps"][n] = hw.inter_node_gbps

    def _load_sequences(self, n: int, p: PricedTask) -> None:
        a, o, t = p.task.table_arrays, p.order, p.task.num_tables
        f, i = self.seq_f[n], self.seq_i[n]
        s, tb = len(self.layout.summary), len(self.layout.table)
        f[:t, PER_ROW] = a.memory_bytes_per_row[o]
        f[:t, LOOKUPS] = a.lookups[o]
        f[:t, ROW_BYTES] = a.row_bytes[o]
        f[:t, OPT_BYTES] = a.optimizer_bytes[o]
        f[:t, DIM] = a.dim[o]
        f[:t + 1, BYTES_LEFT] = p.bytes_left
        f[:t + 1, SUMMARY:SUMMARY + s] = p.summary
        f[:t, SUMMARY + s:SUMMARY + s + tb] = p.table_feats
        i[:t, ORDER], i[:t, ROWS], i[:t, USED] = o, a.rows[o], a.rows_used[o]
        i[:t, BUCKETS:] = p.rows[o]
        self.curves[n, :t] = a.curves[o]
        self.placed_device[n, :t] = -1
        self.placed_rows[n, :t] = 0

    # -- the step ------------------------------------------------------------------------------

    def place(self, played: np.ndarray) -> np.ndarray:
        """Places every episode's next table with its legal action; returns the rewards."""
        ar, i = self._ar, self.step
        d, k = np.divmod(played, self.buckets)
        fill = k == self.values
        kv = np.minimum(k, self.values - 1)
        value_parts = self.cur_parts[ar, d, kv]
        price = np.where(fill, self.fill_total[ar, d], value_parts.sum(axis=-1))
        parts = np.where(fill[:, None], self.fill_parts[ar, d], value_parts)
        rows = np.where(fill, self.fill_rows[ar, d], self.seq_i[ar, i, BUCKETS + kv])
        per_row = self.seq_f[ar, i, PER_ROW]
        self.free_hbm[ar, d] -= rows * per_row
        self.free_host[ar, d] -= (self.seq_i[ar, i, ROWS] - rows) * per_row
        self.load_ms[ar, d] += price
        t = self.seq_i[ar, i, ORDER]
        self.placed_device[ar, t], self.placed_rows[ar, t] = d, rows
        raw = self.raw[ar, d]
        record_placement(raw, parts, price, self.load_ms[ar, d], self.free_hbm[ar, d],
                         self.free_host[ar, d])
        self.raw[ar, d] = raw
        self.dev_obs[ar[:, None], d[:, None], self._scaled[None, :]] = raw * self.scale[ar, d]
        top = np.maximum(self.top, raw[:, RAW["load"]])
        reward: np.ndarray = -(top - self.top) / self.lower_bound
        self.top = top
        self.step += 1
        return reward

    def observe_summary(self) -> None:
        """The device slacks and the summary of every episode."""
        ar, lay, step = self._ar, self.layout, self.step
        top = self.top / self.lower_bound
        write_slack(self.dev_obs, top[:, None], lay, where=self.valid)
        free, load = self._sums()
        base = self.seq_f[ar, step, SUMMARY:SUMMARY + len(lay.summary)]
        write_summary(self.summary_obs, lay, base, self.seq_f[ar, step, BYTES_LEFT], free, load,
                      top, self.devices, self.lower_bound)

    def _sums(self) -> tuple[np.ndarray, np.ndarray]:
        """Every episode's free HBM and load summed over its own devices, as numpy sums a
        vector of that length (episodes grouped by device count, so the rounding is the
        single episode's)."""
        if self._groups is None:
            self._groups = [(int(d), np.flatnonzero(self.devices == d))
                            for d in np.unique(self.devices)]
        if len(self._groups) == 1:
            d = self._groups[0][0]
            return self.free_hbm[:, :d].sum(axis=1), self.load_ms[:, :d].sum(axis=1)
        free, load = np.empty(self.n), np.empty(self.n)
        for d, idx in self._groups:
            free[idx] = self.free_hbm[idx, :d].sum(axis=1)
            load[idx] = self.load_ms[idx, :d].sum(axis=1)
        return free, load

    def gather_current(self, live: np.ndarray) -> None:
        """The next table of every live episode: its features and its value buckets' option
        features and prices."""
        ar = self._ar
        self._i = np.minimum(self.step, self.tables - 1)
        self.current_table = self.seq_i[ar, self._i, ORDER]
        s, tb = len(self.layout.summary), len(self.layout.table)
        self.table_obs[:] = self.seq_f[ar, self._i, SUMMARY + s:SUMMARY + s + tb]
        options, parts = self.options, self.cur_parts
        tables, devices = self.current_table.tolist(), self.devices.tolist()
        for n in np.flatnonzero(live).tolist():
            p, t, d = self.priced[n], tables[n], devices[n]
            assert p is not None
            p.static.write(options[n, :d, :-1], t, self.layout)
            parts[n, :d] = p.parts[t]

    def offer_fill(self, live: np.ndarray) -> None:
        """Prices the fill bucket of every live episode's next table on its devices (the most
        hottest rows the free HBM holds, at most the rows ever used); where those rows are one
        of the value buckets, that bucket's price is taken."""
        ar, i = self._ar, self._i
        per_row = self.seq_f[ar, i, PER_ROW]
        fit = np.floor(np.maximum(self.free_hbm, 0.0) / per_row[:, None])
        rows = np.minimum(fit, self.seq_i[ar, i, ROWS][:, None]).astype(np.int64)
        rows = np.minimum(rows, self.seq_i[ar, i, USED][:, None])
        parts, unmatched = bucket_parts(rows, self.seq_i[ar, i, BUCKETS:], self.cur_parts)
        new = unmatched & self.valid & live[:, None]
        if new.any():
            parts[new] = self._price(new, rows)
        self.fill_rows, self.fill_parts, self.fill_total = rows, parts, parts.sum(axis=-1)

    def _price(self, new: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """[count, 3] hbm/uvm/comm ms of the (episode, device) options ``new`` with ``rows``
        HBM rows of the episodes' next tables, in the order of ``np.nonzero(new)``."""
        nn, dd = np.nonzero(new)
        out = np.empty((nn.size, 3))
        batch = self.plain[nn] if self._batched_price else np.zeros(nn.size, dtype=bool)
        if batch.any():
            out[batch] = self._price_terms(nn[batch], dd[batch], rows[nn[batch], dd[batch]])
        for n in np.unique(nn[~batch]).tolist():
            at = np.flatnonzero((nn == n) & ~batch)
            task, t = self.tasks[n], int(self.current_table[n])
            p = self.cost_model.price(task, np.full(at.size, t), dd[at], rows[n, dd[at]])  # type: ignore[arg-type]
            out[at] = np.array((p.hbm_ms, p.uvm_ms, p.comm_ms)).T
        return out

    def _price_terms(self, nn: np.ndarray, dd: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The cost model's prices of rows of several episodes' next tables, one call."""
        i = self._i[nn]
        f = self.seq_f[nn, i]
        share = curve_share(self.curves[nn, i], self.seq_i[nn, i, ROWS], np.arange(nn.size),
                            rows)
        terms: dict[str, Any] = {name: a[nn] for name, a in self.task_terms.items()}
        terms.update({name: a[nn, dd] for name, a in self.dev_terms.items()})
        p = self.cost_model.price_terms(  # type: ignore[attr-defined]
            hbm_share=share, row_bytes=f[:, ROW_BYTES], dim=f[:, DIM],
            optimizer_bytes=f[:, OPT_BYTES],
            lookups=f[:, LOOKUPS], num_devices=self.devices[nn], **terms)
        return np.stack([p.hbm_ms, p.uvm_ms, p.comm_ms], axis=-1)

    def fits(self) -> np.ndarray:
        """[n, devices, buckets] whether each option of the next table fits (its HBM rows in
        free HBM, the rest in free host memory)."""
        ar, i, v = self._ar, self._i, self.values
        hbm_rows = np.empty((self.n, self.buckets, self.layout.max_devices), dtype=np.int64)
        hbm_rows[:, :v] = self.seq_i[ar, i, BUCKETS:][:, :, None]
        hbm_rows[:, v] = self.fill_rows
        per_row = self.seq_f[ar, i, PER_ROW][:, None, None]
        table_rows = self.seq_i[ar, i, ROWS][:, None, None]
        fits = ((hbm_rows * per_row <= self.free_hbm[:, None, :] + 1e-6)
                & ((table_rows - hbm_rows) * per_row <= self.free_host[:, None, :] + 1e-6))
        out: np.ndarray = fits.transpose(0, 2, 1) & self.valid[:, :, None]
        return out

    def observe_options(self, fits: np.ndarray) -> None:
        """The option features of every device and bucket, and the mask."""
        per_row = self.seq_f[self._ar, self._i, PER_ROW]
        write_fill_option(self.options[:, :, -1], self.fill_total,
                          self.fill_rows * per_row[:, None], self.lower_bound[:, None],
                          self.hbm_cap, self.layout)
        self.write_dynamic(fits)
        self.mask[:] = fits.reshape(self.n, -1)

    def write_dynamic(self, fits: np.ndarray) -> None:
        """The option features that depend on the devices' state, of every option grid
        (:func:`autoshard.policy.observation.write_dynamic_options`)."""
        write_dynamic_options(self.options, self.dev_obs,
                              (self.top / self.lower_bound)[:, None, None], fits, self.layout)

    def clear(self, done: np.ndarray) -> None:
        """The observation of finished episodes: no next table, no option, nothing allowed."""
        idx = np.flatnonzero(done)
        if idx.size:
            self.mask[idx] = False
            self.table_obs[idx] = 0.0
            self.options[idx] = 0.0
