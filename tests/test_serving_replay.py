"""Measuring one server at a time: call schedules, the replay loops on a simulated clock with
fixed service times, and the composition of the requests."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from autoshard.serving.cluster import load_serving_profile
from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.registry import get_strategy
from autoshard.serving.replay import (
    compose,
    main_steps,
    measure_round,
    replay_calls,
    replay_main,
)
from autoshard.serving.schedule import (
    CallSchedule,
    RequestStream,
    Routing,
    held_rows,
    main_schedules,
    request_stream,
    route,
    shard_schedules,
)
from autoshard.serving.simulate import deal, sample_requests, server_load
from autoshard.serving.suites import suite_model
from autoshard.serving.task import ServingTask


class Clock:
    """A simulated clock (microseconds): ``sleep`` moves it on, running what falls due."""

    def __init__(self) -> None:
        self.now = 0.0
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now

    def at(self, when: float, then: Callable[[], None]) -> None:
        heapq.heappush(self._due, (when, next(self._order), then))

    def sleep(self, span: float) -> None:
        self.run_until(self.now + span)

    def run_until(self, end: float) -> None:
        while self._due and self._due[0][0] <= end:
            when, _, then = heapq.heappop(self._due)
            self.now = max(self.now, when)
            then()
        self.now = max(self.now, end)

    def wait(self, _: list[Any]) -> None:
        """Runs everything still due (every reply in)."""
        if self._due:
            self.run_until(max(d[0] for d in self._due))


class Server:
    """One core, first come first served, a fixed service time per call and a fixed wire
    time each way."""

    def __init__(self, clock: Clock, service_us: float, wire_us: float) -> None:
        self.clock, self.service, self.wire, self.free = clock, service_us, wire_us, 0.0

    def send(self, _: Any, on_reply: Callable[[], None]) -> None:
        begin = max(self.clock.now + self.wire, self.free)
        self.free = begin + self.service
        self.clock.at(self.free + self.wire, on_reply)


#: Three tables: 0 on shard A (1,000 us a call), 1 on shard B (300 us), 2 on the main server
#: (200 us in-line); 50 us on the wire each way; the main server takes 10 us to issue a call.
ASSIGN = (0, 1, MAIN)
SERVICE = {1: 1000.0, 2: 300.0}


def _case() -> tuple[RequestStream, Routing, Mapping]:
    """Requests at 0, 100 and 5,000 us (1,000 qps): tables {0, 1, 2}, {0}, {1, 2}."""
    parts = np.array([0, 1, 2, 0, 1, 2])
    stream = RequestStream(gaps=np.array([0.0, 0.1, 4.9]), entry_start=np.array([0, 3, 4, 6]),
                           part=parts, bags=np.ones(6, dtype=np.int64),
                           id_start=np.arange(7), ids=np.zeros(6, dtype=np.int64))
    target = np.array([1, 2, 0, 1, 2, 0])
    routing = Routing(np.zeros(3, dtype=np.int64), target, np.array([0, 0, 1, 2]),
                      np.array([1, 2, 1, 2]))
    return stream, routing, Mapping(2, ASSIGN, replicas=(1, 1))


def test_requests_compose_from_servers_measured_alone() -> None:
    stream, routing, mapping = _case()
    qps = 1000.0

    def run_main(replica: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        clock = Clock()
        (schedule,) = main_schedules(stream, routing, mapping)
        steps = main_steps(stream, routing, schedule, qps, lambda entries: entries)
        steps = [(due * 1e6, own, calls) for due, own, calls in steps]  # the clock is in us

        def issue(_: Any, on_reply: Callable[[], None]) -> None:
            clock.now += 10.0
            clock.at(clock.now, on_reply)  # the stand-in answers at once

        def look_up(_: Any) -> None:
            clock.now += 200.0

        sent, local = replay_main(steps, clock, clock.sleep, issue, look_up, clock.wait)
        return schedule.request, local, np.array(list(sent)), np.array(list(sent.values()))

    def run_calls(schedule: CallSchedule, order: np.ndarray, due_us: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        clock = Clock()
        server = Server(clock, SERVICE[int(routing.call_target[schedule.call[0]])], 50.0)
        sent, trips = replay_calls(due_us, [schedule.entries_of(c) for c in order], clock,
                                   clock.sleep, server.send, clock.wait)
        return trips, sent - due_us

    times = measure_round(stream, routing, mapping, run_main, run_calls)
    # main: request 0 issues A at 0 and B at 10, done at 220; request 1 (due 100) issues A
    # at 220, done at 230; request 2 issues B at 5000, done at 5210
    assert times.local_us.tolist() == [220.0, 230.0, 5210.0]
    assert times.send_us.tolist() == [0.0, 10.0, 220.0, 5000.0]
    # A: call 0 back at 1100; call 2 (sent 220) waits for call 0: served 1050-2050, back 2100.
    # B: 300 us each, alone, back 400 us after sending
    assert times.trip_us.tolist() == [1100.0, 400.0, 1880.0, 400.0]
    assert times.late_us.tolist() == [0.0] * 4
    latency = times.latencies_us(stream, routing, qps)
    assert latency.tolist() == [1100.0, 2000.0, 400.0]
    # a modelled network beyond the host's adds to every request that waits on a call
    assert times.latencies_us(stream, routing, qps, 25.0).tolist() == [1125.0, 2025.0, 425.0]


def test_compose_takes_the_last_of_own_work_and_replies() -> None:
    got = compose(np.array([0.0, 10.0]), np.array([5.0, 40.0]), np.array([0, 0, 1]),
                  np.array([1.0, 2.0, 12.0]), np.array([3.0, 9.0, 4.0]))
    assert got.tolist() == [11.0, 30.0]  # max(5, 1+3, 2+9) - 0; max(40, 12+4) - 10


@pytest.fixture(scope="module")
def bench_task() -> ServingTask:
    return ServingTask(suite_model("bench"), load_serving_profile("local-cpu"), qps=100.0,
                       requests=200)


def test_schedules_deal_calls_as_the_simulator_does(bench_task: ServingTask) -> None:
    mapping = get_strategy("load_balanced").map(bench_task, 2).with_replicas((2, 1), 2)
    parts = mapping.part_set(24)
    sample = sample_requests(bench_task.model, 300, (0, 1))
    stream = request_stream(bench_task, parts, sample, 1000)
    routing = route(stream, sample, mapping)
    main_rep, call_rep = deal(sample, mapping)
    assert np.array_equal(routing.main, main_rep)
    calls = server_load(sample, bench_task.costs_for(parts), mapping).calls[:, 1:]
    shards = shard_schedules(stream, routing, mapping)
    assert [s.server.name for s in shards] == ["shard 0 replica 0", "shard 0 replica 1",
                                               "shard 1 replica 0"]
    for sched, (s, r) in zip(shards, [(0, 0), (0, 1), (1, 0)], strict=True):
        expected = np.flatnonzero(calls[:, s] & (call_rep[:, s] == r))
        assert np.array_equal(sched.request, expected)  # one call per request needing it
        for c in range(sched.calls):
            assert set(mapping.array[stream.part[sched.entries_of(c)]]) == {s}
    mains = main_schedules(stream, routing, mapping)
    assert sorted(np.concatenate([m.request for m in mains]).tolist()) == list(range(300))
    remote = np.concatenate([s.entries for s in shards])
    local = np.flatnonzero(routing.target == 0)
    assert sorted(np.r_[remote, local].tolist()) == list(range(stream.part.size))


def test_stream_looks_up_the_models_lookups_in_the_rows_held(bench_task: ServingTask) -> None:
    model = bench_task.model
    parts = bench_task.base_parts
    sample = sample_requests(model, 200, (0, 1))
    stream = request_stream(bench_task, parts, sample, 500)
    rows = held_rows(model, parts, 500)
    assert rows.max() <= 500 and rows.min() >= 1
    for e in range(stream.part.size):
        ids = stream.ids[stream.id_start[e]:stream.id_start[e + 1]]
        p = int(stream.part[e])
        assert ids.size and ids.max() < rows[p] and ids.size % int(stream.bags[e]) == 0
        assert stream.bags[e] == (model.items if model.per_item[p] else 1)
    touched = bench_task.costs_for(parts)  # the same parts the simulator's requests touch
    assert stream.part.size == int(sample.touched[:, touched.table].sum())
    again = request_stream(bench_task, parts, sample, 500)
    assert np.array_equal(again.ids, stream.ids)  # seeded


def test_pinning_puts_the_server_and_its_caller_on_two_cores() -> None:
    import os

    from autoshard.serving.bench import pinned_cores

    assert pinned_cores(False) is None
    allowed = os.sched_getaffinity(0)
    got = pinned_cores(True)
    if len(allowed) < 2:
        assert got is None
    else:
        assert got is not None and len(set(got)) == 2 and set(got) <= allowed
