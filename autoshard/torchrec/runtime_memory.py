"""The HBM TorchRec's runtime keeps per table or shard: a task's reservation for TorchRec.

Every sharder, the MILP and the incremental placement check HBM through the task's reservation
(:mod:`autoshard.reservation`, via :class:`autoshard.task.TableArrays`' ``hbm_bytes_per_row``
and ``hbm_reserved_bytes``), so that a plan that fits our count also fits TorchRec's storage
estimate (``EmbeddingStorageEstimator`` of torchrec 1.8.0, CUDA, for the training pipeline the
reservation names; :mod:`autoshard.torchrec.storage` mirrors it exactly, and tests check both
against the estimator). In training TorchRec charges a shard, beyond its weights:

- optimizer state per weight byte by the optimizer its state size implies (row-wise Adagrad:
  one element per row; up to a row: one row; more: two rows);
- input and output buffers: 8 bytes per input id it receives (every sample's ids for table-wise
  and column-wise shards, a world's share of them for row-wise ones, a node's for table-row-wise
  ones) and 4 bytes per element of the pooled output it writes (its columns, every sample), in
  TorchRec's default pipeline; in its prefetch pipeline, three input buffers, and seven more for
  a shard with an HBM cache (its prefetched ids), and no output buffer;
- with an HBM cache (``fused_uvm_caching``): 16 bytes of cache state per cached row and 4 bytes
  of index per row of the shard.

In inference it charges the weights alone. What :class:`TorchRecReservation` keeps
(:data:`TORCHREC`, named ``torchrec``, for TorchRec's default pipeline, the CLI's default, or
:data:`TORCHREC_PREFETCH`, ``torchrec-prefetch``, for its prefetch pipeline), an upper bound of
that count for any kernel the export picks:

- per row kept in HBM: weights, the larger of our and TorchRec's optimizer state, and 16 bytes
  of cache state (train);
- per table or shard, wherever it lives: its input and output buffers (with prefetch: ten input
  buffers, as if cached) and 4 bytes of cache index per row (train), and one row of HBM bytes
  plus 64 bytes for TorchRec's rounding.

TorchRec's runtime also routes a row split's ids in fixed even blocks and keeps one cache load
factor per table; the reservation says so (:attr:`Reservation.fixed_row_blocks`,
:attr:`Reservation.one_share_per_table`), and every sharder keeps those layouts on its tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from autoshard.limits import one_of
from autoshard.reservation import Reservation, weight_bytes

#: Input buffers per shard in TorchRec's prefetch pipeline, and the prefetch buffers of a cached
#: shard (``calculate_pipeline_io_cost``: 3 x input + (1 + 6 / passes) x prefetch, one pass).
PREFETCH_INPUTS, PREFETCH_CACHED = 3, 7
INDEX_BYTES = 8  # TorchRec sizes input ids as int64
OUTPUT_BYTES = 4  # FP32 pooled output
CACHE_SLOT_BYTES = 16  # lxu_cache_state + lru_state per cached row
CACHE_INDEX_BYTES = 4  # cache_index_table_map per row
ROUNDING_BYTES = 64  # TorchRec rounds each of a shard's few terms up to a byte


def optimizer_multiplier(optimizer_bytes: np.ndarray, element_bytes: np.ndarray,
                         dim: np.ndarray) -> np.ndarray:
    """TorchRec's optimizer state per weight byte for the optimizer our state size implies
    (``dim``: the table's embedding dim)."""
    row_bytes = element_bytes * dim
    return np.select([optimizer_bytes == 0, optimizer_bytes <= element_bytes,
                      optimizer_bytes <= row_bytes], [0.0, 1.0 / dim, 1.0], 2.0)


#: TorchRec training pipelines: its default (no prefetch) and its prefetch pipeline.
PIPELINES = ("none", "prefetch")


def check_pipeline(pipeline: str, field: str = "pipeline", source: str | None = None) -> str:
    """``pipeline`` if it is one of :data:`PIPELINES` (else an InputError naming ``field``)."""
    return one_of(pipeline, PIPELINES, field, source)


def pipeline_of(reservation: Reservation) -> str:
    """The TorchRec training pipeline a task's reservation is for: ``"prefetch"`` or
    ``"none"`` (TorchRec's default; also for a task that keeps no room for TorchRec)."""
    return reservation.pipeline if isinstance(reservation, TorchRecReservation) else "none"


def io_buffer_bytes(lookups_per_sample: np.ndarray, cols: np.ndarray,
                    input_share: np.ndarray | float, batch_size: int, world: int,
                    pipeline: str = "none", cached: bool = True,
                    output_share: np.ndarray | float = 1.0) -> np.ndarray:
    """TorchRec's input and output buffer bytes of shards in training: ``input_share`` of the
    global batch's ids (1, 1/world for row-wise and replicas, 1/local for table-row-wise) at 8
    bytes, and ``cols`` pooled elements per sample of ``output_share`` of the global batch (1;
    a replica its rank's samples, 1/world) at 4 bytes; in the ``"prefetch"`` pipeline
    :data:`PREFETCH_INPUTS` input buffers, :data:`PREFETCH_CACHED` more if ``cached``, and no
    output buffer."""
    batch = max(batch_size // world, 1)  # per rank, as TorchRec sizes it
    lookups = lookups_per_sample * batch * input_share
    outputs = np.minimum(1.0, lookups_per_sample) * batch
    return pipeline_buffers(np.ceil(lookups * world * INDEX_BYTES),
                            np.ceil(outputs * world * output_share * cols * OUTPUT_BYTES),
                            pipeline, cached)


def pipeline_buffers(inputs: np.ndarray, outputs: np.ndarray, pipeline: str, cached: bool
                     ) -> np.ndarray:
    """The buffer bytes a shard with ``inputs`` bytes of input ids and ``outputs`` bytes of
    pooled output keeps in TorchRec's training ``pipeline``: both once in its default one;
    :data:`PREFETCH_INPUTS` input buffers, :data:`PREFETCH_CACHED` more if ``cached``, and no
    output buffer in its prefetch one."""
    if pipeline == "prefetch":
        return (PREFETCH_INPUTS + (PREFETCH_CACHED if cached else 0)) * inputs
    return inputs + outputs


@dataclass(frozen=True)
class TorchRecReservation(Reservation):
    """What TorchRec's training runtime keeps per table or shard (the module docstring).

    Args:
        name: ``torchrec`` or ``torchrec-prefetch``.
        pipeline: The training pipeline it is for (:data:`PIPELINES`).
    """

    pipeline: str = "none"
    fixed_row_blocks: ClassVar[bool] = True
    one_share_per_table: ClassVar[bool] = True
    keeps_room: ClassVar[bool] = True

    def hbm_terms(self, rows: np.ndarray, cols: np.ndarray, table_dim: np.ndarray,
                  element_bytes: np.ndarray, optimizer_bytes: np.ndarray,
                  lookups_per_sample: np.ndarray, input_share: np.ndarray | float, *,
                  train: bool, batch_size: int, world: int,
                  output_share: np.ndarray | float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """See :meth:`autoshard.reservation.Reservation.hbm_terms` and the module docstring."""
        ours = weight_bytes(element_bytes, cols, optimizer_bytes, train)
        if not train:  # the weights alone, with room for TorchRec's rounding of a cache
            return ours, ours + ROUNDING_BYTES
        row_bytes = (element_bytes * cols).astype(np.float64)
        theirs = row_bytes * (1.0 + optimizer_multiplier(optimizer_bytes, element_bytes,
                                                         table_dim))
        per_row = np.ceil(np.maximum(ours, theirs)) + CACHE_SLOT_BYTES
        reserved = (io_buffer_bytes(lookups_per_sample, cols, input_share, batch_size, world,
                                    self.pipeline, output_share=output_share)
                    + CACHE_INDEX_BYTES * rows + per_row + ROUNDING_BYTES)
        return per_row, reserved.astype(np.float64)


#: TorchRec's runtime in its default training pipeline, and in its prefetch pipeline.
TORCHREC = TorchRecReservation("torchrec", "none")
TORCHREC_PREFETCH = TorchRecReservation("torchrec-prefetch", "prefetch")
