"""The HBM a runtime keeps beside the rows of each table or shard: a task's reservation.

A plan must fit the memory its runtime will count, not only its rows' weights. A task carries
one :class:`Reservation`; every capacity check of a placement asks it, through the task's
per-table (or per-shard) HBM terms (:meth:`autoshard.task.TableArrays.hbm_bytes`):

- bytes per row kept in HBM (weights, optimizer state in training, and whatever the runtime
  adds per cached row);
- bytes kept wherever the table or shard lives (I/O buffers, cache bookkeeping).

A runtime may also fix how tables are laid out, and the reservation says so:
:attr:`Reservation.fixed_row_blocks` (row splits routed in fixed even blocks, one per device)
and :attr:`Reservation.one_share_per_table` (one HBM share per split table).

Reservations are found by name (the names files and the command line use) through
:func:`get_reservation`: ``none`` keeps nothing (the weights alone: hand-checked cases,
runtimes without per-table buffers); ``torchrec`` and ``torchrec-prefetch`` keep what
TorchRec's training runtime adds in its default and its prefetch pipeline
(:mod:`autoshard.torchrec.runtime_memory`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from autoshard.limits import one_of

#: Reservations by name: ``module:attribute`` strings, imported when asked for.
_ENTRIES: dict[str, str] = {
    "none": "autoshard.reservation:NO_RESERVATION",
    "torchrec": "autoshard.torchrec.runtime_memory:TORCHREC",
    "torchrec-prefetch": "autoshard.torchrec.runtime_memory:TORCHREC_PREFETCH",
}


def weight_bytes(element_bytes: np.ndarray, cols: np.ndarray, optimizer_bytes: np.ndarray,
                 train: bool) -> np.ndarray:
    """HBM bytes of one row of each table or shard by our memory model: its ``cols`` elements
    and, in training, its optimizer state."""
    row_bytes = (element_bytes * cols).astype(np.float64)
    return row_bytes + (optimizer_bytes if train else 0.0)


@dataclass(frozen=True)
class Reservation:
    """What HBM a runtime keeps per table or shard; this base keeps nothing (``none``).

    Args:
        name: Its name in files and on the command line (:func:`reservation_names`).
    """

    name: str = "none"
    #: Whether the runtime routes a row split's ids in fixed even blocks, one per device of the
    #: world (of a node, for the node-local kind): such a table is split into one near-equal
    #: shard per device, each on its own device.
    fixed_row_blocks: ClassVar[bool] = False
    #: Whether the runtime keeps one HBM share per table (one cache size for all its shards),
    #: so that a split table's shards keep one share of their rows in HBM.
    one_share_per_table: ClassVar[bool] = False
    #: Whether it keeps any HBM beyond the rows' weights.
    keeps_room: ClassVar[bool] = False

    def hbm_terms(self, rows: np.ndarray, cols: np.ndarray, table_dim: np.ndarray,
                  element_bytes: np.ndarray, optimizer_bytes: np.ndarray,
                  lookups_per_sample: np.ndarray, input_share: np.ndarray | float, *,
                  train: bool, batch_size: int, world: int,
                  output_share: np.ndarray | float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """HBM bytes per row kept in HBM, and HBM bytes kept wherever it lives, of each table
        or shard ([N] each).

        Args:
            rows: Rows of each table or shard.
            cols: Its columns (a column block's width; a table's dim).
            table_dim: Its table's embedding dim.
            element_bytes: Bytes per element.
            optimizer_bytes: Our optimizer state per row (train mode).
            lookups_per_sample: Its table's lookups per sample.
            input_share: Share of its table's input ids it receives
                (:func:`autoshard.layout.kinds.id_share`).
            train: Training (optimizer state, buffers) or inference (weights only).
            batch_size: Global batch size.
            world: Devices.
            output_share: Share of the global batch whose pooled outputs it writes (1; a
                replica its device's share, :func:`autoshard.pricing.shard_terms.batch_share`).
        """
        return (weight_bytes(element_bytes, cols, optimizer_bytes, train),
                np.zeros(np.shape(rows)))


#: The reservation that keeps nothing.
NO_RESERVATION = Reservation()


def reservation_names() -> tuple[str, ...]:
    """The names :func:`get_reservation` knows."""
    return tuple(_ENTRIES)


def get_reservation(name: str, field: str = "overhead", source: str | None = None
                    ) -> Reservation:
    """The reservation named ``name``.

    Raises:
        InputError: An unknown name, naming ``field`` (and ``source``) and the known names.
    """
    module, _, attr = _ENTRIES[one_of(name, reservation_names(), field, source)].partition(":")
    found: Reservation = getattr(importlib.import_module(module), attr)
    return found


def check_reservation_names(names: tuple[str, ...], field: str = "overheads"
                            ) -> tuple[str, ...]:
    """``names`` if it is a non-empty choice among :func:`reservation_names`.

    Raises:
        InputError: An empty choice or an unknown name, naming ``field``.
    """
    from autoshard.errors import InputError

    if not names:
        raise InputError(f"choose one or more of {', '.join(reservation_names())}",
                         field=field, value=names)
    for name in names:
        one_of(name, reservation_names(), field)
    return names
