"""`autoshard train`: trains the `ppo` sharder's policy.

Every :class:`autoshard.training.config.TrainConfig` field is an option (``--learning-rate``,
``--train-devices 2 --train-devices 8``, ...), generated from the dataclass itself: its type,
its one-line documentation, its default and its range, so nothing is declared twice.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Annotated, Any

import typer

from autoshard.cli.app import app
from autoshard.cli.common import console
from autoshard.errors import InputError
from autoshard.extras import EXTRAS, require_all
from autoshard.training.config import LIMITS, TrainConfig, field_help


def _option_type(hint: Any) -> Any:
    """The CLI type of a config field: variable-length tuples become repeatable options."""
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return typing.Optional[list[args[0]]]  # type: ignore[valid-type]  # noqa: UP045
    return typing.Optional[hint]  # noqa: UP045


def _config_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per config field, its default the field's (shown by ``--help``,
    with the field's range where it has one)."""
    hints = typing.get_type_hints(TrainConfig)
    docs = field_help()
    params = []
    for f in fields(TrainConfig):
        default = f.default if f.default is not MISSING else None
        limit = LIMITS.get(f.name)
        each = ", each" if isinstance(default, tuple) else ""
        text = docs[f.name] + (f"{each} {limit.help()}" if limit else "")
        if isinstance(default, tuple) and typing.get_args(hints[f.name])[-1] is Ellipsis:
            default = list(default)  # a repeatable option
        option = typer.Option(help=text, show_default=True if default != "" else "none")
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=Annotated[_option_type(hints[f.name]),
                                                             option]))
    return params


def train(resume: bool = False, export: Path | None = None, export_policy: Path | None = None,
          **values: Any) -> None:
    """Train the `ppo` sharder's policy with MaskablePPO on autoshard/Placement-v0."""
    require_all({**dict.fromkeys(EXTRAS["learned"].modules, "learned"), "matplotlib": "plots"})
    from autoshard.training.report import describe
    from autoshard.training.train import train as run_training

    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                             for k, v in values.items() if v is not None}
    try:
        cfg = TrainConfig(**given)
    except InputError as exc:  # name the option, not the field
        option = "--" + (exc.field or "").replace("_", "-")
        raise InputError(exc.reason, source="command line", field=option,
                         value=exc.value) from None
    result = run_training(cfg, resume=resume, export=export, export_policy=export_policy)
    console.print(describe(result)
                  + (f"; exported to {export}" if export else "")
                  + (f"; policy copied to {export_policy}" if export_policy else ""),
                  markup=False, highlight=False)


_own = [
    inspect.Parameter("resume", inspect.Parameter.KEYWORD_ONLY, default=False,
                      annotation=Annotated[bool, typer.Option(
                          "--resume", help="Continue the run in --out from its last checkpoint.")]),
    inspect.Parameter("export", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[Path | None, typer.Option(
                          help="Also copy the curve, history and evaluation here "
                               "(e.g. results/ppo).")]),
    inspect.Parameter("export_policy", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[Path | None, typer.Option(
                          help="Also copy the best policy here (autoshard/data/ppo_policy "
                               "replaces the committed one).")]),
]
train.__signature__ = inspect.Signature(_own + _config_parameters())  # type: ignore[attr-defined]
train.__annotations__ = {p.name: p.annotation for p in train.__signature__.parameters.values()}  # type: ignore[attr-defined]
app.command()(train)
