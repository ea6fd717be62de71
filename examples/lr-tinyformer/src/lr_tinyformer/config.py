"""The tinyformer's settings: `--policy.type=tinyformer --policy.n_blocks=4 ...`.

This module imports no torch: lr-config discovers the class through the `lr.policies` entry
point when it parses flags, validates a config or builds a launch command, and lr-tui lists
its fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lr_config import PolicyConfigBase, doc


@dataclass
class TinyformerConfig(PolicyConfigBase):
    """A small transformer: observation tokens and one query token per future action go through
    `n_blocks` identical blocks (the FSDP units); each query token becomes one action."""

    type_name: ClassVar[str] = "tinyformer"
    policy_class: ClassVar[str] = "lr_tinyformer.policy:TinyformerPolicy"

    chunk_size: int = doc(8, "Number of future actions predicted per step.")
    n_action_steps: int = doc(8, "Actions executed from each predicted chunk (<= chunk_size).")
    dim_model: int = doc(64, "Token width.")
    n_heads: int = doc(4, "Attention heads.")
    n_blocks: int = doc(2, "Repeated transformer blocks (each one an FSDP unit).")
    mlp_ratio: int = doc(4, "Hidden width of each block's MLP, as a multiple of dim_model.")
    image_patches: int = doc(4, "Each camera frame becomes image_patches x image_patches tokens (average-pooled).")
    dropout: float = doc(0.0, "Dropout in the blocks.")

    def problems(self) -> list[str]:
        """Rules lr's validate reports with its own (each names its flag)."""
        lines = [f"--policy.{name}: must be >= 1, got {getattr(self, name)}"
                 for name in ("dim_model", "n_heads", "n_blocks", "mlp_ratio", "image_patches") if getattr(self, name) < 1]
        if self.n_heads >= 1 and self.dim_model % self.n_heads:
            lines.append(f"--policy.dim_model: must be divisible by --policy.n_heads ({self.n_heads}), got {self.dim_model}")
        return lines
