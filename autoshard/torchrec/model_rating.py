"""A ``ShardingPlan`` of a live model rated as TorchRec's planner rates its own plans.

TorchRec's planner sizes and prices every sharding option of a model with its enumerator's
estimators (``EmbeddingPerfEstimator`` and ``EmbeddingStorageEstimator``, torchrec 1.8.0) and
keeps a plan only where every rank's shards fit the topology its ``StorageReservation`` leaves
(:mod:`autoshard.torchrec.storage_reservation`). :func:`rate_plan` puts a plan made elsewhere
through the same steps: TorchRec's ``EmbeddingEnumerator`` enumerates the model's tables with
their user constraints, each pinned to the sharding type, kernel and cache of the plan (one
option per table, with the table's features, pooling factors, batch sizes and sharder data
as TorchRec reads them from the model), the plan's shards and ranks replace the enumerated
ones, and the estimators fill in each shard's perf (ms) and storage (bytes).

Unlike :mod:`autoshard.torchrec.estimate`, which rates our tables on a model built from them,
this reads the user's model itself: a table of several features, a sequence
(``EmbeddingCollection``) table and the user's ``ParameterConstraints`` count as TorchRec counts
them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from autoshard.torchrec.runtime_memory import check_pipeline


def rate_plan(sharding_plan: Any, module: Any, sharders: Sequence[Any], topology: Any,
              batch_size: int, constraints: Mapping[str, Any] | None = None,
              pipeline: str = "none") -> list[Any]:
    """TorchRec ``ShardingOption`` objects of ``sharding_plan``'s tables in ``module``, one per
    table in the plan's order, with the plan's shards on their ranks, rated by TorchRec's
    estimators on ``topology`` (the hardware, before any reservation) for ``batch_size``
    samples per rank, in TorchRec's training ``pipeline`` (``"none"`` or ``"prefetch"``).

    Raises:
        KeyError: A table of the plan that the sharders do not find in ``module``.
    """
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.utils import build_sharder_data_map, sharder_name

    planned = {name: ps for module_plan in sharding_plan.plan.values()
               for name, ps in module_plan.items()}
    pinned = {name: _pinned((constraints or {}).get(name), ps) for name, ps in planned.items()}
    enumerator = EmbeddingEnumerator(topology, batch_size, pinned, estimator=_Unrated())
    order = {name: i for i, name in enumerate(planned)}
    options = sorted((o for o in enumerator.enumerate(module, list(sharders))
                      if o.name in planned), key=lambda o: order[o.name])
    for option in options:
        option.shards = _shards(planned[option.name], option)
    data_map = build_sharder_data_map({sharder_name(s.module_type): s for s in sharders})
    for estimator in estimators(topology, pinned, pipeline):
        estimator.estimate(options, data_map)
    return options


def estimators(topology: Any, constraints: Mapping[str, Any], pipeline: str = "none"
               ) -> list[Any]:
    """The estimators TorchRec's default enumerator builds (its default perf estimator and the
    storage estimator), the storage one for the training ``pipeline``."""
    from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
    from torchrec.distributed.planner.shard_estimators import (
        EmbeddingPerfEstimatorFactory,
        EmbeddingStorageEstimator,
    )
    from torchrec.distributed.types import PipelineType

    kind = (PipelineType.TRAIN_PREFETCH_SPARSE_DIST if check_pipeline(pipeline) == "prefetch"
            else PipelineType.NONE)
    given = dict(constraints)
    return [EmbeddingPerfEstimatorFactory.create(DEFAULT_PERF_ESTIMATOR, topology=topology,
                                                 constraints=given),
            EmbeddingStorageEstimator(topology=topology, constraints=given, pipeline_type=kind)]


def _pinned(given: Any, ps: Any) -> Any:
    """The user's constraints of a table (or TorchRec's defaults) pinned to the sharding type,
    kernel and cache parameters that ``ps`` (its ``ParameterSharding``) plans."""
    from torchrec.distributed.planner import ParameterConstraints

    return dataclasses.replace(given if given is not None else ParameterConstraints(),
                               sharding_types=[ps.sharding_type],
                               compute_kernels=[ps.compute_kernel],
                               cache_params=ps.cache_params)


def _shards(ps: Any, option: Any) -> list[Any]:
    """The plan's shards of one table (sizes, offsets, ranks) as TorchRec ``Shard`` objects;
    a replicated table's enumerated copies, one on each of its ranks."""
    from torchrec.distributed.planner.types import Shard

    if ps.sharding_spec is None:
        return [Shard(size=list(x.size), offset=list(x.offset), rank=r)
                for x, r in zip(option.shards, ps.ranks, strict=True)]
    return [Shard(size=[int(v) for v in m.shard_sizes], offset=[int(v) for v in m.shard_offsets],
                  rank=int(m.placement.rank()))
            for m in ps.sharding_spec.shards]


class _Unrated:
    """An estimator that estimates nothing: the enumerated options are rated once their
    shards are the plan's (:func:`rate_plan`), not before."""

    def estimate(self, sharding_options: list[Any], sharder_data_map: Any = None) -> None:
        return None
