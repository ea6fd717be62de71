"""lr's ACT against LeRobot 0.6.1's, both ways, in LeRobot's own environment.

    uv run python tools/lerobot_compat.py

Not part of CI: LeRobot needs Python >= 3.12 and torch < 2.12, so it runs in a venv of its own
under the bench cache (`~/.cache/lr-bench/lerobot-0.6.1`, built once with uv as
tools/bench/data_loading.py builds it; this project's uv.lock is not involved).

1. lr -> LeRobot: lr builds ACT (randomly initialised, the frozen batch norms' statistics
   randomised too), writes `pretrained_model/` with its own writers (config.json,
   lr_policy.json, model.safetensors, the processor files), and computes action chunks for a
   few raw observations through its pre-processor, policy and post-processor. LeRobot then
   loads that folder with `ACTPolicy.from_pretrained` and `make_pre_post_processors` and
   computes the chunks for the same observations.
2. LeRobot -> lr: LeRobot builds its ACT and processors (from dataset statistics), saves them
   with `save_pretrained`, and computes chunks; lr loads the folder as `--policy.path` does
   (`load_pretrained`, `load_processors`) and computes them.

Each way runs for two configurations: LeRobot's defaults (ResNet-18, backbone from scratch)
and a small pre-norm one with GELU, no VAE and a ResNet-34. A third, lr -> LeRobot only, is
LeRobot's defaults with `--policy.dtype=bfloat16`: LeRobot loads the bfloat16 weights into its
float32 ACT; its actions are compared with lr's for the same weights read in float32 (gated),
and with lr's bfloat16 forward (printed, not gated: bfloat16 keeps 8 bits of mantissa).
3. A checkpoint `lerobot-train` itself trained (LeRobot's defaults, backbone from scratch, 2 steps
   of batch 4 on LeRobot's own video dataset, packages/lr-engine/tests/data/lerobot_reference/):
   LeRobot and lr load its `pretrained_model/` and compute chunks for the same observations. Observations are 2 cameras of
48x64 pixels, a 4-value state and a 2-value environment state. It prints the largest
difference per case and exits 1 when one exceeds 1e-4 (float32 on CPU; the two torches
differ).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "bench"))

TOLERANCE = 1e-4
FEATURES = {
    "observation.state": {"type": "STATE", "shape": [4]},
    "observation.environment_state": {"type": "ENV", "shape": [2]},
    "observation.images.top": {"type": "VISUAL", "shape": [3, 48, 64]},
    "observation.images.wrist": {"type": "VISUAL", "shape": [3, 48, 64]},
}
ACTION = {"action": {"type": "ACTION", "shape": [2]}}
CASES = {
    "lerobot-defaults": {"pretrained_backbone_weights": None},
    "small-prenorm-gelu-novae-resnet34": {
        "pretrained_backbone_weights": None, "vision_backbone": "resnet34", "pre_norm": True, "feedforward_activation": "gelu",
        "use_vae": False, "dim_model": 64, "n_heads": 4, "dim_feedforward": 128, "n_encoder_layers": 2, "chunk_size": 20,
        "n_action_steps": 20,
    },
    "lerobot-defaults-bfloat16-weights": {"pretrained_backbone_weights": None, "dtype": "bfloat16"},
}
LR_ONLY = {"dtype"}
"""lr's settings LeRobot's ACTConfig has no field for: a case with one runs lr -> LeRobot only."""


def observations(seed: int, n: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "observation.state": rng.normal(0.3, 2.0, (n, 4)).astype(np.float32),
        "observation.environment_state": rng.normal(-0.5, 1.5, (n, 2)).astype(np.float32),
        "observation.images.top": rng.random((n, 3, 48, 64), dtype=np.float32),
        "observation.images.wrist": rng.random((n, 3, 48, 64), dtype=np.float32),
    }


def stats(seed: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, feat in {**FEATURES, **ACTION}.items():
        shape = [feat["shape"][0], 1, 1] if feat["type"] == "VISUAL" else feat["shape"]
        mean = rng.normal(0, 1, shape).astype(np.float32)
        std = rng.uniform(0.2, 2.0, shape).astype(np.float32)
        out[key] = {"mean": mean, "std": std, "min": mean - 3 * std, "max": mean + 3 * std}
    return out


LEROBOT_SIDE = r'''
import json, sys
from pathlib import Path
import numpy as np, torch
from safetensors.torch import load_file, save_file
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors

mode, folder, obs_file, out_file, case = sys.argv[1:6]
case = json.loads(case)
obs = {k: torch.from_numpy(v) for k, v in np.load(obs_file).items() if k.startswith("observation.")}
torch.manual_seed(0)
if mode == "load":
    policy = ACTPolicy.from_pretrained(folder)
    pre, post = make_pre_post_processors(policy.config, pretrained_path=folder)
else:
    feats = json.loads(case.pop("_features"))
    conv = lambda d: {k: PolicyFeature(type=FeatureType[v["type"]], shape=tuple(v["shape"])) for k, v in d.items()}
    config = ACTConfig(input_features=conv(feats["inputs"]), output_features=conv(feats["outputs"]), device="cpu", **case)
    policy = ACTPolicy(config)
    with torch.no_grad():  # non-trivial frozen batch norms
        g = torch.Generator().manual_seed(1)
        for name, buf in policy.named_buffers():
            if name.endswith(("running_mean", "bias")):
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.1)
            elif name.endswith(("running_var", "weight")) and "backbone" in name:
                buf.copy_(torch.rand(buf.shape, generator=g) + 0.5)
    raw = np.load(obs_file)
    ds_stats = {k.split("|")[0]: {} for k in raw.files if "|" in k}
    for k in raw.files:
        if "|" in k:
            key, stat = k.split("|")
            ds_stats[key][stat] = raw[k]
    pre, post = make_pre_post_processors(config, dataset_stats=ds_stats)
    policy.save_pretrained(folder)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
policy.eval()
with torch.no_grad():
    batch = pre(dict(obs))
    chunk = policy.predict_action_chunk(batch)
    actions = post(chunk)
np.save(out_file, actions.numpy())
print(f"lerobot {mode}: {type(policy).__name__} {sum(p.numel() for p in policy.parameters()):,} parameters, chunk {tuple(actions.shape)}")
'''


def lr_build(folder: Path, case: dict[str, object], obs: dict[str, np.ndarray], st: dict[str, dict[str, np.ndarray]]) -> np.ndarray:
    import torch
    from lr_checkpoint import write_tensor_dict
    from lr_config import ACTConfig, FeatureSpec, save_policy_config
    from lr_config.layout import MODEL_WEIGHTS
    from lr_engine._policies.registry import make_policy
    from lr_engine._processors import make_processors, save_processors

    spec = lambda d: {k: FeatureSpec(type=v["type"], shape=list(v["shape"])) for k, v in d.items()}  # noqa: E731
    config = ACTConfig(input_features=spec(FEATURES), output_features=spec(ACTION), device="cpu", **case)  # type: ignore[arg-type]
    torch.manual_seed(0)
    policy = make_policy(config)
    with torch.no_grad():
        g = torch.Generator().manual_seed(2)
        for name, buf in policy.named_buffers():
            if "backbone" in name and name.endswith(("running_mean", "bias")):
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.1)
            elif "backbone" in name and name.endswith(("running_var", "weight")):
                buf.copy_(torch.rand(buf.shape, generator=g) + 0.5)
    raw = {k: {s: v.tolist() for s, v in d.items()} for k, d in st.items()}
    pre, post = make_processors(config.input_features or {}, config.output_features or {}, config.normalization_mapping, raw)
    folder.mkdir(parents=True, exist_ok=True)
    save_policy_config(folder, config)
    write_tensor_dict(folder / MODEL_WEIGHTS, {k: v.contiguous() for k, v in policy.state_dict().items()})
    save_processors(folder, pre, post)
    return lr_actions(folder, obs)


def lr_actions(folder: Path, obs: dict[str, np.ndarray], as_float32: bool = False) -> np.ndarray:
    import shutil

    import torch
    from lr_config.layout import LR_POLICY
    from lr_engine._policies.registry import load_pretrained
    from lr_engine._processors import load_processors

    if as_float32:  # the same weights, read by a float32 policy (its lr_policy.json says so)
        copy = folder.with_name(folder.name + "-float32")
        shutil.copytree(folder, copy, dirs_exist_ok=True)
        mark = json.loads((copy / LR_POLICY).read_text())
        (copy / LR_POLICY).write_text(json.dumps({**mark, "dtype": "float32"}))
        folder = copy
    policy = load_pretrained(folder)
    pre, post = load_processors(folder)
    policy.eval()
    with torch.no_grad():
        batch = pre({k: torch.from_numpy(v) for k, v in obs.items()})
        chunk = policy.predict_action_chunk(batch)
        out = post({"action": chunk.float()})["action"]
    return out.numpy()


POINTMASS = HERE.parent / "packages" / "lr-engine" / "tests" / "data" / "lerobot_reference" / "dataset_pointmass_video"


def lerobot_trained(python: Path, script: Path, tmp: Path) -> float | None:
    """lerobot-train, LeRobot's defaults (backbone from scratch), 2 steps of batch 4 on its own
    video dataset; its saved pretrained_model, loaded by LeRobot and by lr, on the same observations."""
    import os

    from lr_config.layout import PRETRAINED

    out = tmp / "lerobot-train"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(tmp / "lerobot_home"), "OMP_NUM_THREADS": "1"}
    for key in ("VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(key, None)
    run = subprocess.run([str(python), "-m", "lerobot.scripts.lerobot_train", "--dataset.repo_id=local/pointmass",
                          f"--dataset.root={POINTMASS}", "--dataset.video_backend=pyav", "--policy.type=act",
                          "--policy.pretrained_backbone_weights=null", "--policy.device=cpu", "--policy.push_to_hub=false",
                          "--batch_size=4", "--steps=2", "--save_freq=2", "--log_freq=1", "--wandb.enable=false", "--num_workers=0",
                          f"--output_dir={out}"], capture_output=True, text=True, cwd=tmp, env=env, check=False)
    folders = sorted(out.glob(f"checkpoints/*/{PRETRAINED}"))
    if run.returncode != 0 or not folders:
        print(run.stdout[-2000:] + run.stderr[-4000:])
        print("FAIL lerobot-train: no checkpoint")
        return None
    folder = folders[-1]
    rng = np.random.default_rng(9)
    obs = {"observation.state": rng.normal(0, 1, (3, 4)).astype(np.float32),
           "observation.environment_state": rng.normal(0, 1, (3, 2)).astype(np.float32),
           "observation.images.top": rng.random((3, 3, 48, 64), dtype=np.float32)}
    obs_file = tmp / "obs_pointmass.npz"
    np.savez(obs_file, **obs)
    theirs = lerobot_side(python, script, "load", folder, obs_file, tmp / "c.npy", "{}", "lerobot-train: LeRobot could not load its own checkpoint")
    if theirs is None:
        return None
    mine = lr_actions(folder, obs)
    diff = float(np.abs(mine - theirs).max())
    print(f"lerobot-train -> lr  step {folder.parent.resolve().name}: actions {mine.shape}, max |difference| {diff:.2e}")
    return diff


def lerobot_side(python: Path, script: Path, mode: str, folder: Path, obs_file: Path, out: Path, payload: str,
                 failure: str) -> np.ndarray | None:
    """Run LeRobot's half (`mode` load or make) on `folder`; its action chunks, or None after
    printing its output and `failure`."""
    run = subprocess.run([str(python), str(script), mode, str(folder), str(obs_file), str(out), payload],
                         capture_output=True, text=True, cwd=out.parent, check=False)
    if run.returncode != 0:
        print(run.stdout + run.stderr[-4000:])
        print(f"FAIL {failure}")
        return None
    print(run.stdout.strip())
    return np.load(out)


def main() -> int:
    from data_loading import lerobot_python

    python = lerobot_python()
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="lr-lerobot-compat-") as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "lerobot_side.py"
        script.write_text(LEROBOT_SIDE)
        obs, st = observations(7), stats(8)
        obs_file = tmp / "obs.npz"
        np.savez(obs_file, **obs, **{f"{k}|{s}": v for k, d in st.items() for s, v in d.items()})
        for name, case in CASES.items():
            # lr writes, LeRobot reads
            folder = tmp / f"lr-{name}"
            mine = lr_build(folder, case, obs, st)
            theirs = lerobot_side(python, script, "load", folder, obs_file, tmp / "a.npy", "{}", f"{name}: LeRobot could not load lr's folder")
            if theirs is None:
                return 1
            if LR_ONLY & set(case):
                same_weights = lr_actions(folder, obs, as_float32=True)
                diff = float(np.abs(same_weights - theirs).max())
                print(f"lr -> LeRobot  {name}: actions {mine.shape}, max |difference| {diff:.2e} against lr reading the same "
                      f"weights in float32; {float(np.abs(mine - theirs).max()):.2e} against lr's bfloat16 forward (not gated)")
                worst = max(worst, diff)
                continue
            diff = float(np.abs(mine - theirs).max())
            print(f"lr -> LeRobot  {name}: actions {mine.shape}, max |difference| {diff:.2e}")
            worst = max(worst, diff)
            # LeRobot writes, lr reads
            folder = tmp / f"lerobot-{name}"
            payload = json.dumps({**case, "_features": json.dumps({"inputs": FEATURES, "outputs": ACTION})})
            theirs = lerobot_side(python, script, "make", folder, obs_file, tmp / "b.npy", payload, f"{name}: LeRobot could not build its ACT")
            if theirs is None:
                return 1
            mine = lr_actions(folder, obs)
            diff = float(np.abs(mine - theirs).max())
            print(f"LeRobot -> lr  {name}: actions {mine.shape}, max |difference| {diff:.2e}")
            worst = max(worst, diff)
        # a checkpoint lerobot-train itself trained (2 steps on LeRobot's own video dataset), read by lr
        diff = lerobot_trained(python, script, tmp)
        if diff is None:
            return 1
        worst = max(worst, diff)
    ok = worst <= TOLERANCE
    print(f"{'PASS' if ok else 'FAIL'}: largest difference {worst:.2e} (tolerance {TOLERANCE:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
