"""SAC and TD3 through the actor-learner architecture (rl.sebulba): the configs it refuses
before anything starts, actors that act uniformly at random before `learning_starts` and with the
agent's exploring action after (SAC's policy sample, TD3's noisy mu), a learner whose update stores
the rollout's transitions in its replay buffer (a time limit kept apart from a termination, s' the
observation reached) and then takes T x gradient_steps of the agent's own gradient steps, and `rl
train` writing a run, stopping on Ctrl-C with a checkpoint that holds the buffer, resuming and `rl
eval` playing it. The Pendulum learning checks are marked slow."""

from __future__ import annotations

import json

import gymnasium
import jax
import numpy as np
import pytest
from run_helpers import REPO, interrupted_resumed_and_evaluated, needs_mujoco, run_cli

from rl.agents import actor_critic, sac, td3
from rl.config import build_config, hyperparams, load_config
from rl.config.arch import autoreset_mode
from rl.config.parsing import ConfigError
from rl.core import environment
from rl.nn.networks import TanhGaussian
from rl.sebulba import learner as sebulba
from rl.sebulba.pieces import make_pieces, rollout_sizes
from rl.sebulba.programs import check_devices


class Slide(gymnasium.Env):
    """obs [t, a] (steps into the episode, the last action), reward -a^2; even-numbered episodes
    (counted from the last seeded reset) terminate at t = 3, odd ones would at t = 7 but
    registration's TimeLimit truncates them at t = 5. Actions in [-2, 2]."""

    observation_space = gymnasium.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gymnasium.spaces.Box(-2.0, 2.0, (1,), np.float32)

    def __init__(self):
        self.episode, self.t = -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = 0 if seed is not None else self.episode + 1, 0
        return np.array([0.0, 0.0], np.float32), {}

    def step(self, action):
        a = float(np.asarray(action).reshape(()))
        assert -2.0 <= a <= 2.0, a  # the agent's [-1, 1] mapped onto the bounds
        self.t += 1
        end = 3 if self.episode % 2 == 0 else 7
        return np.array([self.t, a], np.float32), -(a**2), self.t == end, False, {}


gymnasium.register("FusedrlTest/Slide-v0", entry_point=Slide, max_episode_steps=5)
SLIDE = "gymnasium:FusedrlTest/Slide-v0"

# 2 threads x 1 env, rollouts of 8 steps: 16 env steps an update, 2 gradient steps per env step
SMALL = {
    "name": "sac",
    "total_steps": 256,
    "num_envs": 2,
    "utd_ratio": 2.0,
    "buffer_size": 512,
    "learning_starts": 32,
    "batch_size": 8,
    "network": {"hidden": [16, 16]},
    "log_interval": 64,
    "eval_episodes": 2,
}


def config(env=SLIDE, arch=None, agent=None, **sections):
    data = {"env": {"id": env}, "agent": {**SMALL, **(agent or {})}}
    arch = {"name": "sebulba", "rollout_steps": 8, **(arch or {})}
    return build_config({**data, "arch": arch, **sections})


def td3_config(**agent):
    td3_agent = {**SMALL, "name": "td3", "policy_delay": 2, "exploration_noise": 0.3, **agent}
    return config(agent=td3_agent)


# ---------------------------------------------------------------- refused before anything starts


@pytest.mark.parametrize(
    "change, message",
    [
        ({"arch": {"autoreset": "next_step"}}, r"arch.autoreset: next_step .* use same_step"),
        ({"arch": {"learner_devices": [0, 1]}}, r"arch.learner_devices: sac learns on one device"),
        ({"arch": {"frame_stack": "device"}}, r"arch.frame_stack: device follows .* sac resets"),
        ({"agent": {"buffer_size": 8}}, r"agent.buffer_size \(8\) must hold .* = 16\)"),
        (
            {"agent": {"log_interval": 40, "total_steps": 320}},
            r"agent.log_interval \(40 env steps\) .*\(8 x 2 = 16\)",
        ),
    ],
)
def test_configs_that_cannot_work_are_refused_when_loaded(change, message):
    with pytest.raises(ConfigError, match=message):
        config(**change)


def test_rollout_steps_are_refused_for_the_on_policy_agents():
    ppo = {"name": "ppo", "num_envs": 4, "num_steps": 32, "total_steps": 1024, "log_interval": 1}
    data = {"env": {"id": "gymnasium:CartPole-v1"}, "agent": ppo}
    with pytest.raises(ConfigError, match=r"arch.rollout_steps .* ppo's rollouts are agent.num"):
        build_config({**data, "arch": {"name": "sebulba", "rollout_steps": 4}})


def test_several_processes_are_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"sac learns in one process.* has 2"):
        check_devices(config())


def test_auto_resets_are_same_step_resets_and_the_sizes_come_from_env_steps():
    assert autoreset_mode(config()) == "same_step"
    sizes = rollout_sizes(config(agent={"total_steps": 320}))
    assert sizes == (8, 16, 20, 4, 2)  # 320 / 16 updates, a log point every 64 / 16


@needs_mujoco  # gymnasium's HalfCheetah-v5 is made to read its spaces
def test_the_configs_load():
    pendulum = load_config(REPO / "configs" / "sac_sebulba_pendulum.yaml")
    assert (pendulum.agent.name, pendulum.env.id) == ("sac", "gymnasium:Pendulum-v1")
    cheetah = load_config(REPO / "configs" / "sac_sebulba_halfcheetah.yaml")
    agent = cheetah.agent
    assert (agent.buffer_size, agent.learning_starts, agent.batch_size) == (10**6, 5000, 256)
    assert rollout_sizes(cheetah).num_updates == 15680


# ---------------------------------------------------------------- acting


def sac_sample(cfg, env, env_params, params, obs, key):
    """SAC's exploring action: a sample of the squashed Gaussian."""
    actor = sac.make_variant(cfg.agent, env, env_params).actor
    policy = TanhGaussian.from_head(actor.apply(params, obs))
    return np.asarray(policy.env_action(policy.sample(key)))


def td3_noisy_mu(cfg, env, env_params, params, obs, key):
    """TD3's exploring action: clip(mu(s) + N(0, 0.3^2), -1, 1)."""
    actor, _ = td3.make_networks(cfg.agent, env, env_params)
    mu = np.asarray(actor.apply(params, obs))
    return np.clip(mu + 0.3 * np.asarray(jax.random.normal(key, mu.shape)), -1.0, 1.0)


@pytest.mark.parametrize("agent, explored", [("sac", sac_sample), ("td3", td3_noisy_mu)])
def test_actors_act_at_random_before_learning_starts_and_explore_after(agent, explored):
    cfg = config(agent={"name": agent, "exploration_noise": 0.3} if agent == "td3" else None)
    pieces, hparams = make_pieces(cfg), hyperparams(cfg.agent)
    env, env_params = environment.make_env(cfg)
    obs = np.array([[1.0, 0.5], [2.0, -0.5]], np.float32)
    params, _, _ = pieces.init(jax.random.PRNGKey(0), hparams, obs[0])
    key = jax.random.PRNGKey(3)
    _, explore_key, random_key = jax.random.split(key, 3)
    explore = explored(cfg, env, env_params, params, obs, explore_key)
    uniform = np.asarray(actor_critic.random_actions(env.action_space(env_params), random_key, 2))
    for step, want in ((31, uniform), (32, explore)):
        _, (action,), env_action = pieces.act(hparams, params, obs, key, np.int32(step))
        np.testing.assert_allclose(action, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(env_action, 2.0 * want, rtol=1e-5, atol=1e-6)  # onto [-2, 2]
    assert not np.allclose(explore, uniform)


def test_td3s_greedy_action_is_mu_on_the_envs_bounds():
    cfg = td3_config()
    pieces, hparams = make_pieces(cfg), hyperparams(cfg.agent)
    env, env_params = environment.make_env(cfg)
    obs = np.array([[1.0, 0.5], [2.0, -0.5]], np.float32)
    params, _, _ = pieces.init(jax.random.PRNGKey(0), hparams, obs[0])
    actor, _ = td3.make_networks(cfg.agent, env, env_params)
    mu = np.asarray(actor.apply(params, obs))
    np.testing.assert_allclose(pieces.greedy(params, obs), 2.0 * mu, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- learning


def test_an_update_stores_the_rollout_and_takes_t_times_gradient_steps_once_learning_starts():
    cfg = config(arch={"actor_threads": 1}, agent={"num_envs": 2, "learning_starts": 24})
    learner = sebulba.Learner(cfg)
    state = learner.init()
    first, rows = learner.run(state, num_updates=1)
    sac_state = first.replay
    assert int(sac_state.buffer.size) == 16 and int(sac_state.step) == 16
    assert int(sac_state.updates) == 0  # 16 of 24 random steps stored: no gradient step yet
    jax.tree.map(np.testing.assert_array_equal, first.params, state.params)
    data = jax.tree.map(lambda x: np.asarray(x)[:16], sac_state.buffer.data)
    # Slide's episodes from each env's seeded reset: ends at t = 3 (terminated), 5 (truncated), 3
    t, next_t = data["obs"][:, 0].reshape(8, 2), data["next_obs"][:, 0].reshape(8, 2)
    terminated = data["terminated"].reshape(8, 2)
    for env in range(2):
        np.testing.assert_array_equal(t[:, env], [0, 1, 2, 0, 1, 2, 3, 4])
        np.testing.assert_array_equal(next_t[:, env], [1, 2, 3, 1, 2, 3, 4, 5])  # reached obs
        np.testing.assert_array_equal(terminated[:, env], [0, 0, 1, 0, 0, 0, 0, 0])  # t=5: trunc.
    actions = data["action"].reshape(8, 2)
    np.testing.assert_allclose(data["next_obs"][:, 1].reshape(8, 2), 2.0 * actions, rtol=1e-6)
    np.testing.assert_allclose(data["reward"].reshape(8, 2), -((2.0 * actions) ** 2), rtol=1e-5)
    second, rows = learner.run(first, num_updates=2)
    assert first.replay.buffer.storage[0].is_deleted()  # donated: updated in place, no copy
    # 32 transitions >= learning_starts: 8 steps x 2 envs x utd 2 = 32 gradient steps
    assert int(second.replay.updates) == 32 and int(second.replay.buffer.size) == 32
    changed = jax.tree.map(lambda a, b: not np.allclose(a, b), second.params, first.params)
    assert all(jax.tree.leaves(changed))


def test_a_run_logs_sacs_losses_and_the_lag_within_max_lag():
    """The losses are means over the log period; alpha is its value at the log point, as the
    one-program SAC logs it."""
    learner = sebulba.Learner(config(arch={"max_lag": 1}))
    state, rows = learner.run(learner.init())
    assert rows[-1]["alpha"] == pytest.approx(float(np.exp(state.replay.log_alpha)), rel=1e-6)
    assert [row["step"] for row in rows] == [64, 128, 192, 256]
    for row in rows:  # the first period's means skip its first update, before learning_starts
        for name in ("critic_loss", "actor_loss", "q_mean", "entropy", "alpha", "eval_return"):
            assert np.isfinite(row[name]), (name, row)
    assert max(row["param_lag_max"] for row in rows) <= 1
    returns = [row["episode_return"] for row in rows if row["episodes"]]
    assert returns and all(-20.0 <= r <= 0.0 for r in returns)  # 3 or 5 steps of -a^2, a^2 <= 4


# ---------------------------------------------------------------- rl train, end to end


def test_rl_train_stops_on_ctrl_c_with_the_buffer_checkpointed_and_resumes(tmp_path, capsys):
    data = config().to_dict()
    data["agent"]["total_steps"] = 512
    rows, setting = interrupted_resumed_and_evaluated(tmp_path, data, capsys)
    assert [row["step"] for row in rows] == [64 * (i + 1) for i in range(8)]
    assert all(np.isfinite(row["critic_loss"]) for row in rows[1:])
    assert setting["episodes"] == 2 and -20.0 <= setting["mean"] <= 0.0


def test_td3_updates_its_actor_and_targets_every_policy_delay_critic_steps():
    learner = sebulba.Learner(td3_config(learning_starts=24))
    state, _ = learner.run(learner.init(), num_updates=2)
    td3_state = state.replay
    # the second update only: 32 stored >= 24, 8 steps x 2 envs x utd 2 = 32 critic steps
    assert int(td3_state.updates) == 32 and int(td3_state.buffer.size) == 32
    steps = lambda opt_state: {int(x) for x in jax.tree.leaves(opt_state) if np.ndim(x) == 0}
    assert td3_state.opt_state is None  # the learner keeps it in a field of its own
    assert steps(state.opt_state["critic"]) == {32}  # Adam's step counts
    assert steps(state.opt_state["actor"]) == {16}
    for target, online in (
        (td3_state.target_params, state.params),
        (td3_state.target_critic_params, td3_state.critic_params),
    ):
        moved = jax.tree.map(lambda a, b: not np.allclose(a, b), target, online)
        assert all(jax.tree.leaves(moved))  # Polyak targets trail the online networks


def test_a_td3_run_logs_its_losses():
    """The losses are means over the log period; the gradient steps so far are their count at the
    log point, as the one-program TD3 logs them: 32 an update of 16 env steps once 32 are stored
    (learning_starts), so 3 x 32 at step 64."""
    learner = sebulba.Learner(td3_config())
    state, rows = learner.run(learner.init())
    assert [row["step"] for row in rows] == [64, 128, 192, 256]
    assert [row["gradient_steps"] for row in rows] == [96, 224, 352, 480]
    assert rows[-1]["gradient_steps"] == int(state.replay.updates)
    for row in rows:
        for name in ("critic_loss", "actor_loss", "q_mean", "eval_return"):
            assert np.isfinite(row[name]), (name, row)


@needs_mujoco
def test_a_tiny_halfcheetah_run_writes_finite_losses(tmp_path, capsys):
    tiny = [
        "agent.total_steps=256",
        "agent.learning_starts=64",
        "agent.buffer_size=1024",
        "agent.batch_size=16",
        "agent.log_interval=128",
        "agent.eval_episodes=0",
        "agent.network.hidden=[16,16]",
        "env.params.max_episode_steps=32",
        "arch.rollout_steps=8",
    ]
    config_path = REPO / "configs" / "sac_sebulba_halfcheetah.yaml"
    args = ["train", config_path, "--output-dir", tmp_path, "--name", "c", "--no-progress"]
    assert run_cli([*args, *tiny]) == 0, capsys.readouterr().err
    rows = [
        json.loads(line) for line in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [row["step"] for row in rows] == [128, 256]
    assert np.isfinite(rows[1]["critic_loss"]) and rows[1]["episodes"] == 4


@pytest.mark.slow
def test_sac_through_the_actor_learner_path_balances_pendulum():
    """gymnasium's Pendulum-v1, configs/sac_sebulba_pendulum.yaml (20k steps): the greedy return
    at the last log point >= -250 (SAC balances it by then in the one-program runs)."""
    learner = sebulba.Learner(load_config(REPO / "configs" / "sac_sebulba_pendulum.yaml"))
    _, rows = learner.run(learner.init())
    assert rows[-1]["eval_return"] >= -250.0, [row["eval_return"] for row in rows]


@pytest.mark.slow
def test_td3_through_the_actor_learner_path_balances_pendulum():
    """gymnasium's Pendulum-v1, configs/td3_sebulba_pendulum.yaml (20k steps): the greedy return
    at the last log point >= -250."""
    learner = sebulba.Learner(load_config(REPO / "configs" / "td3_sebulba_pendulum.yaml"))
    _, rows = learner.run(learner.init())
    assert rows[-1]["eval_return"] >= -250.0, [row["eval_return"] for row in rows]
