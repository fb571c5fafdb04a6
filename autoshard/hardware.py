"""Hardware profiles: devices with an HBM and a host (UVM) tier, and the links between them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured, write_structured
from autoshard.limits import (
    BANDWIDTH_GBPS,
    CAPACITY_GB,
    MAX_CAPACITY_BYTES,
    MAX_CAPACITY_GB,
    MAX_DEVICES,
    MAX_KERNEL_OVERHEAD_US,
    check_fields,
    int_in,
    is_finite,
    number_in,
)

GB = 1e9  # spec sheets quote decimal gigabytes
#: The fields of a profile file, and of each device in it (``node`` only in a ``devices`` list).
PROFILE_FIELDS = ("schema_version", "kind", "name", "intra_node_gbps", "inter_node_gbps",
                  "kernel_overhead_us", "devices_per_node", "num_devices", "device", "devices")
DEVICE_FIELDS = ("hbm_gb", "hbm_bandwidth_gbps", "host_gb", "host_bandwidth_gbps")


@dataclass(frozen=True)
class Tier:
    """One memory tier of a device.

    Args:
        capacity_bytes: Bytes available for embedding tables in this tier.
        bandwidth_gbps: Bandwidth for embedding lookups, GB/s (1e9 bytes per second).
    """

    capacity_bytes: int
    bandwidth_gbps: float

    def __post_init__(self) -> None:
        if not number_in(self.capacity_bytes, 0, MAX_CAPACITY_BYTES):
            raise InputError(f"capacity must be in [0, {MAX_CAPACITY_BYTES:,}] bytes (2^50)",
                             field="capacity_bytes", value=self.capacity_bytes)
        check_bandwidth("bandwidth_gbps", self.bandwidth_gbps)


@dataclass(frozen=True)
class Device:
    """A GPU: its HBM, the host memory it reaches over PCIe (UVM), and the node it sits in."""

    hbm: Tier
    host: Tier
    node: int = 0

    def __post_init__(self) -> None:
        check_count("node", self.node, MAX_DEVICES - 1, low=0)


@dataclass(frozen=True)
class HardwareProfile:
    """Devices, links and fixed costs of a cluster.

    Args:
        name: Profile name.
        devices: The devices, rank order.
        intra_node_gbps: Per-device all-to-all bandwidth to a device in the same node, GB/s.
        inter_node_gbps: Per-device all-to-all bandwidth to a device in another node, GB/s.
        kernel_overhead_us: Fixed cost of one embedding kernel (per table, per pass), microseconds.
        devices_per_node: Devices in one node.
    """

    name: str
    devices: tuple[Device, ...]
    intra_node_gbps: float
    inter_node_gbps: float
    kernel_overhead_us: float = 5.0
    devices_per_node: int = 8

    def __post_init__(self) -> None:
        if not self.devices:
            raise InputError("a profile needs at least one device", field="devices", value=0)
        check_count("devices", len(self.devices), MAX_DEVICES)
        for key in ("intra_node_gbps", "inter_node_gbps"):
            check_bandwidth(key, getattr(self, key))
        check_count("devices_per_node", self.devices_per_node, MAX_DEVICES)
        if not number_in(self.kernel_overhead_us, 0, MAX_KERNEL_OVERHEAD_US):
            raise InputError(f"must be a number in [0, {MAX_KERNEL_OVERHEAD_US:g}]",
                             field="kernel_overhead_us", value=self.kernel_overhead_us)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def node_devices(self) -> int:
        """Devices of one node as these devices fill it: ``devices_per_node``, or all of them
        where they fill less than one node (TorchRec's local world size)."""
        return min(self.devices_per_node, self.num_devices)

    @property
    def spans_nodes(self) -> bool:
        """Whether the devices fill more than one node of ``devices_per_node`` (so that some
        links between them are inter-node ones)."""
        return self.num_devices > self.devices_per_node

    def with_devices(self, count: int) -> HardwareProfile:
        """The same kind of device, ``count`` of them, filling nodes of ``devices_per_node``."""
        check_count("devices", count, MAX_DEVICES)
        template = self.devices[0]
        devices = tuple(replace(template, node=i // self.devices_per_node) for i in range(count))
        name = _base_name(self.name)
        return replace(self, devices=devices, name=f"{count}x{name}")

    def with_nodes(self, nodes: int) -> HardwareProfile:
        """``nodes`` full nodes of this profile's device."""
        check_count("nodes", nodes, MAX_DEVICES // self.devices_per_node)
        return self.with_devices(nodes * self.devices_per_node)

    def with_hbm_bytes(self, capacity_bytes: int) -> HardwareProfile:
        """Every device's HBM tier capped at ``capacity_bytes`` for embeddings."""
        if not number_in(capacity_bytes, 0, MAX_CAPACITY_BYTES):
            raise InputError(f"must be in [0, {MAX_CAPACITY_GB:g}] GB", field="hbm_gb",
                             value=capacity_bytes / GB if is_finite(capacity_bytes)
                             else capacity_bytes)
        devices = tuple(replace(d, hbm=replace(d.hbm, capacity_bytes=int(capacity_bytes)))
                        for d in self.devices)
        return replace(self, devices=devices)

    def to_dict(self) -> dict[str, Any]:
        per_node = self.devices_per_node
        uniform = all(d == replace(self.devices[0], node=i // per_node)
                      for i, d in enumerate(self.devices))
        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "kind": "hardware", "name": self.name,
            "intra_node_gbps": self.intra_node_gbps, "inter_node_gbps": self.inter_node_gbps,
            "kernel_overhead_us": self.kernel_overhead_us,
            "devices_per_node": self.devices_per_node,
        }
        if uniform:
            doc["num_devices"] = self.num_devices
            doc["device"] = _device_doc(self.devices[0])
        else:
            doc["devices"] = [dict(_device_doc(d), node=d.node) for d in self.devices]
        return doc

    @classmethod
    def from_dict(cls, doc: Any, source: str = "<hardware>") -> HardwareProfile:
        """A profile from a mapping; errors name the source, the field and the value."""
        doc = check_schema(doc, "hardware", source)
        try:
            check_fields(doc, PROFILE_FIELDS)
            per_node = _integer(doc, "devices_per_node", 8)
            check_count("devices_per_node", per_node, MAX_DEVICES)
            devices = _devices(doc, per_node)
            return cls(
                name=str(doc.get("name", Path(source).stem)),
                devices=devices,
                intra_node_gbps=_number(doc, "intra_node_gbps"),
                inter_node_gbps=_number(doc, "inter_node_gbps"),
                kernel_overhead_us=_number(doc, "kernel_overhead_us", 5.0),
                devices_per_node=per_node,
            )
        except InputError as exc:
            raise exc.located(source) from exc


def check_count(name: str, value: Any, high: int, low: int = 1) -> None:
    """Fails unless ``value`` is an integer in ``[low, high]``; the error names ``name``."""
    if not int_in(value, low, high):
        raise InputError(f"must be an integer in [{low}, {high:,}]", field=name, value=value)


def check_bandwidth(name: str, value: Any) -> None:
    """Fails unless ``value`` is a bandwidth in GB/s within the documented limits
    (:data:`autoshard.limits.BANDWIDTH_GBPS`)."""
    BANDWIDTH_GBPS.check(value, name)


def check_gb(name: str, value: Any) -> None:
    """Fails unless ``value`` is a capacity in GB within the documented limits
    (:data:`autoshard.limits.CAPACITY_GB`)."""
    CAPACITY_GB.check(value, name)


def _required(doc: dict[str, Any], key: str) -> Any:
    if key not in doc or doc[key] is None:
        raise InputError("required field missing", field=key)
    return doc[key]


def _number(doc: dict[str, Any], key: str, default: float | None = None) -> float:
    """A finite number from ``doc[key]`` (``default`` when absent and a default is given)."""
    if default is not None and doc.get(key) is None:
        return default
    value = _required(doc, key)
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise InputError("must be a number", field=key, value=value) from exc
    if not math.isfinite(number):
        raise InputError("must be a finite number", field=key, value=value)
    return number


def _integer(doc: dict[str, Any], key: str, default: int) -> int:
    number = _number(doc, key, float(default))
    if not number.is_integer():
        raise InputError("must be an integer", field=key, value=doc.get(key))
    return int(number)


def _devices(doc: dict[str, Any], per_node: int) -> tuple[Device, ...]:
    """A profile file's devices: a ``devices`` list, or ``num_devices`` (default: one node) of
    one ``device``; giving both forms is an error, never one of them ignored."""
    if "devices" in doc:
        if "device" in doc:
            raise InputError("give either 'device' (with 'num_devices') or a 'devices' list, "
                             "not both", field="device", value=doc["device"])
        if not isinstance(doc["devices"], list) or not doc["devices"]:
            raise InputError("expected a non-empty list of devices", field="devices",
                             value=doc["devices"])
        check_count("devices", len(doc["devices"]), MAX_DEVICES)
        if doc.get("num_devices", len(doc["devices"])) != len(doc["devices"]):
            raise InputError(f"the 'devices' list holds {len(doc['devices'])} devices",
                             field="num_devices", value=doc["num_devices"])
        return tuple(_device(d, f"devices[{i}]", i // per_node, listed=True)
                     for i, d in enumerate(doc["devices"]))
    _required(doc, "device")
    count = _integer(doc, "num_devices", per_node)
    check_count("num_devices", count, MAX_DEVICES)
    one = _device(doc["device"], "device", 0, listed=False)
    return tuple(replace(one, node=i // per_node) for i in range(count))


def _device(doc: Any, where: str, node: int, listed: bool) -> Device:
    """One device of a profile file at ``where``; ``node`` (its default node) may be given
    only for a device of a ``devices`` list."""
    if not isinstance(doc, dict):
        raise InputError("expected a mapping", field=where, value=doc)
    try:
        check_fields(doc, (*DEVICE_FIELDS, "node") if listed else DEVICE_FIELDS)
        values = {key: _number(doc, key) for key in
                  ("hbm_gb", "hbm_bandwidth_gbps", "host_gb", "host_bandwidth_gbps")}
        node = _integer(doc, "node", node)
        check_count("node", node, MAX_DEVICES - 1, low=0)
        for key in ("hbm_gb", "host_gb"):
            check_gb(key, values[key])
        for key in ("hbm_bandwidth_gbps", "host_bandwidth_gbps"):
            check_bandwidth(key, values[key])
    except InputError as exc:
        raise exc.located("", where) from exc
    return Device(hbm=Tier(int(values["hbm_gb"] * GB), values["hbm_bandwidth_gbps"]),
                  host=Tier(int(values["host_gb"] * GB), values["host_bandwidth_gbps"]),
                  node=node)


def _device_doc(d: Device) -> dict[str, float]:
    return {"hbm_gb": d.hbm.capacity_bytes / GB, "hbm_bandwidth_gbps": d.hbm.bandwidth_gbps,
            "host_gb": d.host.capacity_bytes / GB, "host_bandwidth_gbps": d.host.bandwidth_gbps}


def _base_name(name: str) -> str:
    head, sep, tail = name.partition("x")
    return tail if sep and head.isdigit() else name


def _node(name: str, hbm_gb: float, hbm_gbps: float, host_gb: float, pcie_gbps: float,
          nvlink_gbps: float, network_gbps: float) -> HardwareProfile:
    device = Device(hbm=Tier(int(hbm_gb * GB), hbm_gbps), host=Tier(int(host_gb * GB), pcie_gbps))
    return HardwareProfile(name=name, devices=tuple(replace(device) for _ in range(8)),
                           intra_node_gbps=nvlink_gbps, inter_node_gbps=network_gbps)


#: Bundled single-node profiles. HBM capacity and bandwidth, host link and NVLink figures are
#: spec-sheet numbers (REFERENCES.md: V100 900 GB/s, A100-40GB 1.56 TB/s, H100 SXM 3.35 TB/s,
#: H200 4.8 TB/s; PCIe Gen3/4/5 x16 about 16/32/64 GB/s per direction; NVLink 2/3/4 300/600/900
#: GB/s per GPU). Host memory per GPU is the DGX system's DRAM divided by its 8 GPUs (DGX-1 512 GB,
#: DGX A100 1 TB, DGX H100/H200 2 TB). Inter-node bandwidth is one NIC per GPU (100/200/400/400
#: Gb/s InfiniBand = 12.5/25/50/50 GB/s).
BUNDLED: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        _node("8xV100-16GB", 16, 900, 64, 16, 300, 12.5),
        _node("8xA100-40GB", 40, 1555, 128, 32, 600, 25),
        _node("8xH100-80GB", 80, 3350, 256, 64, 900, 50),
        _node("8xH200-141GB", 141, 4800, 256, 64, 900, 50),
    )
}


def load_hardware(spec: str | Path, *, devices: int | None = None, nodes: int | None = None,
                  hbm_gb: float | None = None) -> HardwareProfile:
    """A bundled profile by name or a YAML/JSON file, with optional overrides.

    Args:
        spec: Bundled profile name (see :data:`BUNDLED`), the same with another device count
            (``16xH100-80GB``, the name :meth:`HardwareProfile.with_devices` gives), or a path
            to a profile file.
        devices: Total device count (overrides the profile's).
        nodes: Number of full nodes; with ``devices`` too, the two must agree (``nodes``
            times the profile's devices per node).
        hbm_gb: HBM capacity per device for embeddings, GB.

    Raises:
        InputError: Unknown profile, a bad file (an unknown field included), or overrides
            out of range or disagreeing.
    """
    name = str(spec)
    head, _, base = name.partition("x")
    if name in BUNDLED:
        profile = BUNDLED[name]
    elif head.isdigit() and int(head) > 0 and f"8x{base}" in BUNDLED:  # e.g. 16xH100-80GB
        profile = BUNDLED[f"8x{base}"].with_devices(int(head))
    elif Path(name).suffix.lower() in (".yaml", ".yml", ".json"):
        profile = HardwareProfile.from_dict(read_structured(name), source=name)
    else:
        raise InputError(f"unknown hardware profile (bundled: {', '.join(BUNDLED)}; "
                         "or give a .yaml/.json file)", field="hardware", value=name)
    if devices is not None and nodes is not None:
        _check_agree(devices, nodes, profile.devices_per_node)
    if devices is not None:
        profile = profile.with_devices(devices)
    elif nodes is not None:
        profile = profile.with_nodes(nodes)
    if hbm_gb is not None:
        check_gb("hbm_gb", hbm_gb)
        profile = profile.with_hbm_bytes(int(hbm_gb * GB))
    return profile


def _check_agree(devices: int, nodes: int, per_node: int) -> None:
    """Fails unless ``nodes`` full nodes of ``per_node`` devices are ``devices`` devices."""
    if nodes * per_node != devices:
        raise InputError(f"--nodes {nodes} and --devices {devices} disagree: {nodes} nodes of "
                         f"{per_node} devices are {nodes * per_node} devices (give one of "
                         "them, or both agreeing)", field="nodes", value=nodes)


def save_hardware(path: str | Path, profile: HardwareProfile) -> None:
    write_structured(path, profile.to_dict())
