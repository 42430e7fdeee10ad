"""envs.envpool: one error naming the extra without envpool (runs everywhere); with envpool (skipped
without it), the spaces of `envs.make("envpool:<id>")`, its refusals, and `VectorEnv`'s same-step
auto-reset against envpool's own next-step reset on a twin pool of the same seed (and its next-step
mode, which is that pool)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import envs
from envs.core import MissingExtraError

OPTIONS = dict(episodic_life=True, reward_clip=True, img_height=44, img_width=44)


def test_a_missing_envpool_gives_one_error_naming_the_extra(monkeypatch):
    from rl.config import build_config
    from rl.config.parsing import ConfigError

    monkeypatch.setitem(sys.modules, "envpool", None)  # `import envpool` fails as if not installed
    with pytest.raises(
        MissingExtraError, match=r'pip install -e "\.\[envpool\]" in the fusedrl clone'
    ):
        envs.make("envpool:Breakout-v5")
    from envs.envpool import VectorEnv

    with pytest.raises(
        MissingExtraError, match=r'pip install -e "\.\[envpool\]" in the fusedrl clone'
    ):
        VectorEnv("Breakout-v5", 2, 0)
    data = {"env": {"id": "envpool:Breakout-v5"}, "agent": {"name": "ppo"}, "arch": "sebulba"}
    with pytest.raises(
        ConfigError,
        match=r"^env.id: envpool:<id> needs the .envpool. package, .*"
        r'pip install -e "\.\[envpool\]" in the fusedrl clone',
    ):
        build_config(data)


def test_vector_env_refuses_an_unknown_autoreset_mode():
    """Before envpool is imported: runs without it too."""
    from envs.envpool import VectorEnv

    with pytest.raises(ValueError, match=r"autoreset_mode: expected one of .* got 'next'"):
        VectorEnv("Breakout-v5", 1, seed=0, autoreset_mode="next")


envpool = pytest.importorskip("envpool")


def test_make_gives_envpools_spaces_and_refuses_to_step():
    env, params = envs.make("envpool:Breakout-v5", **OPTIONS)
    obs_space, action_space = env.observation_space(params), env.action_space(params)
    assert isinstance(obs_space, envs.Box) and obs_space.shape == (4, 44, 44)
    assert np.dtype(obs_space.dtype) == np.uint8 and float(obs_space.high.max()) == 255
    assert isinstance(action_space, envs.Discrete) and action_space.n == 4
    assert params == OPTIONS
    with pytest.raises(NotImplementedError, match=r"train it with arch.name: sebulba"):
        env.reset(None, params)


@pytest.mark.parametrize(
    "env_id, options, message",
    [
        ("Breakout-v4", {}, r"unknown envpool id 'Breakout-v4'. Did you mean 'Breakout-v5'"),
        (
            "Breakout-v5",
            {"episodic_lif": True},
            r"unknown option\(s\) \['episodic_lif'\]; .*"
            r"episodic_life",
        ),
        ("Breakout-v5", {"num_envs": 4}, r"'num_envs' is set by fusedrl \(from agent.num_envs\)"),
    ],
)
def test_unknown_ids_and_options_are_refused_naming_them(env_id, options, message):
    with pytest.raises(ValueError, match=message):
        envs.make(f"envpool:{env_id}", **options)


def test_vector_env_resets_in_the_step_that_ends_an_episode():
    """Same seed, same actions: envpool's own pool of one env (which resets in the step after the
    one that ended the episode, ignoring that step's action, reward 0) and `VectorEnv` see the same
    observations, rewards and ends, with that reset step folded into the step that ended the
    episode; scores and game ends are the game's (a lost life ends the agent's episode only)."""
    from envs.envpool import VectorEnv

    ours = VectorEnv("Breakout-v5", 1, seed=3, **OPTIONS)
    raw = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=1, seed=3, **OPTIONS)
    obs, _ = ours.reset()
    np.testing.assert_array_equal(obs, raw.reset()[0])
    ends = 0
    for action in np.random.default_rng(0).integers(0, 4, (300, 1)):
        obs, reward, terminated, truncated, info = ours.step(action)
        raw_obs, raw_reward, raw_terminated, raw_truncated, raw_info = raw.step(action)
        assert (reward, terminated, truncated) == (raw_reward, raw_terminated, raw_truncated)
        assert info["score"] == raw_info["reward"]
        if not (terminated | truncated)[0]:
            np.testing.assert_array_equal(obs, raw_obs)
            assert "final_obs" not in info and not info["game_over"][0]
            continue
        np.testing.assert_array_equal(info["final_obs"], raw_obs)
        assert info["_final_obs"].tolist() == [True]
        assert info["game_over"][0] == (raw_info["lives"][0] == 0) == (raw_info["terminated"][0])
        reset_obs, reset_reward, *_ = raw.step(np.zeros(1, int))  # envpool's reset step
        assert reset_reward[0] == 0
        np.testing.assert_array_equal(obs, reset_obs)
        assert not np.array_equal(obs, info["final_obs"])
        ends += 1
    assert ends >= 3


def test_vector_env_with_next_step_resets_is_envpools_own_pool():
    """autoreset_mode "next_step": step for step envpool's own pool of the same seed and actions
    (the step after an end resets the env, reward 0, no end, no second envpool step), with the
    game's scores and ends beside it."""
    from envs.envpool import VectorEnv

    ours = VectorEnv("Breakout-v5", 3, seed=5, autoreset_mode="next_step", **OPTIONS)
    raw = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=3, seed=5, **OPTIONS)
    np.testing.assert_array_equal(ours.reset()[0], raw.reset()[0])
    ended, resets, games = np.zeros(3, bool), 0, 0
    for action in np.random.default_rng(2).integers(0, 4, (400, 3)):
        got, want = ours.step(action), raw.step(action)
        for a, b in zip(got[:4], want[:4]):
            np.testing.assert_array_equal(a, b)
        info = got[4]
        assert "final_obs" not in info
        np.testing.assert_array_equal(info["score"], want[4]["reward"])
        np.testing.assert_array_equal(info["game_over"], want[4]["terminated"] != 0)
        assert (got[1][ended] == 0).all() and not (got[2] | got[3])[ended].any()
        resets, games = resets + ended.sum(), games + info["game_over"].sum()
        ended = got[2] | got[3]
    assert resets >= 6 and games >= 1


def test_vector_env_places_each_reset_on_its_own_env():
    from envs.envpool import VectorEnv

    ours = VectorEnv("Breakout-v5", 3, seed=0, **OPTIONS)
    ours.reset()
    rng, seen = np.random.default_rng(1), 0
    while seen < 2:
        obs, reward, terminated, truncated, info = ours.step(rng.integers(0, 4, 3))
        ended = terminated | truncated
        if ended.any():
            seen += 1
            final = info["final_obs"]
            for i in range(3):  # ended envs moved on to a new episode, the others did not
                assert np.array_equal(obs[i], final[i]) != ended[i]


def test_vector_env_resets_box_action_envs_that_end_at_different_steps_as_envpool_does():
    """MuJoCo's Hopper (float64 observations, Box actions of 3) through `VectorEnv` and through
    envpool's own twin pool, same seed and actions: envs that fall (terminated) or reach the time
    limit (truncated) at different steps are reset at once, alone, each by envpool's own reset
    step (its Box actions of the right shape, ignored), and `final_obs` keeps the observation
    each ended on, the truncation bootstrap's."""
    from envs.envpool import VectorEnv

    if "Hopper-v4" not in envpool.list_all_envs():  # an envpool built without MuJoCo
        pytest.skip("needs envpool's MuJoCo envs")
    n, limit = 4, 30
    ours = VectorEnv("Hopper-v4", n, seed=7, max_episode_steps=limit)
    raw = envpool.make(
        "Hopper-v4", env_type="gymnasium", num_envs=n, seed=7, max_episode_steps=limit
    )
    obs, _ = ours.reset()
    np.testing.assert_array_equal(obs, raw.reset()[0])
    assert obs.dtype == np.float64 and ours.reset_actions.shape == (n, 3)
    rng, ends = np.random.default_rng(0), {"terminated": 0, "truncated": 0, "partial": 0}
    for _ in range(120):
        action = rng.uniform(-1, 1, (n, 3))
        obs, reward, terminated, truncated, info = ours.step(action)
        raw_obs, raw_reward, raw_terminated, raw_truncated, _ = raw.step(action)
        np.testing.assert_array_equal(reward, raw_reward)
        assert (terminated == raw_terminated).all() and (truncated == raw_truncated).all()
        ended = terminated | truncated
        if not ended.any():
            np.testing.assert_array_equal(obs, raw_obs)
            assert "final_obs" not in info
            continue
        np.testing.assert_array_equal(info["final_obs"], raw_obs)
        assert info["_final_obs"].tolist() == ended.tolist()
        ids = np.flatnonzero(ended)
        first, *_, first_info = raw.step(np.zeros((ids.size, 3)), env_id=ids)  # envpool's reset
        np.testing.assert_array_equal(obs[first_info["env_id"]], first)
        np.testing.assert_array_equal(obs[~ended], raw_obs[~ended])
        ends["terminated"] += terminated.sum()
        ends["truncated"] += truncated.sum()
        ends["partial"] += ids.size < n
    assert ends["terminated"] >= 2 and ends["truncated"] >= 1 and ends["partial"] >= 2, ends
