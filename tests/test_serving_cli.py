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
    code, stdout, err = run_cli(["serve", "plan", "--p99-ms", "50", "--qps", "2000", "--model",
                                 "medium", "--span", "2", "--requests", "1000", "--samples", "3",
                                 "--strategies", "capacity_balanced,feature_group",
                                 "--seeds", "7", "-o", str(out)], capsys)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["memory_bound_shards"] == 3
    assert summary["fewest_servers"]["capacity_balanced"] == 4  # 3 shards and 1 main server
    assert summary["answer"].startswith("meets P99 <= 50 ms with 4 servers")
    assert [s["seed"] for s in summary["seeds"]] == [7] and summary["same"]
    assert summary["servers_on_every_seed"] == 4 and not summary["marginal"]
    assert "seeds 7: 4 (capacity_balanced); the same answer on every seed" in stdout
    plan = json.loads((out / "plan.json").read_text())
    assert plan["servers"] == 3 and len(plan["assign"]) == 200 and plan["main_replicas"] == 1
    assert (out / "p99_vs_servers.png").stat().st_size > 0
    assert "p99_hi_ms" in (out / "sweep.csv").read_text()
    assert "capacity_balanced" in stdout and "feature_group" in stdout  # names not cut
    code, stdout, err = run_cli(["serve", "simulate", "--model", "medium", "--plan",
                                 str(out / "plan.json"), "--qps", "2000", "--requests", "500",
                                 "--samples", "2", "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["total_servers"] == 4
    code, _, err = run_cli(["serve", "simulate", "--model", "medium", "--plan",
                            str(out / "plan.json"), "--precision", "int8"], capsys)
    assert code == 2 and "precision" in err and "fp32" in err


def test_simulate_json_reports_percentiles_and_fan_out(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, err = run_cli(["serve", "simulate", "--model", "small", "--strategy",
                                 "main_only", "--requests", "1000", "--json"], capsys)
    assert code == 0, err
    row = json.loads(stdout)
    assert row["calls_per_request"] == 0 and row["p99_overhead"] == 0
    assert row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["p99_hi_ms"]
    code, _, err = run_cli(["serve", "simulate", "--model", "small", "--strategy",
                            "main_only", "--servers", "2"], capsys)
    assert code == 2 and "--servers" in err


@pytest.mark.parametrize(("args", "field"), [
    (["--qps", "-5"], "--qps"),
    (["--qps", "100", "--strategy", "best_ever"], "strategy"),
    (["--qps", "100", "--strategy", "singular"], "main_only"),
    (["--qps", "100", "--precision", "int3"], "--precision"),
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
    for flag, value in (("--bench-rounds", "0"), ("--bench-warmup", "295"),
                        ("--bench-mode", "parallel")):
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


def test_table_larger_than_a_server_is_row_split(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump({
        "kind": "serving_model", "items": 4,
        "tables": [gb_table("small", 1).to_dict(), gb_table("giant", 400).to_dict()]}))
    out = tmp_path / "plan"
    code, _, err = run_cli(["serve", "plan", "--p99-ms", "50", "--qps", "10", "--model",
                            str(model), "--strategies", "capacity_balanced", "--span", "1",
                            "--requests", "500", "--samples", "2", "-o", str(out)], capsys)
    assert code == 0, err
    plan = json.loads((out / "plan.json").read_text())
    giant = [p for p in plan["parts"] if p["table"] == "giant"]
    assert len(giant) == 2 and len({p["server"] for p in giant}) == 2


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
    assert json.loads(stdout)["servers"] == 2  # 90 GB on 64 GB servers less 10% headroom


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


def test_plan_can_minimise_cost_and_rejects_bad_choices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "p.yaml"
    code, stdout, _ = run_cli(["serve", "profiles", "cpu-256gb"], capsys)
    prof.write_text(stdout.replace("main_cost: 1.0", "main_cost: 10.0")
                    .replace("server_cost: 1.0", "server_cost: 0.5"))
    out = tmp_path / "plan"
    code, _, err = run_cli(["serve", "plan", "--p99-ms", "50", "--qps", "2000", "--model",
                            "small", "--profile", str(prof), "--minimise", "cost", "--span", "2",
                            "--requests", "500", "--samples", "2", "--strategies",
                            "main_only,capacity_balanced", "-o", str(out)], capsys)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    import csv

    meeting = [r for r in csv.DictReader((out / "sweep.csv").open()) if r["meets"] == "True"]
    assert summary["minimise"] == "cost" and len(meeting) >= 2
    assert summary["answer_row"]["cost"] == min(float(r["cost"]) for r in meeting) == 10.0
    assert {float(r["cost"]) for r in meeting} >= {10.0, 10.5}
    for args, field in ((["--minimise", "money"], "--minimise"),
                        (["--max-utilisation", "1.5"], "--max-utilisation"),
                        (["--samples", "1"], "--samples")):
        code, _, err = run_cli(["serve", "plan", "--p99-ms", "5", "--qps", "10", *args, "-o",
                                str(tmp_path / "no")], capsys)
        assert code == 2 and field in err
    code, _, err = run_cli(["serve", "compare", "--suite", "small", "--seeds", "1,x", "-o",
                            str(tmp_path / "no")], capsys)
    assert code == 2 and "--seeds" in err
    assert not (tmp_path / "no").exists()


def test_simulate_gives_a_latency_verdict_only_against_a_target(
        capsys: pytest.CaptureFixture[str]) -> None:
    """No target: the verdict says only whether the deployment fits (never 'misses'), and the
    JSON's ``meets`` is null; a target gives meets or misses against it."""
    base = ["serve", "simulate", "--model", "small", "--strategy", "main_only", "--requests",
            "1000", "--samples", "2"]
    code, stdout, err = run_cli(base, capsys)
    assert code == 0, err
    assert "fits" in stdout and "misses" not in stdout and "meets" not in stdout
    code, stdout, _ = run_cli([*base, "--json"], capsys)
    assert json.loads(stdout)["meets"] is None and json.loads(stdout)["p99_target_ms"] is None
    code, stdout, _ = run_cli([*base, "--p99-ms", "0.01"], capsys)
    assert code == 0 and "misses" in stdout
    code, stdout, _ = run_cli([*base, "--p99-ms", "1000", "--json"], capsys)
    assert json.loads(stdout)["meets"] is True


def test_answers_name_servers_and_shards_in_words() -> None:
    """One server is 'server'; a deployment without shards says so (no 'x replicas -')."""
    from autoshard.serving.plan_output import deployment_words
    from autoshard.serving.suite_report import answer_lines

    alone = {"strategy": "main_only", "servers": 0, "total_servers": 1, "replicas": "-",
             "main_replicas": 1, "p99_ms": 1.07, "p99_lo_ms": 1.06, "p99_hi_ms": 1.09,
             "max_utilisation": 0.13}
    assert deployment_words(alone) == "1 server (main_only: no shard; 1 main)"
    line = answer_lines([{"qps": 5000.0, "memory_bound_shards": 0, "answer": alone,
                          "seeds": [{"seed": 1, "total_servers": 1}], "same": True,
                          "marginal": False, "servers_on_every_seed": 1}])[0]
    assert "1 servers" not in line and "x replicas -" not in line
    assert "1 server (main_only: no shard; 1 main); P99 1.07 ms" in line
    sharded = dict(alone, strategy="load_balanced", servers=4, total_servers=14,
                   replicas="3,3,3,3", main_replicas=2)
    assert deployment_words(sharded) == ("14 servers (load_balanced: 4 shards, replicas "
                                         "3,3,3,3; 2 main)")


def test_study_writes_under_runs_by_default() -> None:
    """`serve study` (and `serve compare`) write to runs/serving unless told: the committed
    results/serving files change only when named."""
    import typer

    from autoshard.cli import app

    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    for name in ("study", "compare"):
        output = next(p for p in serve.commands[name].params if p.name == "output")
        assert str(output.default) == "runs/serving", name
