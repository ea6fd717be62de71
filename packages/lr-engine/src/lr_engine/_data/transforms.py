"""LeRobot's image augmentations (`--dataset.image_transforms.*`), in plain torch.

`ImageTransforms(cfg)` is what LeRobot 0.6's `ImageTransforms` is: from the transforms with a
weight above 0, it draws `max_num_transforms` of them by weight without replacement and
applies them in their listed order (`random_order=true`: in the drawn order), to one
camera frame at a time. The transforms and their ranges are torchvision's, which LeRobot uses:

- `ColorJitter` (`brightness`, `contrast`, `saturation`, `hue`: a factor drawn uniformly in
  each given range; several given are applied in a random order, as torchvision does);
- `SharpnessJitter` (`sharpness`: blend with a 3x3-smoothed image, border pixels kept);
- `RandomAffine` (`degrees`: rotation about the centre; `translate`: the largest shift as a
  fraction of the width and height; nearest pixel, zero fill).

Every draw comes from the `torch.Generator` the caller passes, which the dataset seeds from
(`--seed`, the sample's number in the global order): a frame gets the same augmentation on
any rank, in any DataLoader worker and after a resume, and a new one in each epoch. Frames
are float (C, H, W) RGB in [0, 1]; so are the results.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from lr_config import ImageTransformConfig, ImageTransformsConfig

__all__ = ["ImageTransforms", "sample_generator"]

Transform = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def sample_generator(seed: int, sample: int) -> torch.Generator:
    """The generator of one sample's augmentation: a function of the seed and its number only."""
    return torch.Generator().manual_seed((seed * 1_000_003 + sample) % 2**63)


def _uniform(low: float, high: float, gen: torch.Generator) -> float:
    return low + (high - low) * float(torch.rand((), generator=gen))


def _gray(img: torch.Tensor) -> torch.Tensor:
    r, g, b = img[0], img[1], img[2]
    return (0.2989 * r + 0.587 * g + 0.114 * b).unsqueeze(0)


def _blend(img: torch.Tensor, other: torch.Tensor, factor: float) -> torch.Tensor:
    return (factor * img + (1.0 - factor) * other).clamp_(0.0, 1.0)


def adjust_brightness(img: torch.Tensor, factor: float) -> torch.Tensor:
    return _blend(img, torch.zeros_like(img), factor)


def adjust_contrast(img: torch.Tensor, factor: float) -> torch.Tensor:
    return _blend(img, _gray(img).mean().expand_as(img), factor)


def adjust_saturation(img: torch.Tensor, factor: float) -> torch.Tensor:
    return _blend(img, _gray(img).expand_as(img), factor)


def _rgb_to_hsv(img: torch.Tensor) -> torch.Tensor:
    r, g, b = img.unbind(0)
    high, low = img.max(0).values, img.min(0).values
    span = high - low
    safe = torch.where(span == 0, torch.ones_like(span), span)
    sat = span / torch.where(high == 0, torch.ones_like(high), high)
    rc, gc, bc = (high - r) / safe, (high - g) / safe, (high - b) / safe
    hue = torch.where(high == r, bc - gc, torch.where(high == g, 2.0 + rc - bc, 4.0 + gc - rc))
    hue = torch.where(span == 0, torch.zeros_like(hue), (hue / 6.0) % 1.0)
    return torch.stack([hue, sat, high])


def _hsv_to_rgb(img: torch.Tensor) -> torch.Tensor:
    h, s, v = img.unbind(0)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64) % 6
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = torch.zeros_like(img)
    for k, channels in enumerate(choices):
        mask = i == k
        for c in range(3):
            out[c] = torch.where(mask, channels[c], out[c])
    return out


def adjust_hue(img: torch.Tensor, shift: float) -> torch.Tensor:
    hsv = _rgb_to_hsv(img)
    hsv[0] = (hsv[0] + shift) % 1.0
    return _hsv_to_rgb(hsv).clamp_(0.0, 1.0)


_SMOOTH = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0


def adjust_sharpness(img: torch.Tensor, factor: float) -> torch.Tensor:
    if img.shape[-1] < 3 or img.shape[-2] < 3:
        return img
    kernel = _SMOOTH.to(img.dtype).expand(img.shape[0], 1, 3, 3)
    smooth = img.clone()
    smooth[:, 1:-1, 1:-1] = F.conv2d(img.unsqueeze(0), kernel, groups=img.shape[0])[0]
    return _blend(img, smooth, factor)


def affine(img: torch.Tensor, degrees: float, shift_x: float, shift_y: float) -> torch.Tensor:
    """Rotate by `degrees` (counter-clockwise) about the centre and shift by pixels; nearest, zero fill."""
    _, h, w = img.shape
    a = math.radians(degrees)
    cos, sin = math.cos(a), math.sin(a)
    # The output is the input rotated about the centre, then shifted (torchvision's order), so an
    # output pixel p reads the input at R(-a)(p - shift); written in affine_grid's coordinates,
    # [-1, 1] across each axis (half-sizes w/2, h/2).
    back_x, back_y = cos * shift_x + sin * shift_y, -sin * shift_x + cos * shift_y
    theta = torch.tensor(
        [[cos, sin * h / w, -2.0 * back_x / w], [-sin * w / h, cos, -2.0 * back_y / h]], dtype=img.dtype
    ).unsqueeze(0)
    grid = F.affine_grid(theta, [1, img.shape[0], h, w], align_corners=False)
    return F.grid_sample(img.unsqueeze(0), grid, mode="nearest", padding_mode="zeros", align_corners=False)[0]


def _color_jitter(ranges: dict[str, list[float]]) -> Transform:
    adjust = {"brightness": adjust_brightness, "contrast": adjust_contrast, "saturation": adjust_saturation, "hue": adjust_hue}
    order = [name for name in adjust if name in ranges]

    def apply(img: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        for k in torch.randperm(len(order), generator=gen).tolist():
            name = order[k]
            img = adjust[name](img, _uniform(*ranges[name], gen))
        return img

    return apply


def _sharpness_jitter(ranges: dict[str, list[float]]) -> Transform:
    low, high = ranges.get("sharpness", [0.5, 1.5])
    return lambda img, gen: adjust_sharpness(img, _uniform(low, high, gen))


def _random_affine(ranges: dict[str, list[float]]) -> Transform:
    lo, hi = ranges.get("degrees", [0.0, 0.0])
    tx, ty = ranges.get("translate", [0.0, 0.0])

    def apply(img: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        angle = _uniform(lo, hi, gen)
        _, h, w = img.shape
        dx = round(_uniform(-tx * w, tx * w, gen))
        dy = round(_uniform(-ty * h, ty * h, gen))
        return affine(img, angle, dx, dy)

    return apply


_MAKERS: dict[str, Callable[[dict[str, list[float]]], Transform]] = {
    "ColorJitter": _color_jitter,
    "SharpnessJitter": _sharpness_jitter,
    "RandomAffine": _random_affine,
}


def make_transform(cfg: ImageTransformConfig) -> Transform:
    return _MAKERS[cfg.type](cfg.kwargs)


class ImageTransforms:
    """The configured random subset of transforms (see the module docstring)."""

    def __init__(self, cfg: ImageTransformsConfig) -> None:
        active = [(name, tf) for name, tf in cfg.tfs.items() if tf.weight > 0]
        self.names = [name for name, _ in active]
        self.transforms = [make_transform(tf) for _, tf in active]
        self.weights = torch.tensor([tf.weight for _, tf in active], dtype=torch.float64)
        self.count = min(len(active), cfg.max_num_transforms)
        self.random_order = cfg.random_order
        self.enabled = cfg.enable and self.count > 0

    def __call__(self, img: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if not self.enabled:
            return img
        picked = torch.multinomial(self.weights, self.count, replacement=False, generator=gen)
        if not self.random_order:
            picked = picked.sort().values
        for i in picked.tolist():
            img = self.transforms[i](img, gen)
        return img
