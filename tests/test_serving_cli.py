"""`autoshard serve ...`: outputs, and bad input failing with exit 2, the field named and
nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import run_cli
from tests.serving_helpers import gb_table


def test_plan_answers_with_servers_and_writes_its_outputs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    code, _, err = run_cli(["serve", "plan", "--p99-ms", "50", "--qps", "2000", "--model",
                                 "medium", "--span", "2", "--requests", "2000",
                                 "--strategies", "capacity_balanced,feature_group,optimiser",
                                 "-o", str(out)], capsys)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["memory_bound_servers"] == 3
    assert summary["fewest_servers"]["optimiser"] == 3
    plan = json.loads((out / "plan.json").read_text())
    assert plan["servers"] == 3 and len(plan["assign"]) == 200
    assert (out / "p99_vs_servers.png").stat().st_size > 0
    assert "calls_per_request" in (out / "sweep.csv").read_text()


def test_simulate_json_reports_percentiles_and_fan_out(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, err = run_cli(["serve", "simulate", "--model", "small", "--strategy",
                                 "singular", "--requests", "2000", "--json"], capsys)
    assert code == 0, err
    row = json.loads(stdout)
    assert row["calls_per_request"] == 0 and row["p99_overhead"] == 0
    assert row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]


@pytest.mark.parametrize(("args", "field"), [
    (["--qps", "-5"], "--qps"),
    (["--qps", "100", "--strategy", "best_ever"], "strategy"),
    (["--qps", "100", "--requests", "5"], "--requests"),
    (["--qps", "100", "--model", "nosuch"], "--model"),
])
def test_bad_options_exit_2_naming_the_field(
        args: list[str], field: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code, _, err = run_cli(["serve", "simulate", *args, "-o", str(out)], capsys)
    assert code == 2
    assert field in err
    assert not out.exists()


def test_plan_rejects_negative_rate_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    code, _, err = run_cli(["serve", "plan", "--p99-ms", "5", "--qps", "-1", "-o", str(out)],
                           capsys)
    assert code == 2 and "--qps" in err
    assert not out.exists()


def test_compare_rejects_bad_bench_rounds_before_measuring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "serving"
    for flag, value in (("--bench-rounds", "0"), ("--bench-warmup", "295")):
        code, _, err = run_cli(["serve", "compare", "--suite", "bench", "--measure",
                                "--bench-requests", "300", flag, value, "-o", str(out)], capsys)
        assert code == 2 and flag in err
    assert not out.exists()


def test_malformed_profile_names_file_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"kind": "serving_profile", "cores": "many"}))
    out = tmp_path / "plan"
    code, _, err = run_cli(["serve", "plan", "--p99-ms", "5", "--qps", "10", "--profile",
                            str(bad), "-o", str(out)], capsys)
    assert code == 2
    assert "bad.yaml" in err and "cores" in err
    assert not out.exists()
    bad.write_text(yaml.safe_dump({"kind": "serving_profile", "network_gbps": -1}))
    code, _, err = run_cli(["serve", "simulate", "--profile", str(bad)], capsys)
    assert code == 2 and "network_gbps" in err


def test_table_larger_than_any_server_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump({
        "kind": "serving_model", "items": 4,
        "tables": [gb_table("small", 1).to_dict(), gb_table("giant", 400).to_dict()]}))
    out = tmp_path / "plan"
    code, _, err = run_cli(["serve", "plan", "--p99-ms", "5", "--qps", "10", "--model",
                            str(model), "-o", str(out)], capsys)
    assert code == 2
    assert "giant.rows" in err
    assert not out.exists()


def test_model_file_with_unknown_group_member(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump({"kind": "serving_model", "items": 4,
                                     "tables": [gb_table("a", 1).to_dict()],
                                     "groups": {"g": ["a", "zz"]}}))
    code, _, err = run_cli(["serve", "simulate", "--model", str(model)], capsys)
    assert code == 2 and "groups.g" in err and "zz" in err


def test_profiles_round_trip_as_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run_cli(["serve", "profiles", "cpu-64gb"], capsys)
    assert code == 0
    path = tmp_path / "mine.yaml"
    path.write_text(stdout)
    code, stdout, err = run_cli(["serve", "simulate", "--model", "small", "--profile",
                                 str(path), "--strategy", "capacity_balanced", "--requests",
                                 "1000", "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["servers"] == 2  # 90 GB on 64 GB servers


def test_sharders_lists_the_serving_strategies_as_the_serve_mode(
        capsys: pytest.CaptureFixture[str]) -> None:
    from autoshard.serving.registry import strategy_names

    code, out, err = run_cli(["sharders", "--mode", "serve"], capsys)
    assert code == 0, err
    assert all(name in out for name in strategy_names())
    assert "recshard" not in out
    code, out, _ = run_cli(["sharders"], capsys)
    assert code == 0 and "recshard" in out and "feature_group" not in out
    code, _, err = run_cli(["sharders", "--mode", "servr"], capsys)
    assert code == 2 and "--mode" in err and "servr" in err
