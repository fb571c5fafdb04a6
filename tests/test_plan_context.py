"""Self-describing plans: a plan records the context it was made in, and every command that
reads it (evaluate, export, run-plan) uses that context unless told to re-price it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli as run

from autoshard.errors import InputError
from autoshard.layout.plan import Plan
from autoshard.layout.plan_context import PlanContext, read_table_set, tables_digest
from autoshard.tables import Table, save_tables

TABLES = (Table("a", rows=20_000, dim=16, pooling_factor=4.0, zipf_alpha=1.1),
          Table("b", rows=5_000, dim=8, pooling_factor=2.0),
          Table("c", rows=8_000, dim=16, pooling_factor=1.0, zipf_alpha=0.9))


@pytest.fixture
def planned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    """A plan of three tables made for 2 devices of 1 GB HBM each, batch 4096, inference,
    no reservation; returns (plan file, table file)."""
    tables = tmp_path / "tables.yaml"
    save_tables(tables, TABLES)
    plan = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", str(tables), "-H", "8xV100-16GB", "--devices", "2",
                        "--hbm-gb", "1", "--batch-size", "4096", "--mode", "infer",
                        "--overhead", "none", "-s", "lookup_greedy", "-o", str(plan)], capsys)
    assert code == 0, err
    return plan, tables


def test_the_plan_records_its_context(planned: tuple[Path, Path]) -> None:
    plan_file, tables = planned
    doc = json.loads(plan_file.read_text())
    assert doc["schema_version"] == 3
    context = Plan.load(plan_file).context
    assert context is not None
    assert context.tables == str(tables) and context.tables_digest == tables_digest(TABLES)
    assert context.hardware.num_devices == 2
    assert {d.hbm.capacity_bytes for d in context.hardware.devices} == {10**9}
    assert context.hardware_spec == {"profile": "8xV100-16GB", "devices": 2, "nodes": None,
                                     "hbm_gb": 1.0}
    assert (context.workload.batch_size, context.workload.mode) == (4096, "infer")
    assert context.reservation == "none" and context.cost_model == "analytical"
    assert PlanContext.from_dict(context.to_dict(), "x") == context


@pytest.mark.slow
def test_evaluate_export_and_run_plan_use_it_with_no_flags(
        planned: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file, _ = planned
    code, out, err = run(["evaluate", str(plan_file), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert len(report["per_device"]) == 2 and report["batch_size"] == 4096
    assert report["mode"] == "infer" and report["reservation"] == "none"
    assert {d["hbm_capacity_bytes"] for d in report["per_device"]} == {10**9}
    exported = tmp_path / "torchrec.json"
    code, _, err = run(["export", str(plan_file), "-o", str(exported)], capsys)
    assert code == 0, err
    doc = json.loads(exported.read_text())
    assert doc["world_size"] == 2 and doc["pipeline"] == "none"
    code, out, err = run(["run-plan", str(plan_file), "--iterations", "2", "--warmup", "0",
                          "--json"], capsys)
    assert code == 0, err
    assert len(json.loads(out)["measured"]["per_device"]) == 2


@pytest.mark.parametrize(("args", "named"), [
    (["--devices", "8"], ["--devices", "2xV100-16GB", "8xV100-16GB"]),
    (["--hbm-gb", "2"], ["--hbm-gb", "1 GB", "2 GB"]),
    (["-H", "8xH100-80GB"], ["--hardware", "2xV100-16GB", "8xH100-80GB"]),
    (["--batch-size", "8192"], ["--batch-size", "4096", "8192"]),
    (["--mode", "train"], ["--mode", "infer", "train"]),
    (["--overhead", "torchrec"], ["--overhead", "'none'", "'torchrec'"]),
])
@pytest.mark.parametrize("command", ["evaluate", "export", "run-plan"])
def test_a_contradicting_flag_exits_2_naming_both_values(
        planned: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        command: str, args: list[str], named: list[str]) -> None:
    plan_file, _ = planned
    out = tmp_path / "out.json"
    written = [] if command == "evaluate" else ["-o", str(out)]
    code, _, err = run([command, str(plan_file), *args, *written], capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    for piece in named:
        assert piece in err, (piece, err)
    assert not out.exists()


def test_reprice_prices_on_the_given_hardware_and_says_so(
        planned: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    plan_file, _ = planned
    code, out, err = run(["evaluate", str(plan_file), "--hbm-gb", "2", "--reprice", "--json"],
                         capsys)
    assert code == 0, err
    report = json.loads(out)
    assert {d["hbm_capacity_bytes"] for d in report["per_device"]} == {2 * 10**9}
    assert "re-priced on hardware" in err and "2 GB" in err and "1 GB" in err
    assert report["notes"] and "re-priced" in report["notes"][0]


def test_the_same_tables_from_another_file_are_no_contradiction(
        planned: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file, _ = planned
    copy = tmp_path / "copy.json"
    save_tables(copy, TABLES)
    code, _, err = run(["evaluate", str(plan_file), "-t", str(copy)], capsys)
    assert code == 0 and err == "", err
    other = tmp_path / "other.json"
    save_tables(other, (*TABLES[:2], Table("c", rows=9_000, dim=16)))
    code, _, err = run(["evaluate", str(plan_file), "-t", str(other)], capsys)
    assert code == 2 and "--tables" in err and "other tables" in err, err


def test_a_changed_table_file_is_noticed(planned: tuple[Path, Path],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    plan_file, tables = planned
    save_tables(tables, (*TABLES[:2], Table("c", rows=9_000, dim=16)))
    code, _, err = run(["evaluate", str(plan_file)], capsys)
    assert code == 2 and "context.tables_digest" in err and str(tables) in err, err


def test_plans_of_earlier_schemas_still_load(planned: tuple[Path, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    plan_file, tables = planned
    doc = json.loads(plan_file.read_text())
    del doc["context"]
    doc["schema_version"] = 1
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    code, _, err = run(["evaluate", str(old)], capsys)
    assert code == 2 and "--tables" in err and "earlier schema" in err, err
    code, out, err = run(["evaluate", str(old), "-t", str(tables), "-H", "8xV100-16GB",
                          "--devices", "2", "--json"], capsys)
    assert code == 0 and len(json.loads(out)["per_device"]) == 2, err


@pytest.mark.parametrize(("change", "field"), [
    ({"tables": 3}, "context.tables"),
    ({"workload": {"batch_size": 0, "mode": "train"}}, "context.workload.batch_size"),
    ({"reservation": "gpu"}, "context.reservation"),
    ({"hardware": {"name": "x"}}, "context.hardware"),
])
def test_a_malformed_context_is_named(planned: tuple[Path, Path], change: dict[str, object],
                                      field: str) -> None:
    plan_file, _ = planned
    doc = json.loads(plan_file.read_text())
    doc["context"].update(change)
    with pytest.raises(InputError) as info:
        Plan.from_dict(doc, "p.json")
    assert info.value.field is not None and info.value.field.startswith(field)


def test_suite_tasks_are_a_table_source() -> None:
    from autoshard.compare.suites import get_suite

    spec = get_suite("tiny")[0]
    assert read_table_set(f"suite:tiny/{spec.name}") == spec.build().tables
    with pytest.raises(InputError, match="no task"):
        read_table_set("suite:tiny/nowhere")
