"""Overflow, NaN and absurd sizes: rejected at the edges with the field named, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli as run
from handcase import hand_task_of

from autoshard.compare.harness import FixedTask, run_suite
from autoshard.errors import InputError, PlannerError
from autoshard.hardware import BUNDLED, Device, HardwareProfile, Tier, load_hardware
from autoshard.limits import MAX_BATCH_SIZE, MAX_DEVICES, MAX_ROWS, check_finite_costs
from autoshard.pricing.cost import Pricing
from autoshard.tables import Table, load_tables, save_tables
from autoshard.task import ShardingTask, Workload

GOOD = [{"name": "a", "rows": 1000, "dim": 16}, {"name": "b", "rows": 500, "dim": 8}]


@pytest.fixture
def no_huge_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test at once where more devices are built than any cluster may hold: an
    absurd count must be rejected up front, not after building the cluster."""
    built = [0]
    init = Device.__init__

    def counted(self: Device, *args: object, **kwargs: object) -> None:
        built[0] += 1
        assert built[0] <= MAX_DEVICES, "built the cluster before rejecting its size"
        init(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Device, "__init__", counted)


def _tables_file(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": [dict(GOOD[0], **extra), GOOD[1]]}))
    return path


@pytest.mark.parametrize(("extra", "field"), [
    ({"rows": 1e20}, "a.rows"),
    ({"rows": 2**40 + 1}, "a.rows"),
    ({"dim": 10**7}, "a.dim"),
    ({"pooling_factor": 1e308}, "a.pooling_factor"),
    ({"pooling_std": 1e300}, "a.pooling_std"),
    ({"optimizer_bytes_per_row": 10**12}, "a.optimizer_bytes_per_row"),
    ({"zipf_alpha": 1e300}, "a.zipf_alpha"),
])
def test_absurd_table_sizes_fail_naming_field(tmp_path: Path, extra: dict[str, object],
                                              field: str) -> None:
    path = _tables_file(tmp_path, **extra)
    with pytest.raises(InputError) as info:
        load_tables(path)
    assert info.value.field == field and info.value.source == str(path)


def test_largest_allowed_table_prices_finitely() -> None:
    huge = Table("huge", rows=MAX_ROWS, dim=65_536, bytes_per_element=8, pooling_factor=1e6)
    task = ShardingTask((huge,), load_hardware("8xH100-80GB", devices=2),
                        Workload(batch_size=MAX_BATCH_SIZE))
    from autoshard.pricing.analytical import AnalyticalCostModel

    price = AnalyticalCostModel().price(task, np.array([0]), np.array([0]), np.array([0]))
    assert np.isfinite(price.total_ms).all() and price.total_ms[0] > 0


@pytest.mark.parametrize(("args", "option"), [
    (["--hbm-gb", "1e300"], "--hbm-gb"),
    (["--hbm-gb", "inf"], "--hbm-gb"),
    (["--devices", "1000000000"], "--devices"),
    (["--nodes", "1000000000"], "--nodes"),
    (["--nodes", "4096"], "--nodes"),  # 4,096 nodes of 8 is over the device limit
    (["--batch-size", str(2**40)], "--batch-size"),
    (["-H", "1000000000xH100-80GB"], "--devices"),
])
@pytest.mark.usefixtures("no_huge_cluster")
def test_absurd_cli_values_exit_2_naming_option(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                args: list[str], option: str) -> None:
    out = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", str(_tables_file(tmp_path)), *args, "-o", str(out)], capsys)
    assert code == 2, err
    assert option in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(("extra", "field"), [
    ({"rows": 1e20}, "a.rows"),
    ({"pooling_factor": 1e308}, "a.pooling_factor"),
])
def test_absurd_table_files_exit_2_and_write_nothing(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     extra: dict[str, object], field: str) -> None:
    out = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", str(_tables_file(tmp_path, **extra)), "-o", str(out)],
                       capsys)
    assert code == 2 and field in err and "tables.json" in err, err
    assert not out.exists()


@pytest.mark.parametrize(("device", "top", "field"), [
    ({"hbm_gb": 1e300}, {}, "device.hbm_gb"),
    ({"host_gb": 1e300}, {}, "device.host_gb"),
    ({"hbm_bandwidth_gbps": 1e-300}, {}, "device.hbm_bandwidth_gbps"),
    ({"host_bandwidth_gbps": 1e300}, {}, "device.host_bandwidth_gbps"),
    ({}, {"num_devices": 10**9}, "num_devices"),
    ({}, {"intra_node_gbps": 1e300}, "intra_node_gbps"),
    ({}, {"kernel_overhead_us": 1e300}, "kernel_overhead_us"),
    ({}, {"devices_per_node": 10**9}, "devices_per_node"),
    ({"node": 10**9}, {}, "device.node"),
])
@pytest.mark.usefixtures("no_huge_cluster")
def test_absurd_hardware_files(tmp_path: Path, device: dict[str, float], top: dict[str, float],
                               field: str) -> None:
    doc = BUNDLED["8xH100-80GB"].to_dict()
    doc["device"].update(device)
    doc.update(top)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as info:
        load_hardware(str(path))
    assert info.value.field == field and info.value.source == str(path)


def test_constructors_reject_absurd_values() -> None:
    tier = Tier(10**9, 100.0)
    with pytest.raises(InputError, match="capacity"):
        Tier(10**20, 100.0)
    with pytest.raises(InputError, match="bandwidth"):
        Tier(10**9, 1e-9)
    with pytest.raises(InputError) as info:
        HardwareProfile("x", (Device(tier, tier),) * (MAX_DEVICES + 1), 100.0, 10.0)
    assert info.value.field == "devices"
    with pytest.raises(InputError) as info:
        Workload(batch_size=MAX_BATCH_SIZE + 1)
    assert info.value.field == "batch_size"
    with pytest.raises(InputError) as info:
        BUNDLED["8xH100-80GB"].with_hbm_bytes(10**300)
    assert info.value.field == "hbm_gb"


def test_demo_rejects_absurd_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args, option in ((["--devices", "1000000000"], "--devices"),
                         (["--tables", "100000", "--trace-batch", "100000"], "--trace-batch"),
                         (["--tables", "1000000000"], "--tables"),
                         (["--hbm-fraction", "nan"], "--hbm-fraction"),
                         (["--batch-size", str(2**40)], "--batch-size")):
        code, _, err = run(["demo", "--out", str(tmp_path / "demo"), *args], capsys)
        assert code == 2 and option in err, (args, err)
        assert not (tmp_path / "demo").exists()


class NaNModel:
    """Prices every table at NaN ms, as a damaged cost model could."""

    name = "nan"

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        nan = np.full(len(table_idx), np.nan)
        return Pricing(nan, nan, nan)


def test_check_finite_costs() -> None:
    check_finite_costs({"step_cost_ms": 1.0}, "plan")
    for bad in (float("nan"), float("inf")):
        with pytest.raises(PlannerError, match="step_cost_ms") as info:
            check_finite_costs({"lower_bound_ms": 1.0, "step_cost_ms": bad}, "plan")
        assert info.value.kind == "non_finite"


def test_plan_never_writes_a_nan_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import autoshard.cli.core_cmds as core_cmds

    monkeypatch.setattr(core_cmds, "load_cost_model", lambda spec: NaNModel())
    tables = tmp_path / "t.yaml"
    save_tables(tables, [Table("a", 100, 4), Table("b", 50, 4)])
    out = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", str(tables), "-s", "round_robin", "-o", str(out)], capsys)
    assert code == 2 and "step_cost_ms is nan" in err, err
    assert not out.exists()


def test_evaluate_refuses_a_nan_report(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import autoshard.cli.core_cmds as core_cmds

    tables = tmp_path / "t.yaml"
    save_tables(tables, [Table("a", 100, 4), Table("b", 50, 4)])
    plan = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", str(tables), "-s", "round_robin", "-o", str(plan)], capsys)
    assert code == 0, err
    monkeypatch.setattr(core_cmds, "load_cost_model", lambda spec: NaNModel())
    code, out, err = run(["evaluate", str(plan), "-t", str(tables), "--json"], capsys)
    assert code == 2 and "step_cost_ms is nan" in err and str(plan) in err, err
    assert "step_cost_ms" not in out


def test_compare_records_a_nan_plan_as_failed(tmp_path: Path) -> None:
    rows = run_suite("s", [FixedTask("hand", hand_task_of())], NaNModel(), tmp_path,  # type: ignore[arg-type]
                     ["round_robin"])
    assert [(r.status, "nan" in r.reason) for r in rows] == [("failed", True)]


def test_synth_rejects_a_trace_beyond_memory(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.pt"
    for args, option in ((["--tables", "1000000000"], "--tables"),
                         (["--tables", "856", "--batch-size", "10000000"], "--batch-size")):
        code, _, err = run(["synth", *args, "-o", str(out)], capsys)
        assert code == 2 and option in err, (args, err)
        assert not out.exists()


def test_device_node_in_range() -> None:
    tier = Tier(10**9, 100.0)
    with pytest.raises(InputError) as info:
        Device(tier, tier, node=-1)
    assert info.value.field == "node"
