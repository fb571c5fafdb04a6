"""Analytical cost model: bytes moved per tier over that tier's bandwidth, plus fixed overhead."""

from __future__ import annotations

from typing import Any

import numpy as np

from autoshard.pricing.cost import Pricing
from autoshard.pricing.shard_terms import batch_share, comm_scales, replica_terms
from autoshard.task import ShardingTask

_MS_PER_S = 1e3
_BYTES_PER_GB = 1e9


#: Row width (elements) one warp reads per pass in FBGEMM's lookup kernels.
FULL_BLOCK_DIM = 128


def narrow_row_factor(dim: np.ndarray) -> np.ndarray:
    """Bytes a lookup of a ``dim``-wide row moves, over the row's own bytes (>= 1; 1 from
    :data:`FULL_BLOCK_DIM` elements up)."""
    d = np.asarray(dim, dtype=np.float64)
    penalty = np.where(d < FULL_BLOCK_DIM // 2, 1.75, np.where(d < FULL_BLOCK_DIM, 1.15, 1.0))
    return penalty * np.maximum(d, 32.0) / d


class AnalyticalCostModel:
    """Prices embedding lookups from bytes moved, in the spirit of TorchRec's planner estimates.

    Per step and table, with L lookups (batch x pooling factor x coverage), a share h of them
    served by the hot rows in HBM and row size r bytes:

    - forward reads L*r bytes (h from HBM, 1-h from host memory) and writes the pooled output
      (batch x r) to HBM;
    - in train mode, backward and the row-wise optimizer read and write each looked-up row and its
      optimizer state (2r + 2s bytes per lookup, in the tier that holds the row) and read the
      output gradient (batch x r) from HBM: backward about 2x forward, TorchRec's ratio;
    - every pass pays the profile's fixed kernel overhead;
    - all-to-all sends the pooled output (and, in train, receives its gradient), batch x r bytes a
      pass, of which (D-1)/D leave the device, split over intra- and inter-node links by the
      share of peers in each.

    Narrow rows: FBGEMM's fused lookup kernels read a row as 4-element vectors over a warp's 32
    lanes (128 elements); a narrower row leaves lanes idle. Its lookups move row bytes as if the
    row were at least 32 elements wide, times 1.15 below 128 elements and 1.75 below 64 (TorchRec's
    planner's empirical factors, ``FULL_BLOCK_EMB_DIM``, ``HALF_BLOCK_PENALTY``,
    ``QUARTER_BLOCK_PENALTY``). So a table cut into narrow column blocks does more work in all
    than the table whole.

    Shards (:mod:`autoshard.layout.shards`) are priced as small tables: a column block with its
    block of r, a row shard with its share of L and the full r (its partial pooled sums); a
    table-row-wise shard sends (k-1)/k of its partial sums over the intra-node link (the
    reduce-scatter in its node) and 1/k of them through the all-to-all, and a grid shard (a
    row shard of a column block, k per block) does the same with its block's r. A replica
    (``data_parallel``) serves 1/D of L from HBM and sends nothing through the all-to-all; in
    train it pays its table's gradient all-reduce (a ring: 2 (D-1)/D of the table's bytes over
    the slowest link it crosses, the inter-node one when the cluster has several nodes) and the
    dense update of the whole table in HBM (:func:`autoshard.layout.kinds.replica_sync_bytes`).

    Args:
        hbm_efficiency: Fraction of the HBM tier's spec-sheet bandwidth achieved (1.0 = spec).
        host_efficiency: Fraction of the host link's spec-sheet bandwidth achieved.
    """

    name = "analytical"

    def __init__(self, hbm_efficiency: float = 1.0, host_efficiency: float = 1.0) -> None:
        self.hbm_efficiency = hbm_efficiency
        self.host_efficiency = host_efficiency

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        a = task.table_arrays
        dev = task.device_arrays
        t = np.asarray(table_idx)
        d = np.asarray(device_idx)
        hw = task.hardware
        a2a, reduce = comm_scales(task, t)
        sync, update = replica_terms(task, t)
        ring = hw.inter_node_gbps if hw.spans_nodes else hw.intra_node_gbps
        return self.price_terms(
            hbm_share=task.hbm_share(t, hbm_rows), row_bytes=a.row_bytes[t], dim=a.dim[t],
            optimizer_bytes=a.optimizer_bytes[t], lookups=a.lookups[t],
            hbm_gbps=dev.hbm_gbps[d], host_gbps=dev.host_gbps[d],
            intra_share=dev.intra_share[d], inter_share=dev.inter_share[d],
            train=task.workload.train, batch_size=task.workload.batch_size * batch_share(task, t),
            kernel_overhead_us=hw.kernel_overhead_us, num_devices=task.num_devices,
            intra_node_gbps=hw.intra_node_gbps, inter_node_gbps=hw.inter_node_gbps,
            a2a_scale=a2a, reduce_scale=reduce, sync_bytes=sync, update_bytes=update,
            ring_gbps=ring)

    def price_terms(self, *, hbm_share: Any, row_bytes: Any, dim: Any, optimizer_bytes: Any,
                    lookups: Any, hbm_gbps: Any, host_gbps: Any, intra_share: Any,
                    inter_share: Any, train: Any, batch_size: Any, kernel_overhead_us: Any,
                    num_devices: Any, intra_node_gbps: Any, inter_node_gbps: Any,
                    a2a_scale: Any = 1.0, reduce_scale: Any = 0.0, sync_bytes: Any = 0.0,
                    update_bytes: Any = 0.0, ring_gbps: Any = 1.0) -> Pricing:
        """Prices rows given by their terms rather than by a task: each argument a scalar or an
        array that broadcasts against the rows, so that rows of several tasks (a batch of
        environment episodes) are priced in one call, with :meth:`price`'s arithmetic.

        Args:
            hbm_share: Share of the lookups served from HBM (:meth:`ShardingTask.hbm_share`).
            row_bytes, optimizer_bytes: Bytes of a row and of its optimizer state.
            dim: Elements of a row (see :func:`narrow_row_factor`).
            lookups: Lookups per step.
            hbm_gbps, host_gbps: The device's HBM and host-link bandwidth, GB/s.
            intra_share, inter_share: Shares of the device's all-to-all peers in and out of
                its node.
            train: Train mode (forward, backward, optimizer) rather than inference.
            batch_size: Samples whose pooled outputs the row writes: the global batch, or a
                replica's device's share of it (:func:`autoshard.pricing.shard_terms.batch_share`).
            kernel_overhead_us: Fixed cost of a kernel pass, us.
            num_devices: Devices of the cluster.
            intra_node_gbps, inter_node_gbps: Link bandwidths, GB/s.
            a2a_scale, reduce_scale: See :func:`autoshard.pricing.shard_terms.comm_scales`.
            sync_bytes, update_bytes: A replica's all-reduce and dense-update bytes
                (:func:`autoshard.pricing.shard_terms.replica_terms`); ``ring_gbps`` the
                all-reduce's link.
        """
        h, r = hbm_share, row_bytes
        read = r * narrow_row_factor(dim)
        if np.ndim(train) == 0:
            extra: Any = 2.0 * read + 2.0 * optimizer_bytes if train else 0.0
            passes: Any = 2.0 if train else 1.0
        else:
            extra = np.where(train, 2.0 * read + 2.0 * optimizer_bytes, 0.0)
            passes = np.where(train, 2.0, 1.0)
        per_lookup = read + extra
        hbm_bytes = lookups * h * per_lookup + passes * batch_size * r
        uvm_bytes = lookups * (1.0 - h) * per_lookup
        overhead_ms = passes * kernel_overhead_us * 1e-3
        hbm_bw = hbm_gbps * self.hbm_efficiency * _BYTES_PER_GB
        host_bw = host_gbps * self.host_efficiency * _BYTES_PER_GB
        leaving = (num_devices - 1) / num_devices
        sec_per_byte = leaving * (intra_share / (intra_node_gbps * _BYTES_PER_GB)
                                  + inter_share / (inter_node_gbps * _BYTES_PER_GB))
        sec_per_byte = (a2a_scale * sec_per_byte
                        + reduce_scale / (intra_node_gbps * _BYTES_PER_GB))
        return Pricing(
            hbm_ms=(hbm_bytes + update_bytes) / hbm_bw * _MS_PER_S + overhead_ms,
            uvm_ms=uvm_bytes / host_bw * _MS_PER_S,
            comm_ms=(passes * batch_size * r * sec_per_byte
                     + sync_bytes / (ring_gbps * _BYTES_PER_GB)) * _MS_PER_S,
        )


def replica_update_ms(task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray
                      ) -> np.ndarray | float:
    """The dense update of each priced replica in a training step, at its device's spec-sheet
    HBM bandwidth (0 for other rows): what a learned model of the lookups alone leaves out
    (:class:`AnalyticalCostModel` prices it itself)."""
    _, update = replica_terms(task, np.asarray(table_idx))
    if np.ndim(update) == 0:
        return 0.0
    bw = task.device_arrays.hbm_gbps[np.asarray(device_idx)] * _BYTES_PER_GB
    return np.asarray(update) / bw * _MS_PER_S
