"""The layout of the environment's flat observation vector.

One flat ``float32`` vector, so that any SB3 policy can read it and it is cheap to build:

``[table (TABLE) | summary (SUMMARY) | device 0 block | ... | device max_devices-1 block]``

Each device block is ``[valid, DEVICE features, OPTION features x buckets]``; blocks of devices
beyond the task's count are zero (valid = 0). Everything is normalised per task: costs by the
task's lower bound, bytes by the device's capacity, counts by the number of tables.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ObsLayout:
    """Sizes and offsets of the flat observation for ``max_devices`` and ``buckets``."""

    max_devices: int
    buckets: int

    @property
    def device_block(self) -> int:
        return 1 + len(DEVICE) + self.buckets * len(OPTION)

    @property
    def head(self) -> int:
        """Length of the table and summary part before the device blocks."""
        return len(TABLE) + len(SUMMARY)

    @property
    def size(self) -> int:
        return self.head + self.max_devices * self.device_block
