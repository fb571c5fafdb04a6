"""Registry of serving mapping strategies by name (``module:Class`` strings, imported on use).

These are the sharders of the ``serve`` mode: they map tables to CPU serving servers rather
than to training devices. A new strategy is one class and one line in ``_ENTRIES``.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from autoshard.errors import InputError
from autoshard.limits import names_in
from autoshard.serving.mapping import Mapping
from autoshard.serving.task import ServingTask

MODE = "serve"

_ENTRIES: dict[str, str] = {
    "main_only": "autoshard.serving.strategies:MainOnly",
    "capacity_balanced": "autoshard.serving.strategies:CapacityBalanced",
    "load_balanced": "autoshard.serving.strategies:LoadBalanced",
    "feature_group": "autoshard.serving.strategies:FeatureGroup",
    "hot_cold": "autoshard.serving.strategies:HotCold",
    "optimiser": "autoshard.serving.optimiser:Optimiser",
}


#: Former names, each with what to use instead.
RENAMED = {"singular": "main_only"}


class Strategy(Protocol):
    """A serving mapping strategy."""

    summary: str
    needs_servers: bool

    def map(self, task: ServingTask, servers: int) -> Mapping: ...


def strategy_names() -> list[str]:
    return list(_ENTRIES)


def strategy_summaries() -> dict[str, str]:
    """Name -> one-line summary of every registered strategy (``autoshard sharders --mode
    serve``)."""
    out = {}
    for name, entry in _ENTRIES.items():
        module, _, attr = entry.partition(":")
        out[name] = str(getattr(importlib.import_module(module), attr).summary)
    return out


def get_strategy(name: str, **options: Any) -> Strategy:
    """A strategy by registry name.

    Raises:
        InputError: Unknown name.
    """
    if name in RENAMED:
        raise InputError(f"renamed {RENAMED[name]!r} (Lui et al. use 'singular' for another "
                         "setting)", field="strategy", value=name)
    if name not in _ENTRIES:
        raise InputError(f"unknown serving strategy (known: {', '.join(_ENTRIES)})",
                         field="strategy", value=name)
    module, _, attr = _ENTRIES[name].partition(":")
    cls = getattr(importlib.import_module(module), attr)
    strategy: Strategy = cls(**options)
    return strategy


def parse_strategies(spec: str | None, field: str = "strategy",
                     source: str | None = None) -> list[str]:
    """Comma-separated names (all when None), each checked against the registry; naming none
    is an error (:func:`autoshard.limits.names_in`)."""
    for name in (spec or "").split(","):
        if name.strip() in RENAMED:
            raise InputError(f"renamed {RENAMED[name.strip()]!r}", source=source, field=field,
                             value=name.strip())
    return names_in(spec, strategy_names(), field, "serving strategy", source)
