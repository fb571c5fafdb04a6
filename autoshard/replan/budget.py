"""How much a re-plan may move, what a moved byte costs, and which moves the runtime can make.

A :class:`MoveBudget` is what a user gives: a limit on the bytes copied (weights and optimizer
state sent to another device, and rows copied between a device's host memory and its HBM:
:mod:`autoshard.replan.moves`), given in bytes, as a share of the tables' bytes, or in seconds;
and, with a horizon (the steps until the next re-plan), a price on each copy: its transfer time
spread over those steps, so that a move is made only where the steps it saves win its time
back within the horizon. :class:`MoveRules` say which items the runtime can move
(:func:`get_move_rules` finds them by name; TorchRec's live re-sharding has its own,
``autoshard.torchrec.reshard``).

:class:`Moves` is a budget resolved for one re-plan: the plan in use carried onto the new task
(:mod:`autoshard.replan.carry` builds it), the limit in bytes, and the arithmetic of every
geometry of items against the plan in use, which the sharders, the MILP's move term
(:class:`autoshard.milp.model.MoveTerms`) and the search stage read.

A limit in seconds is held as the bytes the slowest link (or host-HBM bus) carries in that time:
a plan within it moves in at most that time, and usually much less, since devices send at once.
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass, field

import numpy as np

from autoshard.errors import InputError
from autoshard.hardware import GB
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.shards import ShardGeometry, ShardLayout
from autoshard.limits import one_of
from autoshard.milp.model import MoveTerms
from autoshard.pricing.curves import UNIT_BYTES
from autoshard.replan.moves import Incumbent, ItemMoves, Link, MoveTime, move_time
from autoshard.task import ShardingTask

#: Relative slack on a limit in bytes (float sums of many copies).
TOLERANCE = 1e-9
#: Bytes the MILP's budget row keeps below the limit: HiGHS holds a row to 1e-7 of its units
#: (GB), about 100 bytes, so that what it returns is within the limit itself.
MILP_MARGIN_BYTES = 1e3


@dataclass(frozen=True)
class MoveRules:
    """Which moves the runtime can make.

    Args:
        name: Its name (:func:`get_move_rules`).
        movable: The sharding kinds whose items may change device; None: every kind.
        keep_splits: Whether every table the plan in use holds keeps its split (the same
            shards, rows and columns).
        hbm_with_device: Whether an item's HBM rows change only where it changes device (a
            runtime that moves shards but cannot re-size a cache in place).
    """

    name: str
    movable: frozenset[ShardingKind] | None = None
    keep_splits: bool = False
    hbm_with_device: bool = False

    def may_move(self, kind: ShardingKind) -> bool:
        return self.movable is None or kind in self.movable


#: Every move allowed: any item to any device, splits and HBM rows changed freely.
ANY_MOVE = MoveRules("any")

_RULES: dict[str, str] = {
    "any": "autoshard.replan.budget:ANY_MOVE",
    "torchrec": "autoshard.torchrec.reshard:TORCHREC_MOVES",
}


def move_rules_names() -> tuple[str, ...]:
    return tuple(_RULES)


def get_move_rules(name: str, field: str = "rules", source: str | None = None) -> MoveRules:
    """The rules named ``name``.

    Raises:
        InputError: An unknown name (the known ones listed).
    """
    module, _, attr = _RULES[one_of(name, move_rules_names(), field, source)].partition(":")
    found: MoveRules = getattr(importlib.import_module(module), attr)
    return found


@dataclass(frozen=True)
class MoveBudget:
    """How much a re-plan may copy, and at what price (module docstring).

    Args:
        max_bytes: Bytes copied at most; None: no limit in bytes.
        max_share: At most this share of the new task's tables' bytes (weights and optimizer
            state); None: no such limit.
        max_seconds: At most this long to copy, s, held as bytes (module docstring); None: no
            limit in time.
        horizon_steps: Steps until the next re-plan: each copy is priced at its transfer time
            over them (a move alone: its bytes over its link's bandwidth), so that the plan
            chosen minimises the step cost plus the moves' time per step; None: copies within
            the limits are free.
        rules: Which moves the runtime can make.
    """

    max_bytes: float | None = None
    max_share: float | None = None
    max_seconds: float | None = None
    horizon_steps: float | None = None
    rules: MoveRules = ANY_MOVE

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_share", "max_seconds"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float))
                                          and math.isfinite(value) and value >= 0):
                raise InputError("must be a number >= 0", field=f"move_budget.{name}",
                                 value=value)
        if self.max_share is not None and self.max_share > 1:
            raise InputError("must be a share in [0, 1]", field="move_budget.max_share",
                             value=self.max_share)
        h = self.horizon_steps
        if h is not None and not (isinstance(h, (int, float)) and math.isfinite(h) and h >= 1):
            raise InputError("must be a number of steps >= 1", field="move_budget.horizon_steps",
                             value=h)

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        return any(v is not None for v in (self.max_bytes, self.max_share, self.max_seconds))

    def limit_bytes(self, total_bytes: float, slowest_gbps: float) -> float:
        """The limit in bytes for tables of ``total_bytes`` on hardware whose slowest link or
        bus carries ``slowest_gbps`` GB/s (inf: none)."""
        limits = [math.inf]
        if self.max_bytes is not None:
            limits.append(float(self.max_bytes))
        if self.max_share is not None:
            limits.append(self.max_share * total_bytes)
        if self.max_seconds is not None:
            limits.append(self.max_seconds * slowest_gbps * GB)
        return min(limits)

    @property
    def label(self) -> str:
        """The budget in a few characters: ``10%``, ``2.5 GB``, ``30 s``, ``none``; ``/h=N``
        where moves are priced over N steps."""
        parts = [f"{100 * self.max_share:.3g}%" if self.max_share is not None else "",
                 f"{self.max_bytes / GB:.3g} GB" if self.max_bytes is not None else "",
                 f"{self.max_seconds:.3g} s" if self.max_seconds is not None else ""]
        text = "+".join(p for p in parts if p) or "none"
        return text + ("" if self.horizon_steps is None else f"/h={self.horizon_steps:.6g}")

    def describe(self) -> str:
        """The budget in words."""
        parts = []
        if self.max_bytes is not None:
            parts.append(f"{self.max_bytes / GB:.3g} GB")
        if self.max_share is not None:
            parts.append(f"{100 * self.max_share:.3g}% of the tables' bytes")
        if self.max_seconds is not None:
            parts.append(f"{self.max_seconds:.3g} s")
        text = " and ".join(parts) or "no limit"
        if self.horizon_steps is not None:
            text += f", moves priced over {self.horizon_steps:.6g} steps"
        return text + ("" if self.rules is ANY_MOVE else f", {self.rules.name}'s moves only")

    @classmethod
    def parse(cls, spec: str, horizon_steps: float | None = None,
              rules: MoveRules = ANY_MOVE, field: str = "--move-budget") -> MoveBudget:
        """A budget from text: ``10%`` (of the tables' bytes), ``2.5GB``, ``500MB``, ``1e9``
        (bytes), ``30s`` or ``none`` (no limit; then a horizon prices the moves).

        Raises:
            InputError: Text of none of these forms, naming ``field``.
        """
        text = spec.strip().lower().replace(" ", "")
        if text in ("none", "inf", ""):
            return cls(horizon_steps=horizon_steps, rules=rules)
        match = re.fullmatch(r"([0-9.e+-]+)(%|b|kb|mb|gb|tb|s)?", text)
        try:
            value = float(match.group(1)) if match else math.nan
        except ValueError:
            value = math.nan
        if match is None or not math.isfinite(value) or value < 0:
            raise InputError("expected a share (10%), bytes (2.5GB, 500MB, 1e9) or seconds "
                             "(30s), or none", source="command line", field=field, value=spec)
        unit = match.group(2) or "b"
        if unit == "%":
            if value > 100:
                raise InputError("a share is at most 100%", source="command line",
                                 field=field, value=spec)
            return cls(max_share=value / 100, horizon_steps=horizon_steps, rules=rules)
        if unit == "s":
            return cls(max_seconds=value, horizon_steps=horizon_steps, rules=rules)
        scale = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}[unit]
        return cls(max_bytes=value * scale, horizon_steps=horizon_steps, rules=rules)


def slowest_gbps(task: ShardingTask) -> float:
    """The slowest link or host-HBM bus of the task's hardware, GB/s (every link the move
    model uses: :mod:`autoshard.replan.moves`)."""
    hw = task.hardware
    links = [hw.intra_node_gbps] + ([hw.inter_node_gbps] if hw.spans_nodes else [])
    return min(links + [d.host.bandwidth_gbps for d in hw.devices])


@dataclass(frozen=True, eq=False)
class Moves:
    """A budget resolved for one re-plan of ``task`` (module docstring).

    Args:
        task: The task planned.
        incumbent: The plan in use, as pieces of the task's tables.
        carried: The plan in use carried onto the task (:func:`autoshard.replan.carry.carry`).
        budget: The budget given.
        limit_bytes: The limit in bytes (inf: none); at least :attr:`forced_bytes`.
        forced_bytes: What the carried plan copies (the pieces of drained devices, tables
            whose split no longer fits, HBM rows the new task no longer has room for).
        notes: What the carry had to change, one line each.
    """

    task: ShardingTask
    incumbent: Incumbent
    carried: ShardLayout
    budget: MoveBudget
    limit_bytes: float
    forced_bytes: float = 0.0
    notes: tuple[str, ...] = ()
    _items: dict[bytes, ItemMoves] = field(default_factory=dict, repr=False)

    @property
    def rules(self) -> MoveRules:
        return self.budget.rules

    @property
    def horizon(self) -> float | None:
        return self.budget.horizon_steps

    @property
    def limited(self) -> bool:
        return math.isfinite(self.limit_bytes)

    def items(self, geometry: ShardGeometry) -> ItemMoves:
        """The move arithmetic of ``geometry``'s items (computed once per geometry)."""
        key = b"".join(np.ascontiguousarray(getattr(geometry, f)).tobytes() for f in (
            "table", "kind", "row_start", "row_end", "col_start", "col_end"))
        if key not in self._items:
            self._items[key] = ItemMoves.of(self.incumbent, self.task, geometry)
        return self._items[key]

    def copied(self, layout: ShardLayout) -> float:
        """Bytes ``layout`` copies from the plan in use."""
        return float(self.items(layout.geometry).copied(layout.device, layout.hbm_rows).sum())

    def allows(self, layout: ShardLayout) -> bool:
        """Whether ``layout`` copies within the limit and keeps the rules."""
        return (self.copied(layout) <= self.limit_bytes * (1 + TOLERANCE)
                and self.keeps_rules(layout))

    def time(self, layout: ShardLayout) -> MoveTime:
        """How long ``layout``'s copies take (:func:`autoshard.replan.moves.move_time`)."""
        moves = self.items(layout.geometry)
        return move_time(moves.transfers(layout.device, layout.hbm_rows), self.task.hardware,
                         self.incumbent.node.size)

    def price_ms(self, layout: ShardLayout) -> float:
        """The moves' price per step, ms: each copy's time alone over the horizon (0 without
        one)."""
        if self.horizon is None:
            return 0.0
        moves = self.items(layout.geometry)
        i = np.arange(layout.num_shards)
        seconds = (moves.seconds_to()[i, layout.device].sum()
                   + (moves.host_bytes(layout.device, layout.hbm_rows)
                      * moves.host_seconds_per_byte()[layout.device]).sum())
        return 1e3 * float(seconds) / self.horizon

    def by_link(self, layout: ShardLayout) -> dict[Link, tuple[float, float]]:
        """(bytes, of which weights) ``layout`` copies over each link."""
        return self.items(layout.geometry).transfers(layout.device, layout.hbm_rows).by_link()

    def start(self, geometry: ShardGeometry) -> tuple[np.ndarray, np.ndarray] | None:
        """The carried plan as a placement of ``geometry``'s items (devices, HBM rows): the
        items it holds where it holds them; any other on the device that holds most of its
        bytes, with the share of its rows in HBM held there. None where an item has no bytes
        on any device (a created table cut otherwise than carried)."""
        carried = self.carried
        where = {k: (int(d), int(r)) for k, d, r in zip(
            _rect_keys(carried.geometry), carried.device, carried.hbm_rows, strict=True)}
        device = np.full(geometry.num_shards, -1, dtype=np.int64)
        rows = np.zeros(geometry.num_shards, dtype=np.int64)
        for i, k in enumerate(_rect_keys(geometry)):
            if k in where:
                device[i], rows[i] = where[k]
        missing = np.flatnonzero(device < 0)
        if missing.size:
            moves = self.items(geometry)
            kept = moves.kept[missing]
            if not (kept.max(axis=1) > 0).all():
                return None
            best = kept.argmax(axis=1)
            share = moves.kept_hbm[missing, best] / kept[np.arange(missing.size), best]
            device[missing] = best
            rows[missing] = np.floor(share * geometry.rows[missing]).astype(np.int64)
        return device, rows

    def pins(self, geometry: ShardGeometry) -> np.ndarray | None:
        """A device per item that the rules keep where the carried plan has it (-1 for the
        others; None when none is kept)."""
        if self.rules.movable is None:
            return None
        carried = self.carried
        key = _rect_keys(carried.geometry)
        where = dict(zip(key, carried.device.tolist(), strict=True))
        pins = np.full(geometry.num_shards, -1, dtype=np.int64)
        for i, k in enumerate(_rect_keys(geometry)):
            kind = ShardingKind.of(geometry.kind[i])
            if k in where and not self.rules.may_move(kind):
                pins[i] = where[k]
        return pins if (pins >= 0).any() else None

    def keeps_rules(self, layout: ShardLayout) -> bool:
        """Whether ``layout`` keeps the rules (its items of immovable kinds, its splits, and the
        HBM rows of items it leaves in place, as the rules say)."""
        rules = self.rules
        if rules is ANY_MOVE:
            return True
        g = layout.geometry
        carried = self.carried
        if rules.keep_splits and not _same_items(g, carried.geometry, self.incumbent):
            return False
        pins = self.pins(g)
        if pins is not None and (layout.device[pins >= 0] != pins[pins >= 0]).any():
            return False
        if rules.hbm_with_device:
            stay = self.items(g).kept[np.arange(g.num_shards), layout.device] >= 1.0 - 1e-12
            old = np.rint(self.items(g).kept_hbm[np.arange(g.num_shards), layout.device]
                          * g.rows).astype(np.int64)
            if (np.abs(layout.hbm_rows[stay] - old[stay]) > 1).any():
                return False
        return True

    def terms(self, geometry: ShardGeometry, tables: np.ndarray, devices: np.ndarray,
              device: np.ndarray, rows: np.ndarray) -> MoveTerms:
        """The MILP's move term for the items ``tables`` of ``geometry`` on ``devices``, the
        other items staying as ``device`` and ``rows`` place them (their copies taken off the
        limit), in the MILP's memory units (:data:`autoshard.pricing.curves.UNIT_BYTES`)."""
        moves = self.items(geometry)
        others = np.ones(device.size, dtype=bool)
        others[tables] = False
        used = float(moves.copied(device, rows)[others].sum()) if others.any() else 0.0
        left = max(self.limit_bytes - used - MILP_MARGIN_BYTES, 0.0)
        memory = moves.memory[tables][:, None]
        pick = np.ix_(tables, devices)
        price_x = price_u = None
        if self.horizon is not None:
            price_x = 1e3 * moves.seconds_to()[pick] / self.horizon
            price_u = np.broadcast_to(1e3 * UNIT_BYTES * moves.host_seconds_per_byte()[devices]
                                      / self.horizon, price_x.shape).copy()
        hold = None
        if self.rules.hbm_with_device:
            hold = moves.kept[pick] >= 1.0 - 1e-12
        return MoveTerms(network=moves.network()[pick] / UNIT_BYTES, kept=moves.kept[pick],
                         kept_hbm=moves.kept_hbm[pick] * memory / UNIT_BYTES,
                         budget=left / UNIT_BYTES if math.isfinite(left) else math.inf,
                         price_network=price_x, price_hbm=price_u, hold=hold)


def _rect_keys(g: ShardGeometry) -> list[tuple[int, int, int, int, int]]:
    return list(zip(g.table.tolist(), g.row_start.tolist(), g.row_end.tolist(),
                    g.col_start.tolist(), g.col_end.tolist(), strict=True))


def _same_items(g: ShardGeometry, carried: ShardGeometry, incumbent: Incumbent) -> bool:
    """Whether ``g`` splits every table the plan in use holds as ``carried`` does."""
    held = ~incumbent.created
    mine = sorted(k for k in _rect_keys(g) if held[k[0]])
    theirs = sorted(k for k in _rect_keys(carried) if held[k[0]])
    return mine == theirs


__all__ = ["ANY_MOVE", "MoveBudget", "MoveRules", "Moves", "get_move_rules", "move_rules_names",
           "slowest_gbps"]
