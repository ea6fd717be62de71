"""Verify: `lr-checkpoint verify`'s read of a DCP folder, over the number of tensors.

    uv run python tools/bench/verify_scaling.py [--repeats=3] [--smoke]

A DCP folder of 25 to 1600 tensors of 256 KiB each (6 to 400 MiB) is saved, as one process
saves it. For each, side by side and interleaved: verify's read of every tensor (`lr_checkpoint._verify._read_dcp`,
the part of `verify_checkpoint` that loads the shards), the same read tensor by tensor (one DCP
load per tensor, as verify did before: each load reads and plans over the whole metadata, so
the cost grows with the square of the tensor count), and the floor: SHA-256 of the folder's
files. The ratio to the hash must stay flat as the tensor count grows.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

TENSOR_FLOATS = 64 << 10  # 256 KiB of fp32 per tensor: the bytes grow with the count
PER_TENSOR_UP_TO = 400  # the old way is quadratic: it stops being worth waiting for


def _save(folder: Path, count: int) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    rows = TENSOR_FLOATS // 64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({f"layer{i}.weight": torch.randn(rows, 64) for i in range(count)}, checkpoint_id=folder, no_dist=True)


def _hash(folder: Path) -> None:
    for path in sorted(folder.iterdir()):
        hashlib.sha256(path.read_bytes()).hexdigest()


def _verify(folder: Path) -> None:
    from lr_checkpoint._verify import _read_dcp

    assert _read_dcp(folder) == []


def _per_tensor(folder: Path) -> None:
    from lr_checkpoint._formats.dcp.metadata import read_whole_dcp_metadata
    from lr_checkpoint._formats.dcp.read import load_dcp_tensor

    meta = read_whole_dcp_metadata(folder)
    for key, entry in meta.tensors.items():
        load_dcp_tensor(folder, key, entry)


def _timed(job, folder: Path) -> float:  # type: ignore[no-untyped-def]
    t0 = C.now()
    job(folder)
    return C.now() - t0


def measure(counts: list[int], repeats: int, tmp: Path) -> dict[int, dict[str, list[float]]]:
    results: dict[int, dict[str, list[float]]] = {}
    for count in counts:
        folder = tmp / f"n{count}"
        _save(folder, count)
        jobs = {"hash": _hash, "verify": _verify}
        if count <= PER_TENSOR_UP_TO:
            jobs["per tensor"] = _per_tensor
        samples: dict[str, list[float]] = {name: [] for name in jobs}
        _hash(folder)  # the page cache holds the files for every job alike
        for repeat in range(repeats):
            for name in list(jobs) if repeat % 2 == 0 else list(reversed(jobs)):
                samples[name].append(_timed(jobs[name], folder))
        print(f"{count} tensors: " + ", ".join(f"{k} {C.median(v):.3f} s" for k, v in samples.items()), flush=True)
        results[count] = samples
    return results


def _section(results: dict[int, dict[str, list[float]]], repeats: int) -> str:
    rows = []
    for count, s in results.items():
        ratios = [v / h for v, h in zip(s["verify"], s["hash"])]
        old = s.get("per tensor")
        rows.append([
            str(count), C.spread(s["hash"]), C.spread(s["verify"]), f"{C.median(ratios):.2f}",
            C.spread(old) if old else "(not run: quadratic)",
            f"{C.median([o / v for o, v in zip(old, s['verify'])]):.1f}x" if old else "-",
        ])
    first, last = list(results.values())[0], list(results.values())[-1]
    flat = [C.median([v / h for v, h in zip(s["verify"], s["hash"])]) for s in (first, last)]
    body = [
        f"Seconds, `median (min-max, n)` over {repeats} interleaved repeats, files in the page cache. One DCP folder per "
        "row: that many fp32 tensors of 256 KiB each, saved by one process. `verify` is lr-checkpoint verify's read "
        "of every tensor (metadata read once, tensors loaded in batches of up to 64 MiB); `per tensor` is one DCP load per "
        "tensor, as verify read them before; `hash` is SHA-256 of the folder's files, the floor any check of every byte "
        "pays.",
        "",
        C.table(["tensors", "hash s", "verify s", "verify / hash", "per tensor s", "per tensor / verify"], rows),
        "",
        f"verify / hash at {list(results)[0]} and {list(results)[-1]} tensors: {flat[0]:.2f} and {flat[1]:.2f} "
        f"({C.verdict(flat[1] <= 2 * flat[0])}: verify grows with the bytes, as hashing them does; target: the ratio at "
        f"{list(results)[-1]} tensors at most twice the ratio at {list(results)[0]}).",
    ]
    return "\n".join(body)


def main() -> None:
    args = C.parse_args(__doc__.splitlines()[0])
    args.repeats = args.repeats or (1 if args.smoke else 3)
    counts = [10, 40] if args.smoke else [25, 100, 400, 1600]
    ctx = C.Context.now()
    with tempfile.TemporaryDirectory(prefix="lr-bench-verify-") as tmp:
        results = measure(counts, args.repeats, Path(tmp))
    flags = [] if args.smoke else [f"--repeats={args.repeats}"]
    C.write_section(args.out, "verify_scaling", "9. Verify: time over the number of tensors", C.command_line("verify_scaling.py", args, flags),
                    ctx, _section(results, args.repeats), args.smoke)


if __name__ == "__main__":
    main()
