"""LeRobot's image transforms in lr: each does what its torchvision namesake does, the subset is drawn
by weight, and the draws depend only on (seed, sample number)."""

from __future__ import annotations

import pytest
import torch
from lr_config import ImageTransformConfig, ImageTransformsConfig, parse_train_config, validate

from lr_engine._data.transforms import (
    ImageTransforms,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    adjust_sharpness,
    affine,
    sample_generator,
)


@pytest.fixture
def image() -> torch.Tensor:
    return torch.rand(3, 24, 32, generator=torch.Generator().manual_seed(0))


def test_color_adjustments_match_their_definitions(image: torch.Tensor) -> None:
    torch.testing.assert_close(adjust_brightness(image, 0.5), image * 0.5)
    gray = 0.2989 * image[0] + 0.587 * image[1] + 0.114 * image[2]
    torch.testing.assert_close(adjust_contrast(image, 0.0), gray.mean().expand_as(image))
    torch.testing.assert_close(adjust_saturation(image, 0.0), gray.expand_as(image))
    for factor in (0.8, 1.0, 1.2):
        out = adjust_saturation(image, factor)
        assert out.min() >= 0 and out.max() <= 1
    torch.testing.assert_close(adjust_hue(image, 0.0), image, atol=1e-5, rtol=0)
    torch.testing.assert_close(adjust_hue(adjust_hue(image, 0.1), -0.1), image, atol=1e-4, rtol=0)
    red = torch.zeros(3, 2, 2)
    red[0] = 1.0
    torch.testing.assert_close(adjust_hue(red, 1 / 3), torch.stack([torch.zeros(2, 2), torch.ones(2, 2), torch.zeros(2, 2)]))


def test_sharpness_and_affine(image: torch.Tensor) -> None:
    torch.testing.assert_close(adjust_sharpness(image, 1.0), image)
    blurred = adjust_sharpness(image, 0.0)
    assert torch.equal(blurred[:, 0], image[:, 0]) and not torch.equal(blurred[:, 5, 5], image[:, 5, 5])  # borders kept
    assert torch.equal(affine(image, 0.0, 0, 0), image)
    shifted = affine(image, 0.0, 3, 2)
    assert torch.equal(shifted[:, 2:, 3:], image[:, :-2, :-3]) and shifted[:, :2].abs().sum() == 0  # zero fill
    square = torch.rand(1, 9, 9)
    quarter = affine(square, 90.0, 0, 0)
    assert torch.equal(affine(quarter, -90.0, 0, 0), square)


def test_a_sample_is_augmented_alike_everywhere_and_anew_in_each_draw(image: torch.Tensor) -> None:
    transforms = ImageTransforms(ImageTransformsConfig(enable=True))
    assert transforms.count == 3 and transforms.names == ["brightness", "contrast", "saturation", "hue", "sharpness", "affine"]
    a = transforms(image, sample_generator(1000, 42))
    assert torch.equal(a, transforms(image, sample_generator(1000, 42)))
    assert not torch.equal(a, transforms(image, sample_generator(1000, 43)))
    assert not torch.equal(a, transforms(image, sample_generator(7, 42)))
    assert not torch.equal(a, image) and a.min() >= 0 and a.max() <= 1


def test_weights_decide_what_is_drawn(image: torch.Tensor) -> None:
    only = {"brightness": ImageTransformConfig(1.0, "ColorJitter", {"brightness": [0.5, 0.5]}),
            "off": ImageTransformConfig(0.0, "RandomAffine", {"degrees": [90.0, 90.0]})}
    transforms = ImageTransforms(ImageTransformsConfig(enable=True, max_num_transforms=3, tfs=only))
    assert transforms.count == 1 and transforms.names == ["brightness"]
    torch.testing.assert_close(transforms(image, sample_generator(0, 1)), image * 0.5)
    assert torch.equal(ImageTransforms(ImageTransformsConfig(enable=False))(image, sample_generator(0, 1)), image)


@pytest.mark.parametrize(
    "flag,message",
    [
        ('--dataset.image_transforms.tfs.hue.kwargs={"hue": [-0.9, 0.1]}',
         "--dataset.image_transforms.tfs.hue.kwargs.hue: expected [low, high] with -0.5 <= low <= high <= 0.5, got [-0.9, 0.1]"),
        ('--dataset.image_transforms.tfs.sharpness.kwargs={"sharp": [0.5, 1.5]}',
         "--dataset.image_transforms.tfs.sharpness.kwargs: SharpnessJitter takes sharpness, not 'sharp' (did you mean 'sharpness'?)"),
        ("--dataset.image_transforms.tfs.affine.weight=-1", "--dataset.image_transforms.tfs.affine.weight: must be a finite number >= 0"),
        ("--dataset.image_transforms.max_num_transforms=0", "--dataset.image_transforms.max_num_transforms: must be >= 1, got 0"),
        ("--dataset.tolerance_s=-0.1", "--dataset.tolerance_s: must be a finite number of seconds >= 0"),
    ],
)
def test_bad_transform_settings_name_the_flag(flag: str, message: str) -> None:
    with pytest.raises(Exception) as err:
        validate(parse_train_config([flag]))
    assert message in str(err.value)
