"""Measuring a deployment one server at a time, and composing its requests (trace-driven).

Each server is replayed its own schedule (:mod:`autoshard.serving.schedule`) alone on the
host, its counterpart on another core:

- A main replica takes its requests at their arrival times, sends each remote call (to a
  stand-in that answers at once) and looks up its own parts in-line. It records when it began
  sending each call (``send_us``) and when it was done with each request's own work
  (``local_us``), both from the start of the stream.
- A shard replica is sent its calls by a load generator at the times its main server began
  sending them in the same round. The generator records each call's round trip
  (``trip_us``): the host's network both ways, the server's queue and its work, and the
  reply's handling, as the main server would handle it.

A request ends when its main server's own work and the last of its replies are done::

    end_i = max(local_i, max over its calls c of (send_c + trip_c + network_us))

and its latency is ``end_i - arrival_i``. This is exact when servers share nothing: a
server's time depends only on the calls it receives and its own cores. ``network_us`` is the
modelled network beyond this host's loopback (0 here: the round trips hold it).

The loops take their clock, sleep and transport as arguments: the worker processes pass the
machine's clock and ``torch.distributed.rpc``, a test a simulated clock and fixed service
times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard.serving.mapping import Mapping
from autoshard.serving.schedule import CallSchedule, RequestStream, Routing, shard_schedules

#: One main-replica request: (due, in seconds of the clock; its in-line lookups' payload, or
#: None; each remote call as (index among the routing's calls, payload)).
MainStep = tuple[float, Any, Sequence[tuple[int, Any]]]
#: ``send(payload, on_reply)``: starts a call, arranges ``on_reply()`` when its reply is in,
#: and returns something ``wait`` can wait on (done only after ``on_reply`` ran).
Send = Callable[[Any, Callable[[], None]], Any]


def replay_main(steps: Sequence[MainStep], clock: Callable[[], float],
                sleep: Callable[[float], None], send: Send, lookup: Callable[[Any], Any],
                wait: Callable[[list[Any]], None],
                progress: Callable[[int], None] | None = None
                ) -> tuple[dict[int, float], np.ndarray]:
    """Replays a main replica's requests: sleeps until each is due, begins each remote call,
    then looks up its own parts.

    Returns:
        ({call index: time its sending began}, (steps,) when each request's own work was
        done), in the clock's time.
    """
    sent: dict[int, float] = {}
    local = np.empty(len(steps))
    pending: list[Any] = []
    for n, (due, own, calls) in enumerate(steps):
        pause = due - clock()
        if pause > 0:
            sleep(pause)
        for call, payload in calls:
            sent[call] = clock()
            pending.append(send(payload, _nothing))
        if own is not None:
            lookup(own)
        local[n] = clock()
        if progress is not None:
            progress(n)
    wait(pending)
    return sent, local


def replay_calls(due: np.ndarray, payloads: Sequence[Any], clock: Callable[[], float],
                 sleep: Callable[[float], None], send: Send,
                 wait: Callable[[list[Any]], None],
                 progress: Callable[[int], None] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Sends one server its calls, each when due (``due`` ascending, clock time).

    Returns:
        (when each call was sent, its round trip), clock time.
    """
    sent = np.empty(due.size)
    back = np.full(due.size, np.nan)
    pending: list[Any] = []
    for k, (when, payload) in enumerate(zip(due, payloads, strict=True)):
        pause = when - clock()
        if pause > 0:
            sleep(pause)
        sent[k] = clock()

        def record(k: int = k) -> None:
            back[k] = clock()

        pending.append(send(payload, record))
        if progress is not None:
            progress(k)
    wait(pending)
    return sent, back - sent


def _nothing() -> None:
    return None


def main_steps(stream: RequestStream, routing: Routing, schedule: CallSchedule, qps: float,
               payload: Callable[[np.ndarray], Any]) -> list[MainStep]:
    """A main replica's steps: each request's due time (seconds from the stream's start), the
    payload of its in-line lookups (None without), and its remote calls' payloads (each
    ``payload(entries)``), built before anything is timed."""
    arrivals = stream.arrivals_us(qps) / 1e6
    call_start = np.searchsorted(routing.call_request, np.arange(stream.requests + 1))
    steps: list[MainStep] = []
    for n, i in enumerate(schedule.request):
        entries = schedule.entries_of(n)
        target = routing.target[entries]
        own = entries[target == 0]
        calls = [(int(c), payload(entries[target == routing.call_target[c]]))
                 for c in range(call_start[i], call_start[i + 1])]
        steps.append((float(arrivals[i]), payload(own) if own.size else None, calls))
    return steps


@dataclass(frozen=True)
class RoundTimes:
    """What one round of one (deployment, rate) measured, microseconds from the stream's
    start (each server's replay is timed from its own start).

    Args:
        local_us: (requests,) when each request's main server was done with its own work.
        send_us: (calls,) when each remote call's sending began.
        trip_us: (calls,) each remote call's round trip.
        late_us: (calls,) how late the load generator sent each call (by shard replica).
    """

    local_us: np.ndarray
    send_us: np.ndarray
    trip_us: np.ndarray
    late_us: np.ndarray

    def latencies_us(self, stream: RequestStream, routing: Routing, qps: float,
                     network_us: float = 0.0) -> np.ndarray:
        """(requests,) each request's composed latency (:func:`compose`)."""
        return compose(stream.arrivals_us(qps), self.local_us, routing.call_request,
                       self.send_us, self.trip_us, network_us)


#: ``run_main(replica)``: replays a main replica alone; returns (its requests, when each was
#: done with its own work, its calls, when each call's sending began), microseconds.
RunMain = Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
#: ``run_calls(schedule, order, due_us)``: sends a shard replica its calls ``order`` (indices
#: into the schedule) at ``due_us`` (ascending); returns (their round trips, how late each
#: was sent), microseconds.
RunCalls = Callable[[CallSchedule, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def measure_round(stream: RequestStream, routing: Routing, mapping: Mapping,
                  run_main: RunMain, run_calls: RunCalls) -> RoundTimes:
    """One round: each main replica, then each shard replica, one at a time; a shard
    replica's calls come when its main server began sending them in this round."""
    local = np.zeros(stream.requests)
    send = np.zeros(routing.call_request.size)
    for replica in range(mapping.main_replicas):
        requests, local_us, calls, send_us = run_main(replica)
        local[requests] = local_us
        send[calls] = send_us
    trip = np.zeros(routing.call_request.size)
    late = np.zeros(routing.call_request.size)
    for schedule in shard_schedules(stream, routing, mapping):
        order = np.argsort(send[schedule.call], kind="stable")
        calls = schedule.call[order]
        trip[calls], late[calls] = run_calls(schedule, order, send[calls])
    return RoundTimes(local, send, trip, late)


def compose(arrivals_us: np.ndarray, local_us: np.ndarray, call_request: np.ndarray,
            send_us: np.ndarray, trip_us: np.ndarray, network_us: float = 0.0) -> np.ndarray:
    """(requests,) each request's latency from what its servers took (see the module)."""
    end = np.asarray(local_us, float).copy()
    np.maximum.at(end, call_request, send_us + trip_us + network_us)
    return end - arrivals_us
