"""The event parser on output captured from real failing runs (tests/data/, made by capture_logs.py),
and on a run whose rank is SIGKILLed here and now."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from real_runs import TINY, end, launch, log_text, wait_for_log, worker_pid

from lr_tui._events import Event, parse_lines
from lr_tui._log_filter import LogFilter

DATA = Path(__file__).parent / "data"


def events_of(text: str) -> list[tuple[str, str, int | None, str]]:
    return [(e.kind, e.severity, e.rank, e.title) for e in parse_lines(text.splitlines())]


def assert_each_says_what_to_do(events: list[Event]) -> None:
    for event in events:
        assert event.advice and "\n" not in event.advice, event


def test_a_rank_killed_now_is_named_with_its_signal_and_the_root_cause(tmp_path, tiny_dataset):
    out = tmp_path / "run"
    proc = launch(2, [f"--dataset.root={tiny_dataset}", *TINY, "--steps=100000"], out)
    try:
        wait_for_log(out, "step 5/", proc)
        # Rank 0 is paused while rank 1 dies, so torchrun observes rank 1's SIGKILL first on every
        # machine: on a loaded one, rank 0 could otherwise fail on the closed connection and exit
        # before torchrun's next poll, which then reports rank 0 first. Rank 0 goes on once torchrun
        # has begun to stop it (a paused rank would hold torchrun for its 30 s shutdown timeout);
        # rank 0's gloo error on a lost peer is parsed in killed_rank.log below.
        rank0 = worker_pid(proc.pid, 0)
        os.kill(rank0, signal.SIGSTOP)
        try:
            os.kill(worker_pid(proc.pid, 1), signal.SIGKILL)
            wait_for_log(out, "closing signal SIGTERM", proc, timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank0, signal.SIGCONT)
        wait_for_log(out, "failed (exitcode: -9) local_rank: 1", proc, timeout=120)
        assert proc.wait(timeout=120) != 0
    finally:
        end(proc.pid)
    events = parse_lines(log_text(out).splitlines())
    kinds = {(e.kind, e.rank): e for e in events}
    died = kinds[("host_oom", None)]
    assert died.title == "local rank 1 died: SIGKILL (exit -9)"
    assert "OOM killer" in died.advice
    root = kinds[("child_failed", 1)]
    assert root.title == "job failed: rank 1 failed first, SIGKILL (exit -9)"
    assert_each_says_what_to_do(events)
    assert [e.line_number for e in events] == sorted(e.line_number for e in events)


CAPTURED = {
    "killed_rank.log": [
        ("gloo", "error", 0, "gloo: Connection closed by peer [127.0.0.1]:26030"),
        ("host_oom", "error", None, "local rank 1 died: SIGKILL (exit -9)"),
        ("child_failed", "error", 1, "job failed: rank 1 failed first, SIGKILL (exit -9)"),
    ],
    "gloo_timeout.log": [
        ("gloo", "error", 0, "gloo recv timed out after 5 s"),
        ("child_failed", "error", 0, "job failed: rank 0 failed first, exit 1"),
    ],
    "env_guard.log": [
        ("accelerate_env", "error", 0, "refused: accelerate environment variables would reconfigure the engine"),
        ("child_failed", "error", 0, "job failed: rank 0 failed first, exit 2"),
    ],
    "stop_resume.log": [
        ("stopped", "info", None, "torchrun got signal 2: passing it to the workers"),
        ("checkpoint_saved", "info", 0, "checkpoint saved: 000012"),
        ("stopped", "info", 0, "stopped at step 12 on request (checkpoint saved)"),
        ("resume_changed", "warning", 0,
         "resumed with changed settings: dp_world_size 2 -> 1, world_size 2 -> 1, layout ddp -> single (not sample-exact)"),
        ("checkpoint_saved", "info", 0, "checkpoint saved: 000015"),
    ],
    "checkpoint_failed.log": [
        ("checkpoint_failed", "error", 0, "checkpoint save failed: OSError: [Errno 27] File too large"),
        ("child_failed", "error", 0, "job failed: rank 0 failed first, exit 1"),
    ],
    "rendezvous_timeout.log": [("rendezvous", "error", None, "rendezvous timed out waiting for the other nodes")],
    "rendezvous_unreachable.log": [("rendezvous", "error", None, "cannot reach the rendezvous store 192.0.2.1:29500")],
    "host_oom.log": [
        ("host_oom", "error", 0, "host out of memory (could not allocate 1.0 GiB)"),
        ("child_failed", "error", 0, "job failed: rank 0 failed first, exit 1"),
    ],
    "shell_oom.log": [
        ("host_oom", "error", None, "a process was killed (shell: Killed)"),
        ("host_oom", "error", None, "host out of memory (MemoryError)"),
    ],
}


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_captured_failures_become_events(name):
    text = (DATA / name).read_text()
    assert events_of(text) == CAPTURED[name]
    assert_each_says_what_to_do(parse_lines(text.splitlines()))


def test_repeats_fold_and_a_chained_exception_counts_once():
    (retrying,) = parse_lines((DATA / "rendezvous_unreachable.log").read_text().splitlines())
    assert retrying.count > 1 and "--rdzv-endpoint" in retrying.advice
    failed = [e for e in parse_lines((DATA / "checkpoint_failed.log").read_text().splitlines()) if e.kind == "checkpoint_failed"]
    assert len(failed) == 1 and "`last` are intact" in failed[0].advice  # two chained OSErrors, one event


def test_nccl_and_cuda_messages_from_the_torch_binaries_are_known():
    """No GPU here to provoke them: the messages as the installed torch binaries hold them."""
    kinds = {line: [e.kind for e in parse_lines([line])] for line in (DATA / "torch_strings.txt").read_text().splitlines()}
    assert all(found for found in kinds.values()), kinds
    assert {k[0] for line, k in kinds.items() if "CUDA out of memory" in line} == {"cuda_oom"}
    assert {k[0] for line, k in kinds.items() if "CUDA" not in line} == {"nccl"}


def test_the_log_filter_keeps_words_ranks_and_event_lines():
    lines = (DATA / "stop_resume.log").read_text().splitlines()
    event_lines = {e.line_number for e in parse_lines(lines)}
    kept = [n for n, line in enumerate(lines, 1) if LogFilter.parse("rank:0 checkpoint").matches(line, n in event_lines)]
    assert [lines[n - 1] for n in kept][0].startswith("[rank0]:checkpoint saved: ")
    # two saves, "stopped ... (checkpoint saved)", the resume warning naming checkpoints/000012, two "done: checkpoints in"
    assert len(kept) == 6
    only_events = [n for n, line in enumerate(lines, 1) if LogFilter.parse("events").matches(line, n in event_lines)]
    assert only_events == sorted(event_lines)
    assert LogFilter.parse("rank:x").problem == "rank:x: expected rank:N or rank:N,M"


def test_an_async_save_is_saving_first_then_saved():
    """The two lines lr-engine prints for a `--checkpoint_async=true` save (see
    `lr_engine._checkpointing.save` and `finish_pending`), as rank 0's torchrun prefix carries them."""
    events = parse_lines([
        "[rank0]:checkpoint saving in the background: /runs/a/checkpoints/000004",
        "[rank0]:checkpoint saved: /runs/a/checkpoints/000004",
    ])
    assert [(e.kind, e.rank, e.title) for e in events] == [
        ("checkpoint_saving", 0, "checkpoint saving in the background: 000004"),
        ("checkpoint_saved", 0, "checkpoint saved: 000004"),
    ]


def test_once_a_run_finished_no_event_suggests_resuming_it_as_it_is():
    """The captured stop, resume and finish, ended by the line lr-engine prints when a run
    finishes: the stop and the saves no longer say "resume with r", only that a resume trains
    with --steps above the final step; what comes after a later resume is advised afresh."""
    lines = (DATA / "stop_resume.log").read_text().splitlines()
    longer = "[rank0]:train longer with: torchrun -m lr_engine.cli train --resume=true --config_path=x/checkpoints/last --steps=30   (any --steps above 15)"
    before = parse_lines(lines)
    assert any("r in the Monitor" in e.advice for e in before)
    after = parse_lines([*lines, longer])
    assert [(e.kind, e.title) for e in after if e.kind == "finished"] == [("finished", "finished at step 15")]
    assert not any("r in the Monitor" in e.advice or "(Monitor: r)" in e.advice for e in after if e.kind != "finished")
    assert {e.advice for e in after if e.kind in ("checkpoint_saved", "stopped") and e.rank == 0} == {
        "the run finished at step 15: a resume trains only with steps above 15"
    }
    assert_each_says_what_to_do(after)
    again = parse_lines([*lines, longer, "[rank0]:checkpoint saved: x/checkpoints/000020"])
    assert again[-1].advice.startswith("resume from it with r in the Monitor")
