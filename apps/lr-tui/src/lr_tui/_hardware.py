"""The host's CPU and RAM use and each GPU's utilisation and memory, without torch.

`HostHardware().sample()` reads `/proc/stat` (CPU busy share since the previous sample)
and `/proc/meminfo` (used = MemTotal - MemAvailable), and the GPUs from `nvidia-smi`
(`--query-gpu=index,name,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits`,
a subprocess) when it is on PATH, else from NVML when `pynvml` is importable. Where neither
exists, the sample says so. Anything with a `sample()` method returning a `HardwareSample`
is a source: the tests inject a fixed one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "GpuSample",
    "HardwareSample",
    "HardwareSource",
    "HostHardware",
    "parse_meminfo",
    "parse_nvidia_smi",
    "parse_proc_stat",
]

NVIDIA_SMI_QUERY = ["--query-gpu=index,name,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"]
MIB = 2**20


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    util_percent: float | None
    """None where the driver does not report it ([N/A], e.g. a MIG slice)."""
    mem_used: int
    mem_total: int
    """Bytes."""


@dataclass(frozen=True)
class HardwareSample:
    cpu_percent: float | None
    """Busy share of all cores since the previous sample; None on the first one."""
    cpu_count: int
    mem_used: int
    mem_total: int
    gpus: tuple[GpuSample, ...] = ()
    gpu_source: str = ""
    """'nvidia-smi' or 'NVML'; empty when no GPU could be read."""
    gpu_note: str = ""
    """Why there are no GPUs to show."""


class HardwareSource(Protocol):
    def sample(self) -> HardwareSample: ...


def parse_proc_stat(text: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from /proc/stat's first line."""
    fields = [int(v) for v in text.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user/nice
    return total - idle, total


def parse_meminfo(text: str) -> tuple[int, int]:
    """(used, total) bytes: MemTotal - MemAvailable, MemTotal."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    total = values["MemTotal"]
    return total - values.get("MemAvailable", values.get("MemFree", 0)), total


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_nvidia_smi(text: str) -> list[GpuSample]:
    """GPUs from `nvidia-smi` with `NVIDIA_SMI_QUERY` (memory in MiB)."""
    gpus: list[GpuSample] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        index, name, util, used, total = parts[0], ", ".join(parts[1:-3]), parts[-3], parts[-2], parts[-1]
        gpus.append(
            GpuSample(
                index=int(index),
                name=name,
                util_percent=_number(util),
                mem_used=int((_number(used) or 0) * MIB),
                mem_total=int((_number(total) or 0) * MIB),
            )
        )
    return gpus


def _nvidia_smi(executable: str) -> tuple[list[GpuSample], str]:
    try:
        done = subprocess.run([executable, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    if done.returncode != 0:
        first = (done.stdout + done.stderr).strip().splitlines()
        return [], f"nvidia-smi failed: {first[0] if first else f'exit {done.returncode}'}"
    return parse_nvidia_smi(done.stdout), ""


def _nvml() -> tuple[list[GpuSample], str]:
    nvml: Any = importlib.import_module("pynvml")  # only where importable (no stubs either way)
    try:
        nvml.nvmlInit()
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
            gpus.append(GpuSample(i, name.decode() if isinstance(name, bytes) else str(name), float(util), int(mem.used), int(mem.total)))
        return gpus, ""
    except Exception as exc:  # NVMLError and its many subclasses
        return [], f"NVML failed: {exc}"


class HostHardware:
    """The machine the TUI runs on."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._last_cpu: tuple[int, int] | None = None
        self._smi = shutil.which("nvidia-smi")
        self._has_nvml = importlib.util.find_spec("pynvml") is not None

    def _cpu_percent(self) -> float | None:
        busy, total = parse_proc_stat((self.proc / "stat").read_text())
        last, self._last_cpu = self._last_cpu, (busy, total)
        if last is None or total <= last[1]:
            return None
        return 100.0 * (busy - last[0]) / (total - last[1])

    def _gpus(self) -> tuple[list[GpuSample], str, str]:
        if self._smi is not None:
            gpus, note = _nvidia_smi(self._smi)
            return gpus, "nvidia-smi" if gpus else "", note or ("" if gpus else "nvidia-smi lists no GPU")
        if self._has_nvml:
            gpus, note = _nvml()
            return gpus, "NVML" if gpus else "", note or ("" if gpus else "NVML lists no GPU")
        return [], "", "no GPU information: nvidia-smi is not on PATH and pynvml is not installed"

    def sample(self) -> HardwareSample:
        used, total = parse_meminfo((self.proc / "meminfo").read_text())
        gpus, source, note = self._gpus()
        return HardwareSample(
            cpu_percent=self._cpu_percent(),
            cpu_count=os.cpu_count() or 1,
            mem_used=used,
            mem_total=total,
            gpus=tuple(gpus),
            gpu_source=source,
            gpu_note=note,
        )
