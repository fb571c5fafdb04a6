"""A plan exported for TorchRec: fitted to TorchRec's HBM count, described, checked, written.

:func:`export_plan` is the ``torchrec`` target of :func:`autoshard.exporting.export`, and the one
sequence that ``autoshard export --to torchrec`` and the comparison's TorchRec opinion
(:mod:`autoshard.torchrec.opinion`) run:

1. the plan's tables as TorchRec shardings (:func:`autoshard.torchrec.shardings.table_shardings`);
2. with ``fit``, the HBM caches of ranks TorchRec's storage count overfills lowered until every
   rank fits (:func:`autoshard.torchrec.storage.fit_shardings`);
3. our plan of those shardings (what TorchRec gets) and its description
   (:func:`autoshard.torchrec.export.export_doc`);
4. with ``check``, the description loaded as a TorchRec ``ShardingPlan``, checked against
   TorchRec's sharder and sized by its storage estimator per rank (:func:`check_export`);
5. the description written, then our plan of it where asked.

A run in ``DistributedModelParallel`` (:func:`autoshard.torchrec.dmp.plan_runs`) needs less: it
runs the plan as planned, so it takes the description of the plan itself
(:func:`~autoshard.torchrec.export.export_doc`, step 3 without the fitting or the round trip
through TorchRec's shardings), writes no file, and is checked by TorchRec as it shards.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoshard.errors import PlannerError, gib
from autoshard.fileio import write_structured
from autoshard.layout.plan import Plan
from autoshard.task import ShardingTask
from autoshard.torchrec.estimate import TorchRecEstimate, estimate_shardings
from autoshard.torchrec.export import (
    check_sharding_plan,
    export_doc,
    load_sharding_plan,
    meta_collection,
    module_groups,
    read_export,
)
from autoshard.torchrec.shardings import TableSharding, table_shardings, to_plan
from autoshard.torchrec.storage import fit_shardings


@dataclass(frozen=True)
class TorchRecExport:
    """A plan as exported for TorchRec.

    Args:
        doc: The description written (kind ``torchrec_sharding_plan``; JSON/YAML-ready).
        plan: Our plan of what TorchRec gets (the fitted shardings), to price with
            ``evaluate``.
        planned: The plan's tables as TorchRec shardings, before fitting.
        shardings: The tables as exported (fitted).
        changed: The tables whose HBM caches were lowered to fit, in task order.
        estimate: TorchRec's storage and perf estimate of the description, per rank, where it
            was checked (None: not checked).
    """

    doc: dict[str, Any]
    plan: Plan
    planned: tuple[TableSharding, ...]
    shardings: tuple[TableSharding, ...]
    changed: tuple[str, ...]
    estimate: TorchRecEstimate | None = None

    @property
    def checked(self) -> str | None:
        """What TorchRec's check found, in words (None: not checked)."""
        if self.estimate is None:
            return None
        return ("TorchRec accepts it: every table planned with a sharding type and kernel its "
                "EmbeddingBagCollection sharder offers, shards tiling each table, and its "
                f"storage estimate fits every rank (fullest HBM "
                f"{100 * self.estimate.hbm_fill:.1f}%)")

    @property
    def summary(self) -> str:
        """The tables, ranks and (sharding type/kernel) counts of the description."""
        kinds = Counter(f"{t['sharding_type']}/{t['compute_kernel']}" for t in self.doc["tables"])
        counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        paths = sorted({t.get("module_path", self.doc["module_path"]) for t in self.doc["tables"]})
        under = ", ".join(repr(p) for p in paths)
        return (f"{len(self.doc['tables'])} tables on {self.doc['world_size']} ranks ({counts}); "
                f"module path{'s' if len(paths) > 1 else ''} {under}")


def export_plan(plan: Plan, task: ShardingTask, output: str | Path | None = None, *,
                fit: bool = True, check: bool = False,
                fitted_plan: str | Path | None = None,
                module_path: str | None = None) -> TorchRecExport:
    """Exports ``plan`` of ``task`` for TorchRec (the module docstring gives the steps).

    Args:
        plan: The plan.
        task: The task it places; its reservation names the training pipeline the caches are
            exported for (prefetched for TorchRec's prefetch pipeline).
        output: The description file to write (JSON or YAML); None: not written.
        fit: Lower the HBM caches of ranks that TorchRec's storage count overfills (I/O
            buffers, cache state) until every rank fits.
        check: Check the description with TorchRec (:func:`check_export`; needs the torchrec
            extra).
        fitted_plan: Also write our plan of the export (what TorchRec gets) here.
        module_path: The module path of the collection of every table (the key of TorchRec's
            plan: ``sparse_arch.embedding_bag_collection`` in TorchRec's DLRM); None: each
            table's as the plan's context records it (a plan made from a TorchRec model),
            else ``""``, the model itself.

    Raises:
        InputError: The plan does not fit the task, or a row layout TorchRec cannot route.
        PlannerError: A rank that overfills with no HBM rows left to drop, or a failed check;
            nothing is written then.
    """
    planned = table_shardings(plan, task)
    shardings, changed = fit_shardings(planned, task) if fit else (planned, [])
    exported = to_plan(shardings, task, plan.sharder)
    recorded = plan.context.module_paths if plan.context is not None else None
    paths = ({t.name: module_path for t in task.tables} if module_path is not None
             else recorded)
    doc = export_doc(exported, task, paths)
    estimate = check_export(doc, task) if check else None
    if output is not None:
        write_structured(output, doc)
    if fitted_plan is not None:
        exported.save(fitted_plan)
    return TorchRecExport(doc, exported, tuple(planned), tuple(shardings), tuple(changed),
                          estimate)


def check_export(doc: dict[str, Any], task: ShardingTask) -> TorchRecEstimate:
    """TorchRec loads the description, its sharder accepts every table's sharding, and its
    storage estimator fits every rank; returns that estimate.

    Raises:
        PlannerError: What fails (the rank and its bytes where the estimate overfills one).
    """
    sharding_plan = load_sharding_plan(doc)
    _, shardings = read_export(doc)
    for path, group in module_groups(doc, shardings).items():
        module = meta_collection([(s.table, s.rows, s.dim, s.data_type) for s in group])
        check_sharding_plan(sharding_plan, module, doc["world_size"], doc["local_world_size"],
                            path)
    estimate = estimate_shardings(shardings, task)
    for r in estimate.per_rank:
        if not r.fits:
            raise PlannerError("capacity", f"TorchRec's storage estimate of rank {r.rank}: "
                               f"HBM {gib(r.hbm_bytes)} of {gib(r.hbm_capacity)}, host "
                               f"{gib(r.ddr_bytes)} of {gib(r.ddr_capacity)}")
    return estimate
