"""Everything that knows TorchRec, in one place.

- :mod:`~autoshard.torchrec.mapping`: our sharding kinds, HBM rows and element sizes in
  TorchRec's terms (sharding types, compute kernels, data types, row blocks);
- :mod:`~autoshard.torchrec.shardings`: a plan as TorchRec table shardings, and back;
- :mod:`~autoshard.torchrec.export`: the sharding-plan description file, and TorchRec's
  ``ShardingPlan`` objects built from it and checked against its sharder;
  :mod:`~autoshard.torchrec.exporter`: a plan exported (fitted, described, checked, written),
  the ``torchrec`` target of :func:`autoshard.exporting.export`;
- :mod:`~autoshard.torchrec.runtime_memory`: the HBM TorchRec's runtime keeps per table or shard
  (a task's reservation); :mod:`~autoshard.torchrec.storage`: TorchRec's own storage count,
  mirrored exactly, and plans fitted to it;
- :mod:`~autoshard.torchrec.estimate`: TorchRec's perf and storage estimators on a plan;
  :mod:`~autoshard.torchrec.cost`: its perf estimator as a cost model;
  :mod:`~autoshard.torchrec.opinion`: its figures beside ours for a comparison's plans;
- :mod:`~autoshard.torchrec.sharder`: TorchRec's planner as a sharder;
- :mod:`~autoshard.torchrec.autoshard_planner`: the other way round, autoshard behind TorchRec's
  planner interface (``AutoshardPlanner``), with :mod:`~autoshard.torchrec.model_tables` (a model's
  tables), :mod:`~autoshard.torchrec.topology` (a Topology as our hardware),
  :mod:`~autoshard.torchrec.parameter_constraints` (its ParameterConstraints as ours),
  :mod:`~autoshard.torchrec.storage_reservation` (its StorageReservation: what each rank keeps
  for the rest of the model), :mod:`~autoshard.torchrec.model_rating` (a plan rated on the live
  model by TorchRec's enumerator and estimators), :mod:`~autoshard.torchrec.planner_stats` (the
  statistics table TorchRec's planner prints) and :mod:`~autoshard.torchrec.planner_errors`
  (its PlannerError and error types).

The core reaches this package only through its registries (sharders, cost models,
reservations, export targets), by name; nothing here is imported by the core. Importing
TorchRec itself (the ``torchrec`` extra) happens inside the functions that need it.
"""

from __future__ import annotations

from autoshard.extras import pip_command

TORCHREC_EXTRA = (f"{pip_command('torchrec')} (torchrec 1.8.0 with fbgemm-gpu-cpu 1.8.0 and "
                  "torch 2.13 on CPU machines; fbgemm-gpu on GPU machines)")


def torchrec_unavailable(load: bool = False) -> str | None:
    """Why TorchRec cannot be used here (None when it can).

    By default only checks that the packages are installed (fast: importing TorchRec takes
    seconds); with ``load`` imports them, which also catches native libraries that fail to load.
    """
    import importlib.util

    try:
        for name in ("fbgemm_gpu", "torchrec"):
            if importlib.util.find_spec(name) is None:
                raise ImportError(f"No module named '{name}'")
        if load:
            import fbgemm_gpu  # noqa: F401
            import torchrec.distributed.planner  # noqa: F401
    except Exception as exc:  # ImportError, or a native library that fails to load
        return f"install the torchrec extra: {TORCHREC_EXTRA} ({type(exc).__name__}: {exc})"
    return None
