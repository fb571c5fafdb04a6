"""The Typer application every command module registers its commands on."""

from __future__ import annotations

from typing import Any

import typer


def _flags_show_no_type() -> None:
    """Shows no type after a flag in the help panels, as typer did before 0.29.

    typer 0.29.0 writes a type after every option, flags included (``--help <bool>``,
    ``--json <bool>``), where its earlier releases left a bool's out: a flag takes no value.
    Every command's help, ``--help`` itself included, is built from ``TyperOption``, so its
    ``display_type_rich`` is wrapped once here to return nothing for a flag (or a counter);
    every other option keeps its type. On a typer without that method nothing changes.
    """
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "flags_show_no_type", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if self.is_flag or self.count else shown(self, ctx)

    display_type_rich.flags_show_no_type = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_show_no_type()

app = typer.Typer(
    name="autoshard",
    help="Place DLRM embedding tables on devices and memory tiers, and compare sharders.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
