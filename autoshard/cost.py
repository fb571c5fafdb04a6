"""The one cost-model interface every pricing in autoshard goes through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from autoshard.task import ShardingTask


@dataclass(frozen=True)
class Pricing:
    """Cost of placing tables on devices, one entry per queried (table, device, split) row, ms.

    Args:
        hbm_ms: Embedding work served from HBM (including fixed kernel overhead).
        uvm_ms: Embedding work served from host memory over the host link.
        comm_ms: The table's share of the device's all-to-all communication.
    """

    hbm_ms: np.ndarray
    uvm_ms: np.ndarray
    comm_ms: np.ndarray

    @property
    def compute_ms(self) -> np.ndarray:
        return self.hbm_ms + self.uvm_ms

    @property
    def total_ms(self) -> np.ndarray:
        return self.hbm_ms + self.uvm_ms + self.comm_ms


@runtime_checkable
class CostModel(Protocol):
    """Prices (table, device, HBM rows) rows of a task, vectorised.

    A device's step cost is the sum of its tables' prices; a plan's step cost is the maximum over
    devices. Implementations: :class:`autoshard.analytical.AnalyticalCostModel` and the learned
    LightGBM model in ``cost_models``.
    """

    name: str

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        """Prices each row: table ``table_idx[i]`` on device ``device_idx[i]`` with its
        ``hbm_rows[i]`` hottest rows in HBM and the rest in host memory."""
        ...


def load_cost_model(spec: str | None) -> CostModel:
    """``analytical`` (or None) for the analytical model, else a directory of a learned model."""
    from autoshard.analytical import AnalyticalCostModel

    if spec in (None, "", "analytical"):
        return AnalyticalCostModel()
    from pathlib import Path

    from autoshard.errors import InputError

    if not Path(spec).is_dir():
        raise InputError("cost model must be 'analytical' or a model directory",
                         field="cost_model", value=spec)
    try:
        from cost_models.model import LightGBMCostModel
    except ImportError as exc:
        raise InputError(f"learned cost model unavailable ({exc})", field="cost_model",
                         value=spec) from exc
    return LightGBMCostModel.load(spec)
