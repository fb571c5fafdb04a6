"""`autoshard train`: trains the `ppo` sharder's policy.

Every :class:`autoshard.training.config.TrainConfig` field is an option (``--learning-rate``,
``--train-devices 2 --train-devices 8``, ...), generated from the dataclass itself: its type,
its one-line documentation and its default, so nothing is declared twice.
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
from autoshard.training.config import TrainConfig, field_help


def _option_type(hint: Any) -> Any:
    """The CLI type of a config field: variable-length tuples become repeatable options."""
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return typing.Optional[list[args[0]]]  # type: ignore[valid-type]  # noqa: UP045
    return typing.Optional[hint]  # noqa: UP045


def _config_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per config field (default None: the field's own default)."""
    hints = typing.get_type_hints(TrainConfig)
    docs = field_help()
    params = []
    for f in fields(TrainConfig):
        default = f.default if f.default is not MISSING else None
        shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
        option = typer.Option(help=f"{docs[f.name]} [default: {shown}]", show_default=False)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[_option_type(hints[f.name]),
                                                             option]))
    return params


def train(resume: bool = False, export: Path | None = None, export_policy: Path | None = None,
          **values: Any) -> None:
    """Train the `ppo` sharder's policy with MaskablePPO on autoshard/Placement-v0."""
    from autoshard.training.train import train as run_training

    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                             for k, v in values.items() if v is not None}
    cfg = TrainConfig(**given)
    result = run_training(cfg, resume=resume, export=export, export_policy=export_policy)
    console.print(f"trained {result.steps:,} steps in {result.wall_seconds:.0f} s"
                  f"{' (stopped early)' if result.stopped_early else ''}; best held-out cost "
                  f"ratio {result.best_ratio:.3f}; policy in {result.policy_dir}"
                  + (f"; exported to {export}" if export else "")
                  + (f"; policy copied to {export_policy}" if export_policy else ""))


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
