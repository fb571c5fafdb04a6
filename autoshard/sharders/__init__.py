"""Registry of sharders by name. A new sharder is one module and one line in ``_ENTRIES``.

Entries are ``module:Class`` strings, imported only when used, so listing sharders stays fast and
optional dependencies (torchrec, torch) are needed only by the sharders that use them.

Each sharder class declares the range of each numeric option next to its constructor, as a
class attribute ``option_ranges: ClassVar[dict[str, Range]]`` (:class:`autoshard.limits.Range`);
:func:`check_sharder_options` holds every given option to it before any work.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any

from autoshard.errors import InputError, PlannerError
from autoshard.limits import Range
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
    "torchrec": "autoshard.torchrec.sharder:TorchRecSharder",
    "ppo": "autoshard.sharders.ppo.sharder:PPOSharder",
    "ppo-policy": "autoshard.sharders.ppo.sharder:PPOPolicySharder",
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


def sharder_info(name: str, **options: Any) -> SharderInfo:
    """A registry entry; a sharder whose module cannot be imported is listed as unavailable.

    ``options`` are those the sharder would be made with: availability can depend on them
    (``ppo`` with ``policy=`` needs that folder, not the default one).
    """
    try:
        cls = _load_class(name)
    except PlannerError as exc:
        return SharderInfo(name, "", str(exc).split(": ", 1)[-1])
    return SharderInfo(name, cls.summary, _unavailable(cls, options))


def list_sharders() -> list[SharderInfo]:
    return [sharder_info(n) for n in _ENTRIES]


def accepted_options(name: str) -> dict[str, Any]:
    """The options sharder ``name`` takes (its constructor's keyword arguments), with defaults.

    Raises:
        InputError: Unknown name.
        PlannerError: The sharder's module cannot be imported here.
    """
    parameters = inspect.signature(_load_class(name)).parameters
    return {key: p.default for key, p in parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def sharder_class(name: str) -> Any:
    """The class registered as ``name``, imported now.

    Raises:
        InputError: Unknown name.
        PlannerError: The sharder's module cannot be imported here.
    """
    return _load_class(name)


def option_ranges(name: str) -> dict[str, Range]:
    """The declared range of each numeric option of sharder ``name`` (its class's
    ``option_ranges``).

    Raises:
        InputError: Unknown name.
        PlannerError: The sharder's module cannot be imported here.
    """
    return dict(getattr(_load_class(name), "option_ranges", {}))


def common_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The part of a set of *common* settings (``seed``, ``time_limit``) that sharder ``name``
    takes, for harnesses that run many sharders under the same settings. Options a user gave
    for one sharder go to :func:`get_sharder` unfiltered, so that a misspelt one fails.
    A sharder that cannot be imported here takes none (:func:`get_sharder` says why).

    Raises:
        InputError: Unknown name.
    """
    try:
        accepted = accepted_options(name)
    except PlannerError:
        return {}
    return {key: value for key, value in options.items() if key in accepted}


def check_sharder_options(name: str, options: dict[str, Any]) -> None:
    """Fails unless every option is one sharder ``name`` takes, with a value of its type
    within the option's declared range (:func:`option_ranges`).

    Raises:
        InputError: An unknown option (the message lists the accepted ones), a NaN or an
            infinity, a value whose type differs from the option's default (an integer is
            accepted for a float), or one out of the option's range; the field is
            ``SHARDER.OPTION``.
    """
    accepted = accepted_options(name)
    parameters = inspect.signature(_load_class(name)).parameters
    ranges = option_ranges(name)
    for key, value in options.items():
        field = f"{name}.{key}"
        if key not in accepted:
            listing = ", ".join(accepted) or "none"
            raise InputError(f"unknown option for sharder '{name}' (accepted: {listing})",
                             field=field, value=value)
        takes_none = _takes_none(parameters[key].annotation)
        if value is None and takes_none:
            continue
        if isinstance(value, numbers.Real) and not math.isfinite(value):
            raise InputError("must be a finite number", field=field, value=value)
        if not _same_kind(accepted[key], value):
            raise InputError(f"expected {type(accepted[key]).__name__} (default "
                             f"{accepted[key]!r})", field=field, value=value)
        if key in ranges and value not in ranges[key]:
            raise InputError(f"must be {ranges[key]}" + (" or null" if takes_none else ""),
                             field=field, value=value)


def get_sharder(name: str, **options: Any) -> Sharder:
    """A sharder by registry name, made with ``options`` (its constructor's keyword arguments).

    Every option must be one the sharder takes, as in scikit-learn's ``set_params``: a misspelt
    option fails instead of being silently dropped. A harness that applies common settings to
    many sharders filters them first with :func:`common_options`.

    Raises:
        InputError: Unknown name, unknown option or an option value of the wrong type.
        PlannerError: The sharder cannot run here (missing extra, untrained policy).
    """
    cls = _load_class(name)
    check_sharder_options(name, options)
    reason = _unavailable(cls, options)
    if reason:
        checked = [key for key in options if key in _check_parameters(cls)]
        if checked:  # the options given are at fault (a policy folder that is not there)
            raise InputError(reason, field=checked[0], value=options[checked[0]])
        raise PlannerError("unavailable", f"sharder '{name}' is unavailable: {reason}")
    try:
        sharder: Sharder = cls(**options)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"rejected by sharder '{name}': {exc}", field=name,
                         value=options) from exc
    return sharder


def _unavailable(cls: Any, options: dict[str, Any]) -> str | None:
    """Why ``cls`` made with ``options`` cannot run here (None if it can); the check is given
    the options it takes (e.g. ``policy``)."""
    check = getattr(cls, "unavailable", None)
    if check is None:
        return None
    takes = _check_parameters(cls)
    reason: str | None = check(**{k: v for k, v in options.items() if k in takes})
    return reason


def _check_parameters(cls: Any) -> tuple[str, ...]:
    """The options a sharder class's ``unavailable`` check takes."""
    check = getattr(cls, "unavailable", None)
    return tuple(inspect.signature(check).parameters) if check is not None else ()


def _takes_none(annotation: Any) -> bool:
    """Whether an option's annotation (a string under postponed evaluation) allows None."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return "None" in text.replace(" ", "").split("|") or text.startswith("Optional[")


def _same_kind(default: Any, value: Any) -> bool:
    """Whether ``value`` fits an option whose default is ``default`` (None: anything)."""
    if default is None or default is inspect.Parameter.empty:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))
