"""The tests' own rule: no test asserts a wall-clock (or CPU-clock) duration, so that a slow or
busy machine fails no test. Time limits are tested on a fake clock (:mod:`clocks`); how long
things take is measured by ``benchmarks/``.

The check reads each test module's syntax tree: an ``assert`` may not hold a reading of a real
clock, nor a name bound (in the same function) to an expression that holds one. Waiting for a
process with a generous limit, outside an ``assert``, is not a duration claim and stays allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
#: The real clocks of the ``time`` module (``_ns`` variants too).
CLOCKS = frozenset(f"{name}{ns}" for name in ("time", "monotonic", "perf_counter",
                                              "process_time", "thread_time")
                   for ns in ("", "_ns"))


def _is_clock(node: ast.AST) -> bool:
    """Whether ``node`` reads a real clock: ``time.perf_counter()``, or ``perf_counter()``
    imported from ``time``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr in CLOCKS and isinstance(f.value, ast.Name) and f.value.id == "time"
    return isinstance(f, ast.Name) and f.id in CLOCKS and f.id != "time"


def _reads_clock(node: ast.AST, tainted: set[str]) -> bool:
    """Whether ``node`` computes with a real clock's reading: a reading, or a name in
    ``tainted``, outside the arguments of another call (a deadline handed to the code under
    test is no duration claim)."""
    if _is_clock(node) or (isinstance(node, ast.Name) and node.id in tainted):
        return True
    if isinstance(node, ast.Call):
        return False
    return any(_reads_clock(child, tainted) for child in ast.iter_child_nodes(node))


def _targets(node: ast.AST) -> list[str]:
    """The plain names an assignment binds."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def timed_asserts(source: str) -> list[int]:
    """Lines of the ``assert`` statements of ``source`` that compute with a real clock's
    reading (:func:`_reads_clock`), each function read on its own."""
    tree = ast.parse(source)
    lines = []
    for scope in ast.walk(tree):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = list(ast.walk(scope))
        tainted: set[str] = set()
        while True:  # names bound to a reading, or to an expression of such names
            more = {name for n in body for name in _targets(n)
                    if getattr(n, "value", None) is not None
                    and _reads_clock(n.value, tainted)} - tainted  # type: ignore[attr-defined]
            if not more:
                break
            tainted |= more
        lines += [n.lineno for n in body
                  if isinstance(n, ast.Assert) and _reads_clock(n.test, tainted)]
    return sorted(set(lines))


def test_the_check_sees_a_timed_assert() -> None:
    source = ("import time\n"
              "def test_a():\n"
              "    start = time.perf_counter()\n"
              "    seconds = time.perf_counter() - start\n"
              "    assert seconds < 2.0\n"
              "def test_b():\n"
              "    assert time.monotonic() > 0\n"
              "def test_c(clock):\n"
              "    deadline = clock.now + 5\n"
              "    assert clock.now <= deadline\n"
              "    while time.monotonic() < 10:\n"
              "        pass\n"
              "    assert run(deadline=time.perf_counter() + 60)\n"
              "def test_d():\n"
              "    began = time.monotonic()\n"
              "    later = began + 1\n"
              "    assert later > 0 and run()\n")
    assert timed_asserts(source) == [5, 7, 17]


@pytest.mark.parametrize("path", sorted(TESTS.glob("*.py")), ids=lambda p: p.name)
def test_no_test_asserts_a_wall_clock_duration(path: Path) -> None:
    lines = timed_asserts(path.read_text(encoding="utf-8"))
    assert not lines, (f"{path.name}: lines {lines} assert a real clock's reading; keep the "
                       "limit on a fake clock (tests/clocks.py) or count steps")
