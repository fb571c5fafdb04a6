"""A hand-checkable cluster and tables, and the analytical formula written out independently
of the code under test."""

from __future__ import annotations

from autoshard.hardware import Device, HardwareProfile, Tier
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload

# The hand cluster: 2 devices in one node, 36,000 B of HBM each at 100 GB/s, 1 GB of host
# memory at 10 GB/s, 50 GB/s between devices, 5 us per kernel.
HAND_HBM_BYTES = 36_000
HAND_HBM_GBPS = 100.0
HAND_HOST_GBPS = 10.0
HAND_INTRA_GBPS = 50.0
HAND_KERNEL_US = 5.0
HAND_BATCH = 1000


def hand_profile(devices: int = 2, hbm_bytes: int = HAND_HBM_BYTES,
                 host_bytes: int = 10**9) -> HardwareProfile:
    device = Device(hbm=Tier(hbm_bytes, HAND_HBM_GBPS), host=Tier(host_bytes, HAND_HOST_GBPS))
    return HardwareProfile("hand", tuple(device for _ in range(devices)),
                           intra_node_gbps=HAND_INTRA_GBPS, inter_node_gbps=10.0,
                           kernel_overhead_us=HAND_KERNEL_US, devices_per_node=8)


def hand_tables() -> tuple[Table, ...]:
    """A: 1000 rows, B and C: 500 rows; dim 8 fp32 (32 B/row + 4 B optimizer state = 36 B in
    train mode), so A takes 36,000 B and B, C 18,000 B each; uniform access."""
    return (Table("A", rows=1000, dim=8, pooling_factor=2.0),
            Table("B", rows=500, dim=8, pooling_factor=1.0),
            Table("C", rows=500, dim=8, pooling_factor=1.0))


def hand_task_of(**profile: int) -> ShardingTask:
    """The three hand tables on the hand cluster (profile options as :func:`hand_profile`)."""
    return ShardingTask(hand_tables(), hand_profile(**profile), Workload(batch_size=HAND_BATCH))


def reference_price_ms(table: Table, hbm_share: float, devices: int, train: bool = True,
                       batch: int = HAND_BATCH, intra_share: float = 1.0,
                       inter_gbps: float = 10.0) -> tuple[float, float, float]:
    """(hbm_ms, uvm_ms, comm_ms) of one table on the hand cluster, from the formula of the
    analytical model's docstring, written out with plain floats."""
    r = table.dim * table.bytes_per_element
    # Narrow rows: read as at least 32 elements wide, x1.75 below 64 elements, x1.15 below 128.
    narrow = (1.75 if table.dim < 64 else 1.15 if table.dim < 128 else 1.0) * max(table.dim, 32)
    read = r * narrow / table.dim
    s = table.optimizer_bytes_per_row
    lookups = batch * table.pooling_factor * table.coverage
    per_lookup = 3 * read + 2 * s if train else read
    passes = 2 if train else 1
    hbm_bytes = lookups * hbm_share * per_lookup + passes * batch * r
    uvm_bytes = lookups * (1 - hbm_share) * per_lookup
    hbm_ms = hbm_bytes / (HAND_HBM_GBPS * 1e9) * 1e3 + passes * HAND_KERNEL_US / 1e3
    uvm_ms = uvm_bytes / (HAND_HOST_GBPS * 1e9) * 1e3
    leaving = (devices - 1) / devices
    per_byte_s = intra_share / (HAND_INTRA_GBPS * 1e9) + (1 - intra_share) / (inter_gbps * 1e9)
    comm_ms = passes * batch * r * leaving * per_byte_s * 1e3 if devices > 1 else 0.0
    return hbm_ms, uvm_ms, comm_ms
