"""What each part of a served model costs a server, per request that touches it.

One owner of the serving cost formulas: the simulator, the strategies, the optimiser and the
capacity planner all price parts here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.serving.cluster import ServingProfile
from autoshard.serving.model import INDEX_BYTES, ServingModel
from autoshard.serving.parts import PartSet, row_bytes

FP32_BYTES = 4  # pooled results leave a server in fp32


@dataclass(frozen=True)
class PartCosts:
    """Per-part serving costs of a model on a profile (all arrays of length ``parts``).

    Args:
        bytes: Memory per part, bytes.
        work_us: CPU time of a touched part's lookups (with its fixed overhead), microseconds,
            for a request of the mean item count.
        transfer_us: Remote-call cost of a touched part: its indices and pooled results over
            the network plus the per-table call overhead, microseconds (not paid on the main
            server).
        wire_bytes: Bytes a touched part puts on the network (indices in, results out).
        per_item: Whether the part's costs scale with the request's item count.
        group_p: Touch probability per group. table_p: Conditional touch probability of each
            part's table given its group. part_p: Conditional touch probability of a part given
            its table. group: Group index per part. table: Table index per part.
    """

    bytes: np.ndarray
    work_us: np.ndarray
    transfer_us: np.ndarray
    wire_bytes: np.ndarray
    per_item: np.ndarray
    group_p: np.ndarray
    table_p: np.ndarray
    part_p: np.ndarray
    group: np.ndarray
    table: np.ndarray

    @property
    def touch_p(self) -> np.ndarray:
        """Marginal probability a request touches each part."""
        return self.group_p[self.group] * self.table_p * self.part_p

    @property
    def expected_us(self) -> np.ndarray:
        """Expected work plus transfer per request (touch probability times cost)."""
        return (self.work_us + self.transfer_us) * self.touch_p


def part_costs(model: ServingModel, profile: ServingProfile, parts: PartSet,
               precision: str = "fp32") -> PartCosts:
    """Prices every part's lookups and transfers on ``profile`` at ``precision``."""
    t = parts.array
    q, lookups = parts.touch(model)
    served = row_bytes(model, precision)[t]
    dequant = 0.0 if precision in ("fp32", "fp16") else profile.dequant_ns
    work = (lookups * (profile.lookup_ns + dequant + served / profile.memory_bandwidth_gbps)
            / 1e3 + profile.table_overhead_us)
    per_item = np.asarray(model.per_item)[t]
    out_rows = np.where(per_item, model.items, 1)
    dims = np.array([tab.dim for tab in model.tables], float)[t]
    wire = lookups * INDEX_BYTES + out_rows * dims * FP32_BYTES
    rows = np.array([tab.rows for tab in model.tables], float)[t]
    size = rows * (np.array(parts.hi) - np.array(parts.lo)) * served
    return PartCosts(bytes=size, work_us=work,
                     transfer_us=wire / (profile.network_gbps * 1e3)
                     + profile.call_table_overhead_us,
                     wire_bytes=wire, per_item=per_item, group_p=model.group_touch(),
                     table_p=model.conditional_touch()[t], part_p=q,
                     group=np.asarray(model.group)[t], table=t)
