"""The serving simulator: queueing, latency composition, sampling, and a loop reference."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.errors import InputError
from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.model import table_costs
from autoshard.serving.simulate import (
    RequestSample,
    fifo_departures,
    host_slowdown,
    sample_requests,
    simulate,
)
from tests.serving_helpers import profile, two_group_model


def test_fifo_one_core_queues_back_to_back() -> None:
    dep = fifo_departures(np.array([0.0, 1.0, 2.0]), np.array([2.0, 2.0, 2.0]), 1)
    assert dep.tolist() == [2.0, 4.0, 6.0]


def test_fifo_two_cores_deal_round_robin() -> None:
    dep = fifo_departures(np.array([0.0, 1.0, 2.0, 10.0]), np.array([2.0, 2.0, 2.0, 1.0]), 2)
    assert dep.tolist() == [2.0, 3.0, 4.0, 11.0]


def test_latency_is_slowest_call_plus_dense_without_queueing() -> None:
    model = two_group_model(coverage=1.0)
    prof = profile(dense_us_per_item=10.0)
    mapping = Mapping(2, (0, 0, 1, 1))
    costs = table_costs(model, prof)
    sample = RequestSample(np.ones((3, 4), dtype=bool), np.ones(3), seed=0)
    lat = simulate(model, prof, mapping, qps=1.0, sample=sample)  # a second apart: no queue
    per_server = [(costs.work_us[list(i)] + costs.transfer_us[list(i)]).sum()
                  for i in ((0, 1), (2, 3))]
    expected = (max(per_server) + prof.call_overhead_us + prof.network_latency_us
                + 2 * prof.main_call_us + 4 * 10.0)
    np.testing.assert_allclose(lat.end_to_end_us, expected, rtol=1e-5)
    assert lat.calls.tolist() == [2, 2, 2]


def test_single_server_pays_no_call_overhead() -> None:
    model = two_group_model(coverage=1.0)
    prof = profile(dense_us_per_item=0.0)
    costs = table_costs(model, prof)
    sample = RequestSample(np.ones((2, 4), dtype=bool), np.ones(2), seed=0)
    lat = simulate(model, prof, Mapping(0, (MAIN,) * 4), qps=1.0, sample=sample)
    np.testing.assert_allclose(lat.end_to_end_us, costs.work_us.sum(), rtol=1e-5)
    assert lat.calls.tolist() == [0, 0]


def test_queueing_raises_latency_with_rate() -> None:
    model = two_group_model(coverage=0.5)
    prof = profile(tail_sigma=0.5)
    sample = sample_requests(model, 5000, seed=1)
    mapping = Mapping(2, (0, 0, 1, 1))
    low = simulate(model, prof, mapping, 10.0, sample)
    high = simulate(model, prof, mapping, 5000.0, sample)  # sparse servers ~80% busy
    assert high.percentile_ms(99) > 1.5 * low.percentile_ms(99)
    assert high.utilisation[1:].max() > low.utilisation[1:].max()


def test_groups_are_touched_together_with_measured_marginals() -> None:
    model = two_group_model(coverage=0.3)
    touched = sample_requests(model, 40_000, seed=2).touched
    np.testing.assert_allclose(touched.mean(axis=0), 0.3, atol=0.01)
    same_group = np.mean(touched[:, 0] & touched[:, 1])
    other_group = np.mean(touched[:, 0] & touched[:, 2])
    assert same_group == pytest.approx(0.3, abs=0.01)  # a0 and a1: always together
    assert other_group == pytest.approx(0.09, abs=0.01)  # independent groups


def test_matches_a_request_by_request_reference() -> None:
    model = two_group_model(coverage=0.6)
    prof = profile(tail_sigma=0.4, cores=2, dense_us_per_item=5.0)
    costs = table_costs(model, prof)
    sample = sample_requests(model, 400, seed=3)
    mapping = Mapping(2, (0, 1, 1, MAIN))
    qps = 2000.0
    got = simulate(model, prof, mapping, qps, sample).end_to_end_us
    rng = np.random.default_rng([3, 3])
    tail = np.exp(0.4 * rng.standard_normal((400, 3)) - 0.08)
    arrivals = np.cumsum(sample.gaps) * 1e6 / qps
    free = np.zeros((3, 2))
    seen = [0, 0, 0]
    dense = 5.0 * model.items
    for r in range(400):
        ends = {}
        for s in range(3):
            tables = [t for t in range(4) if sample.touched[r, t] and mapping.assign[t] + 1 == s]
            if s and not tables:
                continue
            work = sum(np.float32(costs.work_us[t]) for t in tables)
            wire = sum(np.float32(costs.transfer_us[t]) for t in tables)
            calls = len({mapping.assign[t] for t in range(4)
                         if sample.touched[r, t] and mapping.assign[t] != MAIN})
            issue = prof.main_call_us * calls * tail[r, 0]
            service = (work * tail[r, 0] + dense + issue if s == 0 else
                       (work + wire + prof.call_overhead_us) * tail[r, s])
            core = seen[s] % 2
            seen[s] += 1
            free[s, core] = max(arrivals[r], free[s, core]) + service
            ends[s] = free[s, core] - arrivals[r] + (prof.network_latency_us * tail[r, s]
                                                     if s else 0.0)
        slowest = (issue + max(v for s, v in ends.items() if s) + dense if len(ends) > 1
                   else 0.0)
        assert got[r] == pytest.approx(max(ends[0], slowest), rel=1e-5)


def test_rejects_non_positive_rate() -> None:
    model = two_group_model()
    with pytest.raises(InputError, match="qps"):
        simulate(model, profile(), Mapping(2, (0, 0, 1, 1)), -5.0, sample_requests(model, 10))


def test_host_slowdown_shares_cores_only_beyond_them() -> None:
    np.testing.assert_allclose(host_slowdown(np.array([0.3, 0.3]), 2), 1.0)
    np.testing.assert_allclose(host_slowdown(np.array([1.0, 1.0, 1.0]), 2), 1.5)
    # one other runnable at a time never slows two cores; both others runnable do
    half = host_slowdown(np.array([0.5, 0.5, 0.5]), 2)
    assert np.all(half > 1.0) and np.all(half < 1.5)
    np.testing.assert_allclose(host_slowdown(np.array([0.5, 0.5]), 1, rounds=1), 1.5)


def test_main_request_time_and_shared_host_add_latency() -> None:
    model = two_group_model(coverage=1.0)
    sample = RequestSample(np.ones((3, 4), dtype=bool), np.ones(3), seed=0)
    mapping = Mapping(2, (0, 0, 1, 1))
    base = simulate(model, profile(), mapping, qps=1.0, sample=sample)
    own = simulate(model, profile(main_request_us=70.0), mapping, qps=1.0, sample=sample)
    np.testing.assert_allclose(own.end_to_end_us, base.end_to_end_us + 70.0, rtol=1e-5)
    # requests back to back: all three processes always busy on one core
    fast = simulate(model, profile(), mapping, qps=1e6, sample=sample)
    shared = simulate(model, profile(host_cores=1), mapping, qps=1e6, sample=sample)
    assert np.all(shared.end_to_end_us > fast.end_to_end_us)
