"""Progress of long commands: what is done, the rate and the time left.

On a terminal a rich bar (on stderr, cleared when done); elsewhere (a log, a pipe) a line on
stderr every :data:`LINE_EVERY_S` seconds and one at the end, so that a long job is never
silent. Each shape is a context manager yielding the function its job calls:

- :func:`progress_bar`: a count of things done (steps, configurations, deployments), total
  known or not; the function takes how many more are done;
- :func:`rank_steps`: ranks running steps (``run-plan``): the function takes each rank's stage
  as it reports it (``step 12 done``), and the bar counts the steps every rank has done;
- :func:`timed`: a job bounded by a time limit that reports nothing itself (a sharder): the
  bar fills with the time used of the limit, from a thread; without a terminal, a line every
  :data:`LINE_EVERY_S` and one when it is done (a job under a second says nothing).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

#: Seconds between progress lines where there is no terminal.
LINE_EVERY_S = 10.0
#: Progress goes to stderr: stdout keeps the report (and JSON) alone.
err_console = Console(stderr=True)
_STEP = re.compile(r"step (\d+)( done)?")


class _Rate(ProgressColumn):
    """Things done per second so far."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        rate = task.completed / elapsed if elapsed > 0 else 0.0
        return Text(f"{rate:,.3g} {self.unit}/s" if rate else "")


class Lines:
    """Progress as lines: ``label: 120 of 300 steps (40%), 3.2 steps/s, 56 s left``, one every
    ``every`` seconds (by ``clock``) and one at the end.

    Args:
        label: What is being done.
        total: How many things in all (None: unknown).
        unit: What a thing is, for the rate.
        write: Where a line goes.
        every: Seconds between lines.
        clock: Seconds (``time.monotonic``).
    """

    def __init__(self, label: str, total: float | None, unit: str,
                 write: Callable[[str], None], every: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.unit, self.write = label, total, unit, write
        self.every, self.clock = every, clock
        self.done = 0.0
        self.start = self.last = clock()

    def advance(self, amount: float = 1.0) -> None:
        """Counts ``amount`` more things done; says so when a line is due."""
        self.update(self.done + amount)

    def update(self, done: float) -> None:
        """Sets the things done; says so when a line is due."""
        self.done = done
        if self.clock() - self.last >= self.every:
            self.say()

    def say(self) -> None:
        """Writes the line now."""
        now = self.clock()
        self.last = now
        elapsed = now - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        of = "" if self.total is None else f" of {self.total:,.0f}"
        share = "" if not self.total else f" ({self.done / self.total:.0%})"
        left = ""
        if self.total and rate > 0 and self.done < self.total:
            left = f", {(self.total - self.done) / rate:,.0f} s left"
        self.write(f"{self.label}: {self.done:,.0f}{of} {self.unit}{share}, "
                   f"{rate:,.3g} {self.unit}/s{left} ({elapsed:,.0f} s)")


def _bar(total: float | None, unit: str) -> Progress:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn(unit), _Rate(unit), TimeElapsedColumn(), TimeRemainingColumn())
    return Progress(*columns, console=err_console, transient=True)


@contextlib.contextmanager
def progress_bar(label: str, total: float | None, unit: str = "done", last_line: bool = True
                 ) -> Iterator[Callable[[float], None]]:
    """Progress of ``total`` things (None: unknown); yields a function taking how many more
    are done. Without a terminal, ``last_line`` says where it ended."""
    if not err_console.is_terminal:
        lines = Lines(label, total, unit, _say)
        yield lines.advance
        if last_line:
            lines.say()
        return
    with _bar(total, unit) as bar:
        task = bar.add_task(label, total=total)

        def advance(amount: float = 1.0) -> None:
            bar.advance(task, amount)

        yield advance


@contextlib.contextmanager
def rank_steps(label: str, steps: int) -> Iterator[Callable[[list[str]], None]]:
    """Progress of ranks that each run ``steps`` steps; yields a function taking every rank's
    stage (``step N done``, ``connected``, ...). The count is the steps every rank has done."""
    with progress_bar(label, steps, "steps") as advance:
        done = [0]

        def stages(found: list[str]) -> None:
            # "step 4 done": 5 steps done; "step 4 (in a collective)": 4.
            counts = [int(m.group(1)) + bool(m.group(2)) if (m := _STEP.search(s)) else 0
                      for s in found]
            least = min(counts, default=0)
            if least > done[0]:
                advance(least - done[0])
                done[0] = least

        yield stages


@contextlib.contextmanager
def timed(label: str, limit_s: float | None, every: float = 0.5) -> Iterator[None]:
    """A bar of the seconds used of ``limit_s`` (None: elapsed time alone) while the body
    runs, kept up by a thread."""
    stop = threading.Event()
    start = time.monotonic()
    with progress_bar(label, limit_s, "s", last_line=False) as advance:
        def tick() -> None:
            used = 0.0
            while not stop.wait(every):
                now = time.monotonic() - start
                step = now - used if limit_s is None else min(now, limit_s) - used
                if step > 0:
                    advance(step)
                    used += step

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
    took = time.monotonic() - start
    if not err_console.is_terminal and took >= 1.0:  # a quick job says nothing
        _say(f"{label}: done in {took:,.1f} s")


def _say(line: str) -> None:
    err_console.print(line, markup=False, highlight=False, soft_wrap=True)


__all__ = ["LINE_EVERY_S", "Lines", "err_console", "progress_bar", "rank_steps", "timed"]
