"""The serving simulator: shared-queue servers, latency composition, replicas, item counts,
stalls, sampling."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.errors import InputError
from autoshard.serving.costs import part_costs
from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.parts import PartSet
from autoshard.serving.queueing import host_slowdown, solve_queues, stall_delays
from autoshard.serving.simulate import RequestSample, sample_requests, simulate
from tests.serving_helpers import profile, two_group_model


def _sample(n: int, tables: int = 4, gap: float = 1.0) -> RequestSample:
    return RequestSample(np.ones((n, tables), dtype=bool), np.full(n, gap), np.ones(n), (0,))


def _run(model, prof, mapping, qps, sample):  # type: ignore[no-untyped-def]
    costs = part_costs(model, prof, mapping.part_set(model.num_tables))
    return simulate(model, prof, mapping, qps, [sample], costs)[0]


def test_one_core_queues_back_to_back() -> None:
    starts, deps = solve_queues([np.array([0.0, 1.0, 2.0])], [np.array([2.0, 2.0, 2.0])], 1)
    assert deps[0].tolist() == [2.0, 4.0, 6.0] and starts[0].tolist() == [0.0, 2.0, 4.0]


def test_cores_share_one_queue() -> None:
    # Round-robin dealing would send the third job to core 0 behind the long first job
    # (start 10); a shared queue starts it on core 1 as soon as that frees (at 1).
    _, deps = solve_queues([np.array([0.0, 0.0, 0.5])], [np.array([10.0, 1.0, 1.0])], 2)
    assert deps[0].tolist() == [10.0, 1.0, 2.0]
    # queues of different lengths, unsorted arrivals, solved together
    _, deps = solve_queues([np.array([3.0, 0.0]), np.array([0.0])],
                           [np.array([1.0, 5.0]), np.array([2.0])], 1)
    assert deps[0].tolist() == [6.0, 5.0] and deps[1].tolist() == [2.0]


def test_shared_queue_tail_is_shorter_than_per_core_queues() -> None:
    rng = np.random.default_rng(0)
    n, cores, load = 40_000, 8, 0.8
    arrivals = np.cumsum(rng.exponential(1.0 / (cores * load), n))
    service = rng.exponential(1.0, n)
    _, shared = solve_queues([arrivals], [service], cores)
    split = [(arrivals[c::cores], service[c::cores]) for c in range(cores)]
    _, dealt = solve_queues([a for a, _ in split], [x for _, x in split], 1)
    wait_shared = np.percentile(shared[0] - arrivals, 99)
    wait_dealt = np.percentile(np.concatenate(dealt) - np.concatenate([a for a, _ in split]), 99)
    assert wait_shared < 0.75 * wait_dealt


def test_latency_is_slowest_call_plus_dense_without_queueing() -> None:
    model = two_group_model(coverage=1.0)
    prof = profile(dense_us_per_item=10.0)
    mapping = Mapping(2, (0, 0, 1, 1))
    costs = part_costs(model, prof, PartSet.whole(4))
    lat = _run(model, prof, mapping, 1.0, _sample(3))  # a second apart: no queue
    per_server = [(costs.work_us[list(i)] + costs.transfer_us[list(i)]).sum()
                  for i in ((0, 1), (2, 3))]
    expected = (max(per_server) + prof.call_overhead_us + prof.network_latency_us
                + 2 * prof.main_call_us + 4 * 10.0)
    np.testing.assert_allclose(lat.end_to_end_us, expected, rtol=1e-5)
    assert lat.calls.tolist() == [2, 2, 2]


def test_main_only_pays_no_call_overhead() -> None:
    model = two_group_model(coverage=1.0)
    prof = profile(dense_us_per_item=0.0)
    costs = part_costs(model, prof, PartSet.whole(4))
    lat = _run(model, prof, Mapping(0, (MAIN,) * 4), 1.0, _sample(2))
    np.testing.assert_allclose(lat.end_to_end_us, costs.work_us.sum(), rtol=1e-5)
    assert lat.calls.tolist() == [0, 0]


def test_overlapped_dense_hides_the_calls() -> None:
    from dataclasses import replace

    model = replace(two_group_model(coverage=1.0), dense_overlap=1.0)
    prof = profile(dense_us_per_item=1000.0)  # 4 ms of dense compute, far above a call
    lat = _run(model, prof, Mapping(2, (0, 0, 1, 1)), 1.0, _sample(2))
    np.testing.assert_allclose(lat.end_to_end_us, 4000.0 + 2 * prof.main_call_us, rtol=1e-5)


def test_replicas_share_a_shards_load() -> None:
    model = two_group_model(coverage=0.5)
    prof = profile(tail_sigma=0.5)
    sample = sample_requests(model, 4000, seed=1)
    one = Mapping(2, (0, 0, 1, 1))
    two = one.with_replicas((2, 2), 1)
    a, b = _run(model, prof, one, 2500.0, sample), _run(model, prof, two, 2500.0, sample)
    assert b.shard_utilisation.max() < 0.6 * a.shard_utilisation.max()
    assert b.percentile_ms(99) < a.percentile_ms(99)
    assert two.total_servers == 5


def test_queueing_raises_latency_with_rate() -> None:
    model = two_group_model(coverage=0.5)
    prof = profile(tail_sigma=0.5)
    sample = sample_requests(model, 5000, seed=1)
    mapping = Mapping(2, (0, 0, 1, 1))
    low = _run(model, prof, mapping, 10.0, sample)
    high = _run(model, prof, mapping, 5000.0, sample)  # sparse servers ~80% busy
    assert high.percentile_ms(99) > 1.5 * low.percentile_ms(99)
    assert high.shard_utilisation.max() > low.shard_utilisation.max()


def test_item_counts_vary_with_mean_one_and_scale_dense_work() -> None:
    from dataclasses import replace

    model = replace(two_group_model(coverage=1.0), items_sigma=0.8)
    sample = sample_requests(model, 20_000, seed=4)
    assert sample.items.mean() == pytest.approx(1.0, abs=0.03)
    assert np.percentile(sample.items, 99) > 4 * np.median(sample.items)
    prof = profile(dense_us_per_item=100.0)
    lat = _run(model, prof, Mapping(0, (MAIN,) * 4), 1e-3, sample)
    big, small = np.argmax(sample.items), np.argmin(sample.items)
    assert lat.end_to_end_us[big] > lat.end_to_end_us[small] + 100.0 * 4 * (
        sample.items[big] - sample.items[small]) * 0.99


def test_stalls_delay_jobs_in_service_only() -> None:
    rng = np.random.default_rng(0)
    starts, deps = [np.array([0.0, 10.0])], [np.array([1e6, 10.0 + 1e-9])]
    got = stall_delays(starts, deps, 1e6, per_s=50.0, mean_us=100.0, shared=True, rng=rng)
    assert got[0][0] > 0 and got[0][1] == 0.0
    assert stall_delays(starts, deps, 1e6, 0.0, 100.0, True, rng)[0].tolist() == [0.0, 0.0]


def test_groups_are_touched_together_with_measured_marginals() -> None:
    model = two_group_model(coverage=0.3)
    touched = sample_requests(model, 40_000, seed=2).touched
    np.testing.assert_allclose(touched.mean(axis=0), 0.3, atol=0.01)
    assert np.mean(touched[:, 0] & touched[:, 1]) == pytest.approx(0.3, abs=0.01)
    assert np.mean(touched[:, 0] & touched[:, 2]) == pytest.approx(0.09, abs=0.01)


def test_rejects_non_positive_rate() -> None:
    model = two_group_model()
    with pytest.raises(InputError, match="qps"):
        _run(model, profile(), Mapping(2, (0, 0, 1, 1)), -5.0, sample_requests(model, 10))


def test_host_slowdown_shares_cores_only_beyond_them() -> None:
    np.testing.assert_allclose(host_slowdown(np.array([0.3, 0.3]), 2), 1.0)
    np.testing.assert_allclose(host_slowdown(np.array([1.0, 1.0, 1.0]), 2), 1.5)
    half = host_slowdown(np.array([0.5, 0.5, 0.5]), 2)
    assert np.all(half > 1.0) and np.all(half < 1.5)
    np.testing.assert_allclose(host_slowdown(np.array([0.5, 0.5]), 1, rounds=1), 1.5)


def test_main_request_time_and_shared_host_add_latency() -> None:
    model = two_group_model(coverage=1.0)
    mapping = Mapping(2, (0, 0, 1, 1))
    base = _run(model, profile(), mapping, 1.0, _sample(3))
    own = _run(model, profile(main_request_us=70.0), mapping, 1.0, _sample(3))
    np.testing.assert_allclose(own.end_to_end_us, base.end_to_end_us + 70.0, rtol=1e-5)
    fast = _run(model, profile(), mapping, 1e6, _sample(3))
    shared = _run(model, profile(host_cores=1), mapping, 1e6, _sample(3))
    assert np.all(shared.end_to_end_us > fast.end_to_end_us)


def test_main_wake_tail_spreads_only_the_main_servers_own_time() -> None:
    model = two_group_model(coverage=1.0)
    mapping = Mapping(0, (MAIN,) * 4)
    sample = _sample(2000, gap=1.0)
    flat = _run(model, profile(main_request_us=100.0), mapping, 100.0, sample)
    spread = _run(model, profile(main_request_us=100.0, main_tail_sigma=0.8), mapping, 100.0,
                  sample)
    assert np.ptp(flat.end_to_end_us) == pytest.approx(0.0, abs=1e-6)
    extra = spread.end_to_end_us - flat.end_to_end_us  # 100 us times a mean-1 factor, less 100
    assert abs(extra.mean()) < 10.0 and np.percentile(extra, 99) > 200.0
