"""Readers: Meta's DLRM traces (plain and gzipped), Criteo files and CSV/Parquet columns,
with every bad-input path; the command line and the library give the same profile; a format is
one reader class and one registry line."""

from __future__ import annotations

import csv
import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import run_cli

import autoshard.stats.readers as readers
from autoshard.errors import InputError
from autoshard.stats import profile_columnar, profile_criteo, profile_file, profile_trace_file
from autoshard.stats.inputs import Piece
from autoshard.stats.partial import ProfileSchema, TableSchema
from autoshard.stats.readers import FilePlan, Reader, ScanOptions, Sink, detect_format
from autoshard.stats.readers.columnar import parse_hash_sizes
from autoshard.stats.readers.criteo import CATEGORICAL
from autoshard.stats.table_stats import TableProfile
from autoshard.tables import load_tables

CRITEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo_sample.txt"
needs_criteo = pytest.mark.skipif(not CRITEO.is_file(),
                                  reason=f"{CRITEO} absent (shared data not available)")

# Two tables, three samples: table 0 looks up {1, 1}, {}, {4}; table 1 {0}, {0, 2, 2}, {0}.
LENGTHS = [[2, 0, 1], [1, 3, 1]]
INDICES = [1, 1, 4, 0, 0, 2, 2, 0]


def write_trace(path: Path, indices: list[int], lengths: list[list[int]],
                offsets: list[int] | None = None) -> Path:
    flat = [n for row in lengths for n in row]
    offs = offsets if offsets is not None else [0, *np.cumsum(flat).tolist()]
    data = (torch.tensor(indices), torch.tensor(offs), torch.tensor(lengths))
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as fh:
            torch.save(data, fh)
    else:
        torch.save(data, path)
    return path


@pytest.mark.parametrize("name", ["trace.pt", "trace.pt.gz"])
def test_dlrm_trace(tmp_path: Path, name: str) -> None:
    path = write_trace(tmp_path / name, INDICES, LENGTHS)
    assert detect_format(path) == "dlrm"
    t0, t1 = profile_trace_file(path, [5, 3])
    assert (t0.hash_size, t0.lookups, t0.rows_used) == (5, 3, 2)
    assert t0.coverage == pytest.approx(2 / 3) and t0.pooling_factor == 1.5
    assert (t1.lookups, t1.rows_used, t1.coverage, t1.pooling_factor) == (5, 2, 1.0, 5 / 3)
    # table 1: row 0 used 3 times (bin 2), row 2 twice (bin 1)
    assert t1.reuse_rows[:3].tolist() == [0.0, 0.5, 0.5]
    assert t1.reuse_lookups[:3].tolist() == pytest.approx([0.0, 0.4, 0.6])
    undeclared = profile_trace_file(path)
    assert [p.hash_size for p in undeclared] == [5, 3]  # max index + 1


@pytest.mark.parametrize(("indices", "lengths", "offsets", "message"), [
    (INDICES, LENGTHS, [0, 2, 2, 3, 4, 5, 8], "lengths disagree with offsets at table 1"),
    ([1, 1, -4, 0, 0, 2, 2, 0], LENGTHS, None, "negative index in table 0 at position 2"),
    ([1, 1, 4, 0, 0, 2, 3, 0], LENGTHS, None, "index >= hash size 3 in table 1 at position 6"),
    (INDICES, LENGTHS, [0, 2, 2, 3], "offsets must have"),
])
def test_dlrm_bad_trace(tmp_path: Path, indices: list[int], lengths: list[list[int]],
                        offsets: list[int] | None, message: str) -> None:
    path = write_trace(tmp_path / "bad.pt", indices, lengths, offsets)
    with pytest.raises(InputError, match=message) as err:
        profile_trace_file(path, [5, 3])
    assert str(path) in str(err.value)


@pytest.mark.parametrize("name", ["trace.pt", "trace.pt.gz"])
def test_dlrm_empty_and_truncated(tmp_path: Path, name: str) -> None:
    empty = tmp_path / ("empty" + name)
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="file is empty"):
        profile_trace_file(empty)
    whole = write_trace(tmp_path / name, INDICES, LENGTHS).read_bytes()
    cut = tmp_path / ("cut" + name)
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match="truncated") as err:
        profile_trace_file(cut)
    assert str(cut) in str(err.value)


def test_dlrm_wrong_content(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"indices": torch.tensor([1])}, path)
    with pytest.raises(InputError, match="expected"):
        profile_trace_file(path)


@needs_criteo
def test_criteo_sample_against_independent_count() -> None:
    hash_size = 1000
    profiles = profile_criteo(CRITEO, hash_size=hash_size)
    assert [p.name for p in profiles] == list(CATEGORICAL)
    import pandas as pd

    with CRITEO.open(newline="") as fh:
        records = list(csv.DictReader(fh))
    assert len(records) == 200
    for p in profiles:
        values = [r[p.name] for r in records if r[p.name] != ""]
        hashed = pd.util.hash_array(np.array(values, dtype=object)) % np.uint64(hash_size)
        counts = Counter(hashed.tolist())
        assert p.samples == 200 and p.lookups == len(values)
        assert p.coverage == pytest.approx(len(values) / 200)
        assert p.rows_used == len(counts)
        assert p.draws == len(set(values))
        once = sum(1 for c in counts.values() if c == 1)
        assert p.reuse_rows[0] == pytest.approx(once / len(counts))
        top = max(counts.values())
        assert p.to_table().access_curve().share_at(1 / hash_size) == pytest.approx(
            top / len(values), abs=1e-6)


@needs_criteo
def test_criteo_tab_separated_without_header(tmp_path: Path) -> None:
    lines = CRITEO.read_text().splitlines()[1:]
    tsv = tmp_path / "day_0"
    tsv.write_text("\n".join(line.replace(",", "\t") for line in lines) + "\n")
    assert detect_format(tsv) == "criteo"
    a = profile_criteo(CRITEO, hash_size="1000,C3=50")
    b = profile_file(tsv, hash_size="1000,C3=50")
    assert [p.summary() for p in a] == [p.summary() for p in b]
    assert b[2].hash_size == 50 and b[3].hash_size == 1000


def test_criteo_truncated_row(tmp_path: Path) -> None:
    header = "label," + ",".join([f"I{i}" for i in range(1, 14)] + list(CATEGORICAL))
    row = "0," + ",".join(["1"] * 13 + ["ab"] * 26)
    path = tmp_path / "c.csv"
    path.write_text(f"{header}\n{row}\n{row[:20]}")
    with pytest.raises(InputError, match="malformed or truncated") as err:
        profile_criteo(path)
    assert str(path) in str(err.value)


def test_hash_size_spec() -> None:
    assert parse_hash_sizes("10,b=3", ["a", "b"], None) == [10, 3]
    assert parse_hash_sizes(None, ["a"], 7) == [7]
    with pytest.raises(InputError, match="unknown column"):
        parse_hash_sizes("zz=3", ["a", "b"], None)
    with pytest.raises(InputError, match="integer"):
        parse_hash_sizes("a=x", ["a"], None)


def test_csv_multi_hot_and_missing(tmp_path: Path) -> None:
    path = tmp_path / "f.csv"
    path.write_text("user,tags\nu1,a|b|c\nu2,\nu1,a\n")
    user, tags = profile_columnar(path, hash_size=100)
    assert (user.lookups, user.coverage, user.draws) == (3, 1.0, 2)
    assert tags.lookups == 4 and tags.coverage == pytest.approx(2 / 3)
    assert tags.pooling_factor == 2.0 and tags.draws == 3
    with pytest.raises(InputError, match="unknown column") as err:
        profile_columnar(path, columns=["user", "nope"])
    assert "nope" in str(err.value)


def test_csv_ids_out_of_range(tmp_path: Path) -> None:
    path = tmp_path / "ids.csv"
    path.write_text("a\n1\n2\n9\n")
    assert profile_columnar(path, ids=True)[0].hash_size == 10
    with pytest.raises(InputError, match="row id >= hash size 5 in column a at data row 3"):
        profile_columnar(path, ids=True, hash_size="5")
    path.write_text("a\n1\n-2\n")
    with pytest.raises(InputError, match="negative row id in column a at data row 2"):
        profile_columnar(path, ids=True)


def test_parquet_list_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"hist": pa.array([[1, 2], None, [2, 2, 7]]),
                             "city": pa.array(["x", "y", None])}), path)
    hist, city = profile_file(path)
    assert (hist.hash_size, hist.lookups, hist.rows_used) == (8, 5, 3)  # ids as they are
    assert hist.coverage == pytest.approx(2 / 3) and hist.pooling_factor == 2.5
    assert city.lookups == 2 and city.draws == 2
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(path.read_bytes()[:40])
    with pytest.raises(InputError, match="Parquet"):
        profile_file(bad)


def test_empty_columnar(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("")
    with pytest.raises(InputError, match="empty"):
        profile_columnar(path)
    path.write_text("a,b\n")
    with pytest.raises(InputError, match="no data rows"):
        profile_columnar(path)


@pytest.mark.parametrize(("lengths", "what"), [([[], []], "no samples"),
                                                ([[0, 0], [0, 0]], "no lookups")])
def test_dlrm_trace_without_lookups_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                lengths: list[list[int]], what: str) -> None:
    from cli_helpers import run_cli

    from autoshard.tables import Table, save_tables

    path = tmp_path / "trace.pt"
    data = (torch.zeros(0, dtype=torch.int64), torch.zeros(len(lengths) * len(lengths[0]) + 1,
            dtype=torch.int64), torch.tensor(lengths, dtype=torch.int64).reshape(2, -1))
    torch.save(data, path)
    with pytest.raises(InputError, match=what) as err:
        profile_trace_file(path, [5, 3])
    assert err.value.source == str(path)
    given = tmp_path / "given.json"
    save_tables(given, [Table("a", 5, 4, pooling_factor=7.0), Table("b", 3, 4)])
    out = tmp_path / "measured.json"
    code, _, stderr = run_cli(["profile", str(path), "--table-file", str(given), "-o", str(out)],
                              capsys)
    assert code == 2 and str(path) in stderr and what in stderr, stderr
    assert not out.exists()


def _old_library_profiles(path: Path, hash_size: int) -> list[TableProfile]:
    """What the in-memory profilers the library used before it shared the scan gave: whole
    tables of a trace through ``profile_table``, CSV batches through a ``CountAccumulator``."""
    from autoshard.stats.readers.columnar import CsvLayout, column_plan, csv_batches, iter_lookups
    from autoshard.stats.readers.dlrm import iter_tables, load_trace
    from autoshard.stats.table_stats import CountAccumulator, ExactDistinct, profile_table

    if path.suffix == ".pt":
        return [profile_table(f"t{t}", idx, lengths, size) for t, idx, lengths, size
                in iter_tables(load_trace(path), [hash_size] * 2)]
    plan = column_plan(path, hash_size=hash_size)
    acc = CountAccumulator(plan.names, plan.hash_sizes)
    distinct = [ExactDistinct() for _ in plan.names]
    for table, idx, lengths, hashes in iter_lookups(csv_batches(path, list(plan.names),
                                                                CsvLayout()), plan, str(path)):
        acc.add(table, idx, lengths)
        distinct[table].add(hashes)
    return acc.result([d.count() for d in distinct])


@pytest.mark.parametrize("name", ["trace.pt", "f.csv"])
def test_the_cli_and_the_library_give_the_same_profile(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        name: str) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / name
    if name.endswith(".pt"):
        write_trace(path, INDICES, LENGTHS)
        library = profile_trace_file(path, 5)
    else:
        path.write_text("user,tags\nu1,a|b|c\nu2,\nu1,a\n")
        library = profile_columnar(path, hash_size=5)
    code, _, err = run_cli(["profile", str(path), "--hash-size", "5", "-o", "t.json",
                            "--report", "r.json"], capsys)
    assert code == 0, err
    cli = [t.to_dict() for t in load_tables(tmp_path / "t.json")]
    assert cli == [p.to_table().to_dict() for p in library]
    assert cli == [p.to_table().to_dict() for p in _old_library_profiles(path, 5)]
    details = json.loads((tmp_path / "r.json").read_text())["tables"]
    assert details == [p.summary() for p in library]
    lookups = [3, 5] if name.endswith(".pt") else [3, 4]
    assert [t["lookups"] for t in details] == lookups


def test_an_unknown_format_lists_the_registered_ones(tmp_path: Path) -> None:
    from autoshard.stats.readers import get_reader, reader_names

    assert {"dlrm", "criteo", "columnar"} <= set(reader_names())
    with pytest.raises(InputError, match="unknown format") as err:
        get_reader("nope")
    assert all(name in str(err.value) for name in reader_names())
    with pytest.raises(InputError, match="unknown format") as err:
        profile_file(write_trace(tmp_path / "t.pt", INDICES, LENGTHS), fmt="nope")


class PairsReader(Reader):
    """A format known only to this test: each line ``LEFT RIGHT``, a row id of two tables."""

    suffixes = (".pairs",)

    def tables(self, path: Path, options: ScanOptions, list_sep: str,
               first: tuple[TableSchema, ...] | None) -> tuple[None, tuple[TableSchema, ...]]:
        return None, (TableSchema("left", None, False, False),
                      TableSchema("right", None, False, False))

    def scan(self, file: FilePlan, piece: Piece, schema: ProfileSchema, sink: Sink) -> None:
        rows = np.loadtxt(file.path, dtype=np.int64, ndmin=2)
        for table in range(2):
            sink.add(table, rows[:, table], np.ones(len(rows), np.int64))


def test_a_format_is_one_module_and_one_registry_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(readers._ENTRIES, "pairs", f"{__name__}:PairsReader")  # the one line
    path = tmp_path / "data.pairs"
    path.write_text("1 5\n1 0\n3 5\n1 5\n")
    assert readers.detect_format(path) == "pairs"
    code, _, err = run_cli(["profile", str(path), "-o", "t.json"], capsys)
    assert code == 0, err
    left, right = load_tables(tmp_path / "t.json")
    assert (left.name, left.rows, left.rows_used, left.pooling_factor) == ("left", 4, 2, 1.0)
    assert (right.name, right.rows, right.rows_used, right.coverage) == ("right", 6, 2, 1.0)
    # the hottest row of each table (1 on the left, 5 on the right) serves 3 of 4 lookups
    assert left.access_curve().share_at(1 / 4) == pytest.approx(0.75)
    assert right.access_curve().share_at(1 / 6) == pytest.approx(0.75)
    other = tmp_path / "data.txt"
    other.write_text("2 2\n")
    code, _, err = run_cli(["profile", str(other), "--format", "pairs", "-o", "u.json"], capsys)
    assert code == 0 and [t.rows for t in load_tables(tmp_path / "u.json")] == [3, 3], err
