"""A plan's placement: each shard's price and memory (autoshard.pricing.shard_costs), and how
``plan`` and ``evaluate`` show it: by device or table, within 80 columns, large plans summed
up, and the figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli as run
from handcase import reference_price_ms
from rich.console import Console

from autoshard.cli import common, placement_view
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.plan import Placement, Plan, Shard
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.shard_costs import by_device, by_table, shard_costs
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask

MODEL = AnalyticalCostModel()


def _hand_plan(task: ShardingTask) -> Plan:
    """A on device 0 with 600 of its 1000 rows in HBM; B split by rows over both devices, all
    in HBM; C whole on device 1, none in HBM."""
    return Plan((Placement("A", 0, 600),
                 Placement.split("B", ShardingKind.ROW_WISE,
                                 (Shard(0, 0, 250, 0, 8, 250), Shard(1, 250, 500, 0, 8, 250))),
                 Placement("C", 1, 0)), "hand", task.workload, task.hardware.name)


def test_each_shard_has_its_device_rows_price_and_memory(hand_task: ShardingTask) -> None:
    shards = shard_costs(_hand_plan(hand_task), hand_task, MODEL)
    assert [(s.table, s.device, s.row_start, s.row_end, s.hbm_rows) for s in shards] == [
        ("A", 0, 0, 1000, 600), ("B", 0, 0, 250, 250), ("B", 1, 250, 500, 250),
        ("C", 1, 0, 500, 0)]
    a, c = shards[0], shards[3]
    assert a.sharding is ShardingKind.TABLE_WISE and a.hbm_share == pytest.approx(0.6)
    assert a.hbm_bytes == 600 * 36 and a.host_bytes == 400 * 36  # 32 B weights + 4 B state
    assert c.hbm_bytes == 0 and c.host_bytes == 500 * 36
    # A whole table's price is the analytical formula's (the hand case writes it out); C, all
    # in host memory, pays its lookups over the host link. A and C alone here: not split.
    hbm, uvm, comm = reference_price_ms(hand_task.tables[0], 0.6, 2)
    assert (a.hbm_ms, a.uvm_ms, a.comm_ms) == pytest.approx((hbm, uvm, comm), rel=1e-9)
    assert c.total_ms == pytest.approx(sum(reference_price_ms(hand_task.tables[2], 0.0, 2)),
                                       rel=1e-9)


def test_grouped_by_device_and_by_table(hand_task: ShardingTask) -> None:
    shards = shard_costs(_hand_plan(hand_task), hand_task, MODEL)
    devices = by_device(shards, 2)
    assert [[s.table for s in held] for held in devices] == [
        [s.table for s in sorted(shards[:2], key=lambda s: -s.total_ms)],
        [s.table for s in sorted(shards[2:], key=lambda s: -s.total_ms)]]
    tables = {t.table: t for t in by_table(shards)}
    assert tables["B"].devices == (0, 1) and tables["B"].hbm_share == 1.0
    assert tables["B"].total_ms == pytest.approx(shards[1].total_ms + shards[2].total_ms)
    assert tables["A"].hbm_share == pytest.approx(0.6) and tables["C"].hbm_share == 0.0


def test_column_blocks_count_their_share_once(hand_task: ShardingTask) -> None:
    """Two column blocks of A, 600 and 200 of its 1000 rows in HBM: 40% of A's elements."""
    plan = Plan((Placement.split("A", ShardingKind.COLUMN_WISE,
                                 (Shard(0, 0, 1000, 0, 4, 600), Shard(1, 0, 1000, 4, 8, 200))),
                 Placement("B", 1, 500), Placement("C", 0, 500)), "hand", hand_task.workload,
                hand_task.hardware.name)
    tables = {t.table: t for t in by_table(shard_costs(plan, hand_task, MODEL))}
    assert tables["A"].hbm_share == pytest.approx(0.4)


def test_device_list_is_ranges_or_a_count() -> None:
    assert placement_view.device_list((3, 0, 1, 2, 6)) == "0-3,6"
    assert placement_view.device_list((5,)) == "5"
    assert placement_view.device_list(tuple(range(0, 40, 2))) == "20 devices"


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> Console:
    """The command line's console at 80 columns, recording what it prints."""
    console = Console(width=80, record=True, color_system=None, force_terminal=False)
    for module in (common, placement_view):
        monkeypatch.setattr(module, "console", console)
    from autoshard.cli import core_cmds, report
    monkeypatch.setattr(core_cmds, "console", console)
    monkeypatch.setattr(report, "console", console)
    return console


def _wide_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > 80]


def test_plan_shows_its_placement_within_80_columns(tmp_path: Path, narrow: Console,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    tables = tmp_path / "tables.yaml"
    save_tables(tables, (Table("user_id_embedding_table", 5_000_000, 128, zipf_alpha=1.1),
                         Table("item", 2_000_000, 64, pooling_factor=30, zipf_alpha=1.05),
                         Table("city", 100_000, 32, coverage=0.8)))
    plan = tmp_path / "plan.json"
    figure = tmp_path / "plan.png"
    code, _, err = run(["plan", "-t", str(tables), "--devices", "4", "--hbm-gb", "0.5",
                        "-s", "recshard", "--time-limit", "10", "-o", str(plan),
                        "--plot", str(figure)], capsys)
    assert code == 0, err
    text = narrow.export_text()
    assert "placement by device" in text and "user_id_embedding_table" in text
    assert not _wide_lines(text), _wide_lines(text)
    assert "…" not in text  # no figure cut short
    assert figure.stat().st_size > 0
    assert f"wrote {plan} and {figure}" in " ".join(text.split())
    code, _, err = run(["evaluate", str(plan), "--by", "table"], capsys)
    assert code == 0, err
    text = narrow.export_text()
    assert "placement by table" in text and not _wide_lines(text) and "…" not in text
    for name in ("user_id_embedding_table", "item", "city"):
        assert name in text.split("placement by table")[1]


def test_a_large_plan_is_summed_up_unless_every_table_is_asked(
        tmp_path: Path, narrow: Console, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", "default", "--devices", "64", "--hbm-gb", "4",
                        "-s", "lookup_greedy", "-o", str(plan)], capsys)
    assert code == 0, err
    text = narrow.export_text().split("placement by device")[1]
    shown = placement_view.DEVICES_SHOWN
    assert f"the {shown} dearest devices" in text and f"{64 - shown} more devices" in text
    assert "... and" in text and not _wide_lines(text)
    code, _, err = run(["evaluate", str(plan), "--by", "table"], capsys)
    text = narrow.export_text().split("placement by table")[1]
    assert f"... and {856 - placement_view.TABLES_SHOWN} more tables" in text
    code, _, err = run(["evaluate", str(plan), "--by", "table", "--all-tables"], capsys)
    text = narrow.export_text().split("placement by table")[1]
    assert "more tables" not in text and len(text.splitlines()) > 856
    assert not _wide_lines(text)


def test_bad_view_and_plot_path_fail_before_planning(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", "default", "-s", "random", "--by", "rank", "-o",
                        str(plan)], capsys)
    assert code == 2 and "--by" in err and not plan.exists()
    code, _, err = run(["plan", "-t", "default", "-s", "random", "-o", str(plan), "--plot",
                        str(plan)], capsys)
    assert code == 2 and not plan.exists()


def test_json_report_is_unchanged_by_the_view(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    code, out, _ = run(["plan", "-t", "default", "-s", "random", "--devices", "4", "-o",
                        str(plan), "--json"], capsys)
    assert code == 0 and json.loads(out)["sharder"] == "random"
