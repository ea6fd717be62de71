"""What `convert` refuses before it reads anything (no torch: the CLI fails fast)."""

from __future__ import annotations
from lr_config.layout import StepFiles


from ._errors import CheckpointError

__all__ = ["EXPORT_DTYPES", "check_convert_request"]

EXPORT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def check_convert_request(files: StepFiles, dtype: str, overwrite: bool, delete_dcp: bool) -> None:
    """Raise for a bad dtype, a lossy delete, a folder without shards or a refused overwrite."""
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
