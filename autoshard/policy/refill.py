"""Water-filling one device's HBM while an episode places items: the device's loads as the
decode's end (:func:`autoshard.search.polish.polish_plan` with ``fill_only``) will make them.

An episode's ``refill`` mode (:data:`MODES`) says how it does so:

- ``none``: never; each item keeps the rows of the bucket chosen for it (the decodes are
  water-filled once finished);
- ``device``: after each placement, :func:`refill_device` water-fills the device: every item
  there that may change its HBM rows takes the hull segments of its cost curve
  (:class:`autoshard.pricing.curves.Curves`) by worth, the largest first, until the device's
  HBM for rows (its free HBM, what its items' rows hold, less what the items still to place
  keep back for their reservations) is full. The device keeps the new rows only where they
  lower its load and its host memory holds the rest. The observation then shows each device's
  load as the water-filled plan will have it;
- ``level``: as ``device``, and the fill bucket offers what the item would hold once the
  device is water-filled with it (:func:`level_fill`), priced at the device's load increase;
  a device whose HBM is full no longer looks as dear as host memory to a hot item.

A policy records the mode it was trained in (:class:`autoshard.policy.network.PlacementNet`);
the ``ppo`` sharders decode it in that mode, and on small tasks in the others too
(:func:`decode_modes`).
"""

from __future__ import annotations

import numpy as np

from autoshard.layout.placement import PlacementState
from autoshard.pricing.curves import Curves

#: The refill modes (module docstring), and the suffix of a decode's name in each where it is
#: not the policy's own.
MODES = ("none", "device", "level")
SUFFIX = {"none": "plain", "device": "refill", "level": "level"}


def checked_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES`; else ValueError naming them."""
    if mode not in MODES:
        raise ValueError(f"refill mode {mode!r}: expected one of {', '.join(MODES)}")
    return mode


def decode_modes(trained: str, others: bool) -> list[tuple[str, str]]:
    """(mode, name suffix) of a policy's decodes: its own mode (no suffix), and with
    ``others`` the other modes."""
    rest = [(m, f"-{SUFFIX[m]}") for m in MODES if m != trained] if others else []
    return [(trained, ""), *rest]


def refill_device(state: PlacementState, curves: Curves, d: int, kept_back: float
                  ) -> tuple[np.ndarray | None, float]:
    """Water-fills device ``d``'s HBM over the items ``state`` put there (see the module
    docstring) and applies the new rows to ``state`` when they lower the device's load.

    Returns:
        The device's load parts (HBM, host, communication ms) when the rows changed, else
        None; and the device's water level: the saving per HBM byte of the last segment that
        HBM holds in part (0 where it holds every segment that saves anything).

    Args:
        state: The episode's placement state (its task: the items, tables or shards).
        curves: The items' curves (:meth:`Curves.price` of ``state.task``).
        d: The device.
        kept_back: HBM bytes of ``d`` left free for the reservations of items still to
            place (:meth:`PlacementState.kept_back`).
    """
    a = state.task.table_arrays
    on = np.flatnonzero(state.device == d)
    changed = a.hbm_least[on] < a.hbm_most[on]  # the others' rows are fixed by their bounds
    free = on[changed]
    if not free.size:
        return None, 0.0
    per_row = a.hbm_bytes_per_row[free]
    cap = float(state.free_hbm[d] + (state.hbm_rows[free] * per_row).sum() - kept_back)
    owner, extra, worth, _ = curves.segments[int(curves.kind[d])]
    mine = np.zeros(a.rows.size, dtype=bool)
    mine[free] = True
    take = mine[owner]
    o, e = owner[take], extra[take]
    cum = np.cumsum(e)
    part = np.clip((cap - (cum - e)) / e, 0.0, 1.0)
    short = np.flatnonzero(part < 1)
    level = float(worth[take][short[0]]) if short.size else 0.0
    got = np.bincount(o, weights=e * part, minlength=a.rows.size)[free]
    rows = np.floor(got / per_row + 1e-9).astype(np.int64)
    rows = np.clip(rows, a.hbm_least[free], np.minimum(a.hbm_most[free], a.rows[free]))
    moved = state.hbm_rows[free] - rows
    host = float((moved * a.memory_bytes_per_row[free]).sum())
    if not moved.any() or host > state.free_host[d] + 1e-6:
        return None, level
    all_rows = state.hbm_rows[on].copy()
    all_rows[changed] = rows
    p = state.cost_model.price(state.task, on, np.full(on.size, d), all_rows)
    new = float(p.total_ms[changed].sum())
    old = float(state.price_ms[free].sum())
    if not new < old * (1 - 1e-9):
        return None, level
    state.free_hbm[d] += float((moved * per_row).sum())
    state.free_host[d] -= host
    state.hbm_rows[free] = rows
    state.load_ms[d] += new - old
    state.price_ms[free] = p.total_ms[changed]
    return np.array([p.hbm_ms.sum(), p.uvm_ms.sum(), p.comm_ms.sum()]), level


def level_fill(curves: Curves, item: int, level: np.ndarray, room: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """What item ``item`` would take of each device's HBM once water-filled there: the prefix
    of its curve's segments worth more than the device's ``level`` (ms per byte), within
    ``room`` (HBM bytes the device has for rows); returns its HBM bytes and its price then
    plus the saving the other items lose for those bytes at the level (the device's load
    increase, to first order), per device."""
    kind = curves.kind
    worth, used, cost = curves.worth[kind, item], curves.used[kind, item], curves.cost[kind, item]
    fits = used[:, 1:] <= room[:, None] + 1e-6
    j = ((worth > level[:, None]) & fits).sum(axis=1)
    rows = np.arange(kind.size)
    took = used[rows, j]
    return took, cost[rows, j] + level * took


def level_offer(state: PlacementState, curves: Curves, level: np.ndarray, u: int,
                max_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``level`` mode's fill bucket of item ``u``, per device: the HBM rows it would hold
    once the device is water-filled with it (:func:`level_fill` at the device's ``level``,
    within the HBM its items' rows and its free HBM hold beside the reservations), the price
    shown for them (the device's load increase), and the rows placed now (at most
    ``max_rows``; the re-fill that follows gives it the rest)."""
    a = state.task.table_arrays
    free = (state.device >= 0) & (a.hbm_least < a.hbm_most)
    held = np.bincount(state.device[free], minlength=level.size,
                       weights=(state.hbm_rows * a.hbm_bytes_per_row)[free])
    room = state.free_hbm + held - state.kept_back(u) - a.hbm_reserved_bytes[u]
    took, shown = level_fill(curves, u, level, np.maximum(room, 0.0))
    want = np.minimum(np.floor(took / a.hbm_bytes_per_row[u] + 1e-9), a.rows[u])
    return want.astype(np.int64), shown, a.fill_rows(u, np.minimum(want, max_rows))
