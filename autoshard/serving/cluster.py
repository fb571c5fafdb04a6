"""Serving hardware: CPU servers (memory, bandwidth, cores) and the network between them.

A serving cluster has one main server, which runs the dense part of the model and fans each
request out, and up to ``max_servers`` sparse servers that hold embedding tables. Profiles are
bundled by name (:data:`BUNDLED`) or read from YAML/JSON (``kind: serving_profile``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured, write_structured
from autoshard.limits import (
    BANDWIDTH_GBPS,
    CAPACITY_GB,
    LATENCY_US,
    MAX_CAPACITY_GB,
    MAX_LATENCY_US,
    Range,
    check_fields,
)

GB = 1e9
#: Servers, or cores of one, a profile may name.
_COUNT = Range(1, 4096, integer=True)
#: The range of every numeric field of a profile (:mod:`autoshard.limits` holds the shared
#: ones): far above any real server, low enough that every simulated figure stays finite.
FIELD_RANGES: dict[str, Range] = {
    "server_memory_gb": Range(0, MAX_CAPACITY_GB, open_low=True),
    "main_memory_gb": CAPACITY_GB,
    "memory_bandwidth_gbps": BANDWIDTH_GBPS, "network_gbps": BANDWIDTH_GBPS,
    "cores": _COUNT, "max_servers": _COUNT, "host_cores": Range(0, 4096, integer=True),
    "lookup_ns": Range(0, MAX_LATENCY_US * 1e3),
    **{key: LATENCY_US for key in ("table_overhead_us", "call_overhead_us",
                                   "network_latency_us", "main_call_us", "main_request_us",
                                   "call_table_overhead_us", "dense_us_per_item")},
    # a wider tail is not a service-time distribution
    "tail_sigma": Range(0, 3), "main_tail_sigma": Range(0, 3),
    "nic_gbps": BANDWIDTH_GBPS,
    "utilisation_ceiling": Range(0, 1, open_low=True),
    "memory_headroom": Range(0, 0.9),
    "stall_per_s": Range(0, 1e4),
    "stall_us": LATENCY_US,
    "dequant_ns": Range(0, MAX_LATENCY_US * 1e3),
    "main_cost": Range(0, 1e6), "server_cost": Range(0, 1e6),
    "batch_items": Range(0, 1_000_000, integer=True), "batch_overhead_us": LATENCY_US,
}


@dataclass(frozen=True)
class ServingProfile:
    """A serving cluster of identical CPU servers.

    Args:
        name: Profile name.
        server_memory_gb: Memory per sparse server available to embedding tables, GB.
        main_memory_gb: Memory on the main server available to embedding tables, GB (the rest
            holds the dense model and the serving runtime).
        memory_bandwidth_gbps: Bandwidth of one lookup stream, GB/s (one core's share).
        cores: Cores per server serving calls in parallel (each call runs on one core).
        lookup_ns: Fixed CPU cost of one embedding-row lookup, nanoseconds.
        table_overhead_us: Fixed cost of looking up one table in a call (operator dispatch,
            one more tensor to send), microseconds.
        call_overhead_us: Fixed server time of one remote call (receiving, deserialising,
            scheduling, replying), microseconds; it occupies a core.
        main_call_us: Time the main server takes to issue each remote call it makes
            (serialising it and handing it to the transport), microseconds; calls are issued
            one after another, and taking the reply is part of ``network_latency_us``.
        network_latency_us: Latency a remote call adds without occupying the server (the
            network round trip, waking the threads), microseconds.
        main_request_us: The main server's own fixed time per request (taking it, waking to
            it, dispatching it), microseconds; it occupies the main server.
        main_tail_sigma: Sigma of a further lognormal (mean 1) factor on
            ``main_request_us`` alone: how late the main server wakes to a request.
        host_cores: 0 when every server has its own machine; otherwise the cores of the one
            host all processes (main and sparse servers) share, stretching service times
            when more are busy than it has cores.
        call_table_overhead_us: Extra cost of each table carried by a remote call (its tensors
            serialised and sent), microseconds.
        network_gbps: Network bandwidth between the main server and a sparse server, GB/s.
        dense_us_per_item: Dense compute on the main server per scored item, microseconds.
        tail_sigma: Sigma of the lognormal (mean 1) factor each service time is drawn with;
            0 makes service times deterministic.
        max_servers: Most servers a plan may use, main-tier replicas and sparse-server
            replicas together.
        nic_gbps: Network-interface bandwidth of each server (main and sparse), GB/s, each
            direction; a plan whose traffic keeps a link at or above ``utilisation_ceiling``
            is not feasible.
        utilisation_ceiling: Busy share of a server's cores (and of its network interface) a
            feasible plan stays below.
        memory_headroom: Share of each server's table memory a plan leaves free.
        stall_per_s: Stalls per second of each server (or of the shared host when
            ``host_cores`` > 0): pauses in which every call in service waits.
        stall_us: Mean length of a stall, microseconds (exponentially distributed).
        dequant_ns: CPU cost of dequantising one looked-up row of an 8- or 4-bit table, ns.
        main_cost: Cost of one main-tier server (any unit; the plan minimises total cost).
        server_cost: Cost of one sparse server, same unit.
        batch_items: Most items the main server scores in one batch: a larger request is split
            into batches run side by side on its cores (DeepRecSys); 0 never splits.
        batch_overhead_us: Fixed cost of each batch of a split request, microseconds.
    """

    name: str
    server_memory_gb: float = 256.0
    main_memory_gb: float = 128.0
    memory_bandwidth_gbps: float = 10.0
    cores: int = 16
    lookup_ns: float = 60.0
    table_overhead_us: float = 5.0
    call_overhead_us: float = 300.0
    network_latency_us: float = 100.0
    main_call_us: float = 20.0
    main_request_us: float = 0.0
    main_tail_sigma: float = 0.0
    host_cores: int = 0
    call_table_overhead_us: float = 5.0
    network_gbps: float = 3.0
    dense_us_per_item: float = 20.0
    tail_sigma: float = 0.5
    max_servers: int = 32
    nic_gbps: float = 12.5
    utilisation_ceiling: float = 0.8
    memory_headroom: float = 0.1
    stall_per_s: float = 0.0
    stall_us: float = 0.0
    dequant_ns: float = 15.0
    main_cost: float = 1.0
    server_cost: float = 1.0
    batch_items: int = 0
    batch_overhead_us: float = 50.0

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name):
            raise InputError("must be a non-empty string", field="name", value=self.name)
        for key, rng in FIELD_RANGES.items():
            rng.check(getattr(self, key), key)

    @property
    def server_bytes(self) -> float:
        return self.server_memory_gb * GB

    @property
    def main_bytes(self) -> float:
        return self.main_memory_gb * GB

    @property
    def usable_server_bytes(self) -> float:
        """A sparse server's table memory less the headroom a plan leaves free."""
        return self.server_bytes * (1 - self.memory_headroom)

    @property
    def usable_main_bytes(self) -> float:
        """The main server's table memory less the headroom."""
        return self.main_bytes * (1 - self.memory_headroom)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "serving_profile", **asdict(self)}

    @classmethod
    def from_dict(cls, doc: Any, source: str = "<serving profile>") -> ServingProfile:
        """Builds a profile; errors name the source and the field."""
        doc = dict(check_schema(doc, "serving_profile", source))
        doc.pop("schema_version", None)
        doc.pop("kind", None)
        try:
            check_fields(doc, tuple(f.name for f in fields(cls)))
        except InputError as exc:
            raise exc.located(source) from exc
        if "name" not in doc:
            doc["name"] = Path(source).stem
        for key, value in doc.items():
            if key != "name" and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InputError("must be a number", source=source, field=key, value=value)
        try:
            return cls(**doc)
        except InputError as exc:
            raise exc.located(source) from exc


#: Bundled profiles. ``cpu-256gb``: dual-socket CPU servers with 256 GB for tables (the scale of
#: Lui et al.'s servers), a datacenter network: a remote call costs 300 us of server time (RPC
#: stack, serialisation) plus a 100 us round trip.
#: ``cpu-64gb``: the same servers with 64 GB, so mid-size models need several.
#: ``local-cpu``: the processes of ``serve bench`` on one small machine (one busy thread per
#: server: the interpreter lock serialises its RPC worker threads); its timing constants are
#: placeholders for ``serve calibrate`` to measure (``serve compare --measure`` calibrates
#: before it measures), and all its processes share one host (``host_cores``, also found by
#: calibration).
BUNDLED: dict[str, ServingProfile] = {
    "cpu-256gb": ServingProfile(name="cpu-256gb"),
    "cpu-64gb": ServingProfile(name="cpu-64gb", server_memory_gb=64.0, main_memory_gb=32.0),
    "local-cpu": ServingProfile(name="local-cpu", server_memory_gb=0.05, main_memory_gb=0.03,
                                memory_bandwidth_gbps=5.0, cores=1, lookup_ns=100.0,
                                call_overhead_us=300.0, network_gbps=1.0, dense_us_per_item=0.0,
                                tail_sigma=0.5, max_servers=3, host_cores=2,
                                utilisation_ceiling=0.9, memory_headroom=0.0),
    "ispass-2021": ServingProfile(name="ispass-2021", dense_us_per_item=150.0),
}


#: The fields ``serve calibrate`` measures on this machine.
CALIBRATED = ("call_overhead_us", "network_latency_us", "main_call_us", "main_request_us",
              "main_tail_sigma", "call_table_overhead_us", "network_gbps", "nic_gbps",
              "lookup_ns", "memory_bandwidth_gbps", "table_overhead_us", "tail_sigma",
              "stall_per_s", "stall_us")


def with_calibration(profile: ServingProfile, found: dict[str, Any],
                     name: str | None = None) -> ServingProfile:
    """``profile`` with the :data:`CALIBRATED` fields taken from ``found``."""
    values: dict[str, Any] = {k: float(found[k]) for k in CALIBRATED}
    if "host_cores" in found:
        values["host_cores"] = int(found["host_cores"])
    return replace(profile, name=name or profile.name, **values)


def load_serving_profile(spec: str | Path, *, server_gb: float | None = None,
                         max_servers: int | None = None) -> ServingProfile:
    """A bundled profile by name, or one read from a YAML/JSON file, with overrides.

    Raises:
        InputError: Unknown name, unreadable or malformed file, or a bad override.
    """
    key = str(spec)
    if key in BUNDLED and not Path(key).exists():
        profile = BUNDLED[key]
    elif Path(key).suffix.lower() in (".yaml", ".yml", ".json"):
        profile = ServingProfile.from_dict(read_structured(key), key)
    else:
        raise InputError(f"unknown serving profile (bundled: {', '.join(BUNDLED)}; or a YAML "
                         "file)", field="profile", value=key)
    if server_gb is not None:
        profile = replace(profile, server_memory_gb=server_gb)
    if max_servers is not None:
        profile = replace(profile, max_servers=max_servers)
    return profile


def save_serving_profile(path: str | Path, profile: ServingProfile) -> None:
    write_structured(path, profile.to_dict())
