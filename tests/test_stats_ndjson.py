"""The newline-delimited JSON reader: detection, a profile counted by hand, the same hashing as
the CSV reader, bad lines named by file, line and value, pieces that add up to the whole file,
and ``autoshard profile data.ndjson`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli

from autoshard.errors import InputError
from autoshard.stats import profile_columnar, profile_file
from autoshard.stats.engine import EngineOptions, run_plan
from autoshard.stats.readers import detect_format
from autoshard.stats.scan import ScanOptions, plan_scan
from autoshard.tables import load_tables

# Five lines, four samples (the blank line is none):
#   user (raw values, hashed): u1, u2, u1, missing ("")   -> 3 lookups, 2 distinct values
#   item (row ids):            3, [1, 3], missing, null   -> 3 lookups on rows {1, 3}
#   tags (raw values, hashed): [a, b], [], a, missing     -> 3 lookups, 2 distinct values
#   extra (row ids):           only in the third sample   -> 1 lookup
HAND = [{"user": "u1", "item": 3, "tags": ["a", "b"]},
        {"user": "u2", "item": [1, 3], "tags": []},
        None,
        {"user": "u1", "tags": "a", "extra": 7},
        {"user": "", "item": None}]


def write_lines(path: Path, samples: list[dict[str, object] | None]) -> Path:
    path.write_text("".join(("" if s is None else json.dumps(s)) + "\n" for s in samples))
    return path


@pytest.mark.parametrize(("name", "fmt"), [("data.ndjson", "ndjson"), ("DATA.JSONL", "ndjson"),
                                           ("data.json", "columnar")])
def test_detected_by_suffix(tmp_path: Path, name: str, fmt: str) -> None:
    assert detect_format(write_lines(tmp_path / name, HAND)) == fmt


def test_hand_counted_profile(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "data.ndjson", HAND)
    user, item, tags, extra = profile_file(path, hash_size="100")
    assert [p.name for p in (user, item, tags, extra)] == ["user", "item", "tags", "extra"]
    assert (user.samples, user.present, user.lookups, user.draws) == (4, 3, 3, 2)
    assert (user.hash_size, user.rows_used) == (100, 2)  # u1 and u2 land on distinct rows
    assert (item.hash_size, item.lookups, item.rows_used, item.draws) == (100, 3, 2, None)
    assert (item.coverage, item.pooling_factor, item.pooling_std) == (0.5, 1.5, 0.5)
    assert item.counts.times.tolist() == [2, 1]  # row 3 twice, row 1 once
    assert (tags.present, tags.lookups, tags.draws, tags.pooling_factor) == (2, 3, 2, 1.5)
    assert (extra.present, extra.lookups, extra.rows_used) == (1, 1, 1)
    undeclared = profile_file(path, columns=["item", "extra"])
    assert [p.hash_size for p in undeclared] == [4, 8]  # row ids: the largest + 1


def test_raw_values_hashed_as_the_csv_reader_hashes_them(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "data.ndjson", HAND)
    csv = tmp_path / "same.csv"
    csv.write_text("user,tags\nu1,a|b\nu2,\nu1,a\n,\n")
    ours = profile_file(path, hash_size="7", columns=["user", "tags"])
    theirs = profile_columnar(csv, hash_size=7)
    assert [p.to_table().to_dict() for p in ours] == [p.to_table().to_dict() for p in theirs]
    assert [p.draws for p in ours] == [p.draws for p in theirs] == [2, 2]


@pytest.mark.parametrize(("line", "field", "message"), [
    ('{"user": u2}', "line 3", "not JSON"),
    ('["u2"]', "line 3", "not a JSON object"),
    ('{"user": "u2", "item": 1.5}', "item", "not an id or a list of ids"),
    ('{"user": "u2", "item": [[1]]}', "item", "not an id or a list of ids"),
    ('{"user": "u2", "item": "x"}', "item", "not an integer row id in column item at line 3"),
    ('{"user": "u2", "item": 9}', "item", "row id >= hash size 5 in column item at line 3"),
])
def test_a_bad_line_is_named_by_file_line_and_value(tmp_path: Path, line: str, field: str,
                                                    message: str) -> None:
    path = tmp_path / "bad.ndjson"
    path.write_text('{"user": "u1", "item": 3}\n\n' + line + "\n")
    with pytest.raises(InputError, match=message) as err:
        profile_file(path, hash_size="100,item=5")
    assert (err.value.source, err.value.field) == (str(path), field)
    if field.startswith("line"):
        assert err.value.value == line


def random_lines(rows: int, seed: int) -> list[dict[str, object] | None]:
    """Samples with a hashed feature, a multi-hot row-id feature, missing values and blanks."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, object] | None] = []
    for i in range(rows):
        sample: dict[str, object] = {"user": f"u{rng.zipf(1.5) % 500}",
                                     "items": rng.integers(0, 300, rng.integers(0, 4)).tolist()}
        if rng.random() < 0.3:
            sample["city"] = f"c{rng.integers(0, 40)}"
        out += [sample] if i % 97 else [sample, None]
    return out


def test_pieces_add_up_to_the_whole_file(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "data.ndjson", random_lines(3000, seed=1))
    whole = plan_scan([path], ScanOptions(hash_size="1000"))
    cut = plan_scan([path], ScanOptions(hash_size="1000", piece_bytes=10_000))
    assert len(whole.pieces) == 1 and len(cut.pieces) > 5
    one, many = (run_plan(plan, EngineOptions()).profiles() for plan in (whole, cut))
    assert [p.summary() for p in many] == [p.summary() for p in one]
    assert [p.to_table().to_dict() for p in many] == [p.to_table().to_dict() for p in one]
    assert [p.draws for p in many] == [p.draws for p in one]
    assert one[0].samples == 3000 and one[1].lookups > 3000


def test_a_bad_line_in_a_later_piece_has_its_line_in_the_file(tmp_path: Path) -> None:
    lines = [json.dumps(s) for s in random_lines(2000, seed=2) if s is not None]
    lines[1500] = lines[1500].replace(":", "=", 1)
    path = tmp_path / "data.ndjson"
    path.write_text("\n".join(lines) + "\n")
    plan = plan_scan([path], ScanOptions(hash_size="1000", piece_bytes=10_000))
    assert plan.pieces[0].stop <= len("\n".join(lines[:1500]))  # not in the first piece
    with pytest.raises(InputError, match="not JSON") as err:
        run_plan(plan, EngineOptions())
    assert (err.value.source, err.value.field) == (str(path), "line 1501")


def test_cli_profiles_an_ndjson_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_lines(tmp_path / "data.ndjson", HAND)
    code, out, err = run_cli(["profile", str(path), "-o", "t.json", "--hash-size", "100",
                              "--json"], capsys)
    assert code == 0, err
    tables = {t.name: t for t in load_tables(tmp_path / "t.json")}
    assert list(tables) == ["user", "item", "tags", "extra"]
    assert tables["item"].rows == 100 and tables["item"].pooling_factor == 1.5
    assert tables["tags"].coverage == 0.5 and tables["user"].rows_used == 2
    summary = {t["name"]: t for t in json.loads(out)["tables"]}
    assert summary["user"]["lookups"] == 3 and summary["extra"]["coverage"] == 0.25
    bad = write_lines(tmp_path / "bad.jsonl", [{"user": "u1"}])
    bad.write_text(bad.read_text() + "{oops\n")
    code, _, err = run_cli(["profile", str(bad), "-o", "u.json"], capsys)
    assert code == 2 and str(bad) in err and "line 2" in err and "{oops" in err, err
    assert not (tmp_path / "u.json").exists()
