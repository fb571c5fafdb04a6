"""One process of a measured serving run (``python -m autoshard.serving.bench_worker SPEC RANK``).

Rank 0 is the main server: it replays the sampled requests at their arrival times, calls the
sparse servers (ranks 1..S) over torch.distributed.rpc (TensorPipe) in parallel, looks up its
own tables in-line, and records each request's latency from its scheduled arrival. Sparse
servers hold their tables as ``torch.nn.EmbeddingBag`` and answer :func:`lookup`.

The main thread sleeps (never spins) until a request is due, and the interpreter's switch
interval is short (:data:`SWITCH_S`): the RPC threads that take replies need the interpreter
lock, and a thread holding it for the default 5 ms would add that to every call it delays.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

_TABLES: dict[int, torch.nn.EmbeddingBag] = {}
HEARTBEAT_S = 0.5
SWITCH_S = 0.0002


def lookup(ids: list[int], indices: list[torch.Tensor],
           offsets: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pooled embeddings of one call: per table, one bag per offset (sum pooling)."""
    import torch

    with torch.no_grad():
        return [_TABLES[t](i, o) for t, i, o in zip(ids, indices, offsets, strict=True)]


def build_tables(spec: dict[str, Any], server: int) -> None:
    """The ``EmbeddingBag`` of every part that shard ``server`` (-1: the main server) holds."""
    import torch

    gen = torch.Generator().manual_seed(1234 + server)
    for t, (rows, dim, where) in enumerate(zip(spec["rows"], spec["dims"], spec["assign"],
                                               strict=True)):
        if where == server:
            bag = torch.nn.EmbeddingBag(rows, dim, mode="sum")
            with torch.no_grad():
                bag.weight.copy_(torch.rand(rows, dim, generator=gen))
            _TABLES[t] = bag


def requests_of(spec: dict[str, Any]) -> list[dict[int, tuple[list[Any], ...]]]:
    """Per request of the stream: process rank (-1: the main server itself) -> (part ids,
    indices, offsets), dealt by the routing (shard replica ``g`` is rank ``1 + g``)."""
    import torch

    from autoshard.serving.schedule import RequestStream, Routing

    stream = RequestStream.load(Path(spec["stream"]))
    routing = Routing.load(Path(spec["routing"]))
    out = []
    for i in range(stream.requests):
        entries = np.arange(stream.entry_start[i], stream.entry_start[i + 1])
        calls: dict[int, tuple[list[Any], ...]] = {}
        for target in np.unique(routing.target[entries]):
            parts, ids, offsets = stream.call_arrays(entries[routing.target[entries] == target])
            calls[int(target) if target else -1] = (
                parts, [torch.from_numpy(v) for v in ids], [torch.from_numpy(v) for v in offsets])
        out.append(calls)
    return out


def serve_requests(spec: dict[str, Any], reqs: list[dict[int, tuple[list[Any], ...]]],
                   qps: float, progress: Any) -> list[float]:
    """Replays the requests at ``qps``; returns each one's latency, microseconds."""
    import torch
    import torch.distributed.rpc as rpc

    arrivals = np.cumsum(spec["gaps"]) / qps
    done = np.zeros(len(reqs))
    futures = []
    start = time.perf_counter() + 0.05
    for n, calls in enumerate(reqs):
        due = start + arrivals[n]
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        remote = [rpc.rpc_async(f"rank{s}", lookup, args=c) for s, c in calls.items() if s >= 0]
        if -1 in calls:
            lookup(*calls[-1])
        done[n] = time.perf_counter()
        if remote:
            def finish(_: Any, n: int = n) -> None:
                done[n] = max(done[n], time.perf_counter())

            futures.append(torch.futures.collect_all(remote).then(finish))
            futures.extend(remote)
        if n % 20 == 0:
            progress(f"qps {qps:g}: request {n}")
    for fut in futures:
        fut.wait()  # raises the error of a failed call
    return list((done - start - arrivals) * 1e6)


def serve_rounds(spec: dict[str, Any], progress: Any) -> dict[str, list[list[float]]]:
    """Per rate, one list of latencies per round (rounds interleave the rates, so a slow
    stretch of the machine falls on every rate alike)."""
    reqs = requests_of(spec)
    out: dict[str, list[list[float]]] = {str(q): [] for q in spec["qps"]}
    for _ in range(spec.get("rounds", 1)):
        for qps in spec["qps"]:
            out[str(qps)].append(serve_requests(spec, reqs, qps, progress))
    return out


def idle_requests(spec: dict[str, Any]) -> list[float]:
    """Latencies of requests that touch no table, ``pause_s`` apart, replayed as
    :func:`serve_requests` does (sleep until due, dispatch): the main server's own time per
    request, microseconds."""
    out = []
    for _ in range(spec["calls"]):
        due = time.perf_counter() + spec["pause_s"]
        time.sleep(max(due - time.perf_counter(), 0.0))
        lookup([], [], [])
        out.append((time.perf_counter() - due) * 1e6)
    return out


def payload(nbytes: int) -> torch.Tensor:
    """A reply of ``nbytes`` bytes (the network calibration's calls)."""
    import torch

    return torch.zeros(max(nbytes // 4, 1))


def payload_times(spec: dict[str, Any]) -> list[list[float]]:
    """(bytes, median round trip in us) of calls returning 4 KB to 4 MB, ``pause_s`` apart."""
    import torch.distributed.rpc as rpc

    out = []
    for nbytes in (4096, 262_144, 1_048_576, 4_194_304):
        times = []
        for _ in range(max(spec["calls"] // 4, 5)):
            time.sleep(spec["pause_s"])
            t0 = time.perf_counter()
            rpc.rpc_async("rank1", payload, args=(nbytes,)).wait()
            times.append(time.perf_counter() - t0)
        out.append([float(nbytes), float(np.median(times)) * 1e6])
    return out


def cpu_seconds() -> float:
    """CPU time this process has used, all threads (asked of a server over RPC)."""
    return time.process_time()


def calibrate_calls(spec: dict[str, Any]) -> dict[str, Any]:
    """Per configuration (tables per call, lookups per table): the server's CPU time per call
    (its process CPU time over a block of calls), the median round trip of calls spaced
    ``pause_s`` apart, as in a request stream, the median time the caller takes to issue one
    (``rpc_async`` returning: the next call of a request waits for it) and the caller's CPU
    time per call. Each call's arguments are built before it is timed."""
    import torch
    import torch.distributed.rpc as rpc

    rng = np.random.default_rng(0)
    points, spreads = [], []
    for tables in (1, 2, 4, 8):
        for pooling in (4, 32, 128):
            calls = [(list(range(tables)),
                      [torch.from_numpy(rng.integers(0, spec["rows"][t], pooling * 4))
                       for t in range(tables)],
                      [torch.arange(0, pooling * 4, pooling)] * tables)
                     for _ in range(spec["calls"])]
            times, issue = [], []
            cpu0 = rpc.rpc_sync("rank1", cpu_seconds)
            main0 = time.process_time()
            for args in calls:
                time.sleep(spec["pause_s"])
                t0 = time.perf_counter()
                fut = rpc.rpc_async("rank1", lookup, args=args)
                issue.append(time.perf_counter() - t0)
                fut.wait()
                times.append(time.perf_counter() - t0)
            main = (time.process_time() - main0) / spec["calls"]
            cpu = (rpc.rpc_sync("rank1", cpu_seconds) - cpu0) / (spec["calls"] + 1)
            points.append([tables, tables * pooling * 4, cpu * 1e6,
                           float(np.median(times)) * 1e6, float(np.median(issue)) * 1e6,
                           main * 1e6])
            spreads.append(np.log(times) - np.log(np.median(times)))
    pooled = np.concatenate(spreads)
    return {"points": points, "log_spread": float(np.sqrt(np.mean(pooled ** 2))),
            "idle_us": idle_requests(spec), "payload": payload_times(spec)}


def run(spec: dict[str, Any], rank: int, progress: Any) -> dict[str, Any] | None:
    import torch.distributed.rpc as rpc

    build_tables(spec, spec.get("shard_of", [-1, 0])[rank])
    progress("tables built")
    # TCP through libuv, event-driven: the shared-memory transport polls, and its idle
    # spinning would take the CPU the servers share on a small machine.
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=spec["timeout_s"],
                                           init_method=spec["init_method"],
                                           _transports=["uv"], _channels=["basic"])
    name = "main" if rank == 0 else f"rank{rank}"
    rpc.init_rpc(name, rank=rank, world_size=spec["world_size"], rpc_backend_options=opts)
    progress("connected")
    result = None
    if rank == 0:
        if spec.get("mode") == "calibrate":
            result = calibrate_calls(spec)
        else:
            result = {"latencies_us": serve_rounds(spec, progress)}
    else:
        beat = threading.Event()

        def heartbeat() -> None:
            while not beat.wait(HEARTBEAT_S):
                progress("serving")

        threading.Thread(target=heartbeat, daemon=True).start()
    rpc.shutdown()
    return result


def main(argv: list[str], work: Callable[[dict[str, Any], int, Any], dict[str, Any] | None]
         = run) -> int:
    """Runs ``work(spec, rank, progress)`` as rank ``argv[1]`` of the spec ``argv[0]``, pinned
    to the spec's core for it when it names cores; its result (rank 0) goes to result.json,
    an error to rankN.error."""
    import torch

    spec_path, rank = Path(argv[0]), int(argv[1])
    folder = spec_path.parent
    (folder / f"rank{rank}.pid").write_text(str(os.getpid()))
    progress_file = folder / f"rank{rank}.progress"

    def progress(stage: str) -> None:
        progress_file.write_text(stage)

    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, 15)  # PR_SET_PDEATHSIG: SIGTERM when the parent dies
    except (OSError, AttributeError):
        pass
    torch.set_num_threads(1)
    sys.setswitchinterval(SWITCH_S)
    try:
        progress("started")
        spec = json.loads(spec_path.read_text())
        if spec.get("cores"):  # this process and the threads it starts stay on one core
            os.sched_setaffinity(0, {int(spec["cores"][rank])})
        result = work(spec, rank, progress)
        if result is not None:
            tmp = folder / "result.json.tmp"
            tmp.write_text(json.dumps(result))
            tmp.replace(folder / "result.json")
        progress("done")
        return 0
    except BaseException as exc:  # reported to the launcher, which names this process
        (folder / f"rank{rank}.error").write_text(f"{type(exc).__name__}: {exc}".splitlines()[0]
                                                + "\n" + traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
