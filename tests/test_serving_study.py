"""The study of Lui et al.'s findings, on a small run."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoshard.serving import study


def test_study_states_each_finding_with_its_ratio(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(study, "DENSE_US", (0.0, 150.0))
    monkeypatch.setattr(study, "SPAN", 2)
    found = study.run_study(requests=400, samples=2)
    assert len(found["verdicts"]) == 4
    paper = next(r for r in found["sweep"] if r["dense_us_per_item"] == 150.0)
    none = next(r for r in found["sweep"] if r["dense_us_per_item"] == 0.0)
    assert paper["dense_to_remote"] > 10 and none["dense_to_remote"] == 0
    # with dense compute dominating, the sharded P99 is near the unsharded one
    assert abs(paper["best_p99_overhead"]) < abs(none["best_p99_overhead"])
    assert all(r["calls_per_request"] > 0 for r in found["fan_out"])
    study.write_study(found, tmp_path)
    text = (tmp_path / "study.md").read_text()
    assert "serve study" in text and "P99 overhead" in text
