"""The Python blocks of docs/library.md run as written, in order, from an empty folder.

(tests/test_docs_commands.py checks the shell commands of every page; this runs the page that
shows the library from Python.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "library.md"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, code) of each fenced block marked ``python``."""
    out = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        out.append((text[:match.start()].count("\n") + 2, match.group(1)))
    return out


def test_the_page_has_python_blocks_and_the_reader_finds_them() -> None:
    blocks = python_blocks("text\n```python\nx = 1\n```\n```bash\nls\n```\n")
    assert blocks == [(3, "x = 1\n")]
    assert len(python_blocks(PAGE.read_text())) >= 4


@pytest.mark.slow
def test_every_python_block_of_the_library_page_runs(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "docs_library"}
    for line, code in python_blocks(PAGE.read_text()):
        try:
            exec(compile(code, f"{PAGE}:{line}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{PAGE.name}, block at line {line}: {exc!r}") from exc
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]  # nothing beside runs/
    assert {p.name for p in (tmp_path / "runs").iterdir()} == {
        "library_tables.yaml", "library_plan.json", "library_torchrec_plan.json"}
