"""Every key of the app in one place: the bindings and the help screen read from here.

The footer shows each view's bindings with `show` left on, and must fit 80 columns beside
`^q Quit`, `? Help` and the palette's `^p palette`: short descriptions there, the longer
tooltip in the help screen (`?`), which lists every binding, shown in the footer or not."""

from __future__ import annotations

from textual.binding import Binding, BindingType

__all__ = ["APP_BINDINGS", "CHECKPOINT_BINDINGS", "HELP", "LAUNCH_BINDINGS", "LOG_BINDINGS", "MONITOR_BINDINGS"]

APP_BINDINGS: list[BindingType] = [
    Binding("1", "show_view('launch')", "Launch", show=False),
    Binding("2", "show_view('monitor')", "Monitor", show=False),
    Binding("3", "show_view('checkpoints')", "Checkpoints", show=False),
    Binding("4", "show_view('logs')", "Logs", show=False),
    Binding("5", "show_view('hardware')", "Hardware", show=False),
    Binding("question_mark", "help", "Help"),
    Binding("f1", "help", "Help", show=False),
    Binding("escape", "leave_field", "Leave field", show=False),
    Binding("ctrl+q", "quit", "Quit"),
]

LAUNCH_BINDINGS: list[BindingType] = [
    Binding("ctrl+r", "run", "Run", tooltip="start it, output to logs/launch.log (Slurm: save)"),
    Binding("ctrl+y", "copy_command", "Copy", tooltip="copy the command or script (says so if it cannot)"),
    Binding("ctrl+s", "save_preset", "Save preset", tooltip="save the settings as a TrainConfig JSON"),
    Binding("ctrl+o", "load_preset", "Load preset", tooltip="load a TrainConfig JSON (preset or checkpoint)"),
]

MONITOR_BINDINGS: list[BindingType] = [
    Binding("o", "open_run", "Open run", tooltip="watch a run folder by path (its launch reattaches)"),
    Binding("x", "stop_run", "Stop", tooltip="stop: SIGINT, final checkpoint; x again: SIGTERM"),
    Binding("r", "resume_run", "Resume", tooltip="resume last: processes, dp, steps, ckpt format"),
    Binding("l", "show_log", "Log", tooltip="the run's combined log at its first error"),
    Binding("c", "compare", "Compare", tooltip="compare: mark / unmark the highlighted run, 4 at most"),
    Binding("z", "zoom", "Zoom", show=False, tooltip="the charts' steps: all, the last 1000, the last 100"),
    Binding("y", "log_scale", "Log y", show=False, tooltip="the loss chart's y axis: log / linear"),
]

LOG_BINDINGS: list[BindingType] = [
    Binding("slash", "search", "Search", key_display="/", tooltip="search (enter or n: next match, N: previous)"),
    Binding("f", "filter", "Filter", tooltip="filter the lines: words, rank:N, events"),
    Binding("e", "events_only", "Events only", tooltip="show only the lines with events (again: all)"),
    Binding("n", "next_match", "Next", show=False, tooltip="next search match"),
    Binding("N", "previous_match", "Previous", show=False, tooltip="previous search match"),
    Binding("end", "follow", "Follow", tooltip="follow the end of the log"),
]

CHECKPOINT_BINDINGS: list[BindingType] = [
    Binding("c", "convert", "Convert", tooltip="DCP shards -> model.safetensors (fp32/bf16/fp16)"),
    Binding("v", "verify", "Verify", tooltip="lr-checkpoint verify"),
    Binding("p", "publish", "Publish", tooltip="lr-publish to a Hub repo (asks for user/name)"),
    Binding("r", "resume", "Resume", tooltip="resume from this checkpoint (copy or launch it)"),
    Binding("f5", "refresh", "Refresh", show=False, tooltip="read the checkpoints folder again"),
]

_GLOBAL = [
    ("1 2 3 4 5", "Launch, Monitor, Checkpoints, Logs, Hardware view"),
    ("escape", "leave a field (then 1-5 and ? work again)"),
    ("tab / shift+tab", "next / previous field"),
    ("enter / ← →", "in a choice: open its menu / previous, next option"),
    ("ctrl+p", "command palette"),
    ("? or f1", "this help"),
    ("ctrl+q", "quit"),
]


def _rows(bindings: list[BindingType]) -> list[tuple[str, str]]:
    return [(b.key_display or b.key.replace(",", " or "), b.tooltip or b.description) for b in bindings if isinstance(b, Binding)]


HELP: list[tuple[str, list[tuple[str, str]]]] = [
    ("Everywhere", _GLOBAL),
    ("Launch", [
        *_rows(LAUNCH_BINDINGS),
        ("→ at the end", "accept the grey completion: a flag name (more flags), a cached dataset id, a folder name"),
    ]),
    ("Monitor", [
        ("↑ ↓ / enter", "the runs found, newest first: move / watch one"),
        *_rows(MONITOR_BINDINGS),
        ("tab, ↑ ↓", "to the charts, and scroll them"),
        ("tab or →", "in the open dialog: complete the folder name"),
        ("3", "the Checkpoints of the highlighted run"),
    ]),
    ("Checkpoints", _rows(CHECKPOINT_BINDINGS)),
    ("Logs", _rows(LOG_BINDINGS)),
]
