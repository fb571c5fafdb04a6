"""What placing a plan's items copies from the plan in use, over which link, and how long that
takes: the one owner of the move arithmetic.

An item of a new plan (a whole table, or a shard) holds rows R and columns C of its table on a
device d. Of its bytes (weights, and in training its row-wise optimizer state, which every column
block keeps for its rows):

- the part that the plan in use already holds on d stays there: the overlap of R x C with that
  plan's pieces of the table on d;
- the rest is sent to d from the devices that hold it, over an intra-node or an inter-node link
  (for a replicated table from one replica, on d's node where there is one);
- of the part that stays, the rows whose tier changes are copied between d's host memory and
  its HBM (over PCIe, at its host tier's bandwidth): the item's share of rows in HBM against the
  share the old piece kept there, over the rows they share (ids are hashed, so hot rows spread
  evenly over row ranges).

A table the plan in use does not hold (a new one, or one whose rows or dim changed) is created
where the new plan puts it, and nothing is copied for it. A device of the plan in use beyond the
new hardware is drained: its pieces are sent away.

Time: every device sends and receives at once over its links (full duplex). A device's time is
the largest of the bytes it sends (intra-node bytes over ``intra_node_gbps`` plus inter-node
bytes over ``inter_node_gbps``), the bytes it receives (the same) and its host-HBM bytes over its
host tier's bandwidth; the move takes as long as the slowest device.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from autoshard.errors import InputError
from autoshard.hardware import GB, HardwareProfile
from autoshard.layout.plan import Placement, Plan, check_placement
from autoshard.layout.shards import ShardGeometry, pricing_task
from autoshard.tables import Table
from autoshard.task import ShardingTask


class Link(Enum):
    """What a copy crosses: a link between two devices of one node, one between nodes, or the
    bus between a device's host memory and its HBM."""

    INTRA_NODE = "intra_node"
    INTER_NODE = "inter_node"
    HOST_HBM = "host_hbm"

    @property
    def code(self) -> int:
        return _LINKS.index(self)


_LINKS = tuple(Link)


@dataclass(frozen=True, eq=False)
class Incumbent:
    """The plan in use, as pieces of the new task's tables (every array shaped [P] but
    ``node``, ``created``).

    Args:
        table: The task index of each piece's table.
        device: Its rank (one beyond the new hardware's is drained).
        row_start: First row (inclusive).
        row_end: Last row (exclusive).
        col_start: First column (inclusive).
        col_end: Last column (exclusive).
        hbm_share: Share of its rows it keeps in HBM.
        replica: Whether it is a replica of a replicated table.
        node: The node of each rank: the plan in use's hardware's for its ranks, the new
            hardware's for ranks only it has.
        created: [T] the new task's tables the plan in use does not hold (new ones, or ones
            whose rows or dim changed): created where the new plan puts them.
        removed: The tables only the plan in use holds.
    """

    table: np.ndarray
    device: np.ndarray
    row_start: np.ndarray
    row_end: np.ndarray
    col_start: np.ndarray
    col_end: np.ndarray
    hbm_share: np.ndarray
    replica: np.ndarray
    node: np.ndarray
    created: np.ndarray
    removed: tuple[str, ...]

    @classmethod
    def of(cls, previous: Plan, task: ShardingTask, hardware: HardwareProfile | None = None,
           tables: tuple[Table, ...] | None = None) -> Incumbent:
        """The pieces of ``previous`` (made on ``hardware``, default its context's; for
        ``tables``, default its context's where they can be read) that hold ``task``'s tables.
        Where neither gives its hardware, its ranks are taken to lie on the new hardware's
        nodes, ``devices_per_node`` to a node, those beyond the new hardware included.

        Raises:
            InputError: A rank of ``previous`` beyond the hardware it was made on.
        """
        hardware = hardware or (previous.context.hardware if previous.context is not None
                                else None)
        before = {t.name: t for t in (tables or _recorded_tables(previous))}
        cols: dict[str, list[float]] = {k: [] for k in (
            "table", "device", "row_start", "row_end", "col_start", "col_end", "hbm_share",
            "replica")}
        created = np.ones(task.num_tables, dtype=bool)
        removed = []
        for i, p in enumerate(previous.placements):
            t = task.index.get(p.table)
            if t is None:
                removed.append(p.table)
                continue
            table = task.tables[t]
            if not _same_shape(before.get(p.table), table) or not _fits(p, i, table):
                continue
            created[t] = False
            for s in p.pieces(table.rows, table.dim):
                for key, value in (("table", t), ("device", s.device),
                                   ("row_start", s.row_start), ("row_end", s.row_end),
                                   ("col_start", s.col_start), ("col_end", s.col_end),
                                   ("hbm_share", min(s.hbm_rows / max(s.rows, 1), 1.0)),
                                   ("replica", p.sharding.replicated)):
                    cols[key].append(value)
        device = np.array(cols["device"], dtype=np.int64)
        used = int(device.max()) + 1 if device.size else 0
        if hardware is not None and used > hardware.num_devices:
            raise InputError(f"the plan in use places a piece on rank {used - 1}, but its "
                             f"hardware '{hardware.name}' has {hardware.num_devices} devices",
                             field="previous", value=used - 1)
        node = _nodes(hardware or task.hardware, task.hardware, max(used, task.num_devices))
        ints = {k: np.array(cols[k], dtype=np.int64) for k in cols
                if k not in ("hbm_share", "replica")}
        return cls(**ints, hbm_share=np.array(cols["hbm_share"], dtype=np.float64),
                   replica=np.array(cols["replica"], dtype=bool), node=node,
                   created=created, removed=tuple(removed))


def _nodes(before: HardwareProfile, now: HardwareProfile, ranks: int) -> np.ndarray:
    """The node of each of ``ranks`` ranks: ``before``'s where it has the rank, else ``now``'s,
    else ``devices_per_node`` ranks to a node."""
    out = []
    for r in range(ranks):
        known = before if r < before.num_devices else now if r < now.num_devices else None
        out.append(known.devices[r].node if known is not None else r // now.devices_per_node)
    return np.array(out, dtype=np.int64)


def _recorded_tables(plan: Plan) -> tuple[Table, ...]:
    """The tables a plan's context records, where they can be read again unchanged (none
    otherwise: every table is then taken to keep its rows and dim)."""
    if plan.context is None:
        return ()
    try:
        return plan.context.read_tables()
    except (InputError, OSError):
        return ()


def _same_shape(before: Table | None, now: Table) -> bool:
    return before is None or (before.rows, before.dim) == (now.rows, now.dim)


def _fits(p: Placement, i: int, table: Table) -> bool:
    """Whether a placement's pieces tile ``table`` as it is now (else it was re-sized)."""
    try:
        check_placement(p, f"placements[{i}]", rows=table.rows, dim=table.dim)
    except InputError:
        return False
    return True


@dataclass(frozen=True, eq=False)
class Transfers:
    """Copies, one entry each (arrays shaped [K]).

    Args:
        item: The item copied (its index in the geometry).
        source: The device sending (for a host-HBM copy, the device itself).
        target: The device receiving.
        link: The link's code (:attr:`Link.code`).
        bytes: Bytes copied (weights and optimizer state).
        weight_bytes: Of them, weights.
    """

    item: np.ndarray
    source: np.ndarray
    target: np.ndarray
    link: np.ndarray
    bytes: np.ndarray
    weight_bytes: np.ndarray

    def by_link(self) -> dict[Link, tuple[float, float]]:
        """(bytes, of which weights) per link, every link listed."""
        return {k: (float(self.bytes[self.link == k.code].sum()),
                    float(self.weight_bytes[self.link == k.code].sum())) for k in Link}


@dataclass(frozen=True)
class MoveTime:
    """How long a set of copies takes (the module docstring's model).

    Args:
        seconds: The move's time, s: the slowest device's.
        device_seconds: Each rank's time, s (ranks of both plans).
        slowest: The slowest rank (-1 when nothing is copied).
    """

    seconds: float
    device_seconds: tuple[float, ...]
    slowest: int


@dataclass(frozen=True, eq=False)
class ItemMoves:
    """What placing each item of a geometry of the new task on each device copies from the
    plan in use.

    Args:
        geometry: The items.
        memory: [N] each item's bytes (weights and, in training, optimizer state).
        weights: [N] the share of them that is weights.
        kept: [N, D] the share of the item's bytes already on each device.
        kept_hbm: [N, D] the share already in each device's HBM.
        pairs: (item, piece, share of the item's bytes the piece holds) of every overlap with
            the plan in use's pieces, as three [K] arrays.
        incumbent: The plan in use.
        hardware: The new hardware.
    """

    geometry: ShardGeometry
    memory: np.ndarray
    weights: np.ndarray
    kept: np.ndarray
    kept_hbm: np.ndarray
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray]
    incumbent: Incumbent
    hardware: HardwareProfile

    @classmethod
    def of(cls, incumbent: Incumbent, task: ShardingTask, geometry: ShardGeometry
           ) -> ItemMoves:
        """The arrays of ``geometry``'s items (of ``task``'s tables) against ``incumbent``."""
        a = pricing_task(task, geometry).table_arrays
        g = geometry
        memory = g.rows * a.memory_bytes_per_row
        item, piece, share = _overlaps(incumbent, g)
        n, d = g.num_shards, task.num_devices
        kept = np.zeros((n, d))
        kept_hbm = np.zeros((n, d))
        here = incumbent.device[piece] < d
        np.add.at(kept, (item[here], incumbent.device[piece[here]]), share[here])
        np.add.at(kept_hbm, (item[here], incumbent.device[piece[here]]),
                  share[here] * incumbent.hbm_share[piece[here]])
        return cls(g, memory, a.row_bytes / a.memory_bytes_per_row, np.minimum(kept, 1.0),
                   np.minimum(kept_hbm, 1.0), (item, piece, share), incumbent, task.hardware)

    @property
    def created(self) -> np.ndarray:
        """[N] items of tables the plan in use does not hold (nothing is copied for them)."""
        return self.incumbent.created[self.geometry.table]

    def network(self) -> np.ndarray:
        """[N, D] bytes sent to each device from the others if the item goes there."""
        out = self.memory[:, None] * (1.0 - self.kept)
        out[self.created] = 0.0
        return out

    def host_bytes(self, device: np.ndarray, hbm_rows: np.ndarray) -> np.ndarray:
        """[N] bytes each item copies between its device's host memory and HBM."""
        i = np.arange(device.size)
        share = hbm_rows / np.maximum(self.geometry.rows, 1)
        return self.memory * np.abs(self.kept[i, device] * share - self.kept_hbm[i, device])

    def copied(self, device: np.ndarray, hbm_rows: np.ndarray) -> np.ndarray:
        """[N] bytes each item copies where it is placed on ``device`` with ``hbm_rows``."""
        i = np.arange(device.size)
        return self.network()[i, device] + self.host_bytes(device, hbm_rows)

    def transfers(self, device: np.ndarray, hbm_rows: np.ndarray) -> Transfers:
        """Every copy of the items placed on ``device`` with ``hbm_rows`` (module docstring)."""
        item, piece, share = self.pairs
        inc = self.incumbent
        src = inc.device[piece]
        dst = device[item]
        keep = ~self.created[item] & ~inc.replica[piece] & (src != dst)
        parts = [(item[keep], src[keep], dst[keep], share[keep] * self.memory[item[keep]])]
        parts.append(self._from_replicas(device))
        host = self.host_bytes(device, hbm_rows)
        on = np.flatnonzero(host > 0)
        parts.append((on, device[on], device[on], host[on]))
        it, s, t = (np.concatenate([p[k] for p in parts]).astype(np.int64) for k in range(3))
        b = np.concatenate([p[3] for p in parts]).astype(np.float64)
        link = np.where(s == t, Link.HOST_HBM.code,
                        np.where(inc.node[s] == inc.node[t], Link.INTRA_NODE.code,
                                 Link.INTER_NODE.code))
        return Transfers(it, s, t, link, b, b * self.weights[it])

    def _from_replicas(self, device: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The copies of items of replicated tables to devices that hold no replica: from a
        replica on the device's node where there is one, else from the first."""
        item, piece, _ = self.pairs
        inc = self.incumbent
        rep = inc.replica[piece] & ~self.created[item]
        out: list[tuple[int, int, float]] = []
        for i in np.unique(item[rep]):
            d = int(device[i])
            missing = 1.0 - float(self.kept[i, d])
            if missing <= 1e-12:
                continue
            sources = inc.device[piece[rep & (item == i)]]
            near = sources[inc.node[sources] == inc.node[d]]
            out.append((int(i), int((near if near.size else sources)[0]),
                        missing * float(self.memory[i])))
        arr = np.array(out, dtype=np.float64).reshape(-1, 3)
        return (arr[:, 0], arr[:, 1], np.array([device[int(i)] for i in arr[:, 0]]), arr[:, 2])

    def seconds_to(self) -> np.ndarray:
        """[N, D] seconds each item's network copies take if it alone went to each device (its
        bytes from each source over that link; from the nearest replica); what a priced move
        costs (:class:`autoshard.replan.budget.MoveBudget`'s horizon)."""
        item, piece, share = self.pairs
        inc, hw = self.incumbent, self.hardware
        d = np.arange(self.kept.shape[1])
        src = inc.device[piece]
        same = inc.node[src][:, None] == inc.node[d][None, :]
        gbps = np.where(same, hw.intra_node_gbps, hw.inter_node_gbps)
        rows = (share * self.memory[item])[:, None] / (gbps * GB)
        rows[src[:, None] == d[None, :]] = 0.0
        out = np.zeros_like(self.kept)
        plain = ~inc.replica[piece]
        np.add.at(out, item[plain], rows[plain])
        rep = inc.replica[piece]
        if rep.any():  # the nearest replica: the fastest link any of them has
            best = np.full_like(self.kept, np.inf)
            np.minimum.at(best, item[rep], rows[rep] / np.maximum(share[rep, None], 1e-12))
            fast = np.where(np.isfinite(best), best * (1.0 - self.kept), 0.0)
            out += fast
        out[self.created] = 0.0
        return out

    def host_seconds_per_byte(self) -> np.ndarray:
        """[D] seconds a byte takes between each device's host memory and its HBM."""
        return 1.0 / (np.array([x.host.bandwidth_gbps for x in self.hardware.devices]) * GB)


def _overlaps(inc: Incumbent, g: ShardGeometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item, piece, share of the item's bytes the piece holds) of every item of ``g`` and
    piece of ``inc`` of the same table that overlap."""
    order = np.argsort(inc.table, kind="stable")
    tables = inc.table[order]
    lo = np.searchsorted(tables, g.table, side="left")
    hi = np.searchsorted(tables, g.table, side="right")
    counts = hi - lo
    item = np.repeat(np.arange(g.num_shards), counts)
    first = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    piece = order[first + np.arange(item.size)] if item.size else order[:0]
    rows = (np.minimum(g.row_end[item], inc.row_end[piece])
            - np.maximum(g.row_start[item], inc.row_start[piece]))
    cols = (np.minimum(g.col_end[item], inc.col_end[piece])
            - np.maximum(g.col_start[item], inc.col_start[piece]))
    area = np.maximum(rows, 0) * np.maximum(cols, 0)
    share = area / np.maximum(g.rows[item] * g.cols[item], 1)
    keep = share > 0
    return item[keep], piece[keep], share[keep]


def move_time(transfers: Transfers, hardware: HardwareProfile, ranks: int) -> MoveTime:
    """How long ``transfers`` take on ``hardware`` (the module docstring's model), over
    ``ranks`` ranks (those of both plans)."""
    link = transfers.link
    gbps = np.select([link == Link.INTRA_NODE.code, link == Link.INTER_NODE.code],
                     [hardware.intra_node_gbps, hardware.inter_node_gbps], 1.0) * GB
    network = link != Link.HOST_HBM.code
    seconds = np.where(network, transfers.bytes / gbps, 0.0)
    sent = np.bincount(transfers.source[network], weights=seconds[network], minlength=ranks)
    received = np.bincount(transfers.target[network], weights=seconds[network],
                           minlength=ranks)
    host_gbps = np.array([d.host.bandwidth_gbps for d in hardware.devices]) * GB
    host = ~network
    bus = np.bincount(transfers.target[host], minlength=ranks,
                      weights=transfers.bytes[host] / host_gbps[transfers.target[host]])
    per = np.maximum(np.maximum(sent, received), bus)
    if not per.size or per.max() <= 0:
        return MoveTime(0.0, tuple(float(x) for x in per), -1)
    return MoveTime(float(per.max()), tuple(float(x) for x in per), int(per.argmax()))


__all__ = ["Incumbent", "ItemMoves", "Link", "MoveTime", "Transfers", "move_time"]
