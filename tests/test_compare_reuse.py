"""Comparisons that cannot mislead: reused rows say so (machine and date) in the terminal, the
CSV and the Markdown; the committed results are read, never written, unless named; rows with
a non-finite figure are computed again; files the harness did not write are never replaced."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pytest
from cli_helpers import run_cli

from autoshard.compare.harness import COLUMNS, read_rows
from autoshard.errors import InputError
from autoshard.machine import describe_machine

ROOT = Path(__file__).resolve().parents[1]
SUITE = "constrained-50x4"
TINY = ["compare", "--suite", "tiny", "--sharders", "size_greedy,lookup_greedy",
        "--wandb-mode", "disabled"]


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_reuse_marks_every_committed_row_and_leaves_results_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results" / "compare"
    results.mkdir(parents=True)
    for path in (ROOT / "results" / "compare").glob(f"{SUITE}.*"):
        shutil.copy(path, results / path.name)
    before = _tree(results)
    committed = {(r.task, r.sharder): r for r in read_rows(results / f"{SUITE}.csv")
                 if r.sharder in ("recshard", "torchrec")}
    assert len(committed) == 6 and all(r.machine and r.measured_at for r in committed.values())
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["compare", "--suite", SUITE, "--sharders", "recshard,torchrec",
                              "--reuse", "results/compare", "--wandb-mode", "disabled"], capsys)
    assert code == 0, err
    assert _tree(results) == before  # not a byte of results/ changed
    rows = read_rows(tmp_path / "runs" / "compare" / f"{SUITE}.csv")
    assert {(r.task, r.sharder) for r in rows} == set(committed)
    for r in rows:
        old = committed[r.task, r.sharder]
        assert r.reused_from == f"results/compare/{SUITE}.csv"
        assert (r.machine, r.measured_at) == (old.machine, old.measured_at)
        assert (r.step_cost_ms, r.cost_ratio, r.plan_seconds) == (
            old.step_cost_ms, old.cost_ratio, old.plan_seconds)  # copied, not recomputed
    marked = [line for line in " ".join(out.split()).split("c-50x4-")[1:] if "reused:" in line]
    assert len(marked) == 6 and all(old.machine in line for line in marked)
    md = (tmp_path / "runs" / "compare" / f"{SUITE}.md").read_text()
    assert "Machine: none; this run measured no row" in md
    assert describe_machine() not in md.split("## Per sharder")[0]
    assert md.count(f"| results/compare/{SUITE}.csv |") == 6 and "## Reused rows" in md


def test_default_output_is_a_scratch_folder_and_the_summary_a_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(TINY, capsys)
    assert code == 0, err
    assert (tmp_path / "runs" / "compare" / "tiny.csv").is_file()
    assert not (tmp_path / "results").exists()
    assert "|---" not in out and "| sharder |" not in out  # a rich table, not raw Markdown
    assert "cost / bound" in out and "lookup_greedy" in out
    md = (tmp_path / "runs" / "compare" / "tiny.md").read_text()
    assert "|---|" in md and f"Machine: {describe_machine()}  \n" in md
    assert "Reused rows" not in md


def test_a_rerun_marks_the_rows_it_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    out_dir = tmp_path / "cmp"
    assert run_cli([*TINY, "--out", str(out_dir)], capsys)[0] == 0
    first = read_rows(out_dir / "tiny.csv")
    assert first and not any(r.reused for r in first)
    assert all(r.machine == describe_machine() and r.measured_at.endswith("+00:00")
               for r in first)
    code, out, _ = run_cli([*TINY, "--out", str(out_dir)], capsys)
    assert code == 0
    again = read_rows(out_dir / "tiny.csv")
    assert [r.reused_from for r in again] == [str(out_dir / "tiny.csv")] * len(first)
    assert [r.measured_at for r in again] == [r.measured_at for r in first]
    said = " ".join(out.split())  # the terminal wraps long lines
    assert said.count("(reused: measured on") == len(first)
    assert f"{len(first)} row(s) reused from {out_dir / 'tiny.csv'}" in said
    md = (out_dir / "tiny.md").read_text()
    assert "Machine: none; this run measured no row" in md and md.count(" * |") == len(first)


def _set(path: Path, changes: dict[tuple[str, str], dict[str, str]]) -> None:
    """Rewrites cells of a results CSV: (task, sharder) -> {column: text}."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        row.update(changes.get((row["task"], row["sharder"]), {}))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def test_a_row_with_a_non_finite_figure_is_computed_again_and_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "cmp"
    assert run_cli([*TINY, "--out", str(out_dir)], capsys)[0] == 0
    _set(out_dir / "tiny.csv", {("tiny-12x2-s0", "size_greedy"): {"step_cost_ms": "nan"},
                                ("tiny-12x2-s1", "lookup_greedy"): {"cost_ratio": "inf"}})
    code, out, _ = run_cli([*TINY, "--out", str(out_dir)], capsys)
    assert code == 0
    said = " ".join(out.split())
    assert "tiny-12x2-s0 size_greedy: step_cost_ms is nan" in said
    assert "tiny-12x2-s1 lookup_greedy: cost_ratio is inf" in said
    assert said.count("not reused, computed again") == 2
    rows = {(r.task, r.sharder): r for r in read_rows(out_dir / "tiny.csv")}
    assert len(rows) == 4
    for key in (("tiny-12x2-s0", "size_greedy"), ("tiny-12x2-s1", "lookup_greedy")):
        assert not rows[key].reused and math.isfinite(rows[key].step_cost_ms)
        assert math.isfinite(rows[key].cost_ratio)
    assert sum(r.reused for r in rows.values()) == 2
    md = (out_dir / "tiny.md").read_text().lower()
    assert "nan" not in md and "inf" not in md.replace("infer", "")


@pytest.mark.parametrize(("name", "text"), [
    ("tiny.csv", "name,score\nalice,3\n"),  # someone else's CSV
    ("tiny.csv", ",".join(COLUMNS) + "\n" + "tiny,t,2,2,train,x,ok" + ",abc" * 14 + "\n"),
    ("tiny.csv", ""),  # empty: no header
    ("tiny.md", "# my notes\n"),  # a report without the harness's CSV beside it
    ("tiny.devices.json", "{}\n"),
])
def test_a_file_the_harness_did_not_write_is_never_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        name: str, text: str) -> None:
    out_dir = tmp_path / "cmp"
    out_dir.mkdir()
    (out_dir / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["compare", "--suite", "tiny", "--sharders", "size_greedy",
                              "--out", "cmp", "--wandb-mode", "offline"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1
    assert str(Path("cmp") / name) in err
    assert [p.name for p in out_dir.iterdir()] == [name]
    assert (out_dir / name).read_text() == text
    assert not (tmp_path / "runs").exists()  # no W&B run started either


def test_a_row_that_does_not_parse_names_the_file_but_a_torn_last_line_is_dropped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "cmp"
    assert run_cli([*TINY, "--out", str(out_dir)], capsys)[0] == 0
    path = out_dir / "tiny.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines) + lines[1][: len(lines[1]) // 2])  # torn while written
    assert len(read_rows(path)) == len(lines) - 1
    path.write_text("".join([lines[0], "x,y\n", *lines[1:]]))
    with pytest.raises(InputError, match="row 1 does not parse") as caught:
        read_rows(path)
    assert caught.value.source == str(path)


def test_reuse_needs_the_suites_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    code, _, err = run_cli([*TINY, "--out", str(tmp_path / "cmp"), "--reuse",
                            str(tmp_path / "elsewhere")], capsys)
    assert code == 2 and "--reuse" in err and "tiny.csv" in err
    assert not (tmp_path / "cmp").exists()


def test_rows_of_files_that_predate_the_machine_columns_say_so(tmp_path: Path) -> None:
    old = [c for c in COLUMNS if c not in ("found_by", "machine", "measured_at", "reused_from",
                                           "notes")]
    path = tmp_path / "old.csv"
    path.write_text(",".join(old) + "\n" + "tiny,t0,12,2,train,random,ok,," + ",".join(
        ["2.0", "1.0", "2.0", "1.1", "0.1", "0.01"]) + ",analytical,analytical,{}\n")
    (row,) = read_rows(path)
    assert (row.machine, row.measured_at, row.reused) == ("", "", False)
    assert row.provenance() == "measured on an unrecorded machine at an unrecorded time"
