"""The converter's numpy casts against torch's, every floating pair, edge values included."""

from __future__ import annotations

import pytest
import torch

from lr_checkpoint._formats.cast import FLOATING, cast_into


def _values() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    specials = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), 3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 1.1754942e-38,
         65504.0, 65519.99, 65520.0, 6e-8, 2.9e-8, 1.0000001, 1.00390625, 1.01171875, 1.005859375]
    )
    ties = torch.randint(0, 2**31 - 1, (20000,), generator=generator, dtype=torch.int32)
    ties = (ties & ~0xFFFF) | 0x8000  # exactly halfway between two bfloat16 values
    any_bits = torch.randint(-(2**31), 2**31 - 1, (50000,), generator=generator, dtype=torch.int32)
    return torch.cat([
        specials,
        torch.randn(20000, generator=generator),
        torch.randn(2000, generator=generator) * 1e-40,  # subnormal
        torch.randn(2000, generator=generator) * 1e38,
        ties.view(torch.float32),
        any_bits.view(torch.float32),  # includes NaNs with payloads
    ])


def _sources() -> dict[str, torch.Tensor]:
    base = _values()
    wide = torch.cat([base.double(), torch.randn(5000, dtype=torch.float64) * 1e-300, torch.randn(5000, dtype=torch.float64)])
    return {"float64": wide, "float32": base, "float16": base.half(), "bfloat16": base.bfloat16()}


@pytest.mark.parametrize("target", FLOATING)
@pytest.mark.parametrize("source", FLOATING)
def test_cast_matches_torch_bit_for_bit_except_nan_payloads(source: str, target: str) -> None:
    values = _sources()[source]
    expected = values.to(getattr(torch, target))
    out = bytearray(expected.numel() * expected.element_size())
    cast_into(memoryview(values.view(torch.uint8).numpy()).cast("B"), source, target, memoryview(out))
    got = torch.frombuffer(out, dtype=expected.dtype)
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[expected.element_size()]
    assert torch.equal(got[~nan].view(width), expected[~nan].view(width))
    if target == "float16":  # a NaN comes out quiet
        assert bool(((got[nan].view(torch.int16) & 0x0200) != 0).all())
