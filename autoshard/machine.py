"""A one-line description of the machine, recorded next to every measured figure."""

from __future__ import annotations

import hashlib
import os
import platform
from functools import cache
from pathlib import Path
from typing import Any


@cache
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_machine(with_gpu: bool = False) -> str:
    """E.g. ``"2-core Intel(R) Xeon(R) ... (x86_64), Linux, no GPU"``."""
    text = f"{os.cpu_count()}-core {cpu_model()} ({platform.machine()}), {platform.system()}"
    if with_gpu:
        try:
            import torch

            if torch.cuda.is_available():
                return f"{text}, GPU {torch.cuda.get_device_name(0)}"
        except ImportError:
            pass
    return f"{text}, no GPU" if with_gpu else text


@cache
def fingerprint() -> str:
    """A short hash telling this machine from others reporting the same CPU name: of the OS's
    machine id (``/etc/machine-id``), else of the host name. Nothing identifying is recorded."""
    ident = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            ident = Path(path).read_text().strip()
        except OSError:
            continue
        if ident:
            break
    ident = ident or platform.node()
    return hashlib.sha256(f"autoshard:{ident}".encode()).hexdigest()[:12]


def machine_record() -> dict[str, Any]:
    """What a measured dataset or learned model records about the machine that measured it."""
    return {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "arch": platform.machine(),
            "fingerprint": fingerprint(), "description": describe_machine()}


def same_machine(recorded: object, here: dict[str, Any]) -> bool:
    """Whether a recorded machine (:func:`machine_record`) is this one; unrecorded is not."""
    if not isinstance(recorded, dict) or not recorded.get("fingerprint"):
        return False
    return all(recorded.get(k) == here.get(k) for k in ("cpu_model", "cpus", "fingerprint"))
