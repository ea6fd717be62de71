"""torchvision's ImageNet weights for ACT's ResNet backbone (`--policy.pretrained_backbone_weights`).

LeRobot's default is `ResNet18_Weights.IMAGENET1K_V1`: torchvision's file, kept in torch's hub
cache (`$TORCH_HOME/hub/checkpoints`, `~/.cache/torch` by default), where torchvision and
LeRobot put it too. lr reads it from there, or downloads it there once (with a message) when it
is missing. HF_HUB_OFFLINE=1 forbids the download: the error then says where the file goes.
Only a fresh run reads it: a --policy.path fine-tune and a resume take every weight from their
own files. The classifier (`fc`) is not part of the backbone and is left out.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from lr_config import ConfigError
from torch import nn

__all__ = ["WEIGHT_FILES", "load_backbone_weights", "weights_file"]

_BASE_URL = "https://download.pytorch.org/models/"
WEIGHT_FILES = {
    "ResNet18_Weights.IMAGENET1K_V1": "resnet18-f37072fd.pth",
    "ResNet34_Weights.IMAGENET1K_V1": "resnet34-b627a593.pth",
    "ResNet50_Weights.IMAGENET1K_V1": "resnet50-0676ba61.pth",
    "ResNet50_Weights.IMAGENET1K_V2": "resnet50-11ad3fa6.pth",
}
"""torchvision's file for each weights name (its hash prefix is in the name)."""
_FLAG = "--policy.pretrained_backbone_weights"
_HUB_WEIGHTS = "checkpoints"
"""torch.hub's own folder for downloaded weights, under `torch.hub.get_dir()` (not a folder of lr's run layout)."""


def weights_file(name: str) -> Path:
    """Where torch's hub cache keeps `name`'s file."""
    return Path(torch.hub.get_dir()) / _HUB_WEIGHTS / WEIGHT_FILES[name]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _fetch(name: str, path: Path) -> None:
    if _offline():
        raise ConfigError(f"{_FLAG}={name}: {path} is not there and HF_HUB_OFFLINE is set; put torchvision's "
                          f"{path.name} there, or pass {_FLAG}=null to train the backbone from scratch")
    url = _BASE_URL + path.name
    if os.environ.get("RANK", "0") == "0":
        print(f"{_FLAG}={name}: downloading {url} to {path} (once)", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.hub.download_url_to_file(url, str(path), hash_prefix=path.stem.rsplit("-", 1)[-1], progress=False)
    except Exception as exc:  # no network, a proxy, a bad download: the same advice
        raise ConfigError(f"{_FLAG}={name}: {url} could not be downloaded ({type(exc).__name__}: {exc}); put the file at "
                          f"{path}, or pass {_FLAG}=null to train the backbone from scratch") from None


def load_backbone_weights(backbone: nn.Module, name: str) -> None:
    """Load `name`'s ImageNet weights into `backbone` (a `ResNetTrunk`), every tensor of it."""
    path = weights_file(name)
    if not path.is_file():
        _fetch(name, path)
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(f"{_FLAG}={name}: {path} is not a readable torch file ({exc}); delete it to download it again") from None
    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    missing, unexpected = backbone.load_state_dict(state, strict=False)
    unexpected = [k for k in unexpected if not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise ConfigError(f"{_FLAG}={name}: {path} does not fit the backbone (missing {sorted(missing)[:3]}, "
                          f"unexpected {sorted(unexpected)[:3]}); is it the right file?")
