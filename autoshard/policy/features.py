"""The named layout of the placement policy's flat observation vector.

One flat ``float32`` vector, so that any SB3 policy can read it and it is cheap to build:

``[table (TABLE) | summary (SUMMARY) | device 0 block | ... | device max_devices-1 block]``

Each device block is ``[valid, DEVICE features, OPTION features x buckets]``; blocks of devices
beyond the task's count are zero (valid = 0). Everything is normalised per task: costs by the
task's lower bound, bytes by the device's capacity, counts by the number of tables.

Every writer addresses a feature by its name through :class:`ObsLayout` (``layout.table["dim"]``),
never by a literal position, so the order of a name tuple is the only place positions are set.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

#: Costs and bytes in the observation are clipped to this magnitude (in units of the bound or
#: of a device's capacity), so that one huge table cannot dominate a policy's input.
CLIP = 10.0

#: The next table: log10 rows / 8, dim / 256, lookups / task mean (log1p), its bytes / mean
#: device HBM, its relaxation cost / bound, relaxation bytes / mean device HBM, cost all in HBM
#: / bound, cost all in host memory / bound, lookup share of the hottest 1% and 10% of rows,
#: share of rows ever used.
TABLE = ("log_rows", "dim", "lookups", "bytes", "ref_cost", "ref_bytes", "cost_hbm",
         "cost_uvm", "share_1pct", "share_10pct", "used_fraction")
#: The work left: tables left / tables, their relaxation cost / (devices x bound), their
#: relaxation bytes / free HBM, step cost so far / bound, mean device load / bound,
#: devices / 16, 1 / devices, progress.
SUMMARY = ("tables_left", "work_left", "bytes_left", "max_load", "mean_load", "devices",
           "inv_devices", "progress")
#: A device: load by component (HBM, host, communication) and in all / bound, free HBM / HBM
#: capacity, free host / host capacity, tables on it / tables, its costliest table / bound,
#: (step cost - its load) / bound.
DEVICE = ("load_hbm", "load_uvm", "load_comm", "load", "free_hbm", "free_host", "tables",
          "max_table", "slack")
#: Placing the next table on the device with a bucket: its price / bound, the device's load
#: after / bound, the step cost's increase / bound, its HBM bytes / HBM capacity, free HBM after /
#: HBM capacity, whether it fits (the action mask).
OPTION = ("price", "load_after", "increase", "hbm_bytes", "free_after", "fits")


def _index(names: tuple[str, ...]) -> dict[str, int]:
    if len(set(names)) != len(names):
        raise ValueError(f"feature names repeat: {names}")
    return {n: i for i, n in enumerate(names)}


@dataclass(frozen=True)
class ObsLayout:
    """Sizes, offsets and name -> position maps of the flat observation.

    Args:
        max_devices: Device slots.
        buckets: HBM-split buckets per device.
        table_names, summary_names, device_names, option_names: The feature names of each part,
            in observation order (default: this module's tuples).
    """

    max_devices: int
    buckets: int
    table_names: tuple[str, ...] = TABLE
    summary_names: tuple[str, ...] = SUMMARY
    device_names: tuple[str, ...] = DEVICE
    option_names: tuple[str, ...] = OPTION
    table: dict[str, int] = field(init=False, repr=False, compare=False)
    summary: dict[str, int] = field(init=False, repr=False, compare=False)
    device: dict[str, int] = field(init=False, repr=False, compare=False)
    option: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for part, names, reference in (("table", self.table_names, TABLE),
                                       ("summary", self.summary_names, SUMMARY),
                                       ("device", self.device_names, DEVICE),
                                       ("option", self.option_names, OPTION)):
            if sorted(names) != sorted(reference):
                raise ValueError(f"{part} features must be a reordering of {reference}, "
                                 f"got {names}")
            object.__setattr__(self, part, _index(names))

    @property
    def device_block(self) -> int:
        return 1 + len(self.device_names) + self.buckets * len(self.option_names)

    @property
    def head(self) -> int:
        """Length of the table and summary part before the device blocks."""
        return len(self.table_names) + len(self.summary_names)

    @property
    def size(self) -> int:
        return self.head + self.max_devices * self.device_block

    def features(self) -> dict[str, list[str]]:
        """The names of every part, as a policy's config records them."""
        return {"table": list(self.table_names), "summary": list(self.summary_names),
                "device": list(self.device_names), "option": list(self.option_names)}


def nearest_legal(action: int, mask: np.ndarray, options: np.ndarray, layout: ObsLayout) -> int:
    """:meth:`PlacementEpisode.nearest_legal` of an episode's ``mask`` ([slots x buckets]) and
    option features ``options`` ([devices, buckets, OPTION] of the task's devices)."""
    buckets = options.shape[1]
    d, k = divmod(action, buckets)
    if d < options.shape[0]:
        allowed = np.flatnonzero(mask[d * buckets:(d + 1) * buckets])
        if allowed.size:
            return int(d * buckets + allowed[np.argmin(np.abs(allowed - k))])
    o = layout.option
    flat = options.reshape(-1, len(o))
    legal = np.flatnonzero(mask[:flat.shape[0]])
    best = np.lexsort((flat[legal, o["price"]], flat[legal, o["increase"]]))[0]
    return int(legal[best])


@dataclass(frozen=True)
class StaticOptions:
    """The option features of the value buckets that do not change during an episode: each
    (item, device, bucket)'s price / bound and HBM bytes / the device's capacity, written into
    an item's option block when its turn comes (as one array every feature of every option of
    every item would be, 30 MB at 856 x 128, zeroed and filled for one decode).

    Args:
        price: [T, D, buckets]: each option's price over the bound, clipped at :data:`CLIP`.
        hbm: [T, buckets]: each bucket's HBM bytes.
        hbm_cap: [D]: each device's HBM capacity (at least 1 byte).
    """

    price: np.ndarray
    hbm: np.ndarray
    hbm_cap: np.ndarray

    @classmethod
    def concat(cls, parts: list[StaticOptions]) -> StaticOptions:
        """The items of ``parts`` in turn (on the same devices)."""
        return cls(np.concatenate([p.price for p in parts]),
                   np.concatenate([p.hbm for p in parts]), parts[0].hbm_cap)

    def take(self, items: np.ndarray) -> StaticOptions:
        """Those of ``items`` only, in their order."""
        return replace(self, price=self.price[items], hbm=self.hbm[items])

    def write(self, out: np.ndarray, item: int, layout: ObsLayout) -> None:
        """Writes ``item``'s into ``out`` ([D, buckets, OPTION]); its other features zero."""
        o = layout.option
        out[...] = 0.0
        out[..., o["price"]] = self.price[item]
        out[..., o["hbm_bytes"]] = np.clip(self.hbm[item][None, :] / self.hbm_cap[:, None], 0,
                                           CLIP)
