"""Policies: shapes, finite losses, action chunking, safetensors round-trip, wrap units."""

import pytest
import torch
from lr_config import ACTConfig, ConfigError, FeatureSpec, FSDPConfig, MLPConfig
from torch import nn

from lr_engine._parallel.wrap import check_tied_parameters, choose_units
from lr_engine._policies import load_pretrained, make_policy, save_pretrained

INPUTS = {
    "observation.state": FeatureSpec("STATE", [2]),
    "observation.environment_state": FeatureSpec("ENV", [2]),
    "observation.images.top": FeatureSpec("VISUAL", [3, 32, 32]),
}
OUTPUTS = {"action": FeatureSpec("ACTION", [2])}


def configs():
    return [
        ACTConfig(input_features=INPUTS, output_features=OUTPUTS, dim_model=32, n_heads=2, dim_feedforward=64, chunk_size=6, n_action_steps=3),
        MLPConfig(input_features=INPUTS, output_features=OUTPUTS, hidden_dim=32, chunk_size=4, n_action_steps=2),
    ]


def batch(chunk: int, b: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    pad = torch.zeros(b, chunk, dtype=torch.bool)
    pad[0, -2:] = True
    return {
        "observation.state": torch.randn(b, 2, generator=g),
        "observation.environment_state": torch.randn(b, 2, generator=g),
        "observation.images.top": torch.rand(b, 3, 32, 32, generator=g),
        "action": torch.randn(b, chunk, 2, generator=g),
        "action_is_pad": pad,
    }


@pytest.mark.parametrize("cfg", configs(), ids=["act", "mlp"])
def test_forward_gives_a_finite_loss_and_gradients(cfg):
    torch.manual_seed(0)
    policy = make_policy(cfg)
    loss, info = policy(batch(cfg.chunk_size))
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert all(v.ndim == 0 and torch.isfinite(v) for v in info.values())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in policy.parameters() if p.requires_grad)


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_the_cvae_encoder_computing_its_class_token_alone_gives_the_full_encoders_output_and_gradients(pre_norm):
    """`first_only`: the last layer computes one row; the output and every gradient equal the
    full computation's (dropout off: which elements a dropout draws is the only difference)."""
    from lr_engine._policies.act import ACTEncoder

    cfg = ACTConfig(input_features=INPUTS, output_features=OUTPUTS, dim_model=32, n_heads=2, dim_feedforward=64, pre_norm=pre_norm)
    torch.manual_seed(0)
    encoder = ACTEncoder(cfg, n_layers=3).eval()
    x, pos, weight = torch.randn(4, 12, 32), torch.randn(1, 12, 32), torch.randn(4, 32)
    mask = torch.zeros(4, 12, dtype=torch.bool)
    mask[1, -3:] = True
    results = []
    for first_only in (False, True):
        encoder.zero_grad()
        xi = x.clone().requires_grad_(True)
        out = encoder(xi, pos, key_padding_mask=mask, first_only=first_only)
        assert out.shape == ((4, 1, 32) if first_only else (4, 12, 32))
        (out[:, 0] * weight).sum().backward()
        assert xi.grad is not None
        results.append((out[:, 0].detach(), xi.grad, [p.grad.clone() for p in encoder.parameters() if p.grad is not None]))
    (full, full_x, full_p), (one, one_x, one_p) = results
    torch.testing.assert_close(one, full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(one_x, full_x, rtol=1e-5, atol=1e-6)
    assert len(one_p) == len(full_p) == len([p for p in encoder.parameters() if p.requires_grad])
    for a, b in zip(one_p, full_p):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cfg", configs(), ids=["act", "mlp"])
def test_select_action_pops_a_chunk_n_action_steps_at_a_time(cfg):
    torch.manual_seed(0)
    policy = make_policy(cfg).eval()
    obs = {k: v for k, v in batch(cfg.chunk_size).items() if k.startswith("observation.")}
    chunk = policy.predict_action_chunk(obs)
    assert chunk.shape == (3, cfg.chunk_size, 2)
    actions = [policy.select_action(obs) for _ in range(cfg.n_action_steps)]
    for i, a in enumerate(actions):
        assert a.shape == (3, 2)
        torch.testing.assert_close(a, chunk[:, i])
    assert not policy._queue
    policy.select_action(obs)  # refills
    assert len(policy._queue) == cfg.n_action_steps - 1
    policy.reset()
    assert not policy._queue


@pytest.mark.parametrize("cfg", configs(), ids=["act", "mlp"])
def test_a_bfloat16_policy_takes_float32_batches_and_gives_float32_losses_and_actions(tmp_path, cfg):
    """--policy.dtype=bfloat16: parameters and buffers are bfloat16; float32 inputs are cast as
    they enter forward, predict_action_chunk and select_action; the loss and the actions are float32; the saved
    weights are bfloat16 and load back into a bfloat16 policy."""
    import dataclasses
    import json

    from safetensors.torch import load_file

    torch.manual_seed(0)
    cfg = dataclasses.replace(cfg, dtype="bfloat16")
    policy = make_policy(cfg)
    assert {t.dtype for t in [*policy.parameters(), *policy.buffers()] if t.is_floating_point()} == {torch.bfloat16}
    loss, info = policy(batch(cfg.chunk_size))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in policy.parameters())
    obs = {k: v for k, v in batch(cfg.chunk_size).items() if k.startswith("observation.")}
    policy.eval()
    assert policy.predict_action_chunk(obs).dtype == torch.bfloat16  # float32 observations are cast on the way in
    action = policy.select_action(obs)
    assert action.dtype == torch.float32 and action.shape == (3, 2)
    save_pretrained(policy, tmp_path)
    assert {t.dtype for t in load_file(str(tmp_path / "model.safetensors")).values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "lr_policy.json").read_text())["dtype"] == "bfloat16"
    again = load_pretrained(tmp_path).eval()
    assert again.config == policy.config and next(again.parameters()).dtype == torch.bfloat16
    policy.reset()
    assert torch.equal(policy.select_action(obs), again.select_action(obs))


def test_padded_steps_do_not_count_in_the_loss():
    torch.manual_seed(0)
    cfg = configs()[1]
    policy = make_policy(cfg)
    b = batch(cfg.chunk_size)
    loss_a, _ = policy(b)
    b["action"][0, -2:] += 100.0  # only padded steps change
    loss_b, _ = policy(b)
    assert torch.equal(loss_a, loss_b)


@pytest.mark.parametrize("cfg", configs(), ids=["act", "mlp"])
def test_save_and_load_round_trip(tmp_path, cfg):
    torch.manual_seed(0)
    policy = make_policy(cfg).eval()
    save_pretrained(policy, tmp_path)
    again = load_pretrained(tmp_path).eval()
    assert again.config == policy.config
    obs = {k: v for k, v in batch(cfg.chunk_size).items() if k.startswith("observation.")}
    assert torch.equal(policy.predict_action_chunk(obs), again.predict_action_chunk(obs))
    assert not list(tmp_path.glob("*.bin")) and not list(tmp_path.glob("*.pt"))


def test_load_refuses_a_folder_with_only_dcp_shards(tmp_path):
    policy = make_policy(configs()[1])
    save_pretrained(policy, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model_fsdp_0").mkdir()
    with pytest.raises(ConfigError, match="lr-checkpoint convert"):
        load_pretrained(tmp_path)


def test_act_declares_its_blocks_as_wrap_units():
    policy = make_policy(configs()[0])
    units, source = choose_units(policy, FSDPConfig(), type(policy)._fsdp_wrap_modules)
    assert source == "the policy's _fsdp_wrap_modules"
    assert {type(m).__name__ for _, m in units} == {"ACTEncoderLayer", "ACTDecoderLayer"}
    by_size, _ = choose_units(policy, FSDPConfig(min_num_params=5000), [])
    assert by_size and all(sum(p.numel() for p in m.parameters()) >= 5000 for _, m in by_size)


def test_unknown_wrap_class_lists_the_policy_classes():
    policy = make_policy(configs()[1])
    with pytest.raises(ConfigError) as err:
        choose_units(policy, FSDPConfig(wrap_modules=["Block"]), [])
    assert "--accelerator.fsdp.wrap_modules" in str(err.value) and "MLPBlock" in str(err.value)


def test_tied_parameters_across_units_are_named():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Sequential(nn.Linear(4, 4))
            self.head = nn.Sequential(nn.Linear(4, 4))
            self.head[0].weight = self.embed[0].weight

    model = Tied()
    with pytest.raises(ConfigError) as err:
        check_tied_parameters(model, [("embed", model.embed), ("head", model.head)])
    assert "embed.0.weight" in str(err.value) and "head.0.weight" in str(err.value)
