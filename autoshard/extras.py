"""autoshard's optional dependencies, grouped by use into the extras of its install, and the one
check a command makes before it imports one of them.

The core (tables and their statistics files, hardware, the analytical cost model, the greedy
family, ``recshard``'s MILP, ``random``, ``evaluate``, plan files and their export for TorchRec)
needs only numpy, pyyaml, typer, rich, click, scipy and highspy. Everything else is an extra,
named here by what it is for, as ``pyproject.toml`` declares it::

    pip install 'autoshard[learned]'            # the ppo sharders, their env and training
    pip install 'autoshard[learned,plots]'      # several at once
    pip install 'autoshard[all]'                # every extra below but torchrec

A command imports an optional package through :func:`require` (or :func:`require_all`), where
it first needs it; when the package is missing the error names the extra and the pip command,
and the command line turns it into exit status 2 with that message.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType

from autoshard.errors import PlannerError


@dataclass(frozen=True)
class Extra:
    """One extra of autoshard's install.

    Attributes:
        name: The extra's name, as in ``pip install 'autoshard[NAME]'``.
        modules: The top-level modules it makes importable (import names, not the names of the
            distributions, which ``pyproject.toml`` lists with their pins).
        use: What it is for: the commands and modules that need it.
    """

    name: str
    modules: tuple[str, ...]
    use: str


#: Every extra but ``dev`` (the tools that test the project) and ``all`` (every extra listed
#: here but ``torchrec``, whose install on a CPU machine takes the steps of scripts/setup.sh).
EXTRAS: dict[str, Extra] = {e.name: e for e in (
    Extra("learned", ("torch", "gymnasium", "stable_baselines3", "sb3_contrib"),
          "the ppo and ppo-policy sharders, the placement environment, `train`"),
    Extra("costmodel", ("lightgbm", "pandas", "torch"),
          "the learned cost model (pricing with it, `cost-model`) and microbenchmarks "
          "(`bench`)"),
    Extra("data", ("pandas", "pyarrow", "dask", "distributed", "datasketches", "torch"),
          "profiling lookup data (`profile`: Parquet, CSV, Criteo, Meta's .pt traces, the dask "
          "engine), `synth`, `demo`"),
    Extra("run", ("torch",),
          "running plans for real: `run-plan`, `serve bench`, `serve calibrate`, "
          "`serve compare --measure`"),
    Extra("tracking", ("wandb",),
          "Weights & Biases tracking (`compare`, `train`, `cost-model fit --wandb-mode offline`)"),
    Extra("plots", ("matplotlib",),
          "the figures of `compare`, `demo`, `train`, `calibrate`, `cost-model compare`, "
          "`serve plan` and `serve compare`"),
    Extra("torchrec", ("torchrec", "fbgemm_gpu"),
          "TorchRec: the torchrec sharder and cost model, `export --check`, `run-plan --engine "
          "torchrec`, AutoshardPlanner"),
)}


def pip_command(*extras: str) -> str:
    """The command that installs ``extras``: ``pip install 'autoshard[learned,plots]'``."""
    return f"pip install 'autoshard[{','.join(extras)}]'"


def extras_of(module: str) -> list[str]:
    """The extras that install top-level ``module``, in :data:`EXTRAS` order (none for a core
    or unknown module)."""
    return [e.name for e in EXTRAS.values() if module in e.modules]


def missing(module: str, extra: str) -> str | None:
    """Why ``module`` cannot be imported here (None when it is installed), without importing it
    (fast enough for listings); the sentence names ``extra`` and the pip command."""
    _check_known(module, extra)
    try:
        if sys.modules.get(module) is not None or importlib.util.find_spec(module) is not None:
            return None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        pass
    return _sentence([(module, extra, None)])


def require(module: str, extra: str, instead: str = "") -> ModuleType:
    """``module`` imported, for a command that needs it.

    Args:
        module: A module of ``extra`` (a top-level name, or a dotted name under one).
        extra: The extra that installs it (a key of :data:`EXTRAS`).
        instead: What else mends it, appended to the message (``or set wandb_mode to
            'disabled'``).

    Raises:
        PlannerError: Kind ``missing_extra``: the module cannot be imported; the message names
            the extra and the pip command that installs it.
    """
    return require_all({module: extra}, instead)[module]


def require_all(needs: Mapping[str, str], instead: str = "") -> dict[str, ModuleType]:
    """Every module of ``needs`` (module -> the extra that installs it) imported, by name; one
    error naming every extra that is missing, so that one install command mends it.

    Raises:
        PlannerError: Kind ``missing_extra``, naming each module that cannot be imported, its
            extra and one pip command for all of them (then ``instead``, when given).
    """
    loaded, failed = {}, []
    for module, extra in needs.items():
        _check_known(module, extra)
        try:
            loaded[module] = importlib.import_module(module)
        except ImportError as exc:
            failed.append((module, extra, exc))
    if failed:
        raise PlannerError("missing_extra", _sentence(failed) + (f", {instead}" if instead
                                                                 else ""))
    return loaded


def missing_module_error(exc: ModuleNotFoundError) -> PlannerError | None:
    """The error to show for ``exc`` when it is an optional package that is not installed
    (naming the extras that install it), None when it is anything else (a fault to report
    as it is)."""
    module = (exc.name or "").partition(".")[0]
    extras = extras_of(module)
    if not extras:
        return None
    if len(extras) == 1:
        return PlannerError("missing_extra", _sentence([(module, extras[0], None)]))
    return PlannerError("missing_extra", f"{module} is not installed (autoshard's extras "
                        f"{_listed(extras)} each install it): {pip_command(extras[0])}")


def _sentence(failed: Sequence[tuple[str, str, ImportError | None]]) -> str:
    """``torch is not installed (it comes with autoshard's 'learned' extra): pip install
    'autoshard[learned]'``: the modules grouped by extra, one pip command for every extra."""
    absent: dict[str, list[str]] = {}
    broken = []
    for module, extra, exc in failed:
        top = module.partition(".")[0]
        if exc is None or (isinstance(exc, ModuleNotFoundError)
                           and (exc.name or "").partition(".")[0] == top):
            absent.setdefault(extra, []).append(top)
        else:  # installed but broken, or one of its own dependencies missing
            broken.append(f"{module} cannot be imported ({type(exc).__name__}: {exc}; it comes "
                          f"with autoshard's '{extra}' extra)")
    clauses = [f"{_listed(names)} {'is' if len(names) == 1 else 'are'} not installed "
               f"({'it comes' if len(names) == 1 else 'they come'} with autoshard's '{extra}' "
               f"extra)" for extra, names in absent.items()]
    extras = list(dict.fromkeys(extra for _, extra, _ in failed))
    return "; ".join(clauses + broken) + f": {pip_command(*extras)}"


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _check_known(module: str, extra: str) -> None:
    """A caller's own mistake (an extra that does not exist or does not hold ``module``)."""
    top = module.partition(".")[0]
    assert extra in EXTRAS and top in EXTRAS[extra].modules, (module, extra)
