"""A one-line description of the machine, recorded next to every measured figure."""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path


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
