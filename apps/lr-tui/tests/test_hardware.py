"""The hardware panel's sources: this host's /proc, nvidia-smi (a stand-in on PATH), none at all."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from tui_support import FixedHardware, app_ready, wait_until

from lr_tui import _hardware as hardware
from lr_tui._app import LrApp
from lr_tui._hardware import HostHardware, parse_meminfo, parse_proc_stat

NVIDIA_SMI = """\
#!{python}
import sys
assert sys.argv[1:] == {query!r}, sys.argv
print("0, NVIDIA H200, 87, 61234, 143771")
print("1, NVIDIA H200, [N/A], 1, 143771")
"""


def test_this_hosts_proc_gives_cpu_and_ram():
    busy, total = parse_proc_stat(Path("/proc/stat").read_text())
    used, mem_total = parse_meminfo(Path("/proc/meminfo").read_text())
    assert 0 <= busy <= total and 0 < used < mem_total
    source = HostHardware()
    first = source.sample()
    assert first.cpu_percent is None  # a share needs two readings
    # work until the kernel's CPU counters have moved on (a tick is 10 ms at 100 Hz; a fast loop
    # could end within one, and a share over no time is None by design)
    seen = parse_proc_stat(Path("/proc/stat").read_text())[1]  # at or after the first sample's reading
    while parse_proc_stat(Path("/proc/stat").read_text())[1] <= seen:
        sum(i * i for i in range(20_000))
    second = source.sample()
    assert second.cpu_percent is not None and 0 <= second.cpu_percent <= 100
    assert second.gpus or second.gpu_note


def test_gpus_come_from_nvidia_smi_when_it_is_on_path(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(NVIDIA_SMI.format(python=sys.executable, query=hardware.NVIDIA_SMI_QUERY))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    sample = HostHardware().sample()
    assert sample.gpu_source == "nvidia-smi" and sample.gpu_note == ""
    first, second = sample.gpus
    assert (first.index, first.name, first.util_percent, first.mem_used, first.mem_total) == (0, "NVIDIA H200", 87.0, 61234 * 2**20, 143771 * 2**20)
    assert second.util_percent is None  # [N/A], as a MIG slice reports it


def test_without_nvidia_smi_or_nvml_the_panel_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(hardware.importlib.util, "find_spec", lambda name: None)
    sample = HostHardware().sample()
    assert sample.gpus == () and sample.gpu_note == "no GPU information: nvidia-smi is not on PATH and pynvml is not installed"


@pytest.mark.asyncio
async def test_the_view_samples_only_while_it_is_shown():
    source = FixedHardware(gpus=False)
    app = LrApp(plan_runner=None, hardware=source, hardware_interval=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await app_ready(pilot)
        await wait_until(pilot, lambda: app.hardware_view.samples == 1, what="the first sample")
        await pilot.pause(0.3)
        assert source.calls == 1  # hidden: no more samples
        await pilot.press("5")
        await wait_until(pilot, lambda: source.calls >= 3, what="samples while shown")
        assert str(app.query_one("#hw-gpus").render()) == source.sample().gpu_note
