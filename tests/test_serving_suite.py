"""A suite's report: how the simulator agrees with a measurement, replicas measured against
one server, and the answers on fresh seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoshard.serving.cluster import CALIBRATED
from autoshard.serving.suite_report import answer_lines, measured_lines, write_suite
from autoshard.serving.suite_run import agreement, replica_verdicts


def _point(sim: float, measured: float, below: bool = True, replicas: str = "1,1",
           qps: float = 150.0, spread: float = 0.1) -> dict[str, Any]:
    row: dict[str, Any] = {"strategy": "load_balanced", "servers": 2, "replicas": replicas,
                           "qps": qps, "below_ceiling": below,
                           "p99_ratio": round(measured / sim, 3)}
    for name, value in (("simulated", sim), ("measured", measured)):
        for q, scale in (("p50", 0.5), ("p90", 0.8), ("p99", 1.0)):
            row[f"{name}_{q}_ms"] = value * scale
        row[f"{name}_p99_lo_ms"], row[f"{name}_p99_hi_ms"] = value - spread, value + spread
    return row


def test_agreement_leaves_out_points_above_the_ceiling() -> None:
    rows = [_point(1.0, 1.2), _point(2.0, 1.8), _point(3.0, 4.0), _point(4.0, 1.0, False)]
    got = agreement(rows)
    assert got["points"] == 3 and got["above_ceiling"] == 1
    assert got["spearman_p99"] == 1.0  # the point above the ceiling would break the order
    assert got["p99_ratio_range"] == [0.9, 1.333] and got["within_1_5x"] == 3


def test_two_replicas_count_as_faster_only_with_intervals_apart() -> None:
    rows = [_point(3.0, 3.0, replicas="1", qps=300.0), _point(2.5, 2.85, replicas="2", qps=300.0),
            _point(5.0, 5.0, replicas="1", qps=800.0), _point(3.5, 3.6, replicas="2", qps=800.0)]
    low, high = replica_verdicts(rows)
    assert low["simulated_faster"] and not low["measured_faster_apart"]  # 2.95 > 2.9
    assert high["simulated_faster"] and high["measured_faster_apart"]
    assert high["two_interval"] == [3.5, 3.7]


def _rate(**more: Any) -> dict[str, Any]:
    answer = {"strategy": "feature_group", "servers": 6, "total_servers": 7,
              "replicas": "1,1,1,1,1,1", "main_replicas": 1, "p99_ms": 1.97, "p99_lo_ms": 1.93,
              "p99_hi_ms": 2.0, "max_utilisation": 0.11}
    seeds = [{"seed": 1, **answer}, {"seed": 2, **dict(answer, total_servers=8)}]
    return {"qps": 5000.0, "memory_bound_shards": 6, "answer": answer, "seeds": seeds,
            "same": False, "marginal": True, "servers_on_every_seed": 8, "advantage": [],
            "p99_target_ms": 2.05, **more}


def test_answer_lines_flag_a_marginal_answer_with_the_count_on_every_seed() -> None:
    (line,) = answer_lines([_rate()])
    assert "Fresh seeds 1, 2: 7 (feature_group), 8 (feature_group)" in line
    assert "Marginal" in line and "8 servers meet it on every seed tried" in line
    (line,) = answer_lines([_rate(same=True, marginal=False)])
    assert "the same answer on every seed" in line and "Marginal" not in line


@pytest.fixture()
def measured() -> dict[str, Any]:
    rows = [_point(1.0, 1.2), _point(2.0, 1.8)]
    replicated = [_point(3.0, 3.0, replicas="1"), _point(2.5, 2.4, replicas="2")]
    return {"rows": rows, "replicated": replicated, "wide": [_point(4.0, 4.2)],
            **agreement(rows + replicated), "replica_verdicts": replica_verdicts(replicated),
            "mode": "replay", "profile": {k: 1.0 for k in (*CALIBRATED, "host_cores")},
            "load_average_before": [1.0, 1.0, 1.0], "load_average": [1.1, 1.0, 1.0]}


def test_the_measured_section_says_how_it_was_measured(measured: dict[str, Any]) -> None:
    text = "\n".join(measured_lines(measured))
    assert "Mode `replay`: each server replayed its own calls alone" in text
    assert ("150 qps: two replicas P99 2.4 ms [2.3, 2.5] against one 3.0 ms [2.9, 3.1]: "
            "measured lower, the intervals apart; simulated lower") in text


def test_write_suite_writes_the_report(tmp_path: Path, measured: dict[str, Any]) -> None:
    write_suite("bench", tmp_path, "autoshard serve compare --suite bench", [],
                [_rate()], measured)
    text = (tmp_path / "bench.md").read_text()
    assert "Marginal" in text and "Mode `replay`" in text
    assert (tmp_path / "bench.bench.csv").read_text().count("\n") == 6  # header + 5 points
