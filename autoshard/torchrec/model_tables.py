"""The embedding tables of a TorchRec model: found in its collections, given statistics.

A model's tables live in its ``EmbeddingBagCollection`` and ``EmbeddingCollection`` modules,
nested anywhere in it. They are found as TorchRec's own planner finds them (its enumerator's
walk): from the model down, a module that one of the given sharders shards is planned whole
and not looked into; any other module is looked into. Each table keeps the module path of its
collection (``""`` for the model itself), which is how a ``ShardingPlan`` is keyed.

A table's rows, dim, element size and feature names come from its collection's configs. Its
lookups per sample come, in this order, from:

1. statistics (an autoshard table file, as ``autoshard profile`` writes, or tables given in
   Python), matched by the table's name or else by its features' names (several features
   matched: their lookups per sample summed, the access statistics of the first);
2. the pooling factors of the table's TorchRec ``ParameterConstraints``, summed over its
   features as TorchRec's estimators sum them;
3. TorchRec's default pooling factor (``POOLING_FACTOR``, 1.0), with a warning that names the
   tables.

Our tables price one pooled output of ``dim`` elements per sample. That is what an
``EmbeddingBagCollection`` table with one feature writes. A table of several features writes one
per feature, and an ``EmbeddingCollection`` (sequence) table writes one per lookup, unpooled: for
those the all-to-all and output buffers are under-counted (by the feature count, or by the
pooling factor); :func:`output_notes` names such tables.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autoshard.errors import InputError, PlannerError
from autoshard.tables import Table, check_unique_names, load_tables

_log = logging.getLogger(__name__)
#: Element sizes (bytes) our tables take, by TorchRec data type name.
_ELEMENT_BYTES = {"FP32": 4, "FP16": 2, "BF16": 2, "INT8": 1, "UINT8": 1}
#: Statistics a table takes from a matched statistics table (sizes stay the model's).
_STATS_FIELDS = ("pooling_factor", "pooling_std", "coverage", "access_cdf", "zipf_alpha",
                 "reuse_hist")
Statistics = str | Path | Mapping[str, Table] | Sequence[Table]


@dataclass(frozen=True)
class ModelTable:
    """One embedding table of a model, as TorchRec's planner sees it.

    Args:
        path: Module path of its collection (``""``: the model itself), the plan's key.
        name: The table's name, its parameter's key in the collection's plan.
        rows: Rows (``num_embeddings``).
        dim: Elements per row (``embedding_dim``).
        data_type: TorchRec's data type name of its elements (``FP32``, ``FP16``, ...).
        features: The features that look it up.
        pooled: Whether its collection pools (``EmbeddingBagCollection``) or not
            (``EmbeddingCollection``: one output per lookup).
    """

    path: str
    name: str
    rows: int
    dim: int
    data_type: str
    features: tuple[str, ...]
    pooled: bool = True

    @property
    def bytes_per_element(self) -> int:
        """Bytes of one element.

        Raises:
            InputError: A data type our tables cannot hold (below one byte per element).
        """
        if self.data_type not in _ELEMENT_BYTES:
            raise InputError(f"autoshard plans tables of {', '.join(_ELEMENT_BYTES)} elements",
                             source="model", field=self.qualified, value=self.data_type)
        return _ELEMENT_BYTES[self.data_type]

    @property
    def qualified(self) -> str:
        """``path.name`` (the name alone for the model's own collection)."""
        return f"{self.path}.{self.name}" if self.path else self.name


@dataclass(frozen=True, eq=False)
class Collection:
    """An embedding collection of a model, its module path and the TorchRec sharder for it."""

    path: str
    module: Any = field(repr=False)
    sharder: Any = field(repr=False)

    @property
    def pooled(self) -> bool:
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        return isinstance(self.module, EmbeddingBagCollection)


def find_collections(model: Any, sharders: Sequence[Any]) -> list[Collection]:
    """The collections of ``model`` that ``sharders`` shard, walked as TorchRec's enumerator
    walks it (the module docstring), in module-path order.

    Raises:
        PlannerError: A module a sharder shards that is neither an EmbeddingBagCollection nor an
            EmbeddingCollection (e.g. a quantised or feature-processed one).
    """
    from torchrec.distributed.planner.utils import sharder_name
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    by_type = {sharder_name(s.module_type): s for s in sharders}
    found, queue = [], [("", model)]
    while queue:
        path, module = queue.pop(0)
        sharder = by_type.get(sharder_name(type(module)))
        if sharder is None:
            queue += [(f"{path}.{n}" if path else n, m) for n, m in module.named_children()]
            continue
        if not isinstance(module, (EmbeddingBagCollection, EmbeddingCollection)):
            raise PlannerError("unsupported", f"module '{path}' is a {type(module).__name__}: "
                               "autoshard plans EmbeddingBagCollection and EmbeddingCollection "
                               "modules (leave its sharder out to keep it unsharded)")
        found.append(Collection(path, module, sharder))
    return sorted(found, key=lambda c: c.path)


def collection_tables(collection: Collection) -> list[ModelTable]:
    """The tables of one collection that its sharder shards, in config order."""
    module = collection.module
    configs = (module.embedding_bag_configs() if collection.pooled
               else module.embedding_configs())
    params = collection.sharder.shardable_parameters(module)
    out = []
    for config in configs:
        if config.name not in params:
            continue
        rows, dim = (int(n) for n in params[config.name].shape)
        out.append(ModelTable(collection.path, config.name, rows, dim,
                              str(config.data_type.value), tuple(config.feature_names),
                              collection.pooled))
    return out


def model_tables(model: Any, sharders: Sequence[Any]) -> list[ModelTable]:
    """Every table ``sharders`` shard in ``model``'s collections (:func:`find_collections`,
    :func:`tables_of`)."""
    return tables_of(find_collections(model, sharders))


def tables_of(collections: Sequence[Collection]) -> list[ModelTable]:
    """The tables of ``collections``, in order.

    Raises:
        InputError: Two tables of the same name (in two collections): TorchRec's constraints
            and our plans name a table by its name alone.
    """
    tables = [t for c in collections for t in collection_tables(c)]
    seen: dict[str, ModelTable] = {}
    for t in tables:
        if t.name in seen:
            raise InputError(f"two tables of this name, in '{seen[t.name].path}' and "
                             f"'{t.path}': autoshard needs unique table names", source="model",
                             field=t.qualified, value=t.name)
        seen[t.name] = t
    return tables


def read_statistics(stats: Statistics | None) -> dict[str, Table]:
    """Statistics tables by name: from a table file, a mapping or a sequence of tables."""
    if stats is None:
        return {}
    if isinstance(stats, (str, Path)):
        return {t.name: t for t in load_tables(stats)}
    if isinstance(stats, Mapping):
        return dict(stats)
    return {t.name: t for t in stats}


def our_tables(tables: Sequence[ModelTable], stats: Mapping[str, Table],
               pooling: Mapping[str, float] | None = None, warn: bool = True
               ) -> tuple[tuple[Table, ...], list[str]]:
    """Our tables of a model's, with statistics (the module docstring), and the names of those
    that fell back to TorchRec's default pooling factor (logged as a warning if ``warn``:
    :func:`fallback_note`).

    Args:
        tables: The model's tables.
        stats: Statistics tables by table or feature name.
        pooling: Lookups per sample by table name, from TorchRec's constraints.
        warn: Log the warning (the command line prints it instead).
    """
    from torchrec.distributed.planner.constants import POOLING_FACTOR

    out, fell_back = [], []
    for t in tables:
        base = Table(t.name, t.rows, t.dim, bytes_per_element=t.bytes_per_element,
                     features=tuple(dict.fromkeys(t.features)))
        matched = stats.get(t.name)
        by_feature = [stats[f] for f in t.features if f in stats] if matched is None else []
        if matched is not None or by_feature:
            out.append(_with_stats(base, matched, by_feature))
        elif pooling and t.name in pooling:
            out.append(replace(base, pooling_factor=float(pooling[t.name])))
        else:  # TorchRec's default for each feature that looks the table up
            out.append(replace(base, pooling_factor=POOLING_FACTOR * max(len(t.features), 1)))
            fell_back.append(t.name)
    if fell_back and warn:
        _log.warning("%s", fallback_note(fell_back))
    return tuple(out), fell_back


def fallback_note(names: Sequence[str]) -> str:
    """The warning for tables that fell back to TorchRec's default pooling factor."""
    from torchrec.distributed.planner.constants import POOLING_FACTOR

    return (f"no statistics or pooling factors for {len(names)} table(s) ({', '.join(names)}): "
            f"TorchRec's default pooling factor {POOLING_FACTOR:g} assumed for each of a "
            "table's features")


def _with_stats(base: Table, matched: Table | None, by_feature: list[Table]) -> Table:
    """``base`` with the statistics of its matched table, or of its features' tables."""
    source = matched or by_feature[0]
    stats = {key: getattr(source, key) for key in _STATS_FIELDS}
    if source.rows_used is not None:
        stats["rows_used"] = min(source.rows_used, base.rows)
    if matched is None and len(by_feature) > 1:
        stats.update(pooling_factor=sum(s.lookups_per_sample for s in by_feature),
                     pooling_std=None, coverage=1.0)
    try:
        return replace(base, **stats)
    except InputError as exc:
        raise exc.located("statistics", source.name) from exc


def output_notes(tables: Sequence[ModelTable]) -> list[str]:
    """The tables whose outputs our tables under-count (the module docstring), one note each
    kind."""
    notes = []
    several = [t.name for t in tables if len(t.features) > 1]
    sequence = [t.name for t in tables if not t.pooled]
    if several:
        notes.append(f"tables of several features priced as one pooled output per sample: "
                     f"{', '.join(several)}")
    if sequence:
        notes.append(f"sequence (EmbeddingCollection) tables priced as pooled, their "
                     f"all-to-all under-counted by their pooling factor: {', '.join(sequence)}")
    return notes


def load_factory(spec: str, field: str = "--torchrec-model") -> Callable[[], Any]:
    """The factory ``MODULE:FACTORY`` names: MODULE a dotted module (found from the working
    folder too, as ``python -m`` finds it) or a ``path/to/file.py``.

    Raises:
        InputError: A malformed spec, a module that cannot be imported (its error named), or
            no callable FACTORY in it, naming ``spec``.
    """
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name.isidentifier():
        raise InputError("expected MODULE:FACTORY (a dotted module or a .py file, and the "
                         "name of a function in it that returns the model)",
                         source="command line", field=field, value=spec)
    try:
        module = _import(module_name)
    except Exception as exc:  # the user's module: any error on import is theirs to see
        raise InputError(f"cannot import '{module_name}' ({type(exc).__name__}: {exc})",
                         source="command line", field=field, value=spec) from exc
    factory = getattr(module, name, None)
    if not callable(factory):
        raise InputError(f"'{module_name}' has no function '{name}'", source="command line",
                         field=field, value=spec)
    return factory  # type: ignore[no-any-return]


def _import(module_name: str) -> Any:
    """A module by dotted name (the working folder searched first) or by file path."""
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise FileNotFoundError(f"no file {path}")
        spec = importlib.util.spec_from_file_location(f"_autoshard_model_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import would (pickling, dataclasses need it)
        spec.loader.exec_module(module)
        return module
    with _working_folder_on_path():
        return importlib.import_module(module_name)


@contextlib.contextmanager
def _working_folder_on_path() -> Iterator[None]:
    """The working folder first on ``sys.path`` while importing (as ``python -m`` has it)."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            sys.path.remove(cwd)


def factory_tables(spec: str, stats: Statistics | None = None,
                   field: str = "--torchrec-model") -> tuple[tuple[Table, ...], list[str]]:
    """The tables of the model ``MODULE:FACTORY`` returns (:func:`read_factory`), with
    ``stats``; and the tables that fell back to TorchRec's default pooling factor
    (:func:`our_tables`, not logged).

    Raises:
        InputError: The factory cannot be loaded, fails, or returns a model with no embedding
            collection, naming ``spec``.
    """
    found, fell_back = our_tables(read_factory(spec, field), read_statistics(stats), warn=False)
    check_unique_names(found, spec)
    return found, fell_back


def read_factory(spec: str, field: str = "--torchrec-model") -> list[ModelTable]:
    """The tables of the model ``MODULE:FACTORY`` returns, built on the meta device (no
    weights allocated) and read with TorchRec's default sharders, each with its collection's
    module path.

    Raises:
        InputError: The factory cannot be loaded, fails, or returns a model with no embedding
            collection, naming ``spec``.
    """
    import torch
    from torchrec.distributed.sharding_plan import get_default_sharders

    factory = load_factory(spec, field)
    try:
        with torch.device("meta"):
            model = factory()
    except Exception as exc:  # the user's factory: its error is theirs to see
        raise InputError(f"the factory failed ({type(exc).__name__}: {exc})",
                         source="command line", field=field, value=spec) from exc
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"the factory returned a {type(model).__name__}, not a torch module",
                         source="command line", field=field, value=spec)
    try:
        tables = model_tables(model, get_default_sharders())
    except PlannerError as exc:
        raise InputError(str(exc), source="command line", field=field, value=spec) from exc
    if not tables:
        raise InputError("the model has no EmbeddingBagCollection or EmbeddingCollection "
                         "with tables", source="command line", field=field, value=spec)
    return tables
