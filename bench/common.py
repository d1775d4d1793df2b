"""Helpers shared by the benchmarks."""
from __future__ import annotations

import platform


def cpu_model() -> str:
    """The CPU's model name, for the header of a benchmark's output."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
