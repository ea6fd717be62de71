"""The one user-facing error of lr-checkpoint.

`CheckpointError` is a `lr_config.ConfigError`, so every lr CLI already prints it and exits
2. Its message names the file or folder at fault and what to do about it. It is defined in
lr-config, beside the checkpoint layout, so that torch-free readers raise it too.
"""

from __future__ import annotations

from lr_config import CheckpointError

__all__ = ["CheckpointError"]
