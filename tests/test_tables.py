"""Tables, access curves and table files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoshard.access import GRID, AccessCurve, expected_rows_used
from autoshard.errors import InputError
from autoshard.fileio import SCHEMA_VERSION
from autoshard.tables import REUSE_BINS, Table, load_tables, save_tables, with_stats

CURVE = AccessCurve((0.0, 0.01, 0.1, 0.5), (0.0, 0.6, 0.9, 1.0))
HIST = tuple([0.5, 0.25] + [0.25 / 15] * 15)


def full_table() -> Table:
    return Table("clicks", rows=10_000, dim=64, bytes_per_element=2, optimizer_bytes_per_row=8,
                 pooling_factor=12.5, pooling_std=3.0, coverage=0.75, rows_used=5000,
                 access_cdf=CURVE, reuse_hist=HIST)


def test_sizes_and_lookups() -> None:
    t = full_table()
    assert t.row_bytes == 128
    assert t.memory_bytes_per_row(train=True) == 136
    assert t.memory_bytes_per_row(train=False) == 128
    assert t.lookups_per_sample == pytest.approx(12.5 * 0.75)
    assert len(HIST) == REUSE_BINS


def test_access_source_and_curve() -> None:
    assert full_table().access_source == "measured"
    assert full_table().access_curve() is CURVE
    zipf = Table("z", rows=1000, dim=4, zipf_alpha=1.0)
    assert zipf.access_source == "zipf"
    uniform = Table("u", rows=1000, dim=4, rows_used=250)
    assert uniform.access_source == "uniform"
    assert uniform.access_curve().used_fraction == pytest.approx(0.25)
    assert float(uniform.access_curve().share_at(0.125)) == pytest.approx(0.5)


@pytest.mark.parametrize(("field", "value", "rule"), [
    ("rows", -5, r"integer in \[1, "), ("rows", 0, r"integer in \[1, "),
    ("dim", 2.5, r"integer in \[1, "), ("bytes_per_element", 3, "1, 2, 4 or 8"),
    ("coverage", 1.5, r"\(0, 1\]"), ("pooling_factor", float("nan"), r"in \(0, "),
    ("pooling_std", -1.0, r"in \[0, "), ("rows_used", 20_000, r"\[1, rows\]"),
    ("zipf_alpha", -0.1, r"in \[0, "), ("reuse_hist", (0.1,) * 3, "17 shares"),
])
def test_invalid_fields_name_table_field_and_value(field: str, value: object,
                                                    rule: str) -> None:
    with pytest.raises(InputError, match=rule) as info:
        with_stats(full_table(), **{field: value})
    assert info.value.field == f"clicks.{field}"
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_table_file_round_trip(tmp_path: Path, suffix: str) -> None:
    tables = (full_table(), Table("plain", rows=7, dim=3), Table("z", rows=9, dim=1,
                                                                  zipf_alpha=0.8))
    path = tmp_path / f"tables{suffix}"
    save_tables(path, tables)
    assert load_tables(path) == tables
    assert Table.from_dict(tables[0].to_dict()) == tables[0]
    if suffix == ".json":
        doc = json.loads(path.read_text())
        assert doc["schema_version"] == SCHEMA_VERSION and doc["kind"] == "tables"
        assert doc["tables"][1] == {"name": "plain", "rows": 7, "dim": 3}


def test_plain_list_and_yaml_numeric_name(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("- {name: 17, rows: 100, dim: 8}\n- {name: b, rows: '1e3', dim: 4}\n")
    a, b = load_tables(path)
    assert a.name == "17" and b.rows == 1000


def test_csv_tables(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    hist = ";".join(str(v) for v in HIST)
    path.write_text("name,rows,dim,pooling_factor,coverage,reuse_hist\n"
                    f"a,1000,16,2.5,,{hist}\n b , 20 ,8,,0.5,\n")
    a, b = load_tables(path)
    assert (a.rows, a.dim, a.pooling_factor, a.coverage) == (1000, 16, 2.5, 1.0)
    assert a.reuse_hist == pytest.approx(HIST)
    assert (b.name, b.rows, b.coverage) == ("b", 20, 0.5)


@pytest.mark.parametrize(("name", "text", "pieces"), [
    ("bad.json", "{not json", ["bad.json", "cannot parse"]),
    ("empty.json", "  \n", ["empty.json", "empty"]),
    ("v.json", '{"schema_version": 99, "tables": []}', ["schema_version", "99"]),
    ("k.json", '{"kind": "plan", "tables": []}', ["field 'kind'", "'plan'"]),
    ("none.json", "[]", ["none.json", "no tables"]),
    ("missing.json", '[{"name": "a", "dim": 4}]', ["missing.json", "'a.rows'", "missing"]),
    ("neg.json", '[{"name": "a", "rows": -3, "dim": 4}]', ["'a.rows'", "-3"]),
    ("str.json", '[{"name": "a", "rows": "lots", "dim": 4}]', ["'a.rows'", "'lots'"]),
    ("unk.json", '[{"name": "a", "rows": 3, "dim": 4, "colour": 1}]', ["'a.colour'"]),
    ("dup.json", '[{"name": "a", "rows": 3, "dim": 4}, {"name": "a", "rows": 3, "dim": 4}]',
     ["duplicate", "'a'"]),
    ("cdf.json", '[{"name": "a", "rows": 3, "dim": 4, "access_cdf": {"row_fraction": [0, 1]}}]',
     ["'a.access_cdf.lookup_share'", "missing"]),
    ("cdf2.json", '[{"name": "a", "rows": 3, "dim": 4, "access_cdf": '
     '{"row_fraction": [0, 0.5, 1], "lookup_share": [0, 0.9, 0.8]}}]',
     ["'a.access_cdf'", "must not decrease"]),
    ("hist.json", '[{"name": "a", "rows": 3, "dim": 4, "reuse_hist": [1, 2]}]',
     ["'a.reuse_hist'"]),
    ("notmap.json", '[5]', ["'tables[0]'", "mapping"]),
    ("wide.csv", "name,rows,dim\na,3,4,9\n", ["wide.csv", "line 2", "more values"]),
    ("neg.csv", "name,rows,dim\na,-3,4\n", ["neg.csv", "'a.rows'", "-3"]),
    ("nodim.csv", "name,rows\na,3\n", ["nodim.csv", "'a.dim'", "missing"]),
])
def test_bad_table_files_name_file_field_and_value(tmp_path: Path, name: str, text: str,
                                                    pieces: list[str]) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_tables(path)
    message = str(info.value)
    assert "\n" not in message
    for piece in [str(path), *pieces]:
        assert piece in message


def test_missing_and_undecodable_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="file not found"):
        load_tables(tmp_path / "nope.json")
    with pytest.raises(InputError, match="file not found"):
        load_tables(tmp_path / "nope.csv")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"name,rows,dim\n\xff\xfe,1,1\n")
    with pytest.raises(InputError, match="cannot read"):
        load_tables(binary)


def test_uniform_and_zipf_curves() -> None:
    u = AccessCurve.uniform()
    assert np.allclose(u.share_at(GRID), GRID)
    z = AccessCurve.zipf(1.2, 10**6)
    shares = z.on_grid()
    assert shares[0] == 0.0 and shares[-1] == 1.0 and np.all(np.diff(shares) >= 0)
    # alpha = 0 is uniform popularity.
    assert np.allclose(AccessCurve.zipf(0.0, 1000).on_grid(), GRID, atol=2e-3)
    # Zipf(1) over n rows: the hottest k serve H(k)/H(n); H(100)/H(10^4) = 5.187/9.788.
    assert float(AccessCurve.zipf(1.0, 10**4).share_at(0.01)) == pytest.approx(0.530, abs=2e-3)


def test_curve_from_counts() -> None:
    counts = np.array([0, 6, 0, 3, 1, 0, 0, 0, 0, 0])  # 3 used rows of 10
    c = AccessCurve.from_counts(counts, rows=10)
    assert c.used_fraction == pytest.approx(0.3)
    assert float(c.share_at(0.1)) == pytest.approx(0.6)
    assert float(c.share_at(0.2)) == pytest.approx(0.9)


def test_curve_validation() -> None:
    with pytest.raises(InputError, match="start at"):
        AccessCurve((0.1, 1.0), (0.0, 1.0))
    with pytest.raises(InputError, match="finite"):
        AccessCurve((0.0, float("nan"), 1.0), (0.0, 0.5, 1.0))
    with pytest.raises(InputError, match="end at 1"):
        AccessCurve((0.0, 1.0), (0.0, 0.5))
    # A share within rounding of 1 still marks the used rows.
    assert AccessCurve((0.0, 0.4), (0.0, 1 - 5e-7)).used_fraction == pytest.approx(0.4)


def test_birthday_paradox_rows_used() -> None:
    # Hashing n = H values into H rows touches 1 - 1/e of them, about 63%.
    assert float(expected_rows_used(10**6, 10**6)) / 10**6 == pytest.approx(1 - np.exp(-1),
                                                                          rel=1e-5)


def test_long_values_are_shortened_in_messages() -> None:
    with pytest.raises(InputError) as info:
        AccessCurve(tuple(np.linspace(0, 1, 50)), (0.0, *np.linspace(1, 0.5, 49)))
    assert "..." in str(info.value) and len(str(info.value)) < 200
