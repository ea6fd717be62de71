"""The Hardware view: this host's CPU and RAM, and each GPU's utilisation and memory.

A thread worker asks the source (`hardware.HostHardware` unless one is injected) for a
sample every `interval` seconds while the view is on screen, so a hidden view runs no
nvidia-smi. The panels are plain text with bars, sized to the width they have.
"""

from __future__ import annotations

import threading

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Resize
from textual.widgets import Static
from textual.worker import get_current_worker

from .._hardware import HardwareSample, HardwareSource
from .._series import format_bytes

__all__ = ["HardwareView", "bar", "gpu_text", "host_text"]


def bar(fraction: float | None, width: int) -> Text:
    """`████░░░░` filled to `fraction` (green, yellow past 75%, red past 90%)."""
    width = max(4, width)
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    color = "red" if fraction > 0.9 else "yellow" if fraction > 0.75 else "green"
    return Text.assemble(("█" * filled, color), ("░" * (width - filled), "dim"))


def _percent(value: float | None, missing: str = "...") -> str:
    return f"{missing:>5}" if value is None else f"{value:4.0f}%"


def host_text(sample: HardwareSample, width: int) -> Text:
    bar_width = max(10, width - 34)
    mem = sample.mem_used / sample.mem_total if sample.mem_total else None
    cpu = sample.cpu_percent / 100 if sample.cpu_percent is not None else None
    return Text.assemble(
        "CPU  ", bar(cpu, bar_width), f" {_percent(sample.cpu_percent)}  {sample.cpu_count} cores\n",
        "RAM  ", bar(mem, bar_width), f" {_percent(100 * mem if mem is not None else None)}  "
        f"{format_bytes(sample.mem_used)} / {format_bytes(sample.mem_total)}",
    )


def gpu_text(sample: HardwareSample, width: int) -> Text:
    if not sample.gpus:
        return Text(sample.gpu_note or "no GPU", style="italic")
    bar_width = max(6, (width - 54) // 2)
    out = Text(f"{'#':>2} {'name':<16} {'utilisation':<{bar_width + 8}}memory\n", style="dim")
    for i, gpu in enumerate(sample.gpus):
        mem = gpu.mem_used / gpu.mem_total if gpu.mem_total else None
        util = gpu.util_percent / 100 if gpu.util_percent is not None else None
        out.append_text(Text.assemble(
            f"{gpu.index:>2} {gpu.name[:16]:<16} ", bar(util, bar_width), f" {_percent(gpu.util_percent, 'n/a')}  ",
            bar(mem, bar_width), f" {format_bytes(gpu.mem_used):>9} / {format_bytes(gpu.mem_total)}",
        ))
        if i < len(sample.gpus) - 1:
            out.append("\n")
    return out


class HardwareView(Vertical):
    def __init__(self, source: HardwareSource, *, interval: float = 1.0, id: str | None = None) -> None:
        super().__init__(id=id)
        self.source = source
        self.interval = interval
        self.sample: HardwareSample | None = None
        self.samples = 0

    def compose(self) -> ComposeResult:
        host = Static("reading /proc ...", id="hw-host", classes="hw-panel")
        host.border_title = "host"
        yield host
        gpus = Static("", id="hw-gpus", classes="hw-panel")
        gpus.border_title = "GPUs"
        yield gpus

    def on_mount(self) -> None:
        self._poll()

    @work(thread=True, exclusive=True, group="hardware")
    def _poll(self) -> None:
        worker = get_current_worker()
        wake = threading.Event()
        while not worker.is_cancelled:
            try:
                if self.sample is None or self.app.call_from_thread(lambda: self.is_on_screen):
                    self.app.call_from_thread(self._show, self.source.sample())
            except RuntimeError:  # the app is shutting down
                return
            wake.wait(self.interval)

    def _show(self, sample: HardwareSample) -> None:
        self.sample = sample
        self.samples += 1
        self._redraw()

    def on_resize(self, event: Resize) -> None:
        self._redraw()

    def _redraw(self) -> None:
        if self.sample is None:
            return
        host = self.query_one("#hw-host", Static)
        gpus = self.query_one("#hw-gpus", Static)
        inner = max(20, self.size.width - 4)
        host.update(host_text(self.sample, inner))
        gpus.border_title = f"GPUs ({self.sample.gpu_source})" if self.sample.gpu_source else "GPUs"
        gpus.update(gpu_text(self.sample, inner))

    def focus_main(self) -> None:
        self.screen.set_focus(None)  # nothing here takes keys
