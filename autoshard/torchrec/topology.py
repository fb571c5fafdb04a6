"""A TorchRec ``Topology`` as our hardware profile: the inverse of
:func:`autoshard.torchrec.estimate.torchrec_topology`.

Each rank becomes a device of the topology's capacities (its ``hbm`` and ``ddr`` storage),
the HBM tier at ``hbm_mem_bw`` and the host tier at ``hbm_to_ddr_mem_bw`` (the link UVM reads
go over), ``local_world_size`` ranks to a node, the intra- and inter-node bandwidths as its
links. TorchRec's bandwidths are bytes per ms; ours are GB/s (1e9 bytes per second), a factor
of 1e6.

On a ``cpu`` topology TorchRec's ranks have no HBM: the tables live in host memory (DDR) and
its CPU kernels read it directly, with no UVM caching. Each device's fast tier is then the DDR
(its capacity, at ``ddr_mem_bw``), and the planner keeps every row in that tier (TorchRec's
sharders offer only the ``fused`` kernel on a CPU, :mod:`autoshard.torchrec.parameter_constraints`).
Its host tier is the same DDR again, never used: a device with no host memory at all is one
``recshard``'s MILP cannot plan (it keeps a row per table of host memory free for rounding).
"""

from __future__ import annotations

from typing import Any

from autoshard.hardware import Device, HardwareProfile, Tier

_BYTES_PER_MS_PER_GBPS = 1e6  # 1 GB/s = 1e6 bytes/ms (TorchRec's unit)


def topology_hardware(topology: Any) -> HardwareProfile:
    """Our profile of a TorchRec ``Topology`` (the module docstring), named
    ``torchrec-<device>-<world>x``."""
    local = max(int(topology.local_world_size), 1)
    cpu = topology.compute_device == "cpu"
    devices = []
    for rank, d in enumerate(topology.devices):
        if cpu:
            fast = Tier(int(d.storage.ddr), _gbps(topology.ddr_mem_bw))
            host = fast
        else:
            fast = Tier(int(d.storage.hbm), _gbps(topology.hbm_mem_bw))
            host = Tier(int(d.storage.ddr), _gbps(topology.hbm_to_ddr_mem_bw))
        devices.append(Device(fast, host, node=rank // local))
    return HardwareProfile(
        name=f"torchrec-{topology.compute_device}-{topology.world_size}x",
        devices=tuple(devices), intra_node_gbps=_gbps(topology.intra_host_bw),
        inter_node_gbps=_gbps(topology.inter_host_bw), devices_per_node=local)


def _gbps(bytes_per_ms: float) -> float:
    return float(bytes_per_ms) / _BYTES_PER_MS_PER_GBPS
