"""Checkpoint I/O: save and load MB/s per format against raw sequential I/O on the same disk.

    uv run python tools/bench/checkpoint_io.py [--repeats=4] [--smoke]

A plain 201 MB model (12 x Linear(2048, 2048)) with its AdamW state, saved with
`lr_checkpoint.save_checkpoint` and loaded with `load_model_and_optimizer`:
`safetensors` from one process (plain model), and `safetensors` (gathered), `dcp` and
`safetensors_dcp` from a 2-process FSDP2 run. Each checkpoint is paired, in the same
repeat and the same process, with a raw sequential write (fsynced) and read of exactly
its bytes (the same content) in the same folder. The order of the formats rotates between
repeats, and odd repeats run the raw write and read before the save and load (the first
of two writes in a row may have an edge on a virtual disk that flushes on the host).
Page cache: every save and every raw write ends with fsync; before every load and every
raw read the files' pages are evicted with posix_fadvise(POSIX_FADV_DONTNEED) (no root
needed), so reads come from the disk's side of the page cache.
Settling: each format's save and raw write start --settle seconds (default 12) after the
previous files were deleted and synced. On a thin-provisioned virtual disk whose file system
discards freed blocks (ext4 `-o discard`, as on the benchmark machine), blocks freed a moment
ago are still backed on the host and take writes several times faster than blocks whose
discard went through, so without the pause the write that happens to reuse them wins. A
training run's saves are minutes apart, so the settled state is the one a save meets.
Target: >= 0.8 of raw.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from lr_config.layout import MODEL_WEIGHTS, StepFiles  # noqa: E402

TARGET = 0.8
SCRIPT = Path(__file__).resolve()
CHUNK = 64 << 20


# ---------------------------------------------------------------- raw I/O (main rank)


def tree_content(root: Path) -> bytes:
    """Every file of `root`, concatenated: what the raw write writes, so that both write
    the same data (this virtual disk writes zero blocks several times faster than random
    ones, so the content, not only the size, must match)."""
    return b"".join((Path(d) / n).read_bytes() for d, _, names in sorted(os.walk(root)) for n in sorted(names))


def raw_write(path: Path, data: bytes) -> float:
    view = memoryview(data)
    t0 = C.now()
    with open(path, "wb", buffering=0) as f:
        for start in range(0, len(view), CHUNK):
            f.write(view[start : start + CHUNK])
        os.fsync(f.fileno())
    return C.now() - t0


def raw_read(path: Path, buffer: bytearray) -> float:
    C.drop_file_cache(path)
    view = memoryview(buffer)
    t0 = C.now()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return C.now() - t0


# ---------------------------------------------------------------- worker (every rank)


def _unread_on_load(step_dir: Path) -> int:
    """Bytes a resume does not read: with DCP shards present, the model comes from them and
    the gathered `model.safetensors` of `safetensors_dcp` stays unread."""
    files = StepFiles(step_dir)
    shards, gathered = files.model_dcp, files.pretrained / MODEL_WEIGHTS
    return gathered.stat().st_size if shards.is_dir() and gathered.is_file() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _timed(fn: Any) -> float:
    _barrier()
    t0 = C.now()
    fn()
    _barrier()
    return C.now() - t0


def mount_of(path: Path) -> str:
    """The file system holding `path` and whether it discards freed blocks, from /proc/self/mounts
    (e.g. "ext4, mounted with `discard`"); "" where that cannot be read."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    target = str(path.resolve())
    best: tuple[int, str, str] = (-1, "", "")
    for line in lines:
        fields = line.split()
        if len(fields) >= 4:
            point = fields[1].replace("\\040", " ")
            if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) > best[0]:
                best = (len(point), fields[2], fields[3])
    if best[0] < 0:
        return ""
    discard = "discard" in best[2].split(",")
    return f"{best[1]}, mounted {'with' if discard else 'without'} `discard`"


def one_format(fmt: str, model: Any, optimizer: Any, root: Path, main: bool, buffer: bytearray, raw_first: bool,
               contents: dict[str, bytes], settle_s: float) -> dict[str, Any]:
    """Settle, save and raw write (in that order, or raw first), then load and raw read likewise.

    The raw write needs the checkpoint's bytes: they are kept from the first save of the
    format (the model does not change between repeats), so raw-first repeats can write
    them before this repeat's save."""
    from lr_checkpoint import load_model_and_optimizer, save_checkpoint
    from _stack import save_request

    ckpts, raw = root / f"ckpt-{fmt}", root / "raw.bin"
    step_dir: list[Path] = []
    row: dict[str, Any] = {"format": fmt, "raw_first": raw_first}

    def save() -> None:
        row["save_s"] = _timed(lambda: step_dir.append(save_checkpoint(ckpts, 1, save_request(model, optimizer, 1, fmt))))
        if main and fmt not in contents:
            contents[fmt] = tree_content(step_dir[0])

    def write_raw() -> None:
        if main:
            row["raw_write_s"] = raw_write(raw, contents[fmt])
        _barrier()

    def load() -> None:
        if main:
            C.drop_file_cache(step_dir[0])
        row["load_s"] = _timed(lambda: load_model_and_optimizer(step_dir[0], model, optimizer))

    def read_raw() -> None:
        if main:
            row["raw_read_s"] = raw_read(raw, buffer)
        _barrier()

    if main:
        C.settle(settle_s)
    _barrier()
    for job in (write_raw, save, read_raw, load) if raw_first else (save, write_raw, load, read_raw):
        job()
    if main:
        row["bytes"], row["raw_bytes"] = C.tree_bytes(step_dir[0]), len(contents[fmt])
        row["load_bytes"] = row["bytes"] - _unread_on_load(step_dir[0])
        raw.unlink()
        shutil.rmtree(ckpts)
    _barrier()
    return row


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    import _stack

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    main = not distributed or dist.get_rank() == 0
    size = _stack.SMOKE if args.smoke else _stack.FULL
    model, optimizer = _stack.build(size, distributed)
    formats = args.formats.split(",")
    root = Path(args.tmp)
    root.mkdir(parents=True, exist_ok=True)
    buffer = bytearray(CHUNK) if main else bytearray()
    rows = []
    contents: dict[str, bytes] = {}
    world = dist.get_world_size() if distributed else 1
    for repeat in range(args.repeats):
        shift = repeat % len(formats)
        for fmt in formats[shift:] + formats[:shift]:
            # raw first on odd repeats: the first of two writes in a row may have an edge
            raw_first = repeat % 2 == 1
            rows.append({"repeat": repeat, "world": world, **one_format(fmt, model, optimizer, root, main, buffer, raw_first, contents, args.settle)})
    if main:
        C.write_result(Path(args.result), {"model_bytes": _stack.model_bytes(model), "size": size, "rows": rows})
    C.finish_worker(0)


# ---------------------------------------------------------------- parent


def _section(rows: list[dict[str, Any]], model_mb: float, size: dict[str, int], repeats: int, settle: float,
             mount: str) -> str:
    out = []
    for world, fmt, label in ((1, "safetensors", "safetensors, 1 process (plain model)"),
                              (2, "safetensors", "safetensors, FSDP2-2 (saved gathered by rank 0, loaded by rows on each rank)"),
                              (2, "dcp", "dcp, FSDP2-2"),
                              (2, "safetensors_dcp", "safetensors_dcp, FSDP2-2")):
        mine = [r for r in rows if r["world"] == world and r["format"] == fmt]
        if not mine:
            continue
        mb = mine[0]["bytes"] / 1e6
        save = [r["bytes"] / 1e6 / r["save_s"] for r in mine]
        load = [r["load_bytes"] / 1e6 / r["load_s"] for r in mine]
        raw_w = [r["raw_bytes"] / 1e6 / r["raw_write_s"] for r in mine]
        raw_r = [r["raw_bytes"] / 1e6 / r["raw_read_s"] for r in mine]
        save_ratio = [a / b for a, b in zip(save, raw_w)]
        load_ratio = [a / b for a, b in zip(load, raw_r)]
        out.append([label, f"{mb:.0f}" + (f" ({mine[0]['load_bytes'] / 1e6:.0f} read)" if mine[0]["load_bytes"] != mine[0]["bytes"] else ""), C.spread(save, "{:.0f}"), C.spread(raw_w, "{:.0f}"), C.spread(save_ratio, "{:.2f}"),
                    C.verdict(C.median(save_ratio) >= TARGET), C.spread(load, "{:.0f}"), C.spread(raw_r, "{:.0f}"),
                    C.spread(load_ratio, "{:.2f}"), C.verdict(C.median(load_ratio) >= TARGET)])
    body = [
        f"Model: {model_mb:.1f} MB of fp32 weights ({size['blocks']} x Linear({size['dim']}, {size['dim']})) plus AdamW state; MB = 10^6 bytes, counted "
        f"as every file the checkpoint folder holds. {repeats} interleaved repeats (raw first on odd ones); ratios are "
        f"per repeat, then the median; target >= {TARGET} of raw.",
        "",
        C.table(["format", "MB", "save MB/s", "raw write MB/s", "save / raw", "", "load MB/s", "raw read MB/s", "load / raw", ""], out),
        "",
        "A load's MB/s counts the bytes it reads (`safetensors_dcp` resumes from the DCP shards and leaves its gathered "
        "`model.safetensors` unread; the MB column shows both). Save time: `save_checkpoint` on every rank, between barriers (gathers, DCP planning, writes, fsync of the tree, "
        "rename, `last` link). Load time: `load_model_and_optimizer` into the live FSDP2 or plain model and optimizer. Raw: "
        "one process writes the checkpoint's own bytes (all its files concatenated, read into memory beforehand: this "
        "virtual disk writes zero blocks several times faster than random ones, so the content has to match, not only "
        "the size) sequentially into one file in the same folder (64 MiB writes, then fsync), and reads them back (64 MiB "
        f"`readinto` calls). Settling: each format's save and raw write start {settle:g} s after the previous files "
        f"were deleted and `os.sync()` ran{f' (the file system measured: {mount})' if mount else ''}. On a "
        "thin-provisioned virtual disk whose file system discards freed blocks, blocks freed a moment ago take writes "
        "several times faster until the host has processed their discard (see the measured facts at the end of this file), "
        "so without the pause the write that happens to reuse them wins; saves in a training run are minutes apart "
        "and meet the settled disk. Caching: fsync on every write; before each load or raw read "
        "the files' pages are dropped with `posix_fadvise(POSIX_FADV_DONTNEED)` (root is not needed; on this virtual disk "
        "a host-side cache may still serve reads, for the checkpoint and the raw file alike).",
    ]
    return "\n".join(body)


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("--result", default="", help=argparse.SUPPRESS)
        p.add_argument("--tmp", default="", help=argparse.SUPPRESS)
        p.add_argument("--formats", default="safetensors", help=argparse.SUPPRESS)
        p.add_argument("--dir", type=Path, default=None, help="folder on the disk to measure (default: the system temp folder)")
        p.add_argument("--settle", type=float, default=None,
                       help="seconds between deleting a format's files and the next writes (default 12; 0 with --smoke)")

    args = C.parse_args(__doc__.splitlines()[0], extra)
    args.repeats = args.repeats or (1 if args.smoke else 4)
    if args.settle is None:
        args.settle = 0.0 if args.smoke else 12.0
    if args.worker:
        worker(args)
        return
    ctx = C.Context.now()
    base = args.dir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    common = [f"--repeats={args.repeats}", f"--settle={args.settle}"] + (["--smoke"] if args.smoke else [])
    with tempfile.TemporaryDirectory(prefix=".lr-bench-io-", dir=base) as tmp:
        one = C.run_worker(1, SCRIPT, [*common, f"--tmp={tmp}/1", "--formats=safetensors"], Path(tmp) / "r1.json", timeout=1800)
        two = C.run_worker(2, SCRIPT, [*common, f"--tmp={tmp}/2", "--formats=safetensors,dcp,safetensors_dcp"], Path(tmp) / "r2.json", timeout=1800)
    body = _section(one["rows"] + two["rows"], one["model_bytes"] / 1e6, one["size"], args.repeats, args.settle, mount_of(base))
    flags = [] if args.smoke else [f"--repeats={args.repeats}"] + ([f"--settle={args.settle:g}"] if args.settle != 12 else [])
    C.write_section(args.out, "checkpoint_io", "3. Checkpoint I/O: lr_checkpoint save/load vs raw sequential I/O",
                    C.command_line("checkpoint_io.py", args, flags), ctx, body, args.smoke)


if __name__ == "__main__":
    main()
