"""Start the CLIs as fresh processes that find torch already imported.

Each CLI run of the suite is a process of its own (exit code, stdout, stderr, atexit handlers,
signal handlers and the module's `__main__` all as under `python -m`), but a plain start spends
4 to 6 s of one core importing torch before the CLI does anything, and the suite starts
hundreds. A fork server imports torch once, then forks one child per run: the child points
its stdin, stdout and stderr at the run's files, takes the run's environment, working folder
and argv, and runs the module as `__main__` with `runpy`, then exits as the interpreter does
(non-daemon threads joined, atexit handlers, exit code).

Only torch and what it imports are imported before the fork. Modules that read the
environment when they are imported (huggingface_hub reads HF_ENDPOINT and HF_HOME) and lr's
own packages are imported by each child, under its own environment. Tests that check what a
CLI imports (never torch, for the converter and the TUI) start a plain interpreter instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ForkServer"]

_SERVER = r'''
import json, os, runpy, signal, sys, threading, traceback, atexit
import torch, torch.distributed, torch.distributed.checkpoint, numpy  # what every child would import first

def child(req):
    os.setsid()  # as a process of its own: a signal to its group reaches it and its workers only
    for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_APPEND), (2, req["err"], os.O_WRONLY | os.O_APPEND)):
        os.dup2(os.open(path, mode), fd)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]  # as an interpreter would put them
    sys.path[1:1] = [p for p in extra if p not in sys.path]
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    code = 0
    try:
        if req["module"].endswith(".py"):  # a script, as `python script.py argv...`
            sys.argv = [req["module"], *req["argv"]]
            sys.path.insert(0, os.path.dirname(os.path.abspath(req["module"])))
            runpy.run_path(req["module"], run_name="__main__")
        else:
            sys.argv = [req["module"], *req["argv"]]
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

def main():
    requests = os.fdopen(0, "r")
    replies = os.fdopen(1, "w", buffering=1)
    for line in requests:
        pids = []
        for req in json.loads(line):  # the processes of one run: one CLI, or the ranks of a job
            pid = os.fork()
            if pid == 0:
                requests.close()
                child(req)
            pids.append(pid)
        replies.write(json.dumps({"pids": pids}) + "\n")
        for _ in pids:  # each exit as it happens
            pid, status = os.wait()
            replies.write(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")

main()
'''


class ForkServer:
    """One server process; `run` is `subprocess.run` of `python -m module argv...` through it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def _server(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            self._proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          bufsize=0, env=env)
            self._buffer = b""
        return self._proc

    def _reply(self, timeout: float) -> dict[str, int] | None:
        """The server's next reply, or None when none came within `timeout` seconds."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the test fork server exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def start(self, module: str, argv: Sequence[str], envs: Sequence[Mapping[str, str]], *, cwd: Path | None,
              workdir: Path) -> list[int]:
        """Fork one process of `python -m module argv...` (`python module argv...` for a path ending
        in .py) per environment in `envs`, their stdout and
        stderr appended to `workdir/stdout` and `workdir/stderr`; their pids. `wait` collects them."""
        out, err = workdir / "stdout", workdir / "stderr"
        out.write_bytes(b"")
        err.write_bytes(b"")
        requests = [{"module": module, "argv": list(argv), "env": dict(env), "cwd": str(cwd or os.getcwd()),
                     "out": str(out), "err": str(err)} for env in envs]
        self._lock.acquire()
        try:
            server = self._server()
            assert server.stdin is not None
            server.stdin.write((json.dumps(requests) + "\n").encode())
            started = self._reply(120)
            assert started is not None, "the test fork server did not start the run"
            return list(started["pids"])
        except BaseException:
            self._lock.release()
            raise

    def next_exit(self, timeout: float) -> tuple[int, int] | None:
        """(pid, exit code) of the next process of the started run to end, or None after `timeout` s."""
        reply = self._reply(timeout)
        return None if reply is None else (reply["pid"], reply["code"])

    def finish(self) -> None:
        """Every process of the started run has been collected: the server takes the next run."""
        self._lock.release()

    def run(self, module: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None, timeout: float,
            workdir: Path) -> subprocess.CompletedProcess[str]:
        """`subprocess.run([python, -m, module, *argv], ...)` through the server."""
        cmd = [sys.executable, "-m", module, *argv]
        (pid,) = self.start(module, argv, [env], cwd=cwd, workdir=workdir)
        try:
            ended = self.next_exit(timeout)
            if ended is None:  # the run and what it started are killed; the server reports and goes on
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self.next_exit(60)
        finally:
            self.finish()
        out, err = (workdir / "stdout").read_text(errors="replace"), (workdir / "stderr").read_text(errors="replace")
        if ended is None:
            raise subprocess.TimeoutExpired(cmd, timeout, out, err)
        return subprocess.CompletedProcess(cmd, ended[1], out, err)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
