"""Starts one worker process per rank on this machine and watches them.

A rank that exits with an error, or makes no progress for ``timeout_s``, ends the run: every
worker is stopped (each runs in its own session, terminated and then killed) and a
:class:`RunError` names the rank, its last stage and the last line of its error. Workers also
ask Linux to kill them if the launcher itself dies, so no process outlives a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoshard.errors import PlannerError

POLL_S = 0.05
STOP_GRACE_S = 3.0


class RunError(PlannerError):
    """A measured run that failed: a rank died, hung, or could not start."""

    def __init__(self, message: str) -> None:
        super().__init__("run_failed", message)


def free_port() -> int:
    """A TCP port free on loopback (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_local(spec: dict[str, Any], world: int, timeout_s: float,
                 logs: Path | None = None, worker: str = "autoshard.runner.worker",
                 stages: Callable[[list[str]], None] | None = None,
                 env: dict[str, str] | None = None) -> Any:
    """Runs ``world`` ranks of ``spec`` here; returns rank 0's gathered results.

    Args:
        spec: What every rank runs (tables, plan, config).
        world: Number of ranks.
        timeout_s: Longest time a rank may go without progress.
        logs: Folder for the ranks' logs (a temporary one if None); kept when the run fails,
            removed when it succeeds.
        worker: Module each rank runs as ``python -m WORKER SPEC RANK``.
        stages: Called while the ranks run with each rank's last progress mark (``step 3
            done``, ...), for a progress display.
        env: Environment variables every rank starts with, beside this process's.

    Raises:
        RunError: A rank failed or stalled; all ranks have been stopped.
    """
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="autoshard-run-", dir=logs))
    spec = dict(spec, world_size=world, init_method=f"tcp://127.0.0.1:{free_port()}")
    (work / "spec.json").write_text(json.dumps(spec))
    ranks_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **(env or {}))
    ranks_env.pop("RANK", None)
    procs: list[subprocess.Popen[bytes]] = []
    ok = False
    try:
        for rank in range(world):
            with (work / f"rank{rank}.log").open("wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", worker, str(work / "spec.json"), str(rank)],
                    stdout=log, stderr=subprocess.STDOUT, env=ranks_env,
                    start_new_session=True))
        watch(procs, work, timeout_s, stages)
        result = json.loads((work / "result.json").read_text())
        ok = True
        return result
    finally:
        stop(procs)
        if ok:
            shutil.rmtree(work, ignore_errors=True)


def watch(procs: list[subprocess.Popen[bytes]], work: Path, timeout_s: float,
          stages: Callable[[list[str]], None] | None = None) -> None:
    """Waits for every rank to exit 0; raises on the first failure or stall. ``stages`` is
    given every rank's stage at each look."""
    start = time.monotonic()
    while True:
        if stages is not None:
            stages([stage(work, r) for r in range(len(procs))])
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            raise RunError("; ".join(describe_failure(r, codes[r], work) for r in failed)
                           + f" (logs in {work})")
        if all(c == 0 for c in codes):
            if not (work / "result.json").is_file():
                raise RunError(f"all ranks exited but rank 0 wrote no result (logs in {work})")
            return
        now = time.monotonic()
        quiet = {r: now - last_progress(work, r, start) for r, c in enumerate(codes) if c is None}
        if max(quiet.values()) > timeout_s:
            where = ", ".join(f"rank {r} at '{stage(work, r)}' ({q:.0f} s ago)"
                              for r, q in sorted(quiet.items()))
            raise RunError(f"no progress for {timeout_s:g} s: {where}; stopped all "
                           f"{len(procs)} ranks (logs in {work})")
        time.sleep(POLL_S)


def last_progress(work: Path, rank: int, start: float) -> float:
    """Monotonic time of the rank's last progress mark (its launch if none yet)."""
    path = work / f"rank{rank}.progress"
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return start
    return max(start, time.monotonic() - age)


def stage(work: Path, rank: int) -> str:
    try:
        return (work / f"rank{rank}.progress").read_text() or "starting"
    except FileNotFoundError:
        return "starting"


def describe_failure(rank: int, code: int | None, work: Path) -> str:
    """One line: the rank, its exit code, where it was, and its error's first line."""
    error = work / f"rank{rank}.error"
    if error.is_file():
        detail = error.read_text().splitlines()[0]
    else:
        log = (work / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
        detail = log[-1] if log else "no output"
    return f"rank {rank} exited with code {code} at '{stage(work, rank)}': {detail}"


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminates every live worker's session, then kills what remains after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
    for p in procs:
        if p.poll() is None:
            p.wait()
