"""Many inputs, one profile: files at once, one by one then merged, and concatenated give the same
table file; partial profiles merge only when they describe the same tables; bad inputs exit 2
naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli

from autoshard.errors import InputError
from autoshard.stats.partial import load_partial

CATS = [f"C{i}" for i in range(1, 27)]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs each test in its own folder, so default parts folders (runs/) land there."""
    monkeypatch.chdir(tmp_path)


def criteo_lines(rows: int, seed: int, values: int = 3000) -> list[str]:
    """Criteo-format lines (label, I1-I13, C1-C26, tab-separated): Zipf-like hex values, some
    missing."""
    rng = np.random.default_rng(seed)
    cats = rng.zipf(1.3, (rows, 26)) % values
    missing = rng.random((rows, 26)) < 0.05
    dense = rng.integers(0, 50, (rows, 13))
    return ["\t".join([str(i % 2), *map(str, dense[i]),
                       *("" if missing[i, c] else f"{cats[i, c]:08x}" for c in range(26))])
            for i in range(rows)]


def write_days(folder: Path, days: int = 3, rows: int = 1500) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for day in range(days):
        path = folder / f"day_{day}"
        path.write_text("\n".join(criteo_lines(rows, seed=day)) + "\n")
        paths.append(path)
    return paths


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    return out


def test_files_at_once_one_by_one_merged_and_concatenated_are_identical(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    days = write_days(tmp_path / "data")
    whole = tmp_path / "all.tsv"
    whole.write_text("".join(p.read_text() for p in days))
    opts = ["--hash-size", "2000,C3=300", "--jobs", "1", "--json"]
    cli(["profile", str(tmp_path / "data"), "-o", str(tmp_path / "folder.json"), *opts], capsys)
    cli(["profile", str(tmp_path / "data" / "day_*"), "-o", str(tmp_path / "glob.json"),
         *opts], capsys)
    cli(["profile", str(whole), "-o", str(tmp_path / "cat.json"), *opts], capsys)
    # the concatenation cut into pieces of ~0.1 MB is still the same count
    cli(["profile", str(whole), "-o", str(tmp_path / "pieces.json"), "--piece-mb", "1",
         *opts], capsys)
    partials = []
    for day in days:
        partials.append(str(tmp_path / f"{day.name}.npz"))
        cli(["profile", str(day), "-o", str(tmp_path / "one.json"), "--save-partial",
             partials[-1], *opts], capsys)
    cli(["profile", "merge", *partials, "-o", str(tmp_path / "merged.json"), "--json"], capsys)
    reference = (tmp_path / "cat.json").read_bytes()
    for name in ("folder", "glob", "pieces", "merged"):
        assert (tmp_path / f"{name}.json").read_bytes() == reference, name
    tables = json.loads(reference)["tables"]
    assert [t["name"] for t in tables] == CATS and tables[2]["rows"] == 300
    merged = load_partial(partials[0]).merge(load_partial(partials[1]))
    assert merged.tables[0].lookups == sum(load_partial(p).tables[0].lookups
                                           for p in partials[:2])


def test_pieces_of_one_file_cover_each_line_once(tmp_path: Path) -> None:
    from autoshard.stats.inputs import fingerprint, text_pieces

    path = tmp_path / "lines.txt"
    path.write_text("".join(f"{i:0{i % 7 + 1}d}\n" for i in range(2000)))
    pieces = text_pieces(path, 0, 1000, fingerprint(path))
    assert len(pieces) > 5
    data = path.read_bytes()
    chunks = [data[p.start:p.stop] for p in pieces]
    assert b"".join(chunks) == data and all(c.endswith(b"\n") for c in chunks)


def test_a_mix_of_criteo_and_parquet_equals_their_concatenation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    first, second = criteo_lines(800, seed=5), criteo_lines(700, seed=6)
    (tmp_path / "mix").mkdir()
    (tmp_path / "mix" / "a.tsv").write_text("\n".join(first) + "\n")
    cells = [line.split("\t") for line in second]
    pq.write_table(pa.table({c: [row[14 + i] or None for row in cells]
                             for i, c in enumerate(CATS)}), tmp_path / "mix" / "b.parquet",
                   row_group_size=200)
    (tmp_path / "cat.tsv").write_text("\n".join(first + second) + "\n")
    opts = ["--hash-size", "5000", "--jobs", "1", "--json"]
    cli(["profile", str(tmp_path / "mix"), "-o", str(tmp_path / "mix.json"), *opts], capsys)
    cli(["profile", str(tmp_path / "cat.tsv"), "-o", str(tmp_path / "cat.json"), *opts], capsys)
    assert (tmp_path / "mix.json").read_bytes() == (tmp_path / "cat.json").read_bytes()


def test_dlrm_traces_merge_like_one_trace_of_all_samples(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autoshard.stats.readers.dlrm import save_trace

    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, (3, 400))
    indices = [rng.integers(0, 50 * (t + 1), int(lengths[t].sum())) for t in range(3)]
    halves = []
    for h, cols in enumerate((slice(0, 150), slice(150, 400))):
        part = lengths[:, cols]
        flat = np.concatenate([idx[lengths[t, :cols.start].sum():
                                   lengths[t, :cols.stop].sum()]
                               for t, idx in enumerate(indices)])
        path = tmp_path / f"half{h}.pt"
        save_trace(path, flat, np.concatenate(([0], np.cumsum(part.reshape(-1)))), part)
        halves.append(str(path))
    whole = tmp_path / "whole.pt"
    save_trace(whole, np.concatenate(indices),
               np.concatenate(([0], np.cumsum(lengths.reshape(-1)))), lengths)
    opts = ["--hash-size", "200", "--jobs", "1"]  # the merge, not the processes (test_stats_engine)
    cli(["profile", *halves, *opts, "-o", str(tmp_path / "two.json"), "--json"], capsys)
    cli(["profile", str(whole), *opts, "-o", str(tmp_path / "one.json"), "--json"], capsys)
    assert (tmp_path / "two.json").read_bytes() == (tmp_path / "one.json").read_bytes()
    fewer = tmp_path / "z_fewer.pt"  # sorts after the halves, whose tables come first
    save_trace(fewer, np.array([0, 1]), np.array([0, 1, 2]), np.array([[1], [1]]))
    _rejected(["profile", *halves, str(fewer), *opts, "-o", str(tmp_path / "x.json"),
               "--parts", str(tmp_path / "parts")], capsys,
              str(fewer), "field 'lengths'", "2 tables, expected 3")


def _rejected(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    code, _, err = run_cli(argv, capsys)
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_bad_inputs_exit_2_naming_the_file_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, parts = tmp_path / "out.json", tmp_path / "parts"
    (tmp_path / "empty").mkdir()
    _rejected(["profile", str(tmp_path / "empty"), "-o", str(out)], capsys,
              str(tmp_path / "empty"), "folder holds no file")
    _rejected(["profile", str(tmp_path / "nothing_*.tsv"), "-o", str(out)], capsys,
              "nothing_*.tsv", "glob matches no file")
    _rejected(["profile", str(tmp_path / "missing.tsv"), "-o", str(out)], capsys,
              "missing.tsv", "file not found")
    _rejected(["profile", str(tmp_path), "--engine", "spark", "-o", str(out)], capsys,
              "--engine", "local, dask")
    write_days(tmp_path / "data", days=1, rows=50)
    other = tmp_path / "data" / "z.csv"
    other.write_text("user,item\nu1,i1\n")
    _rejected(["profile", str(tmp_path / "data"), "-o", str(out), "--parts", str(parts)],
              capsys, str(other), "field 'tables'", "other tables")
    assert not out.exists() and not parts.exists()


def test_columns_of_another_kind_are_another_schema(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"item": pa.array([1, 2, 3])}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"item": pa.array(["x", "y", "z"])}), tmp_path / "b.parquet")
    _rejected(["profile", str(tmp_path / "*.parquet"), "--hash-size", "10", "-o",
               str(tmp_path / "o.json")], capsys, "b.parquet", "item.hashed")


def test_partials_of_other_tables_or_hash_sizes_or_the_same_input_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (day,) = write_days(tmp_path / "data", days=1, rows=100)
    small, large, few = (tmp_path / f"{n}.npz" for n in ("small", "large", "few"))
    for path, opts in ((small, ["--hash-size", "100"]), (large, ["--hash-size", "200"]),
                       (few, ["--hash-size", "100", "--columns", "C1,C2"])):
        cli(["profile", str(day), *opts, "-o", str(tmp_path / "t.json"), "--save-partial",
             str(path), "--json"], capsys)
    out = tmp_path / "merged.json"
    _rejected(["profile", "merge", str(small), str(large), "-o", str(out)], capsys,
              str(large), "C1.hash_size", "100")
    _rejected(["profile", "merge", str(small), str(few), "-o", str(out)], capsys, str(few),
              "field 'tables'")
    _rejected(["profile", "merge", str(small), str(small), "-o", str(out)], capsys,
              "covered twice", str(day))
    _rejected(["profile", "merge", str(small), "--hash-size", "3", "-o", str(out)], capsys,
              "--hash-size", "not used by `profile merge`")
    assert not out.exists()


def test_partial_profiles_are_versioned_and_never_unpickled(tmp_path: Path) -> None:
    (day,) = write_days(tmp_path / "data", days=1, rows=100)
    from autoshard.stats.inputs import expand_inputs
    from autoshard.stats.scan import ScanOptions, plan_scan, scan_piece

    plan = plan_scan(expand_inputs([str(day)]), ScanOptions(hash_size="100"))
    part = scan_piece(plan, plan.pieces[0])
    good = tmp_path / "good.npz"
    part.save(good)
    with np.load(good, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays["meta"].tobytes())
    assert meta["kind"] == "partial-profile" and meta["schema_version"] == 1
    assert meta["tables"][0] == {"name": "C1", "hash_size": 100, "hashed": True,
                                 "sketched": False}
    assert meta["pieces"][0]["path"] == str(day) and len(meta["pieces"][0]["file_id"]) == 24
    newer = tmp_path / "newer.npz"
    np.savez(newer, **{**arrays, "meta": np.frombuffer(
        json.dumps({**meta, "schema_version": 99}).encode(), np.uint8)})
    with pytest.raises(InputError, match="unsupported schema version") as err:
        load_partial(newer)
    assert err.value.source == str(newer)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, meta=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(InputError, match="not a partial profile"):
        load_partial(pickled)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, **{**arrays, "0.counts": arrays["0.counts"] + 1})
    with pytest.raises(InputError, match="row counts add up") as err:
        load_partial(wrong)
    assert err.value.field == "C1.lookups"
