"""The Checkpoints view: a run's step folders, their details, and actions on them.

The table and the details come from files only (`checkpoint_scan`: training_step.json,
file presence, safetensors headers). A run opens on the checkpoint `last` points to.
Convert, Verify and Publish run the `lr-checkpoint` and `lr-publish` CLIs as subprocesses in
an exclusive worker whose output streams into the output panel, under the command exactly as
it runs; the panel's subtitle counts the seconds while it runs, and the table refreshes when
it ends. Resume (r) asks the app (`ResumeRequested`) for the resume screen of the selected
checkpoint: its fields, the exact command to copy (ctrl+y) or launch (ctrl+r).
"""

from __future__ import annotations

import time
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.timer import Timer
from textual.widgets import DataTable, Static

from lr_config import ConfigError, check_repo_id
from lr_config.layout import CHECKPOINTS

from .._checkpoint_scan import CheckpointDetails, CheckpointRow, checkpoint_details, scan_checkpoints
from .._cli_tasks import CONVERT_DTYPES, convert_argv, publish_argv, run_streaming, shown_command, verify_argv
from .._keymap import CHECKPOINT_BINDINGS
from .._screens.prompt import ChoicePrompt, TextPrompt
from .._series import format_bytes
from .._widgets.table import Table
from .._widgets.text_panel import TextPanel

__all__ = ["CheckpointsView"]

_DTYPE_TEXT = {"fp32": "full precision (the fp32 master weights)", "bf16": "bfloat16, half the size", "fp16": "float16, half the size"}
_OUTPUT_LINES = 400
_ACTIONS = "c  convert the weights to model.safetensors\nv  verify\np  publish to the Hub\nr  resume from it (or copy the command)"


def _file_tree(details: CheckpointDetails) -> list[str]:
    """Files by folder; folders two levels down (DCP shards) collapse to a count and size."""
    entries: dict[str, dict[str, list[int]]] = {}
    for rel, size in details.files:
        parts = rel.split("/")
        folder = parts[0] + "/" if len(parts) > 1 else ""
        name = parts[1] + "/" if len(parts) > 2 else parts[-1]
        entries.setdefault(folder, {}).setdefault(name, []).append(size)
    lines: list[str] = []
    for folder, names in sorted(entries.items()):
        if folder:
            lines.append(folder)
        for name, sizes in sorted(names.items()):
            count = f"  {len(sizes)} files" if name.endswith("/") else ""
            lines.append(f"  {format_bytes(sum(sizes)):>9}  {name}{count}")
            summary = details.tensors.get(folder + name)
            if summary is not None:
                lines.append(f"{'':>13}{summary.describe()}, {format_bytes(summary.nbytes)} of data")
    return lines


def describe_details(details: CheckpointDetails) -> str:
    lines: list[str] = []
    ts = details.training_step
    if ts is not None:
        lines.append(f"step {ts.step}  epoch {ts.epoch}  samples {ts.samples_seen}")
        lines.append(ts.topology.describe())
        lines.append(f"batch {ts.batch_size} x dp_world {ts.dp_world_size} x grad_accum {ts.grad_accum}")
        lines.append(f"precision {ts.precision}, saved as {ts.checkpoint_format}")
        lines.append("")
    lines += _file_tree(details)
    lines += [f"! {p}" for p in details.problems]
    return "\n".join(lines)


class CheckpointsView(Vertical):
    BINDINGS = CHECKPOINT_BINDINGS

    class ResumeRequested(Message):
        """Resume `run_dir` from its checkpoint `step_dir` (the app opens the resume screen)."""

        def __init__(self, run_dir: Path, step_dir: Path) -> None:
            super().__init__()
            self.run_dir = run_dir
            self.step_dir = step_dir

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.run_dir: Path | None = None
        self.checkpoints: dict[str, CheckpointRow] = {}
        self._output: list[str] = []
        self._subtitle = ""
        self._select_last = True
        """The next refresh selects the row `last` points to (a run just opened)."""

    def compose(self) -> ComposeResult:
        yield Static("no run open", id="ckpt-title", markup=False)
        table: DataTable[str] = Table(id="ckpt-table", cursor_type="row", zebra_stripes=True)
        yield table
        with Horizontal(id="ckpt-bottom"):
            yield TextPanel("details", id="ckpt-details")
            yield TextPanel("output", id="ckpt-output", text=_ACTIONS)

    def on_mount(self) -> None:
        table = self.query_one("#ckpt-table", DataTable)
        table.add_columns("step", "format", "topology", "precision", "size", "weights", "DCP", "last")
        self.action_refresh()

    def open_run(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._select_last = True
        self.action_refresh()

    def action_refresh(self) -> None:
        if self.run_dir is None or not self.is_mounted:  # on_mount refreshes
            return
        table = self.query_one("#ckpt-table", DataTable)
        selected = self.selected()
        rows = scan_checkpoints(self.run_dir)
        self.checkpoints = {row.name: row for row in rows}
        table.clear()
        for row in rows:
            table.add_row(
                row.name,
                row.format,
                row.topology,
                row.precision,
                format_bytes(row.size),
                row.weights or "-",
                "yes" if row.dcp else "-",
                "last" if row.is_last else "",
                key=row.name,
            )
        count = f"{len(rows)} checkpoint{'s' if len(rows) != 1 else ''}"
        self.query_one("#ckpt-title", Static).update(f"{self.run_dir / CHECKPOINTS}: {count}")
        last = next((row.name for row in rows if row.is_last), None)
        if self._select_last and rows:
            self._select_last = False
            selected = self.checkpoints.get(last or rows[-1].name)
        if selected is not None and selected.name in self.checkpoints:
            table.move_cursor(row=table.get_row_index(selected.name))
        self._show_details()

    def selected(self) -> CheckpointRow | None:
        table = self.query_one("#ckpt-table", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self.checkpoints.get(str(key))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_details()

    def _show_details(self) -> None:
        row = self.selected()
        panel = self.query_one("#ckpt-details", TextPanel)
        if row is None:
            panel.show("no checkpoints yet" if self.run_dir else "")
            return
        panel.border_title = f"details: {row.name}"
        panel.show(describe_details(checkpoint_details(row.path)))

    def _say(self, *lines: str, error: bool = False) -> None:
        self._output = (self._output + list(lines))[-_OUTPUT_LINES:]
        self.query_one("#ckpt-output", TextPanel).show("\n".join(self._output), subtitle=self._subtitle, error=error, follow=True)

    def _set_subtitle(self, text: str) -> None:
        self._subtitle = text
        self.query_one("#ckpt-output", TextPanel).set_subtitle(text)

    def _require_selection(self) -> CheckpointRow | None:
        row = self.selected()
        if row is None:
            self.notify("No checkpoint selected.", severity="warning")
        return row

    @work(exclusive=True, group="checkpoint-task")
    async def run_task(self, title: str, argv: list[str]) -> int:
        """Run one CLI, streaming its output under the command exactly as it runs; `title` names it
        in the last line (done or failed); refresh the table when it ends."""
        self._output = []
        started = time.monotonic()

        def tick() -> None:
            self._set_subtitle(f"running: {time.monotonic() - started:.0f} s")

        tick()
        ticker: Timer = self.set_interval(1.0, tick)
        self._say(f"$ {shown_command(argv)}")
        try:
            code = await run_streaming(argv, self._say)
        except OSError as exc:
            self._say(f"could not start {argv[0]}: {exc}")
            code = -1
        finally:
            ticker.stop()
        seconds = f"{time.monotonic() - started:.0f} s"
        self._set_subtitle(f"done in {seconds}" if code == 0 else f"failed after {seconds}")
        self._say(f"{title}: {'done' if code == 0 else f'failed (exit {code})'}", error=code != 0)
        self.action_refresh()
        return code

    def action_convert(self) -> None:
        row = self._require_selection()
        if row is None:
            return

        replace = row.weights == "model"

        def convert(dtype: str | None) -> None:
            if dtype:
                argv = convert_argv(row.path, dtype, overwrite=replace)
                self.run_task(f"lr-checkpoint convert {row.name} --dtype={dtype}", argv)

        if not row.dcp:
            self.notify(f"{row.name} has no DCP shards to convert.", severity="warning")
            return
        title = f"Convert {row.name}'s DCP shards to model.safetensors" + (" (replacing it)" if replace else "")
        choices = [(d, _DTYPE_TEXT[d]) for d in CONVERT_DTYPES]
        self.app.push_screen(ChoicePrompt(title, choices), convert)

    def action_verify(self) -> None:
        row = self._require_selection()
        if row is not None:
            self.run_task(f"lr-checkpoint verify {row.name}", verify_argv(row.path))

    def action_publish(self) -> None:
        row = self._require_selection()
        if row is None:
            return

        def check(repo_id: str) -> str | None:
            try:
                check_repo_id(repo_id.strip(), flag="repo id")
            except ConfigError as exc:
                return str(exc)
            return None

        def publish(repo_id: str | None) -> None:
            if repo_id:
                repo_id = repo_id.strip()
                self.run_task(f"lr-publish {row.name} --repo_id={repo_id}", publish_argv(row.path, repo_id))

        self.app.push_screen(TextPrompt(f"Publish {row.name} to the Hub repo (user/name)", check=check), publish)

    def action_resume(self) -> None:
        row = self._require_selection()
        if row is not None and self.run_dir is not None:
            self.post_message(self.ResumeRequested(self.run_dir, row.path.absolute()))

    def focus_main(self) -> None:
        self.query_one("#ckpt-table").focus()
