"""Offline conversion: DCP model shards -> `pretrained_model/model.safetensors`.

One process, no process group, no GPU, and no torch: the safetensors header is built from
the DCP metadata alone, then the shards' tensor bytes are copied (and cast) through three
reused buffers (`_formats.dcp.stream`; the output is written with direct I/O where the
filesystem takes it), so memory holds a few buffers. The file is written under a temporary name,
checked with `safe_open`, then renamed. Nothing existing is touched unless asked:
an existing model.safetensors needs `overwrite`, and the shards are deleted
(`delete_dcp`) only after every tensor of the new file compared equal to them. The
step folder's checksums.json follows: the new file is added, deleted shards dropped.

`check_convert_request` reads no tensor: the CLI calls it first, so a bad request fails before
any work is done.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lr_config import CheckpointError
from lr_config.layout import StepFiles, resolve_step_dir
from lr_config.st_format import TensorSpec

from ._formats.cast import FLOATING
from ._formats.dcp.metadata import DcpMetadata, read_whole_dcp_metadata
from ._formats.dcp.stream import dcp_safetensors_body
from ._formats.safetensors.body import write_safetensors_body
from ._io.checksums import read_checksums, update_checksums

__all__ = ["EXPORT_DTYPES", "check_convert_request", "convert_checkpoint"]

EXPORT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def check_convert_request(files: StepFiles, dtype: str, overwrite: bool, delete_dcp: bool) -> None:
    """What `convert` refuses before it reads anything: a bad dtype, a lossy delete, a folder
    without shards or a refused overwrite (the CLI calls it first, to fail fast)."""
    if dtype not in EXPORT_DTYPES:
        raise CheckpointError(f"--dtype: expected one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    if delete_dcp and dtype != "fp32":
        raise CheckpointError(
            "--delete_dcp=true needs --dtype=fp32: the DCP shards are the only full-precision copy of the weights"
        )
    if not files.has_model_dcp():
        already = " (it already has model.safetensors)" if files.model.is_file() else ""
        raise CheckpointError(f"{files.root}: has no DCP model shards ({files.model_dcp.name}/) to convert{already}")
    if files.model.exists() and not overwrite:
        raise CheckpointError(f"{files.model}: already exists; pass --overwrite=true to replace it")


def _target_dtype(saved: str, dtype: str) -> str:
    """Floating tensors take the export dtype; integer and bool buffers keep theirs."""
    return EXPORT_DTYPES[dtype] if saved in FLOATING else saved


def _specs(meta: DcpMetadata, dtype: str) -> list[TensorSpec]:
    return [TensorSpec(name=key, dtype=_target_dtype(meta.tensors[key].dtype, dtype), shape=meta.tensors[key].shape) for key in sorted(meta.tensors)]


def _check_equal(path: Path, meta: DcpMetadata, specs: list[TensorSpec], shown: Path) -> None:
    """Before shards are deleted: every tensor of the new file (`path`, shown as `shown`) against
    the shards as DCP itself loads them (torch; a second reader, not the one that wrote the file)."""
    import torch
    from safetensors import safe_open

    from ._formats.dcp.read import iter_dcp_tensors

    with safe_open(str(path), framework="pt") as f:
        for (key, tensor), spec in zip(iter_dcp_tensors(meta, [s.name for s in specs]), specs):
            if not torch.equal(f.get_tensor(key), tensor.to(getattr(torch, spec.dtype))):
                raise CheckpointError(f"{shown}: tensor {key!r} differs from the DCP shards after writing; nothing was changed")


def convert_checkpoint(checkpoint_dir: Path, *, dtype: str = "fp32", overwrite: bool = False, delete_dcp: bool = False) -> Path:
    """Merge a checkpoint's DCP model shards into `pretrained_model/model.safetensors`.

    `checkpoint_dir` is anything `resolve_step_dir` accepts. `dtype` (fp32, bf16, fp16)
    applies to floating tensors. Returns the path of the written file.
    """
    files = StepFiles(resolve_step_dir(checkpoint_dir))
    check_convert_request(files, dtype, overwrite, delete_dcp)
    meta = read_whole_dcp_metadata(files.model_dcp)
    specs = _specs(meta, dtype)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lr-checksums") as pool:
        # checksums.json is parsed (cattrs' import and set-up: about 65 ms) while the shards copy
        current = pool.submit(read_checksums, files.root)

        def before_rename(tmp: Path) -> None:
            # a damaged checksums.json or a mismatch stops the conversion before model.safetensors
            # is replaced: an error leaves the step folder as it was
            current.result()
            if delete_dcp:
                _check_equal(tmp, meta, specs, shown=files.model)

        digest = write_safetensors_body(files.model, specs, dcp_safetensors_body(meta, specs), {"format": "pt"}, direct=True, before_rename=before_rename)
        sums = current.result()
    update_checksums(files.root, sums, written={files.model: digest}, removed_folder=files.model_dcp if delete_dcp else None)
    if delete_dcp:
        shutil.rmtree(files.model_dcp)
    return files.model
