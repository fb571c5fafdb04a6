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


def requests_of(spec: dict[str, Any], qps: float) -> list[dict[int, tuple[list[Any], ...]]]:
    """Per request: process rank (-1: the main server itself) -> (part ids, indices,
    offsets), drawn from the seeded sample; a shard's replica drawn at random per call."""
    import torch

    rng = np.random.default_rng([spec["seed"], int(qps)])
    route = np.random.default_rng([spec["seed"], int(qps), 1])
    out = []
    for touched in spec["touched"]:
        calls: dict[int, tuple[list[Any], ...]] = {}
        for t in touched:
            bags = spec["bags"][t]
            per_bag = max(1, round(spec["lookups"][t] / bags))
            idx = torch.from_numpy(rng.integers(0, spec["rows"][t], bags * per_bag))
            offs = torch.arange(0, bags * per_bag, per_bag)
            shard = spec["assign"][t]
            rank = -1 if shard < 0 else int(route.choice(spec["ranks_of"][shard]))
            ids, indices, offsets = calls.setdefault(rank, ([], [], []))
            ids.append(t)
            indices.append(idx)
            offsets.append(offs)
        out.append(calls)
    return out


def serve_requests(spec: dict[str, Any], qps: float, progress: Any) -> list[float]:
    """Replays the requests at ``qps``; returns each one's latency, microseconds."""
    import torch
    import torch.distributed.rpc as rpc

    reqs = requests_of(spec, qps)
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
    stretch of the machine falls on every rate alike); the first ``warmup`` requests of each
    round are dropped."""
    out: dict[str, list[list[float]]] = {str(q): [] for q in spec["qps"]}
    for _ in range(spec.get("rounds", 1)):
        for qps in spec["qps"]:
            out[str(qps)].append(serve_requests(spec, qps, progress)[spec.get("warmup", 0):])
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
    (its process CPU time over a block of calls) and the median round trip of calls spaced
    ``pause_s`` apart, as in a request stream."""
    import torch
    import torch.distributed.rpc as rpc

    rng = np.random.default_rng(0)
    points, spreads = [], []
    for tables in (1, 2, 4, 8):
        for pooling in (4, 32, 128):
            times = []
            cpu0 = rpc.rpc_sync("rank1", cpu_seconds)
            main0 = time.process_time()
            for _ in range(spec["calls"]):
                args = (list(range(tables)),
                        [torch.from_numpy(rng.integers(0, spec["rows"][t], pooling * 4))
                         for t in range(tables)],
                        [torch.arange(0, pooling * 4, pooling)] * tables)
                time.sleep(spec["pause_s"])
                t0 = time.perf_counter()
                rpc.rpc_async("rank1", lookup, args=args).wait()
                times.append(time.perf_counter() - t0)
            main = (time.process_time() - main0) / spec["calls"]
            cpu = (rpc.rpc_sync("rank1", cpu_seconds) - cpu0) / (spec["calls"] + 1)
            points.append([tables, tables * pooling * 4, cpu * 1e6,
                           float(np.median(times)) * 1e6, main * 1e6])
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


def main(argv: list[str]) -> int:
    import torch

    spec_path, rank = Path(argv[0]), int(argv[1])
    work = spec_path.parent
    (work / f"rank{rank}.pid").write_text(str(os.getpid()))
    progress_file = work / f"rank{rank}.progress"

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
        result = run(spec, rank, progress)
        if result is not None:
            tmp = work / "result.json.tmp"
            tmp.write_text(json.dumps(result))
            tmp.replace(work / "result.json")
        progress("done")
        return 0
    except BaseException as exc:  # reported to the launcher, which names this process
        (work / f"rank{rank}.error").write_text(f"{type(exc).__name__}: {exc}".splitlines()[0]
                                                + "\n" + traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
