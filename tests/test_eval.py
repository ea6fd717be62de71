"""`lr-engine eval`: a trained checkpoint (the session's `tiny_run`), a Hub repo id on the
loopback Hub, the expert and random baselines, and the refusals (exit 2, nothing overwritten)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _support.hub import LoopbackHub
from _support.procs import run_cli
from _support.runs import TinyRun, tree_digest

pytestmark = pytest.mark.multiprocess


def _eval(*flags: str, env: dict[str, str] | None = None, cwd: Path | None = None):  # type: ignore[no-untyped-def]
    return run_cli(["lr_engine.cli", "eval", *flags], env=env, cwd=cwd, timeout=300)


def _episodes(folder: Path) -> list[dict[str, object]]:
    return json.loads((folder / "eval_info.json").read_text())["episodes"]


def test_a_checkpoint_is_rolled_out_the_same_whatever_the_batch_and_saved_as_videos(tiny_run: TinyRun, tmp_path: Path) -> None:
    step = tiny_run.checkpoints / "000004"
    a = _eval(f"--policy.path={step}", "--eval.n_episodes=5", "--eval.batch_size=2", "--eval.videos=1",
              "--env.max_episode_steps=12", f"--output_dir={tmp_path / 'a'}")
    assert a.returncode == 0 and "Traceback" not in a.stderr, a.stderr[-3000:]
    info = json.loads((tmp_path / "a" / "eval_info.json").read_text())
    assert info["policy_step"] == 4 and info["seed"] == 1000 and len(info["episodes"]) == 5
    assert [e["seed"] for e in info["episodes"]] == [1000, 1001, 1002, 1003, 1004]
    assert all(0 < e["length"] <= 12 and e["sum_reward"] < 0 for e in info["episodes"])
    agg = info["aggregate"]
    assert agg["n_episodes"] == 5 and agg["success_ci95_low"] <= agg["success_rate"] <= agg["success_ci95_high"]
    assert f"eval {step} (step 4) on reach2d: 5 episodes, success" in a.stdout
    # the saved rollout: one frame per step, plus the last position
    import av

    assert info["videos"] == ["videos/episode_0000.mp4"]
    with av.open(str(tmp_path / "a" / info["videos"][0])) as container:
        frames = sum(1 for _ in container.decode(video=0))
    assert frames == info["episodes"][0]["length"] + 1

    # the same episodes with another batch size, from the run folder (its final model)
    b = _eval(f"--policy.path={tiny_run.path}", "--eval.n_episodes=5", "--eval.batch_size=3", "--env.max_episode_steps=12",
              f"--output_dir={tmp_path / 'b'}")
    assert b.returncode == 0, b.stderr[-3000:]
    for x, y in zip(info["episodes"], _episodes(tmp_path / "b"), strict=True):
        assert (x["seed"], x["success"], x["length"]) == (y["seed"], y["success"], y["length"])
        assert x["sum_reward"] == pytest.approx(y["sum_reward"], abs=1e-4)

    # a second eval into the same folder is refused and changes nothing
    before = tree_digest(tmp_path / "a")
    again = _eval(f"--policy.path={step}", "--eval.n_episodes=2", f"--output_dir={tmp_path / 'a'}")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "--output_dir" in again.stderr and "already holds eval_info.json" in again.stderr
    assert tree_digest(tmp_path / "a") == before


def test_a_hub_repo_id_is_downloaded_and_rolled_out(tiny_run: TinyRun, hub_server: LoopbackHub, tmp_path: Path) -> None:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_server.endpoint, token="hf_test")
    api.create_repo("me/tiny_act")
    api.upload_folder(folder_path=str(tiny_run.path / "pretrained_model"), repo_id="me/tiny_act")
    env = {"HF_ENDPOINT": hub_server.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1"}
    done = _eval("--policy.path=me/tiny_act", "--eval.n_episodes=2", "--env.max_episode_steps=5", f"--output_dir={tmp_path / 'e'}", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "e" / "eval_info.json").read_text())["policy"] == "me/tiny_act"
    missing = _eval("--policy.path=me/nothing_here", f"--output_dir={tmp_path / 'f'}", env=env)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and "--policy.path=me/nothing_here" in missing.stderr
    assert not (tmp_path / "f").exists()


def test_the_baselines_expert_succeeds_and_random_scores_what_random_scores(tmp_path: Path) -> None:
    """The expert reaches every target; random actions reach few, and exactly the same ones
    in every eval with the same seed (its actions come from that seed)."""
    from lr_config import parse_eval_config
    from lr_engine._eval import run_eval

    expert = run_eval(parse_eval_config(["--policy.baseline=expert", "--eval.n_episodes=20", f"--output_dir={tmp_path / 'x'}"])).info
    assert expert.aggregate.success_rate == 1.0 and max(e.length for e in expert.episodes) < 20
    flags = ["--policy.baseline=random", "--eval.n_episodes=20", "--eval.batch_size=20"]
    first = run_eval(parse_eval_config([*flags, f"--output_dir={tmp_path / 'r1'}"])).info
    second = run_eval(parse_eval_config([*flags, f"--output_dir={tmp_path / 'r2'}"])).info
    assert first.episodes == second.episodes
    assert first.aggregate.success_rate <= 0.25 and first.aggregate.avg_sum_reward < expert.aggregate.avg_sum_reward - 20


@pytest.mark.parametrize(("flags", "says"), [
    (["--policy.path=/no/such/folder"], "--policy.path=/no/such/folder: no such folder"),
    (["--policy.path={empty}"], "no config.json in it"),
    (["--eval.n_episodes=5"], "--policy.path: which policy"),
    (["--policy.path=x", "--eval.n_episode=5"], "did you mean '--eval.n_episodes'"),
])
def test_bad_input_exits_2_with_the_flag_to_change(tmp_path: Path, flags: list[str], says: str) -> None:
    (tmp_path / "empty").mkdir()
    done = _eval(*(f.format(empty=tmp_path / "empty") for f in flags), f"--output_dir={tmp_path / 'out'}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert says in done.stderr
    assert not (tmp_path / "out").exists()
