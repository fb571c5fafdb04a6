"""Exporting a plan for a training framework from Python: :func:`export`, its targets by name.

A target is a ``module:function`` entry imported only when used (as the sharders' registry
does), so the core needs no framework installed; a new target is one function and one line in
``_TARGETS``. Its function takes the plan, its task, the file to write (None: nothing is
written) and its own options, and returns what it exported (:class:`Exported`); the
``torchrec`` target's options and result are
:func:`autoshard.torchrec.exporter.export_plan`'s.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any, Protocol

from autoshard.errors import InputError, PlannerError
from autoshard.layout.plan import Plan
from autoshard.task import ShardingTask

_TARGETS: dict[str, str] = {
    "torchrec": "autoshard.torchrec.exporter:export_plan",
}


class Exported(Protocol):
    """What an export made: the description (JSON/YAML-ready), our plan of what the framework
    gets (the plan as exported, after any fitting), the tables changed to fit the framework's
    memory count, what a check found, and a one-line summary."""

    @property
    def doc(self) -> dict[str, Any]: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def changed(self) -> tuple[str, ...]: ...

    @property
    def checked(self) -> str | None:
        """What the framework's check found, in words (None: not checked)."""
        ...

    @property
    def summary(self) -> str:
        """What the description holds, in one line."""
        ...


def export_targets() -> list[str]:
    """The names of the export targets."""
    return list(_TARGETS)


def export(plan: Plan, task: ShardingTask, output: str | Path | None = None, *,
           to: str = "torchrec", **options: Any) -> Exported:
    """Exports ``plan`` of ``task`` for the framework ``to`` names, writing the description to
    ``output`` when given (nothing is written when a step fails).

    Args:
        plan: The plan.
        task: The task it places (tables, hardware, workload, reservation).
        output: The description file (JSON or YAML by its suffix); None: not written.
        to: The target: ``torchrec`` (:func:`autoshard.torchrec.exporter.export_plan`: fits
            the caches to TorchRec's HBM count, optionally checks the result with TorchRec).
        **options: The target's options (for ``torchrec``: ``fit``, ``check``,
            ``fitted_plan``).

    Raises:
        InputError: An unknown target or option, or a plan that does not fit the task.
        PlannerError: The target's framework is not installed, or the export or its check
            fails.
    """
    if to not in _TARGETS:
        raise InputError(f"must be one of {', '.join(_TARGETS)}", field="to", value=to)
    module, _, attr = _TARGETS[to].partition(":")
    try:
        function = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:  # a missing optional dependency, say
        raise PlannerError("unavailable", f"export target '{to}' is unavailable: cannot load "
                           f"{_TARGETS[to]} ({exc})") from exc
    accepted = [name for name in inspect.signature(function).parameters
                if name not in ("plan", "task", "output")]
    for key in options:
        if key not in accepted:
            raise InputError(f"unknown option for export target '{to}' (accepted: "
                             f"{', '.join(accepted)})", field=key, value=options[key])
    result: Exported = function(plan, task, output, **options)
    return result
