"""lr-tinyformer: an example lr policy plugin (see this package's README, the tutorial).

`lr_tinyformer.config` holds the config dataclass (no torch: lr-config, the flag parser and
lr-tui read it); `lr_tinyformer.policy` holds the `nn.Module` lr-engine builds from it.
"""

from .config import TinyformerConfig

__all__ = ["TinyformerConfig"]
