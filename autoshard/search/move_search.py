"""The move search of the polish (:mod:`autoshard.search.polish`) on one layout's items.

A :class:`Polisher` holds each item's device, HBM rows and price and every device's load, over
the items' cost curves (:mod:`autoshard.search.waterfill`): it water-fills HBM per device and
moves and swaps items off the most loaded device while that lowers it (see the polish's module
docstring for the rules).
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import Curves
from autoshard.search.waterfill import SegmentLists, by_device
from autoshard.task import ShardingTask

#: Candidate moves (and swaps) priced exactly per round, best estimates first.
VERIFY = 6
#: Devices (the highest levels first) whose moves may even out the work when none lowers the
#: maximum.
WORK_SOURCES = 4
#: Most items of a device whose moves a round prices, and most swap partners (on thousands of
#: tables a round over all of them took seconds, past any time guard): beyond, items evenly
#: spread over the price ranking (:func:`_spread`).
MAX_MOVED, MAX_PARTNERS = 256, 2048
#: Relative margin by which a change must lower the load it aims at.
MARGIN = 1e-9


class Polisher:
    """Rows and moves of one layout's items (tables or shards, priced as tables).

    Args:
        items: The task whose tables are the items (a task, or its shards' pricing task).
        cost_model: Prices every item.
        curves: The items' :class:`Curves`.
        device: Each item's device ([N]).
        rows: Each item's HBM rows ([N]).
        node_bound: Items that must stay on their device's node (table_row_wise shards).
        fixed: Items that must stay on their device (:func:`autoshard.layout.shards.fixed_shards`).
        locked: Items whose HBM rows stay as given (a split table's shards once they share
            one HBM share); the others' are filled around them. Items whose HBM rows are fixed
            by their bounds (replicas, constrained tables:
            :attr:`autoshard.task.TableArrays.hbm_least`) are locked at them too.
    """

    def __init__(self, items: ShardingTask, cost_model: CostModel, curves: Curves,
                 device: np.ndarray, rows: np.ndarray,
                 node_bound: np.ndarray | None = None, fixed: np.ndarray | None = None,
                 locked: np.ndarray | None = None) -> None:
        self.items, self.cost_model = items, cost_model
        a, dev = items.table_arrays, items.device_arrays
        n = items.num_tables
        bounded = a.hbm_least == a.hbm_most
        self.device = device.astype(np.int64)
        self.rows = np.where(bounded, a.hbm_least, rows).astype(np.int64)
        self.node_bound = np.zeros(n, dtype=bool) if node_bound is None else node_bound
        self.fixed = np.zeros(n, dtype=bool) if fixed is None else fixed
        self.locked = bounded | (np.zeros(n, dtype=bool) if locked is None else locked)
        # HBM per row and per item wherever it lives, as the runtime counts them; host memory
        # per row not in HBM.
        self.per_row, self.host_per_row = a.hbm_bytes_per_row, a.memory_bytes_per_row
        self.reserved, self.all_rows = a.hbm_reserved_bytes, a.rows
        self.capacity, self.host_cap, self.node = dev.hbm_capacity, dev.host_capacity, dev.node
        self.hbm_cap = self._caps(self.device)  # HBM left for rows, per device
        self.curves = curves
        self.kind = curves.kind
        self.cost, self.used, self.worth = curves.cost, curves.used, curves.worth
        self.extra = curves.extra
        self.segments = curves.segments
        self.price = self._price(np.arange(n), self.device, self.rows)
        self.load = np.bincount(self.device, weights=self.price, minlength=items.num_devices)
        self.level = np.zeros(items.num_devices)  # each device's water level, ms per byte
        self._lists: SegmentLists | None = None  # segments by device (re-laid where items move)

    # -- rows ----------------------------------------------------------------------------------

    def refill(self) -> None:
        """Re-chooses every device's HBM rows; a device keeps its old rows where the new ones
        do not lower its load (or do not fit its host memory)."""
        everything = np.arange(self.items.num_tables)
        rows, level = self._fill(np.arange(self.load.size), self.device)
        price = self._price(everything, self.device, rows)
        load = np.bincount(self.device, weights=price, minlength=self.load.size)
        better = (load < self.load * (1 - MARGIN)) & self._host_ok(everything, self.device, rows)
        take = better[self.device]
        self.rows[take], self.price[take] = rows[take], price[take]
        self.load[better] = load[better]
        self.level = level

    def filled_rows(self) -> np.ndarray:
        """Every item's HBM rows water-filled on its device (locked items keep theirs)."""
        return self._fill(np.arange(self.load.size), self.device)[0]

    def _caps(self, device: np.ndarray) -> np.ndarray:
        """[D]: each device's HBM for rows, less the reservations of the items ``device`` puts
        there and the rows of the locked ones."""
        held = np.where(self.locked, self.rows * self.per_row, 0.0)
        return self.capacity - np.bincount(device, weights=self.reserved + held,
                                           minlength=self.capacity.size)

    def _fill(self, devs: np.ndarray, device: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Water-fills the HBM of devices ``devs`` with the items ``device`` puts there;
        returns every item's rows (those of items elsewhere: 0) and each device's level ([D],
        0 where HBM holds every segment that saves anything, and elsewhere)."""
        rows = np.zeros(self.all_rows.size, dtype=np.int64)
        level = np.zeros(self.load.size)
        caps = self._caps(device)
        wanted = np.zeros(self.load.size, dtype=bool)
        wanted[devs] = True
        for k in np.unique(self.kind[devs]):
            owner, extra, worth, _ = self.segments[k]
            d = device[owner]
            mine = wanted[d] & ~self.locked[owner]
            o, e, w, d = owner[mine], extra[mine], worth[mine], d[mine]
            if devs.size > 1:
                order = by_device(d)  # worth order kept within each device
                o, e, w, d = o[order], e[order], w[order], d[order]
            cum = np.cumsum(e)
            starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]]) if d.size else np.zeros(0, int)
            before = np.repeat(cum[starts] - e[starts], np.diff(np.r_[starts, d.size]))
            room = caps[d] - (cum - e - before)  # HBM left when a segment's turn comes
            part = np.clip(room / e, 0.0, 1.0)
            got = np.bincount(o, weights=e * part, minlength=rows.size)
            on = wanted[device] & (self.kind[device] == k)
            rows[on] = np.floor(got[on] / self.per_row[on] + 1e-9)
            partial = np.flatnonzero((part > 0) & (part < 1))
            level[d[partial]] = w[partial]
        keep = self.locked & wanted[device]
        rows[keep] = self.rows[keep]
        return np.minimum(rows, self.all_rows), level

    def _fill_pair(self, lists: SegmentLists, pair: tuple[int, int], device: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_fill` of two devices after items changed places between them: each
        device's segments from ``lists`` (built before the change) less those of the items
        that left, merged with those of the items that came; locked items keep their rows."""
        rows = np.zeros(self.all_rows.size, dtype=np.int64)
        level = np.zeros(self.load.size)
        caps = self._caps(device)
        for d in pair:
            lo, hi = lists.start[d], lists.end[d]
            o = lists.owner[lo:hi]
            stay = (device[o] == d) & ~self.locked[o]  # locked items keep their rows
            o, e, w = o[stay], lists.extra[lo:hi][stay], lists.worth[lo:hi][stay]
            came = np.flatnonzero((device == d) & (self.device != d) & ~self.locked)
            if came.size:
                k = self.kind[d]
                cw, ce = self.worth[k, came], self.extra[k, came]
                keep = (cw > 0) & (ce > 0)
                co = np.broadcast_to(came[:, None], cw.shape)[keep]
                o, e, w = (np.concatenate((o, co)), np.concatenate((e, ce[keep])),
                           np.concatenate((w, cw[keep])))
                order = np.argsort(-w, kind="stable")
                o, e, w = o[order], e[order], w[order]
            room = caps[d] - (np.cumsum(e) - e)
            part = np.clip(room / e, 0.0, 1.0)
            got = np.bincount(o, weights=e * part, minlength=rows.size)
            on = device == d
            rows[on] = np.floor(got[on] / self.per_row[on] + 1e-9)
            rows[on & self.locked] = self.rows[on & self.locked]
            partial = np.flatnonzero((part > 0) & (part < 1))
            if partial.size:
                level[d] = w[partial[0]]
        return np.minimum(rows, self.all_rows), level

    # -- moves ---------------------------------------------------------------------------------

    def search(self, rounds: int, seconds: float) -> None:
        """Moves and swaps until none helps, ``rounds`` rounds ran or ``seconds`` pass (no
        round starts that the last one's time says would end past them): off the most loaded
        device while that lowers it, else, from the devices whose HBM is worth most (the
        highest levels), those that lower the work of the two devices without raising the
        maximum (which evens the levels, and so the work, out)."""
        stop = time.perf_counter() + seconds
        alike = self.cost.shape[0] == 1  # one kind of device
        last = 0.0  # how long the last round took: a round that would end past stop is not run
        for _ in range(rounds):
            began = time.perf_counter()
            top = int(np.argmax(self.load))
            if began + last >= stop or (alike and (self.device == top).sum() < 2):
                break  # one item alone on the top device: no move can lower it
            improved = self._improve(top, work=False)
            last = time.perf_counter() - began
            if improved:
                continue
            sources = np.argsort(-self.level, kind="stable")[:WORK_SOURCES]
            if not any(time.perf_counter() + last < stop and self._improve(int(d), work=True)
                       for d in sources):
                break

    def _improve(self, s: int, work: bool) -> bool:
        """One round of moves and swaps of device ``s``'s items; whether one was applied.
        Without ``work`` each must lower device ``s`` (the most loaded) with the other device
        below its old load; with it, lower the two devices' total, both below the maximum."""
        mine = np.flatnonzero(self.device == s)
        if mine.size == 0:
            return False
        mine = _spread(mine, self.price[mine], MAX_MOVED)
        if self._lists is None:
            self._lists = SegmentLists.build(self.curves, self.device, self.hbm_cap)
        lists = self._lists
        here = lists.load - self.load  # curve-level minus priced load, per device
        out_s = self._removal(lists, s, mine) - here[s]  # [n_s]
        devices = np.arange(self.load.size)
        others = np.flatnonzero(self.device != s)
        if not work:  # to lower device s, a swap brings in an item cheaper than one it sends
            others = others[self.price[others] < self.price[mine].max()]
        others = _spread(others, self.price[others], MAX_PARTNERS)
        b = self.device[others]
        # Moves: a removal from s (exact) then an arrival on the unchanged other device. Swaps:
        # each side as a removal then an arrival on the unchanged other device; the other
        # device's removal valued at its level (the Lagrangian estimate).
        leave = self.price + self.level[self.device] * self.rows * self.per_row
        limit = float(self.load.max() if work else self.load[s])
        add, add_s = self._estimates(lists, s, mine, out_s, others, leave, limit)
        new_s = np.concatenate((np.repeat(out_s[:, None], devices.size, axis=1),
                                out_s[:, None] + add_s[None, :]), axis=1)
        new_b = np.concatenate((self.load[None, :] + add,
                                (self.load[b] - leave[others])[None, :] + add[:, b]), axis=1)
        allowed = self._allowed(mine, s)
        ok = np.concatenate((allowed, allowed[:, b] & self._allowed(others, b)[:, s][None, :]),
                            axis=1)
        ok[:, s] = False
        top = float(self.load.max())
        new_max = np.maximum(new_s, new_b)
        if work:
            old = self.load[s] + np.concatenate((self.load, self.load[b]))[None, :]
            score = new_s + new_b - old
            ok &= (new_max < top * (1 - MARGIN)) & (score < -MARGIN * top)
        else:
            score = new_max
            ok &= score < self.load[s] * (1 - MARGIN)
        return self._try(lists, s, mine, others, np.where(ok, score, np.inf), work)

    def _estimates(self, lists: SegmentLists, s: int, mine: np.ndarray, out_s: np.ndarray,
                   others: np.ndarray, leave: np.ndarray, limit: float
                   ) -> tuple[np.ndarray, np.ndarray]:
        """What each item of ``mine`` adds to each device's load ([n_s, D]), and each swap
        partner of ``others`` to device ``s``'s ([m]), from :meth:`_arrival`: infinite where
        the change (a move, or a swap with an item there) cannot bring both of its devices
        below ``limit`` (the load :meth:`_improve` asks to undercut), by the bound of
        :meth:`_least`; those are not estimated. ``out_s``: device ``s``'s load without each
        of ``mine``; ``leave``: what each item's leaving takes off its device."""
        b = self.device[others]
        least, last = self._least(lists, mine, np.arange(self.load.size))  # [n_s, D]
        # On s, each partner's cheapest cost first (a weaker bound), then the bound where
        # that leaves a swap possible.
        least_s = self.cost[self.kind[s], others, -1]  # [m]
        maybe = ((out_s.min() + least_s < limit)
                 & (self.load[b] - leave[others] + least.min(axis=0)[b] < limit))
        last_s = np.full(others.size, -1)
        least_s[maybe], last_s[maybe] = (a[:, 0] for a in self._least(lists, others[maybe],
                                                                      np.array([s])))
        swap = ((out_s[:, None] + least_s[None, :] < limit)
                & ((self.load[b] - leave[others])[None, :] + least[:, b] < limit))  # [n_s, m]
        wanted = self.load[None, :] + least < limit  # moves, and the swaps' other sides
        i, j = np.nonzero(swap)
        wanted[i, b[j]] = True
        i, d = np.nonzero(wanted)
        kept = np.flatnonzero(swap.any(axis=0))
        loads = self._arrival(lists, np.concatenate((mine[i], others[kept])),
                              np.concatenate((d, np.full(kept.size, s))),
                              np.concatenate((last[i, d], last_s[kept])))
        add = np.full(wanted.shape, np.inf)
        add[i, d] = loads[:i.size] - lists.load[d]
        add_s = np.full(others.size, np.inf)
        add_s[kept] = loads[i.size:] - lists.load[s]
        return add, add_s

    def _removal(self, lists: SegmentLists, a: int, mine: np.ndarray) -> np.ndarray:
        """[n_a]: device ``a``'s curve-level load without each of its items ``mine``, its HBM
        water-filled again (the cut only moves on, by at most the item's bytes, so only that
        window of the device's segments is scanned per item)."""
        lo, hi = lists.start[a], lists.end[a]
        o, e, gain = lists.owner[lo:hi], lists.extra[lo:hi], lists.saving[lo:hi]
        base0 = self.cost[self.kind[a], mine, 0]
        if o.size == 0:
            return lists.base[a] - base0
        cap = self.hbm_cap[a]
        x_all, v_all = lists.bytes_in[lo:hi], lists.saved_in[lo:hi]
        first = int(np.searchsorted(x_all, cap, side="right"))  # segments taken whole now
        slot = np.full(self.all_rows.size, -1)
        slot[mine] = np.arange(mine.size)
        own = slot[o]
        held = np.bincount(own[own >= 0], weights=e[own >= 0], minlength=mine.size)
        last = min(int(np.searchsorted(x_all, cap + held.max(), side="right")) + 1, o.size)
        head = own[:first] >= 0
        # Bytes and savings before the window, less the item's own.
        bx = (x_all[first - 1] if first else 0.0) - np.bincount(
            own[:first][head], weights=e[:first][head], minlength=mine.size)
        bv = (v_all[first - 1] if first else 0.0) - np.bincount(
            own[:first][head], weights=gain[:first][head], minlength=mine.size)
        w = slice(first, last)
        keep = o[None, w] != mine[:, None]  # [n_a, window]
        x = bx[:, None] + np.cumsum(e[w] * keep, axis=1)
        v = bv[:, None] + np.cumsum(gain[w] * keep, axis=1)
        p = (x <= cap).sum(axis=1)
        rows = np.arange(mine.size)
        prev = np.maximum(p - 1, 0)
        got_x = np.where(p > 0, x[rows, prev], bx) if x.shape[1] else bx
        got_v = np.where(p > 0, v[rows, prev], bv) if x.shape[1] else bv
        nxt = np.minimum(first + p, o.size - 1)
        part = np.where(first + p < o.size, (cap - got_x) * gain[nxt] / e[nxt], 0.0)
        return lists.base[a] - base0 - got_v - part

    def _least(self, lists: SegmentLists, sel: np.ndarray, devices: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """[n, len(devices)]: a lower bound of what each item of ``sel`` adds to each device's
        curve-level load (:meth:`_arrival`), and the last grid point the item's best split
        there can take (-1 where none fits).

        The device's saving is concave in its HBM, so the bytes the item takes (its
        reservation, its rows) cost the others at least the device's water level each (the
        worth of the segment at its HBM's end): the bound is the item's cheapest grid point
        that fits, each byte there priced at that level. Past the point where the item's
        hull's worth falls to that level, a grid point saves the item less than it costs the
        others: no split takes it."""
        cap = self.hbm_cap[devices]
        level = lists.level_at(devices, cap)
        if self.cost.shape[0] == 1:  # one kind of device: each item's curve, broadcast
            used, cost, worth = (a[0, sel][:, None, :] for a in (self.used, self.cost, self.worth))
        else:
            k, item = self.kind[devices][None, :], sel[:, None]
            used, cost, worth = self.used[k, item], self.cost[k, item], self.worth[k, item]
        reserved = self.reserved[sel][:, None]
        fit = (used <= (cap[None, :] - reserved)[:, :, None]).sum(axis=2) - 1  # the last that fits
        # Where the item's hull's slope falls to the level (it is convex).
        turn = (worth > level[None, :, None]).sum(axis=2)
        at = np.minimum(turn, np.maximum(fit, 0))[:, :, None]
        least = (np.take_along_axis(cost, at, axis=2)[:, :, 0]
                 + level[None, :] * (reserved + np.take_along_axis(used, at, axis=2)[:, :, 0]))
        return np.where(fit >= 0, least, np.inf), np.where(fit >= 0, at[:, :, 0], -1)

    def _arrival(self, lists: SegmentLists, sel: np.ndarray, devices: np.ndarray,
                 last: np.ndarray) -> np.ndarray:
        """[n]: curve-level load of device ``devices[i]`` with item ``sel[i]`` added, HBM split
        between the item's grid points (up to ``last[i]``, from :meth:`_least`; none where it
        is -1) and the device's water-filled segments (at most the best split: an upper bound
        of the load).

        The saving of a split is concave in the item's bytes (its hull's saving plus the
        device's water-filled saving of the bytes left, both concave), so the best grid point
        is found by bisection on its slope: about log2(G) points priced, not G."""
        k = self.kind[devices]
        cap = self.hbm_cap[devices] - self.reserved[sel]
        used, cost = self.used[k, sel], self.cost[k, sel]  # [n, G]
        lo, hi = np.zeros(cap.size, dtype=np.int64), np.maximum(last, 0)

        def value(p: np.ndarray, at: np.ndarray) -> np.ndarray:
            """The saving of pairs ``p`` with the item at grid point ``at``."""
            room = cap[p] - used[p, at]
            return cost[p, 0] - cost[p, at] + lists.saving_at(devices[p], room)

        pairs = np.flatnonzero(lo < hi)
        while pairs.size:
            mid = (lo[pairs] + hi[pairs]) // 2
            both = value(np.concatenate((pairs, pairs)), np.concatenate((mid + 1, mid)))
            rise = both[:pairs.size] > both[pairs.size:]
            lo[pairs] = np.where(rise, mid + 1, lo[pairs])
            hi[pairs] = np.where(rise, hi[pairs], mid)
            pairs = pairs[lo[pairs] < hi[pairs]]
        total = np.full(cap.size, -np.inf)
        fit = np.flatnonzero(last >= 0)
        total[fit] = value(fit, lo[fit])
        return lists.base[devices] + cost[:, 0] - total

    def _allowed(self, sel: np.ndarray, home: int | np.ndarray) -> np.ndarray:
        """[n, D]: where each item of ``sel`` may go (node-bound items: their node only; fixed
        items: nowhere else)."""
        ok = np.ones((sel.size, self.load.size), dtype=bool)
        bound = self.node_bound[sel]
        if bound.any():
            here = self.node[np.broadcast_to(home, sel.shape)]
            ok[bound] = self.node[None, :] == here[bound, None]
        fixed = self.fixed[sel]
        if fixed.any():
            at = np.broadcast_to(home, sel.shape)
            ok[fixed] = np.arange(self.load.size)[None, :] == at[fixed, None]
        return ok

    def _try(self, lists: SegmentLists, s: int, mine: np.ndarray, others: np.ndarray,
             score: np.ndarray, work: bool) -> bool:
        """Prices the :data:`VERIFY` best-scored changes exactly (columns of ``score``: moves
        of ``mine[i]`` to every device, then swaps with every item of ``others``); applies the
        best that meets :meth:`_improve`'s condition."""
        n_d = self.load.size
        flat = score.ravel()
        count = min(VERIFY, int(np.isfinite(flat).sum()))
        top = float(self.load.max())
        best: tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        for c in np.argsort(flat, kind="stable")[:count]:
            i, col = divmod(int(c), score.shape[1])
            device = self.device.copy()
            if col < n_d:
                b = col
                device[mine[i]] = b
            else:
                j = others[col - n_d]
                b = int(self.device[j])
                device[mine[i]], device[j] = b, s
            sel = np.flatnonzero((device == s) | (device == b))
            rows, level = self._fill_pair(lists, (s, b), device)
            rows = rows[sel]
            if not self._host_ok(sel, device, rows).all():
                continue
            price = self._price(sel, device[sel], rows)
            load = np.bincount(device[sel], weights=price, minlength=n_d)
            new = max(load[s], load[b])
            if work:
                value = load[s] + load[b] - self.load[s] - self.load[b]
                good = new < top * (1 - MARGIN) and value < -MARGIN * top
            else:
                value = new
                good = new < self.load[s] * (1 - MARGIN)
            if good and (best is None or value < best[0]):
                best = (value, device, sel, rows, level)
        if best is None:
            return False
        _, device, sel, rows, level = best
        self.device = device
        self.hbm_cap = self._caps(device)
        self.rows[sel] = rows
        self.price[sel] = self._price(sel, device[sel], rows)
        self.load = np.bincount(device, weights=self.price, minlength=n_d)
        touched = np.unique(device[sel])
        self._lists = lists.moved(self.curves, device, self.hbm_cap, touched)
        self.level[touched] = level[touched]
        return True

    # -- pricing and memory ----------------------------------------------------------------------

    def _price(self, sel: np.ndarray, device: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.cost_model.price(self.items, sel, device, rows).total_ms)

    def _host_ok(self, sel: np.ndarray, device: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """[D]: whether the host memory of each device holds ``sel``'s rows not in HBM (devices
        without an item of ``sel`` count as holding)."""
        cold = (self.all_rows[sel] - rows) * self.host_per_row[sel]
        host = np.bincount(device[sel], weights=cold, minlength=self.load.size)
        seen = np.bincount(device[sel], minlength=self.load.size) > 0
        return ~seen | (host <= self.host_cap + 1e-6)


def _spread(items: np.ndarray, price: np.ndarray, most: int) -> np.ndarray:
    """``items`` when there are at most ``most``; else ``most`` of them evenly spread over their
    ranking by ``price`` (the dearest and the cheapest included), in their order."""
    if items.size <= most:
        return items
    ranked = np.argsort(price, kind="stable")
    return np.sort(items[ranked[np.linspace(0, items.size - 1, most).round().astype(int)]])
