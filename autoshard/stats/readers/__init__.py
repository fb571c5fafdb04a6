"""Input formats: each is a :class:`Reader`, found through one registry by name. A new format is
one module and one line in ``_ENTRIES``.

Entries are ``module:Class`` strings, imported only when used (the DLRM reader needs torch, the
others pyarrow). A reader answers four questions about a file: how surely it is in the reader's
format (:meth:`Reader.detect`), which tables it holds (:meth:`Reader.tables`, from its header or
first lines only), how it is cut into pieces (:meth:`Reader.pieces`) and what one piece holds
(:meth:`Reader.scan`, which hands each chunk of lookups to a :class:`Sink`). Everything else,
one schema for all files, counting modes, workers, resume and merging, is the scan's
(:mod:`autoshard.stats.scan`) and the engine's (:mod:`autoshard.stats.engine`), the same for
every format.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from autoshard.errors import InputError, PlannerError
from autoshard.stats.inputs import Piece, fingerprint
from autoshard.stats.partial import ProfileSchema, TableSchema

_ENTRIES: dict[str, str] = {
    "dlrm": "autoshard.stats.readers.dlrm:TraceReader",
    "criteo": "autoshard.stats.readers.criteo:CriteoReader",
    "columnar": "autoshard.stats.readers.columnar:ColumnarReader",
    "ndjson": "autoshard.stats.readers.ndjson:JsonLinesReader",
}

#: Scores of :meth:`Reader.detect`: a file a reader knows by its name (suffix), by its first
#: line, any file at all (the catch-all), or not at all. The highest score wins; a tie goes to
#: the reader registered first.
BY_NAME, BY_CONTENT, ANY_FILE, NOT_MINE = 100, 50, 1, 0
#: Separator of the values of a multi-hot text cell (``a|b|c``), unless a format among the inputs
#: keeps cells whole (:attr:`Reader.keeps_cells_whole`).
LIST_SEP = "|"


@dataclass(frozen=True)
class ScanOptions:
    """How to read the inputs (the ``profile`` command's options).

    Args:
        fmt: A registered format (:func:`reader_names`); detected per file when None.
        hash_size: Rows per table: ``N`` for all, ``COL=N,...`` per column, or both (a DLRM
            trace takes one global ``N``).
        hash_sizes: DLRM: rows per table (from a table file).
        names: DLRM: table names (from a table file).
        columns: The categorical columns (features) to read; None: the format's default (all,
            or Criteo's C1-C26).
        ids: Every column holds row ids: none is hashed (formats of raw values and ids).
        memory_bytes: Memory for exact counts per process; larger tables are sketched.
        piece_bytes: About how many bytes of input one piece covers.
    """

    fmt: str | None = None
    hash_size: str | None = None
    hash_sizes: tuple[int, ...] | None = None
    names: tuple[str, ...] | None = None
    columns: tuple[str, ...] | None = None
    ids: bool = False
    memory_bytes: int = 8 << 30
    piece_bytes: int = 256 << 20


@dataclass(frozen=True)
class FilePlan:
    """How one input file is read.

    Args:
        path: The file.
        fmt: Its format (a registry name).
        layout: What its reader found in the header and needs to read any piece (a CSV file's
            delimiter and column names, say): a small frozen value, or None.
    """

    path: str
    fmt: str
    layout: Any = None


class Sink(Protocol):
    """Where a reader puts the lookups of a piece
    (:class:`autoshard.stats.scan.PartialAccumulator`)."""

    def add(self, table: int, indices: np.ndarray, lengths: np.ndarray) -> None:
        """Adds a chunk of samples of a table: their row ids (checked to lie in the table,
        in sample order) and the lookups of each sample."""

    def add_raw(self, table: int, hashes: np.ndarray) -> None:
        """Adds the 64-bit hashes of the raw values of a chunk of a hashed table (for the
        distinct raw values hashed into it)."""


class Reader(Protocol):
    """One input format. Subclass it to inherit the defaults: detection by :attr:`suffixes`,
    and each file one piece.

    A reader is made with no arguments and holds no state: the plan a worker gets carries all
    it needs (:class:`FilePlan`, the schema).
    """

    #: File name endings (lower case) that mark the format, for the default :meth:`detect`.
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: Whether the format's text cells are whole values (Criteo): with a file of it among the
    #: inputs, no file's cells are split into multi-hot values at :data:`LIST_SEP`.
    keeps_cells_whole: ClassVar[bool] = False

    def detect(self, path: Path) -> int:
        """How surely ``path`` is in this format: :data:`BY_NAME`, :data:`BY_CONTENT`,
        :data:`ANY_FILE` or :data:`NOT_MINE`. Never raises (an unreadable file is not mine)."""
        return BY_NAME if path.name.lower().endswith(self.suffixes) else NOT_MINE

    def tables(self, path: Path, options: ScanOptions, list_sep: str,
               first: tuple[TableSchema, ...] | None) -> tuple[Any, tuple[TableSchema, ...]]:
        """The file's :attr:`FilePlan.layout` and tables (counting modes not decided yet), from
        its header or first lines only.

        Args:
            path: The file.
            options: How to read the inputs.
            list_sep: The separator of multi-hot text cells for this dataset ("" for none).
            first: The tables of the dataset's first file of this format (None for that file):
                a reader that would have to read a whole file to find its tables may take
                these, and check them when it counts the file.

        Raises:
            InputError: A missing, empty or unreadable file, or an unknown column.
        """
        ...

    def pieces(self, file: FilePlan, piece_bytes: int) -> list[Piece]:
        """The pieces of about ``piece_bytes`` each that workers count independently (by
        default the whole file, one piece)."""
        path = Path(file.path)
        return [Piece(file.path, 0, -1, path.stat().st_size, fingerprint(path))]

    def scan(self, file: FilePlan, piece: Piece, schema: ProfileSchema, sink: Sink) -> None:
        """Hands every lookup of ``piece`` to ``sink``, table by table as ``schema`` lists them.

        Raises:
            InputError: Bad data in the piece (names the file, the table or column and the
                row). A piece without samples is refused by the scan, for every format.
        """
        ...


def reader_names() -> list[str]:
    """The registered formats, in detection order for ties."""
    return list(_ENTRIES)


def get_reader(name: str) -> Reader:
    """The reader of format ``name``.

    Raises:
        InputError: Unknown format (the message lists the registered ones).
        PlannerError: The reader's module cannot be imported here.
    """
    if name not in _ENTRIES:
        raise InputError(f"unknown format (known: {', '.join(_ENTRIES)})", field="format",
                         value=name)
    module, _, attr = _ENTRIES[name].partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise PlannerError("unavailable", f"format '{name}' is unavailable: cannot load "
                           f"{_ENTRIES[name]} ({exc})") from exc
    reader: Reader = cls()
    return reader


def detect_format(path: str | Path) -> str:
    """The format whose reader claims ``path`` most surely (:meth:`Reader.detect`).

    Raises:
        InputError: No reader claims the file.
    """
    path = Path(path)
    best, score = None, NOT_MINE
    for name in _ENTRIES:
        found = get_reader(name).detect(path)
        if found > score:
            best, score = name, found
    if best is None:
        raise InputError(f"unknown format (known: {', '.join(_ENTRIES)}; name one with "
                         "--format)", source=str(path), field="format")
    return best


def list_separator(readers: Iterable[Reader]) -> str:
    """The separator of multi-hot text cells for a dataset read by ``readers``: none when one of
    them keeps cells whole, else :data:`LIST_SEP`."""
    return "" if any(r.keeps_cells_whole for r in readers) else LIST_SEP
