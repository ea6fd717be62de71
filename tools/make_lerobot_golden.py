"""Writes `tests/golden/lerobot_act_demo/` with LeRobot 0.6.1 itself (not part of CI).

    uv run python tools/make_lerobot_golden.py

LeRobot builds a small ACT for lr's demo features (`observation.state` 2,
`observation.environment_state` 2, `action` 2; dim_model 32, 2 heads, feed-forward 64,
chunk 10, seed 0), makes its processors from the demo dataset's `meta/stats.json`, and saves
them with `save_pretrained` into `pretrained_model/`: a checkpoint exactly as LeRobot writes
it. It also computes the action chunks (un-normalized) of 4 fixed raw observations and saves
observations and chunks in `expected_actions.safetensors`. The tests load that folder as
`--policy.path` (single, DDP-2, FSDP2-2, from the test Hub server too) and check that lr
returns the same actions, without LeRobot installed.

Runs in LeRobot's own environment (built once under the bench cache, as
tools/bench/data_loading.py builds it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "tests" / "golden" / "lerobot_act_demo"
sys.path.insert(0, str(HERE / "bench"))

SIDE = r'''
import json, sys
from pathlib import Path
import numpy as np, torch
from safetensors.torch import save_file
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors

out, stats_file, folder_name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
raw = json.loads(Path(stats_file).read_text())
stats = {k: {s: np.asarray(v, dtype=np.float32) for s, v in d.items()} for k, d in raw.items()}
torch.manual_seed(0)
f = lambda t, n: PolicyFeature(type=t, shape=(n,))
config = ACTConfig(
    input_features={"observation.state": f(FeatureType.STATE, 2), "observation.environment_state": f(FeatureType.ENV, 2)},
    output_features={"action": f(FeatureType.ACTION, 2)}, device="cpu", pretrained_backbone_weights=None,
    dim_model=32, n_heads=2, dim_feedforward=64, chunk_size=10, n_action_steps=10, n_encoder_layers=2, n_vae_encoder_layers=2,
)
policy = ACTPolicy(config)
pre, post = make_pre_post_processors(config, dataset_stats=stats)
folder = out / folder_name
policy.save_pretrained(folder)
pre.save_pretrained(folder)
post.save_pretrained(folder)
g = torch.Generator().manual_seed(3)
obs = {"observation.state": torch.rand(4, 2, generator=g) * 2 - 1, "observation.environment_state": torch.rand(4, 2, generator=g) * 2 - 1}
policy.eval()
with torch.no_grad():
    actions = post(policy.predict_action_chunk(pre(dict(obs))))
save_file({**obs, "action_chunk": actions.contiguous()}, str(out / "expected_actions.safetensors"))
print(f"LeRobot wrote {folder}: {sum(p.numel() for p in policy.parameters()):,} parameters; chunks {tuple(actions.shape)}")
'''


def main() -> int:
    from data_loading import lerobot_python
    from lr_config.layout import PRETRAINED

    python = lerobot_python()
    demo_stats = Path.home() / ".cache" / "lr" / "datasets" / "lr" / "demo_reach2d" / "meta" / "stats.json"
    if not demo_stats.exists():
        from lr_config import DEMO_REPO_ID
        from lr_engine._data.demo import ensure_demo_dataset

        demo_stats = ensure_demo_dataset(DEMO_REPO_ID) / "meta" / "stats.json"
    OUT.mkdir(parents=True, exist_ok=True)
    script = OUT.parent / ".make_lerobot_golden_side.py"
    script.write_text(SIDE)
    try:
        subprocess.run([str(python), str(script), str(OUT), str(demo_stats), PRETRAINED], check=True, cwd=OUT.parent)
    finally:
        script.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
