"""TorchRec's per-table ``ParameterConstraints`` in our terms (for the TorchRec planner).

Each table's constraint becomes a :class:`autoshard.layout.constraints.TableConstraint`:

- ``sharding_types``: those the table's sharder offers on the compute device
  (``sharder.sharding_types(compute_device)``; all of them when the constraint names none),
  among those the constraint names, each with a kernel left (below); each becomes its kind in
  our plans (:func:`autoshard.torchrec.mapping.kind_of`). A type with no kind of ours is dropped
  with a logged note; none left is a :class:`autoshard.errors.PlannerError` naming the table.
- ``compute_kernels``: per type, the kernels the sharder offers for it on the device among
  those the constraint names and our plans hold (:data:`autoshard.torchrec.mapping.KERNELS`).
  The kernels left bound the share of rows in HBM: ``fused`` all, ``fused_uvm`` none,
  ``fused_uvm_caching`` the cache's load factor (``cache_params.load_factor``; none given: any
  share strictly between); several kernels, the range from the least to the most. On a CPU
  the sharders offer ``fused`` alone (no UVM caching), so every row stays in fast memory.
- ``min_partition``: the narrowest column block.
- ``pooling_factors``: the table's lookups per sample (summed over its features, as
  TorchRec's estimators sum them), unless statistics give them
  (:mod:`autoshard.torchrec.model_tables`); a value of 1.0 counts as given like any other.
- ``cache_params``, ``enforce_hbm``, ``stochastic_rounding``, ``bounds_check_mode``,
  ``output_dtype``, ``key_value_params``: passed into the table's ``ParameterSharding`` as
  TorchRec's planner passes them.
- ``device_group`` other than the compute device and ``use_virtual_table``: refused (autoshard
  plans one device group, without virtual tables). ``feature_names`` are matched against the
  statistics. ``num_poolings``, ``batch_sizes`` and ``is_weighted`` do not change our pricing,
  which a logged note says.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from autoshard.errors import PlannerError
from autoshard.layout.constraints import TableConstraint
from autoshard.layout.kinds import ShardingKind
from autoshard.torchrec.mapping import (
    FUSED,
    FUSED_UVM,
    FUSED_UVM_CACHING,
    KERNELS,
    SHARDING_TYPES,
    kind_of,
    torchrec_name,
)
from autoshard.torchrec.model_tables import ModelTable

_log = logging.getLogger("autoshard.torchrec.autoshard_planner")
#: ParameterSharding fields a constraint passes through unchanged, as TorchRec's planner does.
PASSED_THROUGH = ("enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype",
                  "key_value_params")


@dataclass(frozen=True)
class Allowed:
    """What one table may be, in our terms and TorchRec's.

    Args:
        constraint: Our constraint (kinds, share of rows in HBM, narrowest column block).
        type_of: The TorchRec sharding type each allowed kind is written as.
        kernels: The compute kernels allowed for each TorchRec sharding type.
        passed: ParameterSharding fields passed through (:data:`PASSED_THROUGH`, and the
            constraint's ``cache_params``).
    """

    constraint: TableConstraint
    type_of: Mapping[ShardingKind, str]
    kernels: Mapping[str, frozenset[str]]
    passed: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, table: str, ps: Any) -> Any:
        """TorchRec's ``ParameterSharding`` ``ps`` of ``table`` as its constraint has it: the
        sharding type its kind is allowed as, and the fields passed through (a constraint's
        cache parameters with the plan's load factor and, unless they set it, pipeline).

        Raises:
            PlannerError: The plan's kernel is not among those allowed for its type (a share
                of rows in HBM between two kernels allowed, neither of them caching).
        """
        sharding_type = self.type_of[kind_of(ps.sharding_type)]
        if ps.compute_kernel not in self.kernels[sharding_type]:
            raise PlannerError("constraint", f"table '{table}': planned {sharding_type} with "
                               f"the {ps.compute_kernel} kernel, which its constraints do not "
                               f"allow (kernels: {', '.join(sorted(self.kernels[sharding_type]))}"
                               f"); allow {FUSED_UVM_CACHING} too, or a single kernel")
        passed = dict(self.passed)
        cache = passed.pop("cache_params", None)
        if cache is not None and ps.cache_params is not None:
            prefetch = (ps.cache_params.prefetch_pipeline if cache.prefetch_pipeline is None
                        else cache.prefetch_pipeline)
            cache = replace(cache, load_factor=ps.cache_params.load_factor,
                            prefetch_pipeline=prefetch)
        return replace(ps, sharding_type=sharding_type, cache_params=cache or ps.cache_params,
                       **passed)


def pooling_factors(constraints: Mapping[str, Any] | None) -> dict[str, float]:
    """Lookups per sample by table, from each table's constraint (its ``pooling_factors``
    summed over the features). A constraint always carries them: TorchRec's default, [1.0],
    where it was not set, which TorchRec's planner uses for that table too; so a table with a
    constraint counts as given, whatever its value, 1.0 included."""
    return {name: float(sum(c.pooling_factors)) for name, c in (constraints or {}).items()
            if c.pooling_factors}


def allowed(table: ModelTable, c: Any | None, sharder: Any, device: str) -> Allowed:
    """What ``table`` may be under its TorchRec constraint ``c`` (None: unconstrained), given
    its collection's ``sharder`` on compute ``device`` (the module docstring).

    Raises:
        PlannerError: The constraint leaves no sharding type and kernel we can plan, or asks
            for what autoshard refuses (another device group, virtual tables).
    """
    _refuse(table, c, device)
    offered = list(sharder.sharding_types(device))
    wanted = list(c.sharding_types) if c is not None and c.sharding_types else offered
    given = None if c is None or not c.compute_kernels else set(c.compute_kernels)
    kernels: dict[str, frozenset[str]] = {}
    for t in (t for t in offered if t in wanted):
        ours = frozenset(k for k in sharder.compute_kernels(t, device)
                         if k in KERNELS and (given is None or k in given))
        if t in SHARDING_TYPES and ours:
            kernels[t] = ours
    _note_dropped(table, c, offered, wanted, kernels, given)
    if not kernels:
        raise PlannerError("constraint", f"table '{table.name}': no sharding type and kernel "
                           f"autoshard can plan is left ({type(sharder).__name__} offers "
                           f"{', '.join(offered)} on {device}; its constraints allow types "
                           f"{', '.join(wanted)} and kernels "
                           f"{', '.join(sorted(given)) if given else 'any'}; autoshard plans "
                           f"{', '.join(SHARDING_TYPES)} with {', '.join(KERNELS)})")
    type_of: dict[ShardingKind, str] = {}
    for t in kernels:
        kind = kind_of(t)
        if kind not in type_of or t == torchrec_name(kind):
            type_of[kind] = t
    cache = None if c is None else c.cache_params
    load_factor = None if cache is None else cache.load_factor
    split = [k for t, ks in kernels.items() if not kind_of(t).replicated for k in ks]
    share = share_range(split, load_factor, table.rows) if split else (1.0, 1.0)
    constraint = TableConstraint(frozenset(type_of), share,
                                 int(c.min_partition) if c is not None and c.min_partition
                                 else 1)
    passed = {} if c is None else {k: getattr(c, k) for k in PASSED_THROUGH
                                    if getattr(c, k, None) is not None}
    if cache is not None:
        passed["cache_params"] = cache
    return Allowed(constraint, type_of, kernels, passed)


def share_range(kernels: list[str], load_factor: float | None, rows: int
                ) -> tuple[float, float]:
    """The least and most share of a table's rows in HBM under any of ``kernels``: all for
    ``fused``, none for ``fused_uvm``, the load factor for ``fused_uvm_caching`` (none given:
    from one row to all but one)."""
    one = min(1.0 / max(rows, 1), 0.5)
    ranges = {FUSED: (1.0, 1.0), FUSED_UVM: (0.0, 0.0),
              FUSED_UVM_CACHING: ((float(load_factor),) * 2 if load_factor is not None
                                  else (one, 1.0 - one))}
    picked = [ranges[k] for k in kernels if k in ranges]
    if not picked:
        return (1.0, 1.0)
    return min(lo for lo, _ in picked), max(hi for _, hi in picked)


def _refuse(table: ModelTable, c: Any | None, device: str) -> None:
    """Fails on what autoshard cannot honour; notes what does not change its pricing."""
    if c is None:
        return
    if c.device_group is not None and c.device_group != device:
        raise PlannerError("constraint", f"table '{table.name}': device_group "
                           f"'{c.device_group}' differs from the topology's compute device "
                           f"'{device}'; autoshard plans one device group (plan each group "
                           "with its own topology)")
    if getattr(c, "use_virtual_table", False):
        raise PlannerError("constraint", f"table '{table.name}': use_virtual_table is set; "
                           "autoshard plans tables of fixed rows, not virtual tables")
    unpriced = [name for name, on in (
        ("num_poolings", c.num_poolings and any(n != 1 for n in c.num_poolings)),
        ("batch_sizes", bool(c.batch_sizes)), ("is_weighted", c.is_weighted)) if on]
    if unpriced:
        _log.info("table '%s': %s kept in its constraints but not priced by autoshard",
                  table.name, ", ".join(unpriced))


def _note_dropped(table: ModelTable, c: Any | None, offered: list[str], wanted: list[str],
                  kernels: dict[str, frozenset[str]], given: set[str] | None) -> None:
    """Logs the types a table's constraint asks for that are not planned, and why."""
    asked = c is not None and bool(c.sharding_types)
    not_offered = [t for t in wanted if t not in offered]
    unknown = [t for t in offered if t in wanted and t not in SHARDING_TYPES]
    no_kernel = [t for t in offered if t in wanted and t in SHARDING_TYPES and t not in kernels]
    if asked and not_offered:
        _log.warning("table '%s': sharding types %s are not offered here, dropped",
                     table.name, ", ".join(not_offered))
    if unknown:
        log = _log.warning if asked else _log.debug
        log("table '%s': sharding types %s have no kind in autoshard's plans, not planned",
            table.name, ", ".join(unknown))
    if no_kernel and given is not None:
        _log.info("table '%s': sharding types %s offer none of the kernels %s, not planned",
                  table.name, ", ".join(no_kernel), ", ".join(sorted(given)))
