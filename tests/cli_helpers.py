"""Running the CLI in-process from tests."""

from __future__ import annotations

import pytest

from autoshard.cli import main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Runs ``autoshard ARGV``; returns (exit code, stdout, stderr)."""
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
