"""The Typer application every command module registers its commands on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="autoshard",
    help="Place DLRM embedding tables on devices and memory tiers, and compare sharders.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
