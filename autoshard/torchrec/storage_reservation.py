"""TorchRec's storage reservation: the memory each rank keeps aside for the rest of the model,
and what it leaves the embedding tables.

TorchRec's planner takes a ``StorageReservation`` (its default:
``HeuristicalStorageReservation(percentage=0.15)``, planner/planners.py of torchrec 1.8.0) and
plans every rank's shards within the topology its ``reserve`` returns. The heuristic one keeps
15% of each rank's HBM, then the dense part of the model (six times its parameters: weights,
optimizer state and DDP buffers) and the batch's feature ids (KJT: 8 bytes per id, twenty
copies), on every rank. :func:`reserve` calls the reservation as TorchRec's planner does and
says what it kept (:class:`Reserved`); the drop-in planner plans against the capacities left.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The share of HBM TorchRec's default planner reserves
#: (``EmbeddingPlannerBase(heuristical_storage_reservation_percentage=0.15)``).
DEFAULT_PERCENTAGE = 0.15


def default_reservation() -> Any:
    """TorchRec's default planner's reservation: ``HeuristicalStorageReservation(0.15)``.

    TorchRec warns (a ``FutureWarning``) when one is made, as its own planner's default makes
    one: the heuristic overestimates the dense part of a model whose tensors are not
    materialised; pass ``storage_reservation`` to choose another."""
    from torchrec.distributed.planner.storage_reservations import (
        HeuristicalStorageReservation,
    )

    return HeuristicalStorageReservation(percentage=DEFAULT_PERCENTAGE)


@dataclass(frozen=True)
class Reserved:
    """What a storage reservation keeps aside on each rank, and what it leaves the tables.

    Args:
        policy: The reservation's class name.
        percentage: The share of HBM it keeps (None: it has no such share).
        dense_hbm_bytes: HBM it keeps per rank for the dense part of the model (None: it
            says none).
        kjt_hbm_bytes: HBM it estimates per rank for the batch's feature ids (None: it says
            none; ``FixedPercentageStorageReservation`` estimates them but keeps no room).
        hbm_bytes: Each rank's HBM before the reservation.
        hbm_left_bytes: Each rank's HBM left for the tables' shards.
        ddr_bytes: Each rank's host memory (DDR) before the reservation.
        ddr_left_bytes: Each rank's host memory left for the tables' shards.
    """

    policy: str
    percentage: float | None
    dense_hbm_bytes: int | None
    kjt_hbm_bytes: int | None
    hbm_bytes: tuple[int, ...]
    hbm_left_bytes: tuple[int, ...]
    ddr_bytes: tuple[int, ...]
    ddr_left_bytes: tuple[int, ...]

    @property
    def kept_hbm_bytes(self) -> tuple[int, ...]:
        """HBM kept aside on each rank (before minus left)."""
        return tuple(a - b for a, b in zip(self.hbm_bytes, self.hbm_left_bytes, strict=True))

    def describe(self) -> str:
        """One line: the policy, its terms and rank 0's HBM kept and left."""
        return f"{self.policy}: {self.lines()[1]}; {self.lines()[2]}"

    def lines(self) -> list[str]:
        """The policy, then rank 0's HBM kept aside (with the policy's terms) and what is
        left for the tables' shards, GB (2^30 bytes, as TorchRec writes them)."""
        terms = [f"{self.percentage:.0%} of HBM" if self.percentage is not None else "",
                 f"dense {_gb(self.dense_hbm_bytes)}" if self.dense_hbm_bytes is not None
                 else "",
                 f"KJT {_gb(self.kjt_hbm_bytes)}" if self.kjt_hbm_bytes is not None else ""]
        listed = ", ".join(t for t in terms if t)
        return [self.policy,
                f"kept per rank: HBM {_gb(self.kept_hbm_bytes[0])} of "
                f"{_gb(self.hbm_bytes[0])}{f' ({listed})' if listed else ''}",
                f"left per rank for the tables: HBM {_gb(self.hbm_left_bytes[0])}, DDR "
                f"{_gb(self.ddr_left_bytes[0])}"]

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "percentage": self.percentage,
                "dense_hbm_bytes": self.dense_hbm_bytes, "kjt_hbm_bytes": self.kjt_hbm_bytes,
                "hbm_bytes": list(self.hbm_bytes), "hbm_left_bytes": list(self.hbm_left_bytes),
                "ddr_bytes": list(self.ddr_bytes), "ddr_left_bytes": list(self.ddr_left_bytes)}


def _gb(num_bytes: int) -> str:
    return f"{round(num_bytes / 2**30, 3)} GB"


def reserve(reservation: Any, topology: Any, batch_size: int, module: Any,
            sharders: Sequence[Any], constraints: Mapping[str, Any] | None = None
            ) -> tuple[Any, Reserved]:
    """The topology ``reservation`` leaves for the tables (its ``reserve``, called as TorchRec's
    planner calls it, with an enumerator where its signature takes one), and what it kept.

    Raises:
        torchrec.distributed.planner.types.PlannerError: The reservation's own (TorchRec's
            heuristic one raises ``INSUFFICIENT_STORAGE`` when nothing is left).
    """
    arguments: dict[str, Any] = {"topology": topology, "batch_size": batch_size,
                                 "module": module, "sharders": list(sharders),
                                 "constraints": dict(constraints) if constraints else None}
    if "enumerator" in inspect.signature(reservation.reserve).parameters:
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

        arguments["enumerator"] = EmbeddingEnumerator(topology, batch_size,
                                                      arguments["constraints"])
    reserved = reservation.reserve(**arguments)
    dense = getattr(reservation, "_dense_storage", None)
    kjt = getattr(reservation, "_kjt_storage", None)
    percentage = getattr(reservation, "_percentage", None)
    return reserved, Reserved(
        type(reservation).__name__, None if percentage is None else float(percentage),
        None if dense is None else int(dense.hbm), None if kjt is None else int(kjt.hbm),
        tuple(int(d.storage.hbm) for d in topology.devices),
        tuple(int(d.storage.hbm) for d in reserved.devices),
        tuple(int(d.storage.ddr) for d in topology.devices),
        tuple(int(d.storage.ddr) for d in reserved.devices))
