"""PPO on gymnasium's MuJoCo envs through the actor-learner architecture (rl.sebulba), as a
user runs it: configs/ppo_sebulba_halfcheetah.yaml loads with CleanRL's settings, a tiny `rl train`
of it writes its run directory with finite metrics and learned observation statistics that the
actors act with, actions reach the env inside its Box bounds, MuJoCo's float64 observations reach
the network as float32, a time limit is a truncation that GAE bootstraps from the observation it
reached, and without MuJoCo the config fails with one error naming what to install. The learning
check (100k steps, about 40 s on 2 CPU cores) is marked slow. Skipped without the mujoco package
(the brax extra brings it), except the missing-MuJoCo error."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
import pytest
from flax import serialization
from run_helpers import REPO, needs_mujoco, run_cli

from rl.agents import ppo
from rl.config import build_config, hyperparams, load_config
from rl.config.parsing import ConfigError
from rl.core import observation_norm
from rl.sebulba import host_envs as sebulba_envs
from rl.sebulba import learner as sebulba
from rl.sebulba.pieces import make_pieces

CONFIG = REPO / "configs" / "ppo_sebulba_halfcheetah.yaml"

# two updates of 2 threads x 2 envs x 16 steps, episodes cut at 16 steps (a gymnasium.make keyword)
TINY = [
    "agent.total_steps=128",
    "agent.num_envs=4",
    "agent.num_steps=16",
    "agent.num_epochs=2",
    "agent.num_minibatches=2",
    "agent.log_interval=1",
    "env.params.max_episode_steps=16",
]


def mujoco_config(env_id="HalfCheetah-v5", max_episode_steps=None, **agent):
    """A small PPO config on a gymnasium MuJoCo env under sebulba (one actor thread of 2 envs)."""
    params = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    return build_config(
        {
            "env": {"id": f"gymnasium:{env_id}", "params": params},
            "agent": {
                "name": "ppo",
                "total_steps": 64,
                "num_envs": 2,
                "num_steps": 32,
                "num_minibatches": 2,
                "num_epochs": 1,
                "log_interval": 1,
                "network": {"hidden": [16]},
                **agent,
            },
            "arch": {"name": "sebulba", "actor_threads": 1},
        }
    )


class Recorder:
    """A host vector env that keeps what it gives and is given: the actions and the observations."""

    def __init__(self, envs, seen):
        self.envs, self.num_envs, self.seen = envs, envs.num_envs, seen

    def step(self, actions):
        self.seen["actions"].append(np.array(actions))
        out = self.envs.step(actions)
        self.seen["obs"].append(out[0])
        return out

    def close(self):
        self.envs.close()


@pytest.fixture
def recorded(monkeypatch):
    """{"actions": [...], "obs": [...]} of every host vector env the actors make from now on."""
    seen = {"actions": [], "obs": []}
    make = sebulba_envs.make_vector_env

    def recording(config, seeds, mode, autoreset="same_step", frames=False):
        envs, obs = make(config, seeds, mode, autoreset, frames)
        seen["obs"].append(obs)
        return Recorder(envs, seen), obs

    monkeypatch.setattr(sebulba_envs, "make_vector_env", recording)
    return seen


def rollout(config, params=None, seed=0):
    """(params, one actor's rollout Transition [T, envs, ...]) of `config` from fresh params."""
    pieces = make_pieces(config)
    if params is None:
        obs = np.zeros(pieces.obs_space.shape, pieces.obs_dtype)
        params, _, _ = pieces.init(jax.random.PRNGKey(seed), hyperparams(config.agent), obs)
    seeds = list(range(config.agent.num_envs))
    actor = sebulba.Actor(
        pieces, config, jax.jit(pieces.act), seeds, jax.random.PRNGKey(seed), jax.devices()[0]
    )
    try:
        traj, _, _ = actor.rollout(params)
    finally:
        actor.close()
    return params, traj


# ---------------------------------------------------------------- the config


@needs_mujoco
def test_the_halfcheetah_config_loads_with_cleanrls_settings():
    config = load_config(CONFIG)
    agent, arch = config.agent, config.arch
    assert config.env.id == "gymnasium:HalfCheetah-v5" and arch.name == "sebulba"
    assert (arch.actor_threads, agent.num_envs, agent.num_steps) == (2, 8, 256)
    assert (agent.batch_size, agent.num_updates) == (2048, 488)  # CleanRL: 1M // 2048 updates
    assert (agent.num_epochs, agent.num_minibatches, agent.lr, agent.anneal_lr) == (10, 32, 3e-4, 1)
    assert (agent.gamma, agent.gae_lambda, agent.clip_eps) == (0.99, 0.95, 0.2)
    assert agent.clip_value_loss and agent.vf_clip_eps == 0.2  # CleanRL's clip_vloss
    assert (agent.ent_coef, agent.vf_coef, agent.max_grad_norm) == (0.0, 0.5, 0.5)
    assert agent.adam_eps == 1e-5 and agent.normalize_advantages
    assert agent.normalize_obs and agent.obs_clip == 10.0 and agent.reward_scale == 1.0
    assert agent.continuous_policy == "gaussian" and not agent.shared_network
    network = agent.network
    assert (network.hidden, network.activation, network.init) == ((64, 64), "tanh", "orthogonal")


@needs_mujoco
def test_pqn_is_refused_on_mujocos_box_actions():
    agent = {"name": "pqn", "total_steps": 4096, "num_envs": 4, "num_steps": 128, "log_interval": 1}
    data = {"env": {"id": "gymnasium:HalfCheetah-v5"}, "agent": agent, "arch": "sebulba"}
    with pytest.raises(ConfigError, match=r"env.id: pqn needs discrete actions; .*HalfCheetah"):
        build_config(data)


# ---------------------------------------------------------------- rl train, end to end


@needs_mujoco
def test_a_tiny_rl_train_writes_its_run_with_finite_metrics_and_observation_statistics(
    tmp_path, capsys
):
    args = ["train", CONFIG, "--output-dir", tmp_path, "--name", "cheetah", "--no-progress"]
    assert run_cli([*args, *TINY]) == 0, capsys.readouterr().err
    run_dir = tmp_path / "cheetah"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [64, 128]
    for row in rows:
        assert row["episodes"] == 4  # every env's 16-step episode ends in each update
        for name in ("episode_return", "policy_loss", "value_loss", "entropy", "approx_kl"):
            assert np.isfinite(row[name]), (name, row)
    assert json.loads((run_dir / "summary.json").read_text())["metric"] == "episode_return"
    # the learner's observation statistics, of every observation of both rollouts, are saved with
    # the params [settings, seeds, ...], so `rl eval` normalises as the actors did
    params = serialization.msgpack_restore((run_dir / "final_params.msgpack").read_bytes())
    stats = params["obs_stats"]
    assert np.asarray(stats["count"]).reshape(()) == pytest.approx(1e-4 + 128)
    assert np.asarray(stats["mean"]).shape == (1, 1, 17) and np.isfinite(stats["var"]).all()
    out = tmp_path / "eval.json"
    assert run_cli(["eval", run_dir, "--episodes", "2", "--json", out]) == 0
    (setting,) = json.loads(out.read_text())["settings"]
    assert setting["episodes"] == 2 and setting["length_mean"] == 16.0
    assert np.isfinite(setting["mean"])


@needs_mujoco
def test_actors_act_with_the_observation_statistics_the_learner_keeps_in_the_params():
    config = mujoco_config(normalize_obs=True)
    learner = sebulba.Learner(config)
    state, _ = learner.run(learner.init())
    stats = jax.tree.map(np.asarray, state.params["obs_stats"])
    assert stats["count"] == pytest.approx(1e-4 + 64)  # one update of 2 envs x 32 steps
    assert stats["mean"].shape == (17,) and stats["var"].std() > 0  # HalfCheetah's 17 features
    # an actor's step on raw observations = its step on observations normalised by hand under
    # identity statistics (same key): the actors normalise with the learner's statistics
    pieces, hparams = learner.pieces, hyperparams(config.agent)
    obs = np.random.default_rng(0).normal(stats["mean"], 3 * np.sqrt(stats["var"]), (5, 17))
    obs = obs.astype(np.float32)
    identity = observation_norm.initial_observation_stats((17,))
    by_hand = {"network": state.params["network"], "obs_stats": identity}
    normalised = observation_norm.normalize_observation(obs, stats)
    key, step = jax.random.PRNGKey(3), np.int32(0)
    _, (action, _), env_action = pieces.act(hparams, state.params, obs, key, step)
    _, (action_by_hand, _), _ = pieces.act(hparams, by_hand, normalised, key, step)
    np.testing.assert_allclose(action, action_by_hand, rtol=1e-5, atol=1e-5)
    raw = pieces.act(hparams, by_hand, obs, key, step)[1][0]
    assert np.abs(np.asarray(raw) - np.asarray(action)).max() > 1e-3  # the statistics matter


# ---------------------------------------------------------------- what the env gets and gives


@needs_mujoco
def test_actions_reach_the_env_inside_its_box_bounds_and_observations_as_float32(recorded):
    # InvertedPendulum's force is in [-3, 3]; a wide initial policy (std e^1) samples beyond the
    # agent's [-1, 1] often, so clipping and the mapping onto [-3, 3] both show
    config = mujoco_config("InvertedPendulum-v5", log_std_init=1.0)
    _, traj = rollout(config)
    actions = np.concatenate(recorded["actions"])
    assert actions.shape == (32 * 2, 1) and actions.dtype == np.float32
    assert actions.min() >= -3.0 and actions.max() <= 3.0
    assert (np.abs(actions) > 1.0).mean() > 0.2 and (np.abs(actions) == 3.0).any()
    sampled = np.asarray(traj.action).reshape(-1, 1)  # the agent's unclipped sample in [-1, 1]
    np.testing.assert_allclose(actions, 3.0 * np.clip(sampled, -1.0, 1.0), rtol=1e-6)
    assert (np.abs(sampled) > 1.0).any()
    # MuJoCo gives float64; the rollout (what the network reads) holds float32
    assert all(obs.dtype == np.float64 for obs in recorded["obs"])
    assert traj.obs.dtype == np.float32 and traj.final_obs.dtype == np.float32
    np.testing.assert_allclose(traj.obs[1:], np.asarray(recorded["obs"][1:-1], np.float32))
    # the pole falls: terminations, and no time limit within 32 steps
    assert traj.terminated.any() and not traj.truncated.any()


@needs_mujoco
def test_a_time_limit_is_a_truncation_that_gae_bootstraps_from_the_observation_it_reached():
    config = mujoco_config(max_episode_steps=8, gamma=0.9, gae_lambda=0.5)
    params, traj = rollout(config)
    assert traj.truncated[:, 0].nonzero()[0].tolist() == [7, 15, 23, 31]  # HalfCheetah never
    assert not traj.terminated.any()  # terminates
    ended = traj.truncated.any(1)
    # final_obs is the next observation, except at a time limit: the one reached before the reset
    np.testing.assert_array_equal(traj.final_obs[:-1][~ended[:-1]], traj.obs[1:][~ended[:-1]])
    assert not np.allclose(traj.final_obs[7], traj.obs[8])
    s = ppo.make_setup(config)
    hparams = hyperparams(config.agent)
    batch, advantages, targets = ppo.learn_batch(s, hparams, params, traj)
    _, final_values = s.net.apply(params, traj.final_obs)
    # at a time limit the target is r + gamma V(final_obs): no chain crosses into the next episode
    expected = traj.reward[7] + 0.9 * np.asarray(final_values)[7]
    np.testing.assert_allclose(np.asarray(targets).reshape(32, 2)[7], expected, rtol=1e-5)


# ---------------------------------------------------------------- without MuJoCo


def test_without_mujoco_the_config_fails_with_one_error_naming_what_to_install(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(sys.modules, "mujoco", None)  # `import mujoco` raises ImportError
    for name in [name for name in sys.modules if name.startswith("gymnasium.envs.mujoco")]:
        monkeypatch.delitem(sys.modules, name)  # imported again, without mujoco
    message = r'env.id: .*MuJoCo is not installed, run `pip install "gymnasium\[mujoco\]"`'
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG)
    assert run_cli(["train", CONFIG, "--output-dir", tmp_path]) == 2
    err = capsys.readouterr().err
    assert 'pip install "gymnasium[mujoco]"' in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- learning


@pytest.mark.slow
@needs_mujoco
def test_ppo_on_halfcheetah_improves_its_training_return_within_100k_steps():
    """The shipped config for 48 updates (98304 steps, the learning rate annealed over them), with
    `arch.max_lag=0` so that the run does not depend on the threads' timing: the training episodes'
    return at the last log point beats the first's by at least 100."""
    overrides = ["agent.total_steps=98304", "agent.log_interval=8", "arch.max_lag=0"]
    _, metrics = sebulba.train(load_config(CONFIG, overrides))
    returns = metrics["episode_return"]
    assert np.isfinite(returns).all() and returns[-1] > returns[0] + 100, returns
