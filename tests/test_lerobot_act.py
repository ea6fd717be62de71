"""`act` is LeRobot's ACT: checked against files LeRobot 0.6.1 wrote itself (tests/golden/README.md).

- the parameter names, shapes and dtypes of LeRobot's ACT with its defaults (236 tensors);
- `config.json` and the processor files lr writes are LeRobot's, field for field, and read
  back by a reader that follows LeRobot's rules (an unknown field is an error);
- a checkpoint LeRobot wrote loads in lr and gives LeRobot's actions;
- it fine-tunes as `--policy.path` from its folder (single process, FSDP2-2) and from a Hub
  repo id (DDP-2, the loopback Hub);
- the ImageNet backbone weights come from torch's hub cache, and their absence offline is a
  clear error.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _support.hub import LoopbackHub
from _support.procs import run_cli, run_ranks
from _support.runs import tree_digest

GOLDEN = Path(__file__).parent / "golden"
POINTMASS = GOLDEN / "lerobot_act_pointmass"
DEMO = GOLDEN / "lerobot_act_demo"
LEROBOT_STEPS = {"rename_observations_processor", "to_batch_processor", "device_processor", "normalizer_processor", "unnormalizer_processor"}


def _features(config: dict[str, object]):  # type: ignore[no-untyped-def]
    from lr_config import FeatureSpec

    return {k: FeatureSpec(type=v["type"], shape=list(v["shape"])) for k, v in config.items()}  # type: ignore[union-attr,index]


def test_act_has_lerobots_parameter_names_shapes_and_dtypes() -> None:
    from lr_config import load_policy_config
    from lr_engine._policies.registry import make_policy

    config = load_policy_config(POINTMASS)  # LeRobot's own config.json, read strictly
    policy = make_policy(config)
    mine = {k: (list(v.shape), str(v.dtype)) for k, v in policy.state_dict().items()}
    gold = {k: (v["shape"], {"F32": "torch.float32"}[v["dtype"]]) for k, v in json.loads((POINTMASS / "model_safetensors_keys.json").read_text()).items()}
    assert mine == gold
    assert len(mine) == 236 and sum(v.numel() for v in policy.state_dict().values()) == 51_664_514


def _lerobot_reader(config_json: dict[str, object], allowed: set[str]) -> None:
    """LeRobot's rule for config.json (draccus): every key must be a field of the policy's config."""
    unknown = sorted(set(config_json) - allowed)
    assert not unknown, f"LeRobot's parser refuses unknown fields {unknown}"


def test_config_json_is_lerobots_with_its_defaults(tmp_path: Path) -> None:
    from lr_config import ACTConfig, load_policy_config, save_policy_config

    gold = json.loads((POINTMASS / "config.json").read_text())
    mine_cfg = ACTConfig(input_features=_features(gold["input_features"]), output_features=_features(gold["output_features"]),
                         device="cpu", push_to_hub=False, pretrained_backbone_weights=None)
    save_policy_config(tmp_path, mine_cfg)
    mine = json.loads((tmp_path / "config.json").read_text())
    assert list(mine) == list(gold)  # the same fields, in LeRobot's order
    _lerobot_reader(mine, set(gold))
    # LeRobot leaves `private` and `license` unset (null); lr writes its own defaults there
    differ = {k for k in gold if mine[k] != gold[k]}
    assert differ == {"private", "license"} and mine["private"] is False and mine["license"] == "apache-2.0"
    assert json.loads((tmp_path / "lr_policy.json").read_text()) == {"version": 3, "type": "act", "dtype": "float32"}
    assert load_policy_config(tmp_path) == mine_cfg  # and lr reads its own file back
    assert load_policy_config(POINTMASS) == ACTConfig(**{**mine_cfg.__dict__, "push_to_hub": False})


def test_policy_dtype_lives_in_lr_policy_json_and_a_policy_path_keeps_it(tmp_path: Path) -> None:
    """LeRobot's ACT has no dtype field: lr_policy.json (version 3) carries --policy.dtype;
    version 2 files are float32; a key lr does not write there is refused by name."""
    from lr_config import ACTConfig, ConfigError, load_policy_config, parse_train_config, save_policy_config

    gold = json.loads((POINTMASS / "config.json").read_text())
    cfg = ACTConfig(input_features=_features(gold["input_features"]), output_features=_features(gold["output_features"]), dtype="bfloat16")
    save_policy_config(tmp_path, cfg)
    _lerobot_reader(json.loads((tmp_path / "config.json").read_text()), set(gold))
    assert json.loads((tmp_path / "lr_policy.json").read_text()) == {"version": 3, "type": "act", "dtype": "bfloat16"}
    assert load_policy_config(tmp_path).dtype == "bfloat16"
    assert parse_train_config([f"--policy.path={tmp_path}"]).policy.dtype == "bfloat16"
    assert parse_train_config([f"--policy.path={tmp_path}", "--policy.dtype=float32"]).policy.dtype == "float32"
    (tmp_path / "lr_policy.json").write_text(json.dumps({"version": 2, "type": "act"}))
    assert load_policy_config(tmp_path).dtype == "float32"
    (tmp_path / "lr_policy.json").write_text(json.dumps({"version": 3, "type": "act", "dtype": "bfloat16", "compile": True}))
    with pytest.raises(ConfigError, match=r"lr_policy\.json has unknown keys compile"):
        load_policy_config(tmp_path)


def test_a_field_lerobot_does_not_know_is_refused_by_name(tmp_path: Path) -> None:
    from lr_config import ConfigError, load_policy_config

    data = json.loads((POINTMASS / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**data, "dim_modle": 512}))
    with pytest.raises(ConfigError, match=r"dim_modle.*did you mean.*dim_model"):
        load_policy_config(tmp_path)


def test_processor_files_are_lerobots(tmp_path: Path) -> None:
    from lr_engine._processors import load_processors, make_processors, save_processors

    gold_config = json.loads((POINTMASS / "config.json").read_text())
    flat = load_file(str(POINTMASS / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    stats: dict[str, dict[str, object]] = {}
    for key, tensor in flat.items():
        feature, _, stat = key.rpartition(".")
        stats.setdefault(feature, {})[stat] = tensor.tolist()
    norm = {k: v.lower() for k, v in gold_config["normalization_mapping"].items()}
    pre, post = make_processors(_features(gold_config["input_features"]), _features(gold_config["output_features"]), norm, stats)
    save_processors(tmp_path, pre, post)
    for name in ("policy_preprocessor", "policy_postprocessor"):
        mine, gold = (json.loads((folder / f"{name}.json").read_text()) for folder in (tmp_path, POINTMASS))
        assert mine.pop("version") == 2  # lr's version: a key LeRobot's reader does not look at
        assert mine == gold
        assert {step["registry_name"] for step in mine["steps"]} <= LEROBOT_STEPS
        for step in mine["steps"]:
            if "state_file" in step:
                saved = load_file(str(tmp_path / step["state_file"]))
                theirs = load_file(str(POINTMASS / step["state_file"]))
                for key, tensor in saved.items():  # lr keeps the statistics of what it normalizes, as LeRobot saved them
                    assert torch.equal(tensor, theirs[key]), key
    # LeRobot's own files read back into the same processors
    again_pre, again_post = load_processors(POINTMASS)
    assert again_pre.norm_map == pre.norm_map and set(again_pre.stats) == set(pre.stats)
    assert again_post.inverse and set(again_post.stats) == {"action"}


def test_a_checkpoint_lerobot_wrote_gives_lerobots_actions() -> None:
    from lr_engine._policies.registry import load_pretrained
    from lr_engine._processors import load_processors

    expected = load_file(str(DEMO / "expected_actions.safetensors"))
    policy = load_pretrained(DEMO / "pretrained_model")
    pre, post = load_processors(DEMO / "pretrained_model")
    policy.eval()
    obs = {k: v for k, v in expected.items() if k.startswith("observation.")}
    with torch.no_grad():
        chunk = post({"action": policy.predict_action_chunk(pre(obs))})["action"]
    torch.testing.assert_close(chunk, expected["action_chunk"], atol=1e-5, rtol=1e-5)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from lr_config.layout import MODEL_WEIGHTS

    return load_file(str(folder / MODEL_WEIGHTS))


FINE_TUNE = ["--steps=2", "--save_freq=2", "--batch_size=4", "--log_freq=1"]
STILL = ["--optimizer.type=sgd", "--optimizer.betas=[0,0.999]", "--optimizer.weight_decay=0", "--optimizer.grad_clip_norm=0",
         "--optimizer.lr=1e-30"]
"""Plain SGD at a learning rate no float32 weight notices: what a run saves is what it loaded."""


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for key in a:  # a zero stays within 1e-20 of zero; any other value is unchanged
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-20, msg=key)


@pytest.mark.multiprocess
def test_a_lerobot_checkpoint_fine_tunes_from_its_folder_single_and_fsdp2(tmp_path: Path, demo_dataset: Path) -> None:
    base = DEMO / "pretrained_model"
    # single process: trains, and the result is again a LeRobot folder naming its base
    single = tmp_path / "single"
    proc = run_cli(["lr_engine.cli", "train", f"--policy.path={base}", f"--dataset.root={demo_dataset}", f"--output_dir={single}", *FINE_TUNE])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = single / "pretrained_model"
    assert json.loads((out / "config.json").read_text())["pretrained_path"] == str(base)
    trained, start = _weights(out), _weights(base)
    assert set(trained) == set(start) and any(not torch.equal(trained[k], start[k]) for k in start)
    # FSDP2 over 2 ranks, weights held still: they go through sharding and the gather back unchanged
    fsdp = tmp_path / "fsdp"
    proc = run_ranks(2, ["train", f"--policy.path={base}", f"--dataset.root={demo_dataset}", f"--output_dir={fsdp}", *FINE_TUNE,
                         "--parallelism.dp_shard=2", *STILL])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FSDP2" in proc.stdout
    _same(_weights(fsdp / "pretrained_model"), start)


@pytest.mark.multiprocess
def test_a_lerobot_checkpoint_on_the_hub_fine_tunes_under_ddp(tmp_path: Path, demo_dataset: Path, hub_server: LoopbackHub) -> None:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_server.endpoint, token="hf_test")
    api.create_repo("someone/act_demo")
    api.upload_folder(repo_id="someone/act_demo", folder_path=str(DEMO / "pretrained_model"))
    env = {"HF_ENDPOINT": hub_server.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1"}
    out = tmp_path / "ddp"
    proc = run_ranks(2, ["train", "--policy.path=someone/act_demo", f"--dataset.root={demo_dataset}", f"--output_dir={out}",
                         *FINE_TUNE, "--parallelism.dp_replicate=2"], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--policy.path=someone/act_demo: the Hub model is in " in proc.stdout and "DDP" in proc.stdout
    saved = json.loads((out / "train_config.json").read_text())["policy"]["path"]
    assert Path(saved).is_dir() and (Path(saved) / "config.json").is_file()  # the downloaded snapshot it started from
    # the guide's PEFT base, `--policy.path=<user>/my_base_policy`: LoRA adapters onto the Hub model
    lora = tmp_path / "lora"
    proc = run_cli(["lr_engine.cli", "train", "--policy.path=someone/act_demo", f"--dataset.root={demo_dataset}", f"--output_dir={lora}",
                    *FINE_TUNE, "--peft.method_type=LORA", "--peft.r=4"], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    adapters = lora / "pretrained_model"
    recorded = json.loads((adapters / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(recorded) == Path(saved) and (adapters / "adapter_model.safetensors").is_file()
    assert not (adapters / "model.safetensors").exists()
    assert all(".lora_" in name for name in load_file(adapters / "adapter_model.safetensors"))
    # a revision that does not exist is refused by name, before anything is written
    bad = tmp_path / "bad"
    proc = run_cli(["lr_engine.cli", "train", "--policy.path=someone/act_demo", "--policy.pretrained_revision=nope",
                    f"--dataset.root={demo_dataset}", f"--output_dir={bad}", *FINE_TUNE], env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--policy.path=someone/act_demo: RevisionNotFoundError" in proc.stderr
    assert not bad.exists()


def test_the_backbone_names_every_weights_file_lr_config_knows() -> None:
    from lr_config import BACKBONE_WEIGHTS
    from lr_engine._policies.backbone_weights import WEIGHT_FILES

    assert set(WEIGHT_FILES) == {name for names in BACKBONE_WEIGHTS.values() for name in names}


@pytest.mark.multiprocess
def test_imagenet_backbone_weights_come_from_torchs_cache_or_a_clear_error(tmp_path: Path, image_dataset: Path) -> None:
    from lr_engine._policies.act import ResNetTrunk

    flags = ["--policy.type=act", "--policy.dim_model=32", "--policy.n_heads=2", "--policy.dim_feedforward=64", "--policy.chunk_size=5",
             "--policy.n_action_steps=5", "--policy.n_encoder_layers=1", "--policy.n_vae_encoder_layers=1", "--steps=1",
             "--save_freq=1", "--batch_size=2", f"--dataset.root={image_dataset}"]
    # offline and not cached: exit 2, where the file goes and how to do without it; nothing written
    torch_home = tmp_path / "torch"
    env = {"TORCH_HOME": str(torch_home), "HF_HUB_OFFLINE": "1"}
    missing = tmp_path / "missing"
    proc = run_cli(["lr_engine.cli", "train", *flags, f"--output_dir={missing}"], env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    cached = torch_home / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    assert f"--policy.pretrained_backbone_weights=ResNet18_Weights.IMAGENET1K_V1: {cached} is not there" in proc.stderr
    assert "--policy.pretrained_backbone_weights=null" in proc.stderr and not missing.exists()
    # cached (here: a stand-in with torchvision's names, classifier included): the backbone starts from it
    torch.manual_seed(5)  # another init than the run's (seed 1000), and frozen batch norms that are not the identity
    stand_in = dict(ResNetTrunk("resnet18", False).state_dict())
    for key, value in stand_in.items():
        if key.endswith(("running_mean", "bias")):
            stand_in[key] = torch.randn_like(value) * 0.1
        elif key.endswith(("running_var", "bn1.weight", "bn2.weight")) or key.endswith("downsample.1.weight"):
            stand_in[key] = torch.rand_like(value) + 0.5
    stand_in.update({"fc.weight": torch.zeros(1000, 512), "fc.bias": torch.zeros(1000), "bn1.num_batches_tracked": torch.tensor(0)})
    cached.parent.mkdir(parents=True)
    torch.save(stand_in, cached)
    out = tmp_path / "run"
    proc = run_cli(["lr_engine.cli", "train", *flags, *STILL, f"--output_dir={out}"], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = _weights(out / "pretrained_model")
    backbone = {k[len("model.backbone."):]: v for k, v in saved.items() if k.startswith("model.backbone.")}
    _same(backbone, {k: v for k, v in stand_in.items() if not k.startswith("fc.") and not k.endswith("num_batches_tracked")})
    digest = tree_digest(out)
    # a resume reads its checkpoint, not the cache: the file may be gone
    cached.unlink()
    proc = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={out / 'checkpoints' / 'last'}", "--steps=2"], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert tree_digest(out) != digest
    assert os.readlink(out / "checkpoints" / "last") == "000002"
    shutil.rmtree(torch_home)
