"""A table-to-server mapping for serving, and its memory use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError, PlannerError, gib
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured, write_structured
from autoshard.serving.model import ServingModel
from autoshard.serving.profile import ServingProfile

MAIN = -1  # server index of the main server


@dataclass(frozen=True)
class Mapping:
    """Where each table is served from.

    Args:
        servers: Number of sparse servers (0: everything on the main server).
        assign: Server index per table, ``MAIN`` (-1) for the main server.
        strategy: The strategy that made it.
        note: What the strategy reports about it (search gap, bound), if anything.
    """

    servers: int
    assign: tuple[int, ...]
    strategy: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if self.servers < 0 or any(not MAIN <= s < self.servers for s in self.assign):
            raise InputError("server index out of range", field="assign",
                             value=(self.servers, min(self.assign), max(self.assign)))

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.assign, dtype=np.int64)

    def memory_bytes(self, model: ServingModel) -> np.ndarray:
        """Bytes on each server: index 0 the main server, then the sparse servers."""
        return np.bincount(self.array + 1, weights=model.table_bytes(),
                           minlength=self.servers + 1)

    def check_fits(self, model: ServingModel, profile: ServingProfile) -> None:
        """Raises PlannerError naming the first server whose tables exceed its memory."""
        used = self.memory_bytes(model)
        caps = np.r_[profile.main_bytes, np.full(self.servers, profile.server_bytes)]
        over = np.flatnonzero(used > caps * (1 + 1e-9))
        if over.size:
            s = int(over[0])
            name = "main server" if s == 0 else f"server {s - 1}"
            raise PlannerError("capacity", f"{name} holds {gib(used[s])} of tables, its memory "
                               f"is {gib(caps[s])}")

    def to_dict(self, model: ServingModel) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "serving_plan", "model": model.name,
                "strategy": self.strategy, "servers": self.servers, "note": self.note,
                "assign": {t.name: s for t, s in zip(model.tables, self.assign, strict=True)}}

    @classmethod
    def from_dict(cls, doc: Any, model: ServingModel, source: str = "<plan>") -> Mapping:
        doc = check_schema(doc, "serving_plan", source)
        assign = doc.get("assign")
        if not isinstance(assign, dict):
            raise InputError("expected a mapping of table name to server", source=source,
                             field="assign", value=assign)
        missing = [t.name for t in model.tables if t.name not in assign]
        if missing:
            raise InputError("table not placed", source=source, field="assign", value=missing[0])
        servers = doc.get("servers")
        if isinstance(servers, bool) or not isinstance(servers, int):
            raise InputError("must be an integer", source=source, field="servers", value=servers)
        try:
            return cls(servers, tuple(int(assign[t.name]) for t in model.tables),
                       str(doc.get("strategy", "")), str(doc.get("note", "")))
        except (InputError, TypeError, ValueError) as exc:
            raise InputError(f"bad assignment ({exc})", source=source, field="assign") from exc


def save_mapping(path: str | Path, mapping: Mapping, model: ServingModel) -> None:
    write_structured(path, mapping.to_dict(model))


def load_mapping(path: str | Path, model: ServingModel) -> Mapping:
    return Mapping.from_dict(read_structured(path), model, str(path))
