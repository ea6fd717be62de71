"""`lr-engine eval`'s flags and its `eval_info.json` contract (no torch)."""

import json

import pytest

from lr_config import (
    EVAL_INFO_VERSION,
    ConfigError,
    EpisodeResult,
    EvalAggregate,
    EvalInfo,
    format_eval_help,
    load_eval_info,
    parse_eval_config,
    save_eval_info,
    to_dict,
    wilson_interval,
)


def test_flags_as_lerobot_eval_spells_them():
    cfg = parse_eval_config(["--policy.path=outputs/train/x", "--eval.n_episodes=7", "--eval.batch_size=3", "--policy.device=cpu",
                             "--seed=5", "--output_dir=out"])
    assert (cfg.policy.path, cfg.eval.n_episodes, cfg.eval.batch_size, cfg.policy.device, cfg.seed) == ("outputs/train/x", 7, 3, "cpu", 5)
    assert str(cfg.output_dir) == "out"


@pytest.mark.parametrize(("argv", "says"), [
    ([], "--policy.path: which policy"),
    (["--policy.path=a", "--policy.baseline=random"], "not both"),
    (["--policy.path=a", "--eval.n_episode=3"], "did you mean '--eval.n_episodes'"),
    (["--policy.path=a", "--eval.batch_size=0"], "--eval.batch_size=0: must be at least 1"),
    (["--policy.path=a", "--env.success_radius=0"], "--env.success_radius=0"),
    (["--policy.baseline=best"], "--policy.baseline: expected one of 'expert', 'random'"),
])
def test_a_bad_flag_names_what_to_change(argv, says):
    with pytest.raises(ConfigError, match=None) as err:
        parse_eval_config(argv)
    assert says in str(err.value)


def test_help_lists_every_flag():
    text = format_eval_help()
    for flag in ("--policy.path", "--policy.pretrained_revision", "--policy.baseline", "--eval.n_episodes", "--eval.batch_size",
                 "--eval.videos", "--env.max_episode_steps", "--seed", "--output_dir"):
        assert flag in text


def test_eval_info_round_trips_holds_every_field_and_refuses_unknown_keys(tmp_path):
    info = EvalInfo(policy="p", episodes=[EpisodeResult(index=0, seed=3, success=True, sum_reward=-1.5, length=4)],
                    aggregate=EvalAggregate(n_episodes=1, success_rate=1.0))
    path = tmp_path / "eval_info.json"
    save_eval_info(path, info)
    assert load_eval_info(path) == info
    data = json.loads(path.read_text())
    assert data["version"] == EVAL_INFO_VERSION and data == to_dict(info)
    data["episodes"][0]["bonus"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="bonus"):
        load_eval_info(path)
    path.write_text(json.dumps({**to_dict(info), "version": EVAL_INFO_VERSION + 1}))
    with pytest.raises(ConfigError, match="version"):
        load_eval_info(path)


def test_wilson_interval():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(50, 50)
    assert high == 1.0 and 0.92 < low < 0.93  # 95%: 50 of 50 still allows 7% failures
    low, high = wilson_interval(3, 50)
    assert low < 0.06 < high and high < 0.17
