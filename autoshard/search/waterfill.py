"""Water-filling a device's HBM over its items' cost curves.

An item (a table, or a shard priced as one) has, on each kind of device, the lower hull of its
cost against HBM bytes (:class:`autoshard.pricing.curves.Curves`). Water-filling a device's HBM
takes its items' hull segments by worth (saving per byte), the largest first;
:class:`SegmentLists` keeps every device's segments in that order with running sums, so that a
device's best saving for any HBM budget is one search; after a move only the two devices'
segments are laid out again (:meth:`SegmentLists.moved`). The polish
(:mod:`autoshard.search.polish`) works on these.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autoshard.pricing.curves import Curves


def by_device(device: np.ndarray) -> np.ndarray:
    """The stable order of segments by device (a radix sort on 16-bit device numbers)."""
    small = device.astype(np.int16) if device.size and device.max() < 2**15 else device
    return np.argsort(small, kind="stable")


@dataclass(frozen=True)
class SegmentLists:
    """Every device's segments in water-filling order (the largest worth first), with
    cumulative bytes and savings, so that a device's best saving for any HBM budget is one
    search (:meth:`saving_at`)."""

    start: np.ndarray  # [D] first segment of each device
    end: np.ndarray  # [D] past its last
    owner: np.ndarray
    extra: np.ndarray
    worth: np.ndarray
    saving: np.ndarray
    bytes_in: np.ndarray  # cumulative bytes within the device, through each segment
    saved_in: np.ndarray  # cumulative saving within the device, through each segment
    key: np.ndarray  # bytes_in + the device's offset: one increasing array for all devices
    offset: np.ndarray  # [D]
    base: np.ndarray  # [D] load with no row in HBM (curve level)
    load: np.ndarray  # [D] load with HBM water-filled (curve level)

    @classmethod
    def build(cls, curves: Curves, device: np.ndarray, hbm_cap: np.ndarray) -> SegmentLists:
        """The lists of items on ``device`` with ``hbm_cap`` bytes of HBM for rows per
        device."""
        n_d = hbm_cap.size
        parts = []
        for k, (owner, extra, worth, saving) in enumerate(curves.segments):
            d = device[owner]
            m = curves.kind[d] == k
            parts.append((d[m], owner[m], extra[m], worth[m], saving[m]))
        d, o, e, w, g = (np.concatenate(x) for x in zip(*parts, strict=True))
        order = by_device(d)
        d, o, e, w, g = d[order], o[order], e[order], w[order], g[order]
        counts = np.bincount(d, minlength=n_d)
        end = np.cumsum(counts)
        start = end - counts
        x, v = np.cumsum(e), np.cumsum(g)
        bytes_in = x - np.r_[0.0, x][start][d]
        saved_in = v - np.r_[0.0, v][start][d]
        width = float(max(bytes_in.max(initial=0.0), hbm_cap.max())) * 2.0 + 1.0
        offset = np.arange(n_d) * width
        index = np.arange(device.size)
        base = np.bincount(device, weights=curves.cost[curves.kind[device], index, 0],
                           minlength=n_d)
        lists = cls(start, end, o, e, w, g, bytes_in, saved_in, bytes_in + offset[d], offset,
                    base, base)
        full = lists.saving_at(np.arange(n_d), hbm_cap)
        return replace(lists, load=base - full)

    def moved(self, curves: Curves, device: np.ndarray, hbm_cap: np.ndarray,
              devs: np.ndarray) -> SegmentLists:
        """These lists after items moved between devices ``devs`` only (as :meth:`build` of
        ``device`` and ``hbm_cap``): those devices' segments laid out again, the others' kept;
        a whole build where a device's segments outgrow the room its keys have."""
        devs = np.unique(devs)
        blocks = []
        for d in devs:
            owner, extra, worth, saving = curves.segments[curves.kind[d]]
            at = curves.on_device(device, d)
            blocks.append((owner[at], extra[at], worth[at], saving[at]))
        width = self.offset[1] if self.offset.size > 1 else np.inf
        sizes = [float(np.sum(b[1])) for b in blocks]
        if max(sizes, default=0.0) * 2.0 + 1.0 > width:
            return SegmentLists.build(curves, device, hbm_cap)
        counts = self.end - self.start
        cuts = [0]
        pieces: list[tuple[np.ndarray, ...]] = []

        def kept(at: slice) -> tuple[np.ndarray, ...]:
            return (self.owner[at], self.extra[at], self.worth[at], self.saving[at],
                    self.bytes_in[at], self.saved_in[at], self.key[at])

        for d, (o, e, w, g) in zip(devs, blocks, strict=True):
            pieces.append(kept(slice(cuts[-1], self.start[d])))
            x = np.cumsum(e)
            pieces.append((o, e, w, g, x, np.cumsum(g), x + self.offset[d]))
            cuts.append(self.end[d])
            counts[d] = o.size
        pieces.append(kept(slice(cuts[-1], None)))
        o, e, w, g, x, v, key = (np.concatenate(a) for a in zip(*pieces, strict=True))
        end = np.cumsum(counts)
        start = end - counts
        index = np.arange(device.size)
        base = np.bincount(device, weights=curves.cost[curves.kind[device], index, 0],
                           minlength=counts.size)
        lists = SegmentLists(start, end, o, e, w, g, x, v, key, self.offset, base, base)
        return replace(lists, load=base - lists.saving_at(np.arange(counts.size), hbm_cap))

    def _taken(self, dev: np.ndarray, budget: np.ndarray) -> np.ndarray:
        """Index (in the lists) past the last segment of devices ``dev`` that ``budget`` bytes
        of HBM take whole."""
        return np.searchsorted(self.key, budget + self.offset[dev], side="right")

    def level_at(self, dev: np.ndarray, budget: np.ndarray) -> np.ndarray:
        """The worth (ms per byte) of the segment that ``budget`` bytes of HBM of devices
        ``dev`` reach into, 0 where they hold every segment: at most the slope of the device's
        best saving just below ``budget`` (the saving is concave)."""
        pos = self._taken(dev, budget)
        if not self.key.size:
            return np.zeros(np.shape(budget))
        return np.where(pos < self.end[dev], self.worth[np.minimum(pos, self.key.size - 1)], 0.0)

    def saving_at(self, dev: np.ndarray, budget: np.ndarray) -> np.ndarray:
        """Best saving (ms) of devices ``dev`` with ``budget`` bytes of HBM (same shapes)."""
        pos = self._taken(dev, budget)
        start, end = self.start[dev], self.end[dev]
        has = pos > start
        prev = np.maximum(pos - 1, 0)
        got_x = np.where(has, self.bytes_in[prev] if self.key.size else 0.0, 0.0)
        got_v = np.where(has, self.saved_in[prev] if self.key.size else 0.0, 0.0)
        more = pos < end
        nxt = np.minimum(pos, max(self.key.size - 1, 0))
        if not self.key.size:
            return np.zeros(np.shape(budget))
        part = np.where(more, (budget - got_x) * self.saving[nxt] / self.extra[nxt], 0.0)
        return got_v + part
