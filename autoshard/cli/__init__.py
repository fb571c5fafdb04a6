"""The ``autoshard`` command line. Each command group lives in its own module."""

from __future__ import annotations

import sys

import click
import typer

from autoshard.errors import InputError, PlannerError

app = typer.Typer(
    name="autoshard",
    help="Place DLRM embedding tables on devices and memory tiers, and compare sharders.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Command modules register themselves on ``app`` when imported.
from autoshard.cli import core_cmds  # noqa: E402,F401
from autoshard.cli import compare_cmds  # noqa: E402,F401


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the app; bad input exits 2 with one line naming file, field and value."""
    try:
        result = app(args=argv, standalone_mode=False)
    except (InputError, PlannerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    if isinstance(result, int) and result:
        sys.exit(result)
