"""TorchRec's planner run against a deadline: its search space enumerated once per starting
cache load factor and handed to the planner, whose proposers stop at the deadline.

Everything here serves :class:`autoshard.torchrec.sharder.TorchRecSharder`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from autoshard.task import ShardingTask
from autoshard.torchrec.export import meta_collection
from autoshard.torchrec.mapping import (
    DENSE,
    FUSED,
    FUSED_UVM,
    FUSED_UVM_CACHING,
    REPLICATED_TYPE,
    SHARDING_TYPES,
    column_block_cols,
    data_type,
    kind_of,
)

#: The compute kernels TorchRec may choose (every one our plans hold), in the order offered;
#: ``dense``, the replicated tables' only kernel, is added for the tables offered
#: ``data_parallel``.
PLANNED_KERNELS = (FUSED, FUSED_UVM_CACHING, FUSED_UVM)


def predicted_shards(task: ShardingTask, offered: dict[str, list[str]],
                     kernels: tuple[str, ...] = PLANNED_KERNELS) -> int:
    """Shards of the options TorchRec enumerates for ``offered`` with ``kernels``: per table,
    kernel and type,
    one for a whole table, one per rank (of the world, or of a node for node-local kinds) for
    a row split or replicas (one kernel), one per 128 columns for a column split, one per rank
    of a node for each of a grid's column blocks (TorchRec's block width,
    :func:`autoshard.torchrec.mapping.column_block_cols`)."""
    per_node = task.hardware.node_devices
    total = 0
    for t in task.tables:
        for sharding_type in offered[t.name]:
            kind = kind_of(sharding_type)
            if kind.replicated:  # one kernel (dense), a replica per rank
                total += task.num_devices
            elif kind.splits_rows and kind.splits_cols:
                total += per_node * (t.dim // column_block_cols(t.dim)) * len(kernels)
            else:
                total += len(kernels) * (
                    (per_node if kind.node_local else task.num_devices) if kind.splits_rows
                    else max(1, math.ceil(t.dim / 128)) if kind.splits_cols else 1)
    return total


class SearchSpace:
    """The meta-device module, topology and per-table constraints TorchRec plans over, and
    the options enumerated at each starting load factor (each handed to one planner run).
    ``kernels``: the compute kernels offered (all of :data:`PLANNED_KERNELS` unless a time
    limit cut them); ``clock``: the seconds the time limit is kept by (the sharder's)."""

    def __init__(self, task: ShardingTask, offered: dict[str, list[str]],
                 use_stats: bool, pipeline: str,
                 kernels: tuple[str, ...] = PLANNED_KERNELS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

        from autoshard.torchrec.estimate import declare_optimizers, torchrec_topology

        self.task, self.offered, self.use_stats = task, offered, use_stats
        self.pipeline, self.kernels, self.clock = pipeline, tuple(kernels), clock
        self.module = meta_collection([(t.name, t.rows, t.dim, data_type(t))
                                       for t in task.tables])
        if task.workload.train:
            declare_optimizers(self.module, task.tables)
        self.sharders = [EmbeddingBagCollectionSharder()]
        self.topology = torchrec_topology(task)
        self.enumerated: dict[float, tuple[Any, dict[str, Any], list[Any]]] = {}
        self.enumerate_s = 0.0  # how long the last enumeration took

    def enumerator(self, clf: float) -> tuple[Any, dict[str, Any]]:
        """TorchRec's enumerator at starting cache load factor ``clf``, and its constraints."""
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

        from autoshard.torchrec.estimate import (
            per_rank_batch,
            torchrec_constraints,
            torchrec_estimators,
        )

        constraints = torchrec_constraints(self.task, self.use_stats, pipeline=self.pipeline,
                                           cache_load_factor=clf,
                                           compute_kernels=list(self.kernels))
        for name, c in constraints.items():
            c.sharding_types = list(self.offered[name])
            if REPLICATED_TYPE in c.sharding_types:
                c.compute_kernels = [*self.kernels, DENSE]
        return EmbeddingEnumerator(
            self.topology, per_rank_batch(self.task), constraints,
            estimator=torchrec_estimators(self.task, self.topology, constraints,
                                          self.pipeline)), constraints

    def options(self, clf: float) -> tuple[Any, dict[str, Any], list[Any]]:
        """TorchRec's enumerator at ``clf``, its constraints and its options, enumerated once
        (timed), in a fixed order (:func:`in_offered_order`)."""
        if clf not in self.enumerated:
            began = self.clock()
            chosen, constraints = self.enumerator(clf)
            options = in_offered_order(chosen.enumerate(self.module, self.sharders),
                                       self.kernels)
            self.enumerated[clf] = (chosen, constraints, options)
            self.enumerate_s = self.clock() - began
        return self.enumerated[clf]

    def planned(self, clf: float, stop: float, deadline: float, task: ShardingTask,
                proposers: list[Any]) -> Any:
        """TorchRec's plan from the options at ``clf`` (which it then owns), its proposers
        stopped at ``stop`` once some proposal fits, and at ``deadline`` in any case."""
        from torchrec.distributed.planner import EmbeddingShardingPlanner
        from torchrec.distributed.planner.storage_reservations import (
            FixedPercentageStorageReservation,
        )

        from autoshard.torchrec.estimate import per_rank_batch

        enumerator, constraints, options = self.options(clf)
        del self.enumerated[clf]
        found: list[bool] = []
        planner = EmbeddingShardingPlanner(
            topology=self.topology, batch_size=per_rank_batch(task),
            enumerator=_Enumerated(enumerator, options), constraints=constraints,
            storage_reservation=FixedPercentageStorageReservation(0.0),
            proposer=[_UntilDeadline(p, stop, deadline, found, self.clock)
                      for p in proposers],
            debug=False)
        return planner.plan(self.module, self.sharders)


def in_offered_order(options: list[Any], kernels: tuple[str, ...] = PLANNED_KERNELS
                     ) -> list[Any]:
    """``options`` with each table's in the order its sharding types and kernels are offered
    (:data:`autoshard.torchrec.mapping.SHARDING_TYPES`, then ``kernels``, then ``dense``), the
    tables in the enumerator's order.

    TorchRec's enumerator lists a table's constrained sharding types and kernels as
    ``list(set(constrained) & set(allowed))``, so its order follows Python's string hashing
    (``PYTHONHASHSEED``); its proposers and partitioner break ties between equally rated
    options by that order, and its plan changed with the seed. Sorted, it does not.
    """
    table_order: dict[str, int] = {}
    for o in options:
        table_order.setdefault(o.fqn, len(table_order))
    kernel_order = (*kernels, DENSE)

    def key(o: Any) -> tuple[int, int, int]:
        return (table_order[o.fqn], _position(SHARDING_TYPES, o.sharding_type),
                _position(kernel_order, o.compute_kernel))

    return sorted(options, key=key)


def _position(order: tuple[str, ...], value: str) -> int:
    """``value``'s place in ``order`` (after all of it when absent)."""
    return order.index(value) if value in order else len(order)


class _Enumerated:
    """TorchRec's enumerator whose options are already enumerated: the planner gets them
    instead of enumerating again; everything else is the enumerator's."""

    def __init__(self, enumerator: Any, options: list[Any]) -> None:
        self._enumerator, self._options = enumerator, options

    def enumerate(self, module: Any, sharders: list[Any]) -> list[Any]:
        return self._options

    def __getattr__(self, name: str) -> Any:
        return getattr(self._enumerator, name)


class _UntilDeadline:
    """A TorchRec proposer that proposes nothing more once ``stop`` (on ``clock``) has
    passed and some proposal fitted (``found``, shared by the run's proposers), nor once
    ``deadline`` would pass before another proposal is priced (as long as the last one took),
    but for its first proposal while none has fitted (so that a run whose enumeration took its
    time still gets a plan)."""

    def __init__(self, proposer: Any, stop: float, deadline: float, found: list[bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._proposer, self._found, self._clock = proposer, found, clock
        self._stop, self._deadline = stop, deadline
        self._proposed = False
        self._last: float | None = None  # when it last proposed
        self._step = 0.0  # how long the last proposal took to price, s

    def load(self, search_space: list[Any], enumerator: Any = None) -> None:
        self._proposer.load(search_space=search_space, enumerator=enumerator)

    def propose(self) -> Any:
        now = self._clock()
        if self._last is not None:
            self._step = now - self._last
        late = (now + self._step > self._deadline
                or (self._found and now + self._step > self._stop))
        if late and (self._found or self._proposed):
            return None
        self._proposed, self._last = True, now
        return self._proposer.propose()

    def feedback(self, partitionable: bool, **details: Any) -> None:
        if partitionable:
            self._found.append(True)
        self._proposer.feedback(partitionable=partitionable, **details)


def largest_hbm(options: list[Any]) -> float:
    """The most HBM any choice of one option per table takes under TorchRec's own storage
    estimate: the sum over tables of their options' largest."""
    largest: dict[str, float] = {}
    for o in options:
        largest[o.fqn] = max(largest.get(o.fqn, 0.0), float(o.total_storage.hbm))
    return sum(largest.values())
