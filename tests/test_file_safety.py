"""Outputs and input files under hostile paths and contents (autoshard.fileio and its users).

Every special file is a fake made under ``tmp_path`` (FIFOs, symbolic links, and, as root only,
device nodes made with ``os.mknod``); nothing here touches ``/dev``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli

from autoshard.errors import InputError
from autoshard.fileio import (
    append_csv_row,
    atomic_write_text,
    check_distinct_outputs,
    current_umask,
    output_folder,
    read_text,
    write_structured,
)
from autoshard.tables import load_tables

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_MODEL = ROOT / "autoshard" / "data" / "cost_model"
TABLES_CSV = "name,rows,dim\nt0,1000,16\nt1,2000,32\nt2,500,8\n"
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="making a device node needs root")


@pytest.fixture
def tables_csv(tmp_path: Path) -> Path:
    path = tmp_path / "tables.csv"
    path.write_text(TABLES_CSV)
    return path


@pytest.fixture
def umask_027() -> Iterator[int]:
    """Sets the umask to 027 for the test and restores the old one."""
    old = os.umask(0o027)
    try:
        yield 0o027
    finally:
        os.umask(old)


def plan_to(path: Path, tables_csv: Path, capsys: pytest.CaptureFixture[str]
            ) -> tuple[int, str, str]:
    return run_cli(["plan", "-t", str(tables_csv), "-o", str(path)], capsys)


# Outputs to paths that are not regular files -----------------------------------------------------


def test_symlink_output_is_written_through(tmp_path: Path, tables_csv: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "real" / "plan.json"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    code, _, err = plan_to(link, tables_csv, capsys)
    assert code == 0, err
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert json.loads(target.read_text())["kind"] == "plan"
    assert sorted(p.name for p in target.parent.iterdir()) == ["plan.json"]  # no temp file left


def test_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "made.txt")
    atomic_write_text(link, "hello\n")
    assert link.is_symlink() and (tmp_path / "made.txt").read_text() == "hello\n"


@pytest.mark.parametrize("via_link", [False, True])
def test_fifo_output_is_written_directly(tmp_path: Path, tables_csv: Path,
                                         capsys: pytest.CaptureFixture[str],
                                         via_link: bool) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    given = fifo
    if via_link:  # as /dev/stdout is a link to the process's output
        given = tmp_path / "out.link"
        given.symlink_to(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = plan_to(given, tables_csv, capsys)
    reader.join(timeout=20)
    assert code == 0, err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # the FIFO is still a FIFO
    assert given.is_symlink() == via_link
    assert not reader.is_alive() and json.loads(received[0])["kind"] == "plan"


@needs_root
def test_device_output_is_written_directly(tmp_path: Path, tables_csv: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a null device, under tmp_path
    code, _, err = plan_to(null, tables_csv, capsys)
    assert code == 0, err
    assert stat.S_ISCHR(null.lstat().st_mode) and null.lstat().st_rdev == os.makedev(1, 3)


@needs_root
def test_device_write_error_is_reported(tmp_path: Path, tables_csv: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # a "full" device: ENOSPC
    code, out, err = plan_to(full, tables_csv, capsys)
    assert code == 2 and "wrote" not in out
    assert err.startswith("error: ") and str(full) in err and "No space left" in err
    assert len(err.strip().splitlines()) == 1
    assert stat.S_ISCHR(full.lstat().st_mode)


def test_folder_as_output_file_is_refused(tmp_path: Path, tables_csv: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    code, _, err = plan_to(folder, tables_csv, capsys)
    assert code == 2 and str(folder) in err and "folder" in err
    assert list(folder.iterdir()) == []
    with pytest.raises(InputError, match="folder"):
        atomic_write_text(folder, "x")
    with pytest.raises(InputError, match="folder"):
        append_csv_row(folder, {"a": 1}, ["a"])


def test_failed_write_leaves_no_file_and_no_new_folders(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deep" / "out.json"
    with pytest.raises(InputError):
        write_structured(path, {"x": math.inf})
    assert not (tmp_path / "new").exists()


# Permissions -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_overwrite_keeps_the_permission_bits(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "out.json"
    path.write_text("{}\n")
    path.chmod(mode)
    write_structured(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_new_file_follows_the_umask(tmp_path: Path, umask_027: int) -> None:
    assert current_umask() == umask_027
    atomic_write_text(tmp_path / "new.txt", "x")
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640
    append_csv_row(tmp_path / "rows.csv", {"a": 1}, ["a"])
    assert stat.S_IMODE((tmp_path / "rows.csv").stat().st_mode) == 0o640


# Strict JSON -------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float64("nan")])
def test_non_finite_figure_is_refused_naming_the_field(tmp_path: Path, suffix: str,
                                                       bad: float) -> None:
    path = tmp_path / f"report{suffix}"
    with pytest.raises(InputError) as exc:
        write_structured(path, {"model": "m", "metrics": {"mape": 0.1, "spearman": bad}})
    assert exc.value.field == "metrics.spearman" and str(path) in str(exc.value)
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_non_finite_figure_in_a_list_is_named_and_the_old_file_kept(tmp_path: Path) -> None:
    path = tmp_path / "tables.json"
    path.write_text('{"old": true}\n')
    with pytest.raises(InputError) as exc:
        write_structured(path, {"tables": [{"zipf_alpha": 1.0}, {"zipf_alpha": math.nan}]})
    assert exc.value.field == "tables[1].zipf_alpha"
    assert path.read_text() == '{"old": true}\n'


def test_printed_json_is_strict(capsys: pytest.CaptureFixture[str]) -> None:
    from autoshard.cli.common import print_json

    with pytest.raises(InputError, match=r"all\.spearman"):
        print_json({"all": {"spearman": math.nan}})
    print_json({"all": {"spearman": None}})
    assert json.loads(capsys.readouterr().out) == {"all": {"spearman": None}}


def test_spearman_of_one_sample_is_null_with_a_note() -> None:
    from autoshard.cost_models.evaluate import metrics

    one = metrics(np.array([1.0]), np.array([2.0]))
    assert one["spearman"] is None and "fewer than 2" in one["note"] and one["mape"] == 0.5
    flat = metrics(np.array([1.0, 1.0, 1.0]), np.array([1.0, 2.0, 3.0]))
    assert flat["spearman"] is None and "all equal" in flat["note"]
    assert metrics(np.array([1.0, 2.0]), np.array([1.0, 3.0]))["spearman"] == pytest.approx(1.0)


def bench_csv(path: Path, rows: int) -> Path:
    """A microbenchmark CSV of ``rows`` host-memory configurations."""
    from autoshard.cost_models.microbench import COLUMNS

    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, restval="")
        writer.writeheader()
        for i in range(rows):
            fwd = 0.05 + 0.01 * i
            writer.writerow(dict(
                config_id=f"c{i}", op="torch", dim=32, batch=128, num_tables=1, dtype="fp32",
                tier="host", part_rows=1000 * (i + 1), lookups=500.0, distinct_rows=400,
                fwd_ms=fwd, bwd_ms=2 * fwd, fwd_p10_ms=0.9 * fwd, bwd_p10_ms=1.8 * fwd,
                hardware="test-cpu"))
    return path


def test_cost_model_eval_of_one_row_writes_strict_json(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    data = bench_csv(tmp_path / "one.csv", 1)
    report = tmp_path / "eval.json"
    code, _, err = run_cli(["cost-model", "eval", str(COMMITTED_MODEL), str(data), "-o",
                            str(report)], capsys)
    assert code == 0, err
    text = report.read_text()
    assert "NaN" not in text and "Infinity" not in text
    doc = json.loads(text)
    assert doc["infer"]["spearman"] is None and "fewer than 2" in doc["infer"]["note"]


# No output when a command fails ------------------------------------------------------------------


def test_two_outputs_on_one_path_are_refused(tmp_path: Path, tables_csv: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    assert plan_to(plan, tables_csv, capsys)[0] == 0
    out = tmp_path / "export.json"
    code, _, err = run_cli(["export", str(plan), "-t", str(tables_csv), "-o", str(out),
                            "--fitted-plan", str(out)], capsys)
    assert code == 2 and "--output" in err and "--fitted-plan" in err
    assert not out.exists()
    link = tmp_path / "alias.json"
    link.symlink_to(out)
    code, _, err = run_cli(["export", str(plan), "-t", str(tables_csv), "-o", str(out),
                            "--fitted-plan", str(link)], capsys)
    assert code == 2 and "same file" in err and not out.exists()


def test_distinct_outputs_pass() -> None:
    check_distinct_outputs({"--output": "a.json", "--report": "b.json", "--other": None})
    with pytest.raises(InputError, match="--output and --report"):
        check_distinct_outputs({"--output": "a.json", "--report": "./a.json"})


def test_demo_with_an_unknown_hardware_leaves_no_folder(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    out = tmp_path / "runs" / "demo"
    code, _, err = run_cli(["demo", "--out", str(out), "--hardware", "bogus", "--tables", "4",
                            "--devices", "2", "--trace-batch", "64"], capsys)
    assert code == 2 and "--hardware" in err and "bogus" in err
    assert list(tmp_path.iterdir()) == []


def test_calibrate_with_an_unknown_grid_leaves_no_folder(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    out = tmp_path / "calibrated"
    code, _, err = run_cli(["cost-model", "calibrate", str(COMMITTED_MODEL), "-o", str(out),
                            "--grid", "bogus"], capsys)
    assert code == 2 and "grid" in err and "bogus" in err
    assert not out.exists()


def test_output_folder_is_removed_when_the_command_fails(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    with pytest.raises(RuntimeError), output_folder(out) as folder:
        atomic_write_text(folder / "part.txt", "half")
        raise RuntimeError("failed midway")
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), output_folder(kept):
        raise RuntimeError("failed midway")
    assert (kept / "old.txt").read_text() == "old"  # an existing folder is never removed
    with output_folder(tmp_path / "done") as folder:
        atomic_write_text(folder / "all.txt", "whole")
    assert (tmp_path / "done" / "all.txt").read_text() == "whole"


# Input files -------------------------------------------------------------------------------------


def test_csv_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + TABLES_CSV.encode())
    tables = load_tables(path)
    assert [t.name for t in tables] == ["t0", "t1", "t2"] and tables[1].rows == 2000


def test_csv_with_a_repeated_column_is_refused(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dup.csv"
    path.write_text("name,rows,dim,rows\nt0,1000,16,5\n")
    with pytest.raises(InputError) as exc:
        load_tables(path)
    assert exc.value.field == "rows" and "twice" in str(exc.value)
    code, _, err = run_cli(["plan", "-t", str(path), "-o", str(tmp_path / "p.json")], capsys)
    assert code == 2 and "'rows'" in err and str(path) in err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("data", [b"name,rows,dim\nt0,10\x0000,16\n",
                                  b"name,rows,dim\nt\xff\xfe0,1000,16\n"])
def test_binary_table_csv_names_the_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "binary.csv"
    path.write_bytes(data)
    with pytest.raises(InputError, match="not a text file") as exc:
        load_tables(path)
    assert exc.value.source == str(path)


def test_binary_reference_text_names_the_file(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    reference = tmp_path / "stats.txt"
    reference.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\xd0\x90" * 20)
    out = tmp_path / "calibration"
    code, _, err = run_cli(["calibrate", "--reference", str(reference), "--out", str(out)],
                           capsys)
    assert code == 2 and str(reference) in err and "not a text file" in err
    assert not out.exists()
    reference.write_bytes(b"caf\xe9\n")  # Latin-1, no NUL byte
    with pytest.raises(InputError, match="not a text file"):
        read_text(reference)


@pytest.mark.parametrize("command", ["eval", "compare"])
def test_header_only_benchmark_csv_exits_2_naming_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    data = bench_csv(tmp_path / "header_only.csv", 0)
    out = tmp_path / "out"
    argv = (["cost-model", "eval", str(COMMITTED_MODEL), str(data)] if command == "eval"
            else ["cost-model", "compare", str(data), "-o", str(out)])
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and str(data) in err and "no measurements" in err
    assert not out.exists()


def test_compare_of_one_configuration_is_refused(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    data = bench_csv(tmp_path / "one.csv", 1)
    out = tmp_path / "cmp"
    code, _, err = run_cli(["cost-model", "compare", str(data), "-o", str(out)], capsys)
    assert code == 2 and "at least 2 configurations" in err and not out.exists()
