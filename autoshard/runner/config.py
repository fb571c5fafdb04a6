"""Settings of one measured run and the per-rank layout a plan implies."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autoshard.errors import InputError

KERNELS = ("torch", "fbgemm")
DEVICES = ("auto", "cpu", "cuda")

#: Environment variable that injects a fault into one rank, for testing the watchdog:
#: ``"<rank>:exit"`` makes that rank exit with code 3 at its first step, ``"<rank>:hang"`` makes
#: it sleep forever there.
FAULT_ENV = "AUTOSHARD_RUN_FAULT"


@dataclass(frozen=True)
class RunConfig:
    """How to run a plan.

    Args:
        batch_size: Global samples per step (all ranks together); each rank pools its tables for
            the whole batch and, after the all-to-all, holds the pooled features of its own
            ``batch_size / ranks`` samples (a replicated table's are pooled there directly).
        iterations: Timed steps; the report gives per-rank medians over them.
        warmup: Untimed steps before the timed ones.
        mode: ``train`` (forward, all-to-all, backward all-to-all, backward and optimizer; the
            replicated tables' gradient all-reduce and dense update) or ``infer`` (forward and
            all-to-all only).
        seed: Seed of the synthetic lookups and of the weights.
        kernel: ``torch`` (``F.embedding_bag`` per table and tier, row-wise Adagrad on the touched
            rows) or ``fbgemm`` (FBGEMM's table-batched operator per tier, fused row-wise Adagrad).
            Replicated tables always run on the torch kernel: their update waits for the
            all-reduce, which a fused backward leaves no room for.
        device: ``cpu``, ``cuda`` or ``auto`` (CUDA when every rank can have its own GPU).
        learning_rate: Row-wise Adagrad learning rate.
        timeout_s: A rank that makes no progress for this long ends the run (also the process
            group's collective timeout).
        trace: A lookup trace in Meta's DLRM format, or None for synthetic lookups.
        distinct_batches: Distinct batches prepared and cycled through (bounds setup time).
    """

    batch_size: int = 512
    iterations: int = 10
    warmup: int = 3
    mode: str = "train"
    seed: int = 0
    kernel: str = "torch"
    device: str = "auto"
    learning_rate: float = 0.01
    timeout_s: float = 120.0
    trace: str | None = None
    distinct_batches: int = 4

    def __post_init__(self) -> None:
        checks: list[tuple[str, Any, bool]] = [
            ("batch_size", self.batch_size, _positive_int(self.batch_size)),
            ("iterations", self.iterations, _positive_int(self.iterations)),
            ("warmup", self.warmup, isinstance(self.warmup, int) and self.warmup >= 0),
            ("mode", self.mode, self.mode in ("train", "infer")),
            ("kernel", self.kernel, self.kernel in KERNELS),
            ("device", self.device, self.device in DEVICES),
            ("learning_rate", self.learning_rate, self.learning_rate > 0),
            ("timeout_s", self.timeout_s, self.timeout_s > 0),
            ("distinct_batches", self.distinct_batches, _positive_int(self.distinct_batches)),
        ]
        for name, value, ok in checks:
            if not ok:
                raise InputError("invalid value", field=name, value=value)

    @property
    def train(self) -> bool:
        return self.mode == "train"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RunConfig:
        return cls(**doc)


@dataclass(frozen=True)
class ShardTable:
    """One table, or one shard of a split table, as a rank holds it: its hottest ``hbm_rows``
    rows (``[0, hbm_rows)`` in its own popularity order) in the fast tier.

    A row shard holds rows ``[row_start, row_start + rows)`` of its table's hashed id space (it
    sees the lookups whose hashed id falls there and writes partial sums of the full dim); a
    column block holds columns ``[col_start, col_start + dim)`` of every row. A replica
    (``replica``) is the whole table, every row in the fast tier, held by every rank: it pools
    only its rank's own samples, stays out of the all-to-all, and its gradient is all-reduced.
    """

    name: str
    position: int  # index in the task's table order (also seeds its synthetic lookups)
    rows: int
    dim: int
    hbm_rows: int
    table_rows: int = 0  # the whole table's rows and dim (0: this is the whole table)
    table_dim: int = 0
    row_start: int = 0
    col_start: int = 0
    replica: bool = False

    @property
    def row_split(self) -> bool:
        return 0 < self.table_rows != self.rows

    @property
    def full_dim(self) -> int:
        return self.table_dim or self.dim


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
