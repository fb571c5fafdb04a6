"""The context a plan was made in, recorded in the plan file so that every reader uses it.

A plan places tables on a cluster for a workload, keeping HBM aside for a runtime, priced by a
cost model; read on another cluster or with other tables it means something else. A plan file
therefore carries (under ``context``):

- the table set: where it came from (a file path as given, ``default`` for the built-in
  workload, or ``suite:<suite>/<task>``) and the SHA-256 of the tables themselves, so a
  changed file is noticed; tables that cannot be read again from where they came from (a
  TorchRec model's, ``torchrec-model:MODULE:FACTORY``) are recorded in the file themselves
  (``inline_tables``);
- the hardware profile as resolved (every device, every override of ``--devices``,
  ``--nodes``, ``--hbm-gb``), and how it was asked for;
- the workload (batch size, mode), the HBM reservation's name, and the cost model's identity
  (:func:`autoshard.pricing.cost.model_identity`).

:meth:`PlanContext.task` rebuilds the task from it; ``evaluate``, ``export`` and ``run-plan``
use it unless told otherwise (``autoshard.cli.plan_task``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.hardware import HardwareProfile
from autoshard.reservation import get_reservation
from autoshard.tables import Table, check_unique_names, load_tables
from autoshard.task import ShardingTask, Workload

#: The ``tables`` source of the built-in workload (856 generated tables).
DEFAULT_TABLES = "default"
#: Prefix of a suite task's table source, ``suite:<suite>/<task>``.
SUITE_PREFIX = "suite:"


def read_table_set(spec: str, source: str = "command line") -> tuple[Table, ...]:
    """The tables ``spec`` names: a table file, ``default`` (the built-in workload, unless a
    file of that name exists) or ``suite:<suite>/<task>`` (the tables of a suite's task).

    Raises:
        InputError: An unknown suite or task, or a file that cannot be read (named).
    """
    if spec == DEFAULT_TABLES and not Path(spec).exists():
        from autoshard.synth import default_tables

        return default_tables()
    if spec.startswith(SUITE_PREFIX):
        from autoshard.compare.suites import get_suite

        suite, _, name = spec[len(SUITE_PREFIX):].partition("/")
        found = [s for s in get_suite(suite) if s.name == name]
        if not found:
            raise InputError(f"suite '{suite}' has no task of that name", source=source,
                             field="tables", value=spec)
        return found[0].build().tables
    return load_tables(spec)


def tables_digest(tables: tuple[Table, ...]) -> str:
    """SHA-256 of a table set's canonical JSON (names, sizes, statistics, in order)."""
    text = json.dumps([t.to_dict() for t in tables], sort_keys=True, allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class PlanContext:
    """What a plan was made for (see the module docstring).

    Args:
        tables: Where the tables came from (a path as given, ``default`` or
            ``suite:<suite>/<task>``).
        tables_digest: :func:`tables_digest` of them.
        hardware: The resolved hardware profile.
        hardware_spec: How it was asked for: ``profile`` (a bundled name or a file) and the
            ``devices``, ``nodes`` and ``hbm_gb`` overrides (None where not given).
        workload: Batch size and mode.
        reservation: The name of the HBM reservation (:mod:`autoshard.reservation`).
        cost_model: The identity of the cost model it was priced with.
        inline_tables: The tables themselves, where they cannot be read again from
            ``tables`` (a model's); None: read from ``tables``.
        module_paths: Each table's collection's module path in the model it was read from
            (a TorchRec model's: the key of TorchRec's plan, which ``export`` writes); None:
            not read from a model.
    """

    tables: str
    tables_digest: str
    hardware: HardwareProfile
    hardware_spec: dict[str, Any] = field(hash=False)
    workload: Workload
    reservation: str
    cost_model: str
    inline_tables: tuple[Table, ...] | None = field(default=None, compare=False, repr=False)
    module_paths: dict[str, str] | None = field(default=None, compare=False, hash=False)

    @classmethod
    def of(cls, task: ShardingTask, tables: str, hardware_spec: dict[str, Any],
           cost_model: str, inline: bool = False,
           module_paths: dict[str, str] | None = None) -> PlanContext:
        """The context of a plan of ``task``, whose tables came from ``tables`` (recorded
        themselves when ``inline``; with their collections' ``module_paths`` when read from a
        model)."""
        return cls(tables, tables_digest(task.tables), task.hardware, dict(hardware_spec),
                   task.workload, task.reservation.name, cost_model,
                   task.tables if inline else None,
                   None if module_paths is None else dict(module_paths))

    def read_tables(self, source: str = "plan") -> tuple[Table, ...]:
        """The plan's tables, read again from where they came from and checked.

        Raises:
            InputError: The tables cannot be read, or differ from those planned (the digest
                differs: the file changed), naming ``source``.
        """
        tables = (self.inline_tables if self.inline_tables is not None
                  else read_table_set(self.tables, source))
        found = tables_digest(tables)
        if found != self.tables_digest:
            raise InputError(f"the tables in '{self.tables}' are not the ones the plan was made "
                             f"for (their digest is now {found[:19]}..., recorded "
                             f"{self.tables_digest[:19]}...); give the plan's tables with "
                             "--tables", source=source, field="context.tables_digest",
                             value=self.tables)
        return tables

    def task(self, source: str = "plan") -> ShardingTask:
        """The task the plan was made for (:meth:`read_tables`, then the recorded rest)."""
        return ShardingTask(self.read_tables(source), self.hardware, self.workload,
                            get_reservation(self.reservation, "context.reservation", source))

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "tables": self.tables, "tables_digest": self.tables_digest,
            "hardware": self.hardware.to_dict(), "hardware_spec": self.hardware_spec,
            "workload": {"batch_size": self.workload.batch_size, "mode": self.workload.mode},
            "reservation": self.reservation, "cost_model": self.cost_model}
        if self.inline_tables is not None:
            doc["inline_tables"] = [t.to_dict() for t in self.inline_tables]
        if self.module_paths is not None:
            doc["module_paths"] = dict(self.module_paths)
        return doc

    @classmethod
    def from_dict(cls, doc: Any, source: str) -> PlanContext:
        """Reads what :meth:`to_dict` wrote.

        Raises:
            InputError: A field missing or malformed, named under ``context``.
        """
        if not isinstance(doc, dict):
            raise InputError("expected a mapping", source=source, field="context", value=doc)
        for key in ("tables", "tables_digest", "reservation", "cost_model"):
            if not isinstance(doc.get(key), str):
                raise InputError("expected a string", source=source, field=f"context.{key}",
                                 value=doc.get(key))
        for key in ("hardware", "hardware_spec"):
            if not isinstance(doc.get(key), dict):
                raise InputError("expected a mapping", source=source, field=f"context.{key}",
                                 value=doc.get(key))
        try:
            hardware = HardwareProfile.from_dict(doc["hardware"], source)
        except InputError as exc:
            raise exc.located(source, "context.hardware") from exc
        workload = Workload.from_dict(doc.get("workload"), source, "context.workload")
        get_reservation(doc["reservation"], "context.reservation", source)
        return cls(doc["tables"], doc["tables_digest"], hardware, dict(doc["hardware_spec"]),
                   workload, doc["reservation"], doc["cost_model"],
                   _inline_tables(doc.get("inline_tables"), source),
                   _module_paths(doc.get("module_paths"), source))


def _inline_tables(docs: Any, source: str) -> tuple[Table, ...] | None:
    """The tables a context records itself (None when it records none).

    Raises:
        InputError: Not a non-empty list of tables with unique names, named under
            ``context.inline_tables``.
    """
    if docs is None:
        return None
    if not isinstance(docs, list) or not docs:
        raise InputError("expected a non-empty list of tables", source=source,
                         field="context.inline_tables", value=docs)
    try:
        tables = tuple(Table.from_dict(d, source, i) for i, d in enumerate(docs))
        check_unique_names(tables, source)
    except InputError as exc:
        raise exc.located(source, "context.inline_tables") from exc
    return tables


def _module_paths(doc: Any, source: str) -> dict[str, str] | None:
    """The tables' module paths a context records (None when it records none).

    Raises:
        InputError: Not a mapping of table names to module paths (strings), named under
            ``context.module_paths``.
    """
    if doc is None:
        return None
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in doc.items()):
        raise InputError("expected a mapping of table names to module paths", source=source,
                         field="context.module_paths", value=doc)
    return dict(doc)
