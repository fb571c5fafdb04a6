"""The command line: plan, evaluate, hardware, sharders, and every bad-input path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_cli as run

from autoshard.tables import Table, save_tables

TABLES = (Table("a", rows=1000, dim=16, pooling_factor=3.0, zipf_alpha=1.0),
          Table("b", rows=5000, dim=32, pooling_factor=1.0),
          Table("c", rows=200, dim=8, coverage=0.5))




@pytest.fixture
def tables_file(tmp_path: Path) -> Path:
    path = tmp_path / "tables.yaml"
    save_tables(path, TABLES)
    return path


def test_plan_then_evaluate(tmp_path: Path, tables_file: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "out" / "plan.json"
    code, out, _ = run(["plan", "-t", str(tables_file), "-H", "8xV100-16GB", "--devices", "2",
                        "-s", "lookup_greedy", "--batch-size", "4096", "--mode", "infer",
                        "-o", str(plan)], capsys)
    assert code == 0 and plan.is_file()
    assert "step cost" in out and "lower bound" in out
    saved = json.loads(plan.read_text())
    assert saved["sharder"] == "lookup_greedy" and len(saved["placements"]) == 3
    assert saved["workload"] == {"batch_size": 4096, "mode": "infer"}
    code, out, _ = run(["evaluate", str(plan), "-t", str(tables_file), "-H", "8xV100-16GB",
                        "--devices", "2", "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    for key in ("step_cost_ms", "lower_bound_ms", "load_balance", "uvm_lookup_share",
                "per_device"):
        assert key in report
    assert len(report["per_device"]) == 2
    assert report["mode"] == "infer" and report["batch_size"] == 4096  # from the plan
    assert report["step_cost_ms"] >= report["lower_bound_ms"] > 0
    assert report["access_assumptions"] == {"zipf": 1, "uniform": 2}
    # The same hardware named otherwise is no contradiction; another profile is refused,
    # naming both, unless the plan is re-priced on it (which the report says).
    code, _, err = run(["evaluate", str(plan), "-t", str(tables_file), "-H", "2xV100-16GB"],
                       capsys)
    assert code == 0 and err == ""
    code, _, err = run(["evaluate", str(plan), "-t", str(tables_file), "-H", "2xH100-80GB"],
                       capsys)
    assert code == 2 and "--hardware" in err and "2xV100-16GB" in err and "2xH100-80GB" in err
    code, _, err = run(["evaluate", str(plan), "-H", "2xH100-80GB", "--reprice"], capsys)
    assert code == 0 and "re-priced on hardware 2xH100-80GB" in err, err


def test_plan_json_output(tmp_path: Path, tables_file: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.yaml"
    code, out, _ = run(["plan", "-t", str(tables_file), "-s", "random", "--seed", "3",
                        "-o", str(plan), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["sharder"] == "random" and doc["output"] == str(plan)
    assert plan.read_text().startswith("schema_version: 3")  # it records its context


def test_hardware_and_sharders(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["hardware", "list"], capsys)
    assert code == 0 and "8xH200-141GB" in out and "4800" in out
    code, out, _ = run(["hardware", "show", "8xA100-40GB", "--devices", "16", "--hbm-gb", "10"],
                       capsys)
    assert code == 0 and "name: 16xA100-40GB" in out and "num_devices: 16" in out
    assert "hbm_gb: 10.0" in out
    code, out, _ = run(["sharders"], capsys)
    assert code == 0
    for name in ("random", "round_robin", "size_greedy", "size_lookup_greedy"):
        assert name in out


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def bad_inputs(tmp: Path, good: str) -> list[tuple[list[str], list[str]]]:
    """(arguments after `plan`, pieces the one error line must hold)."""
    malformed = write(tmp / "malformed.json", '{"tables": [')
    missing = write(tmp / "missing.csv", "name,rows\nx,10\n")
    negative = write(tmp / "negative.yaml", "tables:\n- {name: x, rows: -10, dim: 4}\n")
    huge = write(tmp / "huge.csv", "name,rows,dim\nbig,10000000000,128\n")
    hw = write(tmp / "hw.yaml", "intra_node_gbps: 1\ninter_node_gbps: 1\n"
               "device: {hbm_gb: 1, hbm_bandwidth_gbps: 100, host_gb: -2, "
               "host_bandwidth_gbps: 10}\n")
    return [
        (["-t", malformed], ["malformed.json", "cannot parse"]),
        (["-t", missing], ["missing.csv", "'x.dim'", "missing"]),
        (["-t", negative], ["negative.yaml", "'x.rows'", "-10"]),
        (["-t", str(tmp / "absent.json")], ["absent.json", "not found"]),
        (["-t", good, "-s", "nope"], ["--sharder", "'nope'"]),
        (["-t", good, "-H", "9xB300"], ["--hardware", "'9xB300'"]),
        (["-t", good, "-H", hw], ["hw.yaml", "'device.host_gb'", "-2"]),
        (["-t", huge], ["huge.csv", "'big'", "GiB"]),
        (["-t", good, "--mode", "serve"], ["--mode", "'serve'"]),
        (["-t", good, "--batch-size", "0"], ["--batch-size", "0"]),
        (["-t", good, "--devices", "0"], ["--devices", "0"]),
        (["-t", good, "--hbm-gb", "-1"], ["--hbm-gb", "-1"]),
        (["-t", good, "--cost-model", "nowhere"], ["--cost-model", "'nowhere'"]),
    ]


def test_every_bad_input_is_one_line_and_exit_2(tmp_path: Path, tables_file: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "plan.json"
    for args, pieces in bad_inputs(tmp_path, str(tables_file)):
        code, out, err = run(["plan", *args, "-o", str(output)], capsys)
        assert code == 2, (args, err)
        assert err.startswith("error: ") and err.count("\n") == 1, (args, err)
        assert "Traceback" not in err + out
        for piece in pieces:
            assert piece in err, (args, err)
        assert not output.exists(), args
        assert not list(tmp_path.glob(".plan.json*")), args


def test_evaluate_bad_plan(tmp_path: Path, tables_file: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    plan = write(tmp_path / "plan.json", '{"placements": [{"table": "a", "device": 0}]}')
    code, _, err = run(["evaluate", plan, "-t", str(tables_file)], capsys)
    assert code == 2 and "'placements[0].hbm_rows'" in err and err.count("\n") == 1
    wrong = write(tmp_path / "p2.json", json.dumps({"placements": [
        {"table": n, "device": 9, "hbm_rows": 0} for n in ("a", "b", "c")]}))
    code, _, err = run(["evaluate", wrong, "-t", str(tables_file), "--devices", "2"], capsys)
    assert code == 2 and "device 9 of 2" in err
    assert f"{wrong}, field 'placements[0].device', value 9" in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", "--batch-size", "many", "-t", "x.json"], capsys)
    assert code == 2 and "--batch-size" in err and "Traceback" not in err
    code, _, _ = run([], capsys)  # no command: help, no traceback
    assert code in (0, 2)


def test_python_m_help() -> None:
    done = subprocess.run([sys.executable, "-m", "autoshard", "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0
    assert "plan" in done.stdout and "evaluate" in done.stdout
    assert done.stderr == ""


@pytest.mark.parametrize("command", ["evaluate", "export"])
def test_bad_split_plan_exits_2_and_writes_nothing(tmp_path: Path, tables_file: Path,
                                                   command: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema_version": 2, "kind": "plan", "placements": [
        {"table": "a", "sharding": "column_wise", "shards": [
            {"device": 0, "rows": [0, 1000], "cols": [0, 8], "hbm_rows": 0},
            {"device": 1, "rows": [0, 1000], "cols": [8, 8], "hbm_rows": 0}]},
        {"table": "b", "device": 0, "hbm_rows": 0}, {"table": "c", "device": 1, "hbm_rows": 0}]}))
    out = tmp_path / "out.json"
    args = [command, str(plan), "-t", str(tables_file), "-H", "2xH100-80GB"]
    code, _, err = run([*args, "-o", str(out)] if command == "export" else args, capsys)
    assert code == 2 and "placements[0].shards[1].cols" in err and "[8, 8]" in err
    assert not out.exists()


def test_split_plan_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables = tmp_path / "tables.yaml"
    save_tables(tables, (*TABLES, Table("huge", rows=2_000_000, dim=128, pooling_factor=100.0,
                                          zipf_alpha=1.05)))
    plan = tmp_path / "plan.json"
    args = ["-t", str(tables), "-H", "8xH100-80GB", "--devices", "4", "--hbm-gb", "0.5"]
    code, _, _ = run(["plan", *args, "-s", "split_lookup_greedy", "-o", str(plan)], capsys)
    assert code == 0
    doc = json.loads(plan.read_text())
    assert doc["schema_version"] == 3  # split, and it records its context
    huge = next(p for p in doc["placements"] if p["table"] == "huge")
    assert huge["sharding"] in ("row_wise", "column_wise") and len(huge["shards"]) > 1
    code, out, _ = run(["evaluate", str(plan), *args, "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["step_cost_ms"] >= report["lower_bound_ms"] > 0
    assert sum(d["tables"] for d in report["per_device"]) == 3 + len(huge["shards"])


def _command_paths() -> list[list[str]]:
    """Every command and subcommand of the app, as argument lists."""
    import typer

    from autoshard.cli import app

    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_help_shows_no_type_after_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    paths = _command_paths()
    assert ["plan"] in paths and ["serve", "plan"] in paths
    for path in paths:
        code, out, _ = run([*path, "--help"], capsys)
        assert code == 0 and "--help" in out, path
        assert "<bool>" not in out, path  # typer 0.29 wrote one after every flag


def test_sharder_option_lists_every_registered_sharder(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    import typer

    from autoshard.cli.common import SharderOpt
    from autoshard.sharders import sharder_names

    pick = typer.Typer()

    def choose(sharder: str = "size_greedy") -> None:
        """Pick a sharder."""

    choose.__annotations__ = {"sharder": SharderOpt, "return": None}  # not a string to resolve
    pick.command()(choose)
    with pytest.raises(SystemExit):
        pick(["--help"], prog_name="pick")
    shown = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert all(name in shown for name in sharder_names())


def test_the_solver_line_names_each_bound_and_no_zero_as_a_share() -> None:
    """The MILP's own bound is named as such beside the cost model's bound cost / bound uses;
    a bound it did not prove (zero) is said in words, never as '100.0% below'."""
    from autoshard.cli.core_cmds import solver_line

    solver = {"solver": "recshard (HiGHS MILP)", "status": "Optimal", "gap": 1.0,
              "found_s": 0.5, "seconds": 2.0}
    none = solver_line(dict(solver, bound_ms=0.0), 0.151)
    assert "%" not in none and "proved no bound of its own" in none and "0.151 ms" in none
    assert "over the splits it chose" in none  # what the MIP gap is a gap of
    same = solver_line(dict(solver, bound_ms=0.151, gap=0.423), 0.151)
    assert "%" not in same and "(its own relaxation) is 0.151 ms, the lower bound" in same
    below = solver_line(dict(solver, bound_ms=0.12), 0.151)
    assert "0.120 ms, below the cost model's lower bound, 0.151 ms" in below


def test_calibrate_says_where_metas_statistics_come_from(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The locality statistics are public data a clone does not hold: without them the command
    names the file to download and its licence, and writes nothing."""
    out = tmp_path / "calibration"
    for args in ([], ["--reference", str(tmp_path / "missing.txt")]):
        code, _, err = run(["calibrate", "--fit", *args, "--out", str(out)], capsys)
        assert code == 2 and "--reference" in err and "dlrm_datasets" in err and "MIT" in err
        assert not out.exists()
