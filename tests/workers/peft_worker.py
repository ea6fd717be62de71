"""Worker for tests/test_peft.py, run under torchrun (or alone): train LoRA with the real
engine pieces, then check on the main rank that

- the base weights, gathered from the trained (possibly sharded) model, are bit-identical
  to the base model file, and every trainable tensor changed;
- the saved adapter (output_dir/pretrained_model), reloaded on the base, gives exactly the
  outputs of the trained model.

Usage: peft_worker.py RESULT_JSON --flags...   (the flags of `lr-engine train`)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from lr_checkpoint import gather_model_state_dict
from lr_config import parse_train_config
from safetensors.torch import load_file

from lr_engine._adapters import load_adapter_policy
from lr_engine._checkpointing import write_final_model
from lr_engine._parallel.dist import finish, init_distributed
from lr_engine._train import banner, build_run, start_files, train_loop


def main() -> None:
    result_path = Path(sys.argv[1])
    cfg = parse_train_config(sys.argv[2:])
    ctx = init_distributed(cfg)
    run = build_run(cfg, ctx)
    initial_trainable = {n: p.detach().clone() for n, p in run.policy.named_parameters() if p.requires_grad}
    initial_trainable = {n: (t.full_tensor() if hasattr(t, "full_tensor") else t) for n, t in initial_trainable.items()}
    start_files(run)
    banner(run)
    train_loop(run)
    write_final_model(run)
    full = gather_model_state_dict(run.model)
    if ctx.is_main:
        result = check(run, full, initial_trainable)
        result_path.write_text(json.dumps(result))
    finish(0)


def check(run, full: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> dict[str, object]:
    base = load_file(str(Path(run.cfg.policy.path) / "model.safetensors"))
    trainable = set(initial)
    base_changed, unmatched, checked = [], [], 0
    for name, tensor in full.items():
        if name in trainable:
            continue
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".").replace(".original_module.", ".")
        if plain not in base:
            unmatched.append(name)
            continue
        checked += 1
        if not torch.equal(tensor, base[plain]):
            base_changed.append(name)
    unchanged_trainable = [n for n in trainable if n in full and torch.equal(full[n], initial[n].cpu())]
    reloaded = load_adapter_policy(run.output_dir / "pretrained_model").eval()
    trained = load_adapter_policy(run.output_dir / "pretrained_model").eval()
    missing, unexpected = trained.load_state_dict(full, strict=False)
    torch.manual_seed(0)
    batch = {k: torch.randn(4, *f.shape) for k, f in run.cfg.policy.input_features.items()}
    same = torch.equal(reloaded.predict_action_chunk(batch), trained.predict_action_chunk(batch))
    return {
        "base_checked": checked,
        "base_total": len(base),
        "unmatched": unmatched,
        "base_changed": base_changed,
        "trainable": sorted(trainable),
        "unchanged_trainable": unchanged_trainable,
        "outputs_equal": same,
        "unexpected": list(unexpected),
    }


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
