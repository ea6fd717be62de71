"""Does training learn? Success rates in the demo task: the zero-flag demo run against the
scripted expert and random actions.

    uv run python tools/bench/eval_success.py [--episodes=100] [--smoke]

Trains `lr-engine train` with no flags (the demo run the README starts with: ACT at the demo
preset; `--smoke`: 4 steps of a tiny ACT, its last checkpoint only), with `--steps=100` (the
row the test of the demo's success rate reads) and with `--policy.type=act` (LeRobot's ACT
defaults: chunk 100, dim 512, 4+1 layers, CVAE; `LEROBOT_STEPS` steps, batch 8), then rolls out
each of their checkpoints, the
scripted expert and uniformly random actions on the same episodes (seeds 1000 to
1000 + episodes - 1, the eval's default), through `lr-engine eval`'s own code (`run_eval`
with the flags parsed as the command parses them), in this process.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from lr_config.layout import CHECKPOINTS, TRAIN_CONFIG, list_step_dirs  # noqa: E402

SHORT_STEPS = 100
LEROBOT_STEPS = 300
LEROBOT_ROW = "ACT with LeRobot's defaults (--policy.type=act)"
SHORT_ROW = "demo run with --steps=100"
"""A shorter zero-flag run (its schedule ends at step 100): the row tests/test_train_eval.py reads."""
SMOKE_TRAIN = ["--steps=4", "--save_freq=2", "--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2", "--batch_size=4"]


def _eval(flags: list[str], out: Path, episodes: int) -> dict[str, object]:
    from lr_config import parse_eval_config, to_dict
    from lr_engine._eval import run_eval

    return to_dict(run_eval(parse_eval_config([*flags, f"--eval.n_episodes={episodes}", f"--output_dir={out}"])).info)


def _row(name: str, info: dict[str, object]) -> list[str]:
    agg = info["aggregate"]
    assert isinstance(agg, dict)
    return [name, f"{100 * agg['success_rate']:.1f}%", f"{100 * agg['success_ci95_low']:.1f}-{100 * agg['success_ci95_high']:.1f}%",
            f"{agg['avg_sum_reward']:.2f}", f"{agg['avg_length']:.1f}"]


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--episodes", type=int, default=None, help="episodes per eval (default 100; 4 with --smoke)")

    args = C.parse_args(__doc__.splitlines()[0], extra)
    episodes = args.episodes or (4 if args.smoke else 100)
    ctx = C.Context.now()
    with tempfile.TemporaryDirectory(prefix="lr-bench-eval-") as tmp:
        run = Path(tmp) / "run"
        env = C.bench_env({"LR_CACHE_DIR": str(Path(tmp) / "cache")}) if args.smoke else C.bench_env()
        C.run_checked([sys.executable, "-m", "lr_engine.cli", "train", f"--output_dir={run}", *(SMOKE_TRAIN if args.smoke else [])],
                      timeout=3600, env=env)
        config = json.loads((run / TRAIN_CONFIG).read_text())
        rows = []
        steps = [p.name for p in list_step_dirs(run / CHECKPOINTS)]
        for step in steps[-1:] if args.smoke else steps:
            info = _eval([f"--policy.path={run / CHECKPOINTS / step}"], Path(tmp) / f"eval_{step}", episodes)
            rows.append(_row(f"demo run, step {int(step)}", info))
        if not args.smoke:  # what tests/test_train_eval.py trains and checks against this table
            short = Path(tmp) / "short"
            C.run_checked([sys.executable, "-m", "lr_engine.cli", "train", f"--output_dir={short}", f"--steps={SHORT_STEPS}"],
                          timeout=3600, env=env)
            info = _eval([f"--policy.path={short / CHECKPOINTS / f'{SHORT_STEPS:06d}'}"], Path(tmp) / "eval_short", episodes)
            rows.append(_row(f"{SHORT_ROW}, step {SHORT_STEPS}", info))
            lerobot = Path(tmp) / "lerobot_defaults"
            C.run_checked([sys.executable, "-m", "lr_engine.cli", "train", f"--output_dir={lerobot}", "--policy.type=act",
                           f"--steps={LEROBOT_STEPS}", "--batch_size=8", f"--save_freq={LEROBOT_STEPS}"], timeout=7200, env=env)
            info = _eval([f"--policy.path={lerobot / CHECKPOINTS / f'{LEROBOT_STEPS:06d}'}"], Path(tmp) / "eval_lerobot", episodes)
            rows.append(_row(f"{LEROBOT_ROW}, batch 8, step {LEROBOT_STEPS}", info))
        expert = _eval(["--policy.baseline=expert"], Path(tmp) / "expert", episodes)
        random = _eval(["--policy.baseline=random"], Path(tmp) / "random", episodes)
    last_rate = float(rows[len(steps) - 1 if not args.smoke else 0][1].rstrip("%"))
    random_rate = 100 * float(random["aggregate"]["success_rate"])  # type: ignore[index]
    body = [
        f"The zero-flag demo run (`lr-engine train`: {config['policy']['type']}, {config['steps']} steps, batch "
        f"{config['batch_size']}, the demo dataset) evaluated at each checkpoint with `lr-engine eval`, and the same run "
        f"with `--steps={SHORT_STEPS}` (its schedule ends there) at its last checkpoint, `--policy.type=act` (LeRobot's ACT "
        f"defaults, {LEROBOT_STEPS} steps of batch 8, the rest of the flags as the demo run) at its last checkpoint, "
        f"{episodes} episodes each (seeds 1000-{999 + episodes}, the same for every row), reach2d: success = the agent "
        f"within {expert['env']['success_radius']} of its target within {expert['env']['max_episode_steps']} steps; "  # type: ignore[index]
        "reward = minus the distance to the target, summed over the episode's steps. The interval is the 95% Wilson "
        "interval of the success rate.",
        "",
        C.table(["policy", "success", "95% interval", "avg sum reward", "avg length"],
                [*rows, _row("scripted expert", expert), _row("random actions", random)]),
        "",
        f"Target: the demo run clearly beats random (its success rate above random's interval): "
        f"{C.verdict(last_rate > 100 * float(random['aggregate']['success_ci95_high']))} "  # type: ignore[index]
        f"({last_rate:.1f}% against random's {random_rate:.1f}%).",
    ]
    flags = [] if args.smoke else [f"--episodes={episodes}"]
    C.write_section(args.out, "eval_success", "10. Eval: success rate of the demo run against the expert and random actions",
                    C.command_line("eval_success.py", args, flags), ctx, "\n".join(body), args.smoke)


if __name__ == "__main__":
    main()
