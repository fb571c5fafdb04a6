"""The ``autoshard`` command line. Each command group lives in its own module."""

from __future__ import annotations

import contextlib
import importlib
import sys

import click
import typer

from autoshard.cli.app import app
from autoshard.errors import InputError, PlannerError
from autoshard.extras import missing_module_error

__all__ = ["app", "main"]


def _click_errors() -> tuple[type[Exception], ...]:
    """Click's usage-error class, and the copy of it that recent typer releases vendor."""
    errors: list[type[Exception]] = [click.exceptions.ClickException]
    with contextlib.suppress(ImportError, AttributeError):
        errors.append(importlib.import_module("typer._click.exceptions").ClickException)
    return tuple(errors)


_CLICK_ERRORS = _click_errors()

# Command modules register themselves on ``app`` when imported (one line each), in the order
# ``--help`` lists them.
# isort: off
from autoshard.cli import core_cmds  # noqa: E402,F401
from autoshard.cli import export_cmds  # noqa: E402,F401
from autoshard.cli import replan_cmds  # noqa: E402,F401
from autoshard.cli import compare_cmds  # noqa: E402,F401
from autoshard.cli import demo_cmds  # noqa: E402,F401
from autoshard.cli import cost_cmds  # noqa: E402,F401
from autoshard.cli import run_cmds  # noqa: E402,F401
from autoshard.cli import data_cmds  # noqa: E402,F401
from autoshard.cli import torchrec_cmds  # noqa: E402,F401
from autoshard.cli import train_cmds  # noqa: E402,F401
from autoshard.cli import serve_cmds  # noqa: E402,F401
# isort: on


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the app; bad input, and an optional package that is not installed (named
    with the extra that installs it), exit 2 with one line."""
    try:
        result = app(args=argv, standalone_mode=False)
    except (InputError, PlannerError) as exc:
        _fail(f"error: {exc}", 2)
    except ModuleNotFoundError as exc:  # an optional package a command imported without require
        error = missing_module_error(exc)
        if error is None:
            raise
        _fail(f"error: {error}", 2)
    except OSError as exc:  # unreadable input or unwritable output, named by the OS message
        _fail(f"error: {exc}", 2)
    except _CLICK_ERRORS as exc:
        exc.show()  # type: ignore[attr-defined]
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]
    except (click.exceptions.Abort, typer.Abort, KeyboardInterrupt):
        _fail("aborted", 130)
    except (click.exceptions.Exit, typer.Exit) as exc:
        sys.exit(exc.exit_code)
    if isinstance(result, int) and result:
        sys.exit(result)


def _fail(line: str, code: int) -> None:
    print(" ".join(line.split()), file=sys.stderr)
    sys.exit(code)
