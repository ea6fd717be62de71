"""Worker for tests/test_shards.py, under torchrun: build a run with the engine's own pieces
and report, from every rank, the local and global size of each parameter after wrapping;
then every rank calls `lr_engine.save_pretrained` on the sharded policy (`RESULT_DIR/saved`).

Usage: shard_worker.py RESULT_DIR --flags...   (the flags of `lr-engine train`)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lr_config import parse_train_config
from torch.distributed.tensor import DTensor

from lr_engine import save_pretrained
from lr_engine._parallel.dist import finish, init_distributed
from lr_engine._train import build_run


def main() -> None:
    out = Path(sys.argv[1])
    cfg = parse_train_config(sys.argv[2:])
    ctx = init_distributed(cfg)
    run = build_run(cfg, ctx)
    report = {
        name: {
            "local": (p.to_local().numel() if isinstance(p, DTensor) else p.numel()),
            "global": p.numel(),
            "dtensor": isinstance(p, DTensor),
            "rows": list(p.shape)[0] if p.dim() else 1,
        }
        for name, p in run.model.named_parameters()
    }
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(report))
    save_pretrained(run.model, out / "saved")  # collective: every rank, the main rank writes
    finish(0)


if __name__ == "__main__":
    main()
