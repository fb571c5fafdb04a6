"""`autoshard train`: trains the `ppo` sharder's policy.

Every :class:`autoshard.training.config.TrainConfig` field is an option (``--learning-rate``,
``--train-devices 2 --train-devices 8``, ...), generated from the dataclass itself: its type,
its one-line documentation, its default and its range, so nothing is declared twice.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, fields
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from autoshard.cli.app import app
from autoshard.cli.common import console
from autoshard.cli.progress import progress_bar
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


def _given(values: dict[str, Any], resume: bool, context: Any) -> dict[str, Any]:
    """The config fields of the command line: every one for a new run; for ``--resume``, only
    those given (the run keeps its own value of every other), as the command's ``context``
    records where each value came from."""
    def given(name: str) -> bool:
        source = context.get_parameter_source(name) if context is not None else None
        return not resume or source is None or source.name != "DEFAULT"

    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()
            if v is not None and given(k)}


def train(ctx: typer.Context | None = None, resume: bool = False, export: Path | None = None,
          export_policy: Path | None = None, **values: Any) -> None:
    """Train the `ppo` sharder's policy with MaskablePPO on autoshard/Placement-v0."""
    require_all({**dict.fromkeys(EXTRAS["learned"].modules, "learned"), "matplotlib": "plots"})
    from autoshard.training.report import describe
    from autoshard.training.train import resumed_config
    from autoshard.training.train import train as run_training

    given = _given(values, resume, ctx)
    try:
        cfg = resumed_config(given) if resume else TrainConfig(**given)
    except InputError as exc:  # name the option, not the field
        if exc.source not in (None, "<config>"):
            raise
        option = "--" + (exc.field or "").replace("_", "-")
        raise InputError(exc.reason, source="command line", field=option,
                         value=exc.value) from None
    result = run_training(cfg, resume=resume, export=export, export_policy=export_policy,
                          progress=partial(progress_bar, unit="steps"))
    console.print(describe(result, cfg)
                  + (f"; exported to {export}" if export else "")
                  + (f"; policy copied to {export_policy}" if export_policy else ""),
                  markup=False, highlight=False)


_own = [
    inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
    inspect.Parameter("resume", inspect.Parameter.KEYWORD_ONLY, default=False,
                      annotation=Annotated[bool, typer.Option(
                          "--resume", help="Continue the run in --out from its last checkpoint, "
                          "with the run's own options; an option given must equal the run's, "
                          "but for --timesteps, --patience, --vec-env and --wandb-mode.")]),
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
