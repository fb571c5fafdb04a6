"""How a long job reports progress without knowing who shows it.

A job takes a :data:`ProgressFactory`: called with what it is doing and how many things it
will do (None: unknown), it gives a context manager yielding the function the job calls with
how many more are done. The command line passes rich bars or periodic lines
(:mod:`autoshard.cli.progress`); :func:`no_progress` shows nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

#: Takes how many more things are done.
Advance = Callable[[float], None]
#: (what is being done, how many things in all or None) -> a context yielding an Advance.
ProgressFactory = Callable[[str, float | None], AbstractContextManager[Advance]]


def _ignore(amount: float = 1.0) -> None:
    """Progress told to no one."""


@contextlib.contextmanager
def no_progress(label: str, total: float | None) -> Iterator[Advance]:
    """Progress shown nowhere."""
    yield _ignore


__all__ = ["Advance", "ProgressFactory", "no_progress"]
