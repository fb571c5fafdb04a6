"""A deployment of a served model: parts of tables on sparse servers, and replicas.

Each part (:class:`autoshard.serving.parts.PartSet`; a whole table unless split) lives on one
sparse server (a *shard*) or on the main server. A shard runs on ``replicas[s]`` identical
servers, and the main tier (dense part, main-server tables, hot-row cache) on
``main_replicas``; calls and requests are dealt to replicas at random.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError, PlannerError, gib
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured, write_structured
from autoshard.serving.cluster import ServingProfile
from autoshard.serving.model import ServingModel
from autoshard.serving.parts import PartSet

MAIN = -1  # server index of the main server


@dataclass(frozen=True)
class Mapping:
    """Where each part is served from, and on how many servers.

    Args:
        servers: Number of sparse shards (0: everything on the main server).
        assign: Shard index per part, ``MAIN`` (-1) for the main server.
        strategy: The strategy that made it.
        note: What the strategy reports about it (search gain, seed), if anything.
        parts: The parts (None: one per table, in table order).
        replicas: Servers per shard (None: one each).
        main_replicas: Servers of the main tier.
    """

    servers: int
    assign: tuple[int, ...]
    strategy: str = ""
    note: str = ""
    parts: PartSet | None = None
    replicas: tuple[int, ...] | None = None
    main_replicas: int = 1

    def __post_init__(self) -> None:
        if self.servers < 0 or any(not MAIN <= s < self.servers for s in self.assign):
            raise InputError("server index out of range", field="assign",
                             value=(self.servers, min(self.assign), max(self.assign)))
        if self.parts is not None and self.parts.size != len(self.assign):
            raise InputError("one server per part", field="assign",
                             value=(len(self.assign), self.parts.size))
        if self.replicas is not None and (len(self.replicas) != self.servers
                                          or any(r < 1 for r in self.replicas)):
            raise InputError("one replica count >= 1 per shard", field="replicas",
                             value=self.replicas)
        if self.main_replicas < 1:
            raise InputError("must be >= 1", field="main_replicas", value=self.main_replicas)

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.assign, dtype=np.int64)

    def part_set(self, tables: int) -> PartSet:
        return self.parts if self.parts is not None else PartSet.whole(tables)

    @property
    def replica_counts(self) -> np.ndarray:
        """Servers of each shard."""
        return np.asarray(self.replicas or (1,) * self.servers, dtype=np.int64)

    @property
    def total_servers(self) -> int:
        """Servers the deployment takes: main tier and every shard replica."""
        return int(self.main_replicas + self.replica_counts.sum())

    def cost(self, profile: ServingProfile) -> float:
        return float(self.main_replicas * profile.main_cost
                     + self.replica_counts.sum() * profile.server_cost)

    def with_replicas(self, replicas: tuple[int, ...], main_replicas: int) -> Mapping:
        return Mapping(self.servers, self.assign, self.strategy, self.note, self.parts,
                       replicas, main_replicas)

    def memory_bytes(self, part_bytes: np.ndarray) -> np.ndarray:
        """Bytes on each server: index 0 the main server, then the shards (one replica)."""
        return np.bincount(self.array + 1, weights=part_bytes, minlength=self.servers + 1)

    def check_fits(self, part_bytes: np.ndarray, profile: ServingProfile) -> None:
        """Raises PlannerError naming the first server whose parts exceed its memory less
        the profile's headroom."""
        used = self.memory_bytes(part_bytes)
        caps = np.r_[profile.usable_main_bytes, np.full(self.servers,
                                                        profile.usable_server_bytes)]
        over = np.flatnonzero(used > caps * (1 + 1e-9))
        if over.size:
            s = int(over[0])
            name = "main server" if s == 0 else f"server {s - 1}"
            raise PlannerError("capacity", f"{name} holds {gib(used[s])} of tables, its memory "
                               f"less {profile.memory_headroom:.0%} headroom is {gib(caps[s])}")

    def to_dict(self, model: ServingModel, precision: str = "fp32") -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "kind": "serving_plan", "model": model.name,
            "strategy": self.strategy, "servers": self.servers, "note": self.note,
            "precision": precision, "main_replicas": self.main_replicas,
            "replicas": [int(r) for r in self.replica_counts]}
        if self.parts is None or self.parts.is_whole():
            doc["assign"] = {t.name: s for t, s in zip(model.tables, self.assign, strict=True)}
        else:
            doc["parts"] = [dict(p, server=s) for p, s in
                            zip(self.parts.to_dict(model), self.assign, strict=True)]
        return doc

    @classmethod
    def from_dict(cls, doc: Any, model: ServingModel, source: str = "<plan>",
                  precision: str | None = None) -> Mapping:
        """A plan file's deployment; ``precision``, when given, must be the file's."""
        doc = check_schema(doc, "serving_plan", source)
        if precision is not None and doc.get("precision", "fp32") != precision:
            raise InputError(f"the plan serves its rows in {doc.get('precision', 'fp32')}, not "
                             f"{precision} (give --precision {doc.get('precision', 'fp32')})",
                             source=source, field="precision", value=precision)
        servers = _integer(doc.get("servers"), "servers", source)
        parts, assign = _placement(doc, model, source)
        replicas = doc.get("replicas")
        try:
            return cls(servers, assign, str(doc.get("strategy", "")), str(doc.get("note", "")),
                       parts, None if replicas is None else tuple(
                           _integer(r, "replicas", source) for r in replicas),
                       _integer(doc.get("main_replicas", 1), "main_replicas", source))
        except (InputError, TypeError) as exc:
            raise InputError(f"bad plan ({exc})", source=source, field="assign") from exc


def _integer(value: Any, field_name: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError("must be an integer", source=source, field=field_name, value=value)
    return value


def _placement(doc: Any, model: ServingModel, source: str
               ) -> tuple[PartSet | None, tuple[int, ...]]:
    """(parts, server per part) of a plan file: ``assign`` by table name, or ``parts``."""
    if "parts" in doc:
        parts = PartSet.from_dict(doc["parts"], model, source)
        return parts, tuple(_integer(p.get("server"), "parts.server", source)
                            for p in doc["parts"])
    assign = doc.get("assign")
    if not isinstance(assign, dict):
        raise InputError("expected a mapping of table name to server", source=source,
                         field="assign", value=assign)
    missing = [t.name for t in model.tables if t.name not in assign]
    if missing:
        raise InputError("table not placed", source=source, field="assign", value=missing[0])
    return None, tuple(_integer(assign[t.name], "assign", source) for t in model.tables)


def save_mapping(path: str | Path, mapping: Mapping, model: ServingModel,
                 precision: str = "fp32") -> None:
    write_structured(path, mapping.to_dict(model, precision))


def load_mapping(path: str | Path, model: ServingModel, precision: str | None = None) -> Mapping:
    return Mapping.from_dict(read_structured(path), model, str(path), precision)
