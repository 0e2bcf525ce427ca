"""The machine a run was measured on, as the reports record it."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from switchboard import paths


def device_info(device: str) -> dict:
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "device": device,
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if device.startswith("cuda"):
        try:
            info["gpu"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        except OSError:
            info["gpu"] = "nvidia-smi not found"
    return info


def machine() -> dict:
    """``device_info`` on the CPU, with the cores this process may use, the load average and
    the commit: what the speech bench records (the machine is shared)."""
    info = device_info("cpu") | {"cpus": len(os.sched_getaffinity(0)), "load_avg_start": os.getloadavg()}
    info.pop("device")
    try:
        info["commit"] = subprocess.run(
            ["git", "-C", str(paths.ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    return info
