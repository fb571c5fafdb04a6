"""One process of a replayed measurement (``python -m autoshard.serving.replay_worker SPEC
RANK``; :mod:`autoshard.serving.replay` says what is measured).

Rank 1 is the server under test: it holds every part as an ``EmbeddingBag`` and plays each
server of each deployment in turn, never two at once. Rank 0 drives it from another core: it
tells it to replay a main replica's requests (then answers that replica's remote calls with
replies of the right shape at once, :func:`stand_in`), and sends it each shard replica's
calls itself, timing their round trips. Rounds repeat every (deployment, rate) in turn, so a
slow stretch of the machine falls on all of them alike. Each process is pinned to its own
core when the spec names two.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autoshard.serving.bench_worker import main as worker_main
from autoshard.serving.mapping import Mapping
from autoshard.serving.replay import (
    RoundTimes,
    main_steps,
    measure_round,
    replay_calls,
    replay_main,
)
from autoshard.serving.schedule import CallSchedule, RequestStream, Routing, main_schedules

if TYPE_CHECKING:
    import torch

HEARTBEAT_S = 0.5
#: Lead-in before a replay's first request, seconds (its plan is built before).
LEAD_S = 0.05
#: Pause between two replays, seconds (the previous one's last replies settle).
SETTLE_S = 0.1

_TABLES: dict[tuple[int, int], torch.nn.EmbeddingBag] = {}
_DIMS: dict[tuple[int, int], int] = {}
_COMMANDS: queue.Queue[tuple[Any, ...]] = queue.Queue()
_RESULTS: queue.Queue[dict[str, Any]] = queue.Queue()


def lookup(key: int, parts: list[int], indices: list[torch.Tensor],
           offsets: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pooled embeddings of one call on stream ``key``'s parts (sum pooling)."""
    import torch

    with torch.no_grad():
        return [_TABLES[(key, p)](i, o) for p, i, o in zip(parts, indices, offsets,
                                                           strict=True)]


def stand_in(key: int, parts: list[int], indices: list[torch.Tensor],
             offsets: list[torch.Tensor]) -> list[torch.Tensor]:
    """A reply of the shape :func:`lookup` gives, at once (the shards a main replica calls are
    measured on their own)."""
    import torch

    return [torch.zeros(len(o), _DIMS[(key, p)]) for p, o in zip(parts, offsets, strict=True)]


def post(command: tuple[Any, ...]) -> None:
    """Hands the server a command (called by the driver)."""
    _COMMANDS.put(command)


def deliver(result: dict[str, Any]) -> None:
    """Hands the driver a main replica's measurement (called by the server)."""
    _RESULTS.put(result)


@dataclass(frozen=True)
class Loaded:
    """What both processes read from the spec: streams, routings and deployments."""

    streams: list[RequestStream]
    routings: list[Routing]
    mappings: list[Mapping]
    jobs: list[dict[str, Any]]


def load(spec: dict[str, Any]) -> Loaded:
    """The streams, routings and deployments the spec names."""
    mappings = [Mapping(len(m["replicas"]), tuple(m["assign"]), replicas=tuple(m["replicas"]),
                        main_replicas=m["main_replicas"]) for m in spec["mappings"]]
    return Loaded([RequestStream.load(Path(p)) for p in spec["streams"]],
                  [Routing.load(Path(p)) for p in spec["routings"]], mappings, spec["jobs"])


def build_tables(spec: dict[str, Any], real: bool) -> None:
    """Every part of every stream: an ``EmbeddingBag`` (``real``) or only its width."""
    import torch

    for key, (rows, dims) in enumerate(zip(spec["rows"], spec["dims"], strict=True)):
        gen = torch.Generator().manual_seed(1234 + key)
        for p, (r, d) in enumerate(zip(rows, dims, strict=True)):
            _DIMS[(key, p)] = d
            if real:
                bag = torch.nn.EmbeddingBag(r, d, mode="sum")
                with torch.no_grad():
                    bag.weight.copy_(torch.rand(r, d, generator=gen))
                _TABLES[(key, p)] = bag


def payload(stream: RequestStream, key: int, entries: np.ndarray) -> tuple[Any, ...]:
    """The arguments of :func:`lookup` for some entries of stream ``key``."""
    import torch

    parts, ids, offsets = stream.call_arrays(entries)
    return (key, parts, [torch.from_numpy(i) for i in ids],
            [torch.from_numpy(o) for o in offsets])


def _send_to(name: str, function: Any) -> Any:
    """A :data:`autoshard.serving.replay.Send` over ``torch.distributed.rpc`` to ``name``."""
    import torch.distributed.rpc as rpc

    def send(args: Any, on_reply: Any) -> Any:
        def done(fut: Any) -> None:
            fut.value()  # raises the call's error
            on_reply()

        return rpc.rpc_async(name, function, args=args).then(done)

    return send


def _wait(futures: list[Any]) -> None:
    for fut in futures:
        fut.wait()


def serve_main(loaded: Loaded, job: int, replica: int) -> dict[str, Any]:
    """Replays a main replica's requests (run by the server under test)."""
    spec = loaded.jobs[job]
    key = spec["stream"]
    stream, routing = loaded.streams[key], loaded.routings[spec["routing"]]
    schedule = main_schedules(stream, routing, loaded.mappings[spec["mapping"]])[replica]
    steps = main_steps(stream, routing, schedule, spec["qps"],
                       lambda entries: payload(stream, key, entries))
    start = time.perf_counter() + LEAD_S
    timed = [(start + due, own, calls) for due, own, calls in steps]
    sent, local = replay_main(timed, time.perf_counter, time.sleep,
                              _send_to("driver", stand_in), lambda args: lookup(*args), _wait)
    return {"requests": schedule.request.tolist(), "local_us": ((local - start) * 1e6).tolist(),
            "calls": list(sent), "send_us": [(t - start) * 1e6 for t in sent.values()]}


def serve_commands(loaded: Loaded) -> None:
    """The server under test: takes the driver's commands until told to stop."""
    import torch.distributed.rpc as rpc

    while True:
        command = _COMMANDS.get()
        if command[0] == "stop":
            return
        _, job, replica = command
        rpc.rpc_sync("driver", deliver, args=(serve_main(loaded, job, replica),))


def measure_job(loaded: Loaded, job: int, stage: list[str], timeout_s: float) -> RoundTimes:
    """One round of one (deployment, rate) (:func:`autoshard.serving.replay.measure_round`):
    the server replays each main replica; the driver sends it each shard replica's calls."""
    import torch.distributed.rpc as rpc

    spec = loaded.jobs[job]
    key = spec["stream"]
    stream, routing = loaded.streams[key], loaded.routings[spec["routing"]]

    def run_main(replica: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        stage[0] = f"{stage[1]}, job {job}: main replica {replica}"
        rpc.rpc_sync("server", post, args=(("main", job, replica),))
        try:  # the replay's span, and as long again as a call may take
            got = _RESULTS.get(timeout=float(stream.arrivals_us(spec["qps"])[-1]) / 1e6
                               + LEAD_S + timeout_s)
        except queue.Empty:
            raise TimeoutError(f"main replica {replica} of job {job} sent no measurement "
                               f"within {timeout_s:g} s of its last request") from None
        time.sleep(SETTLE_S)
        return (np.asarray(got["requests"], dtype=np.int64), np.asarray(got["local_us"]),
                np.asarray(got["calls"], dtype=np.int64), np.asarray(got["send_us"]))

    def run_calls(schedule: CallSchedule, order: np.ndarray, due_us: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        stage[0] = f"{stage[1]}, job {job}: {schedule.server.name}"
        payloads = [payload(stream, key, schedule.entries_of(c)) for c in order]
        start = time.perf_counter() + LEAD_S
        due = start + due_us / 1e6
        sent, trips = replay_calls(due, payloads, time.perf_counter, time.sleep,
                                   _send_to("server", lookup), _wait)
        time.sleep(SETTLE_S)
        return trips * 1e6, (sent - due) * 1e6

    return measure_round(stream, routing, loaded.mappings[spec["mapping"]], run_main,
                         run_calls)


def drive(spec: dict[str, Any], loaded: Loaded, stage: list[str]) -> dict[str, Any]:
    """The driver: every round, every job; then stops the server."""
    import torch.distributed.rpc as rpc

    rounds: list[list[dict[str, Any]]] = [[] for _ in loaded.jobs]
    for r in range(spec["rounds"]):
        stage[1] = f"round {r + 1} of {spec['rounds']}"
        for job in range(len(loaded.jobs)):
            got = measure_job(loaded, job, stage, spec["timeout_s"])
            rounds[job].append({k: getattr(got, k).tolist() for k in
                                ("local_us", "send_us", "trip_us", "late_us")})
    rpc.rpc_sync("server", post, args=(("stop",),))
    return {"jobs": rounds}


def run(spec: dict[str, Any], rank: int, progress: Any) -> dict[str, Any] | None:
    import torch.distributed.rpc as rpc

    loaded = load(spec)
    build_tables(spec, real=rank == 1)
    stage = ["tables built", ""]  # what is being done, and in which round
    beat = threading.Event()

    def heartbeat() -> None:
        while not beat.wait(HEARTBEAT_S):
            progress(stage[0])

    threading.Thread(target=heartbeat, daemon=True).start()
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=spec["timeout_s"],
                                           init_method=spec["init_method"],
                                           _transports=["uv"], _channels=["basic"])
    rpc.init_rpc("driver" if rank == 0 else "server", rank=rank, world_size=2,
                 rpc_backend_options=opts)
    stage[0] = "connected"
    result = None
    if rank == 0:
        result = drive(spec, loaded, stage)
    else:
        stage[0] = "serving"
        serve_commands(loaded)
    rpc.shutdown()
    beat.set()
    return result


def main(argv: list[str]) -> int:
    return worker_main(argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
