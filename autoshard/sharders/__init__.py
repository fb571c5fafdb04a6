"""Registry of sharders by name. A new sharder is one module and one line in ``_ENTRIES``.

Entries are ``module:Class`` strings, imported only when used, so listing sharders stays fast and
optional dependencies (torchrec, torch) are needed only by the sharders that use them.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from autoshard.errors import InputError, PlannerError
from autoshard.sharders.base import Sharder

_ENTRIES: dict[str, str] = {
    "random": "autoshard.sharders.baselines:RandomSharder",
    "round_robin": "autoshard.sharders.baselines:RoundRobinSharder",
    "size_greedy": "autoshard.sharders.greedy:SizeGreedy",
    "dim_greedy": "autoshard.sharders.greedy:DimGreedy",
    "lookup_greedy": "autoshard.sharders.greedy:LookupGreedy",
    "size_lookup_greedy": "autoshard.sharders.greedy:SizeLookupGreedy",
    "split_lookup_greedy": "autoshard.sharders.greedy:SplitLookupGreedy",
    "recshard": "autoshard.sharders.recshard:RecShard",
    "torchrec": "autoshard.sharders.torchrec_planner:TorchRecSharder",
    "ppo": "autoshard.sharders.ppo:PPOSharder",
}


@dataclass(frozen=True)
class SharderInfo:
    """A registry entry: name, one-line summary, and why it is unavailable (None if it is)."""

    name: str
    summary: str
    unavailable: str | None


def sharder_names() -> list[str]:
    return list(_ENTRIES)


def _load_class(name: str) -> Any:
    if name not in _ENTRIES:
        raise InputError(f"unknown sharder (known: {', '.join(_ENTRIES)})", field="sharder",
                         value=name)
    module, _, attr = _ENTRIES[name].partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:  # a missing optional dependency, say
        raise PlannerError("unavailable", f"sharder '{name}' is unavailable: cannot load "
                           f"{_ENTRIES[name]} ({exc})") from exc


def sharder_info(name: str) -> SharderInfo:
    """A registry entry; a sharder whose module cannot be imported is listed as unavailable."""
    try:
        cls = _load_class(name)
    except PlannerError as exc:
        return SharderInfo(name, "", str(exc).split(": ", 1)[-1])
    check = getattr(cls, "unavailable", None)
    return SharderInfo(name, cls.summary, check() if check else None)


def list_sharders() -> list[SharderInfo]:
    return [sharder_info(n) for n in _ENTRIES]


def get_sharder(name: str, **options: Any) -> Sharder:
    """A sharder by registry name.

    Options the sharder's constructor does not take (e.g. ``seed`` for a deterministic sharder)
    are ignored, so callers can pass one common set.

    Raises:
        InputError: Unknown name.
        PlannerError: The sharder cannot run here (missing extra, untrained policy).
    """
    cls = _load_class(name)
    check = getattr(cls, "unavailable", None)
    reason = check() if check else None
    if reason:
        raise PlannerError("unavailable", f"sharder '{name}' is unavailable: {reason}")
    accepted = inspect.signature(cls).parameters
    sharder: Sharder = cls(**{k: v for k, v in options.items() if k in accepted})
    return sharder
