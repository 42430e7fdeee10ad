"""TD3: target policy smoothing and the clipped double-Q target by hand (truncation bootstraps,
termination does not), delayed actor and target updates, a short Pendulum run that improves
(`-m slow`), vmap over seeds equals per-seed runs (CPU), a sweep gives one result per setting,
haiku, config errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import FUSION_EMITTERS

from rl.agents import td3
from rl.config import build_config, hyperparams
from rl.config.parsing import ConfigError
from rl.core import losses

SMALL = dict(
    name="td3",
    total_steps=4000,
    learning_starts=500,
    batch_size=64,
    log_interval=1000,
    eval_episodes=4,
    gamma=0.98,
    network={"hidden": [64, 64]},
)


def make_config(env="Pendulum-v1", **agent):
    return build_config({"env": {"id": env}, "agent": {**SMALL, **agent}})


def test_smoothed_target_action_clips_the_noise_and_the_action():
    key = jax.random.PRNGKey(0)
    mu = jnp.array([[0.0, 0.95, -0.95]] * 2000)
    a = losses.smoothed_target_action(mu, key, noise_std=0.2, noise_clip=0.5)
    noise = a - mu
    assert float(jnp.max(jnp.abs(noise[:, 0]))) <= 0.5 + 1e-6  # clipped noise
    assert float(jnp.max(a)) <= 1.0 and float(jnp.min(a)) >= -1.0  # clipped action
    np.testing.assert_allclose(
        float(jnp.std(noise[:, 0])), 0.2 * 0.9887, rtol=0.08
    )  # std of N(0, .2^2) clipped at 2.5 sigma: sqrt(E[min(|x|, 2.5)^2]) = 0.9887 sigma
    np.testing.assert_array_equal(losses.smoothed_target_action(mu, key, 0.0, 0.5), mu)


def test_deterministic_policy_loss_is_minus_the_mean_q():
    np.testing.assert_allclose(losses.deterministic_policy_loss(jnp.array([1.0, 3.0])), -2.0)


def fake_networks(actor_out, q_by_obs):
    """(actor, critic) apply functions. Actor: a constant action; critic: (q1, q2) looked up by obs
    id (obs[..., 0])."""
    table = jnp.asarray(q_by_obs, jnp.float32)
    actor = lambda p, obs: jnp.full(obs.shape[:-1] + (1,), actor_out)
    critic = lambda p, obs, a: (
        table[obs[..., 0].astype(jnp.int32), 0],
        table[obs[..., 0].astype(jnp.int32), 1],
    )
    return actor, critic


def test_critic_target_is_clipped_double_q_and_bootstraps_on_truncation_only():
    actor, critic = fake_networks(
        0.0, [[1.0, 2.0], [5.0, 3.0]]
    )  # Q(obs 0) = (1, 2); Q(obs 1) = (5, 3)
    batch = {
        "obs": jnp.zeros((2, 1)),
        "action": jnp.zeros((2, 1)),
        "reward": jnp.array([1.0, 1.0]),
        "next_obs": jnp.ones((2, 1)),
        "terminated": jnp.array([False, True]),
    }  # the first is truncated or mid-episode
    hparams = {"gamma": 0.9, "policy_noise": 0.2, "noise_clip": 0.5}
    loss, q_mean = td3.critic_loss(
        actor, critic, None, None, None, batch, jax.random.PRNGKey(0), hparams
    )
    y = np.array([1.0 + 0.9 * min(5.0, 3.0), 1.0])
    np.testing.assert_allclose(
        loss, 0.5 * (np.mean((1.0 - y) ** 2) + np.mean((2.0 - y) ** 2)), rtol=1e-6
    )
    np.testing.assert_allclose(q_mean, 1.0)


def test_actor_and_targets_update_every_policy_delay_critic_steps():
    """One log point per phase (one env step, one gradient step): after the 63 phases before
    learning_starts, each phase steps the critics, and every third also the actor and both targets
    (its actor_loss reads NaN otherwise)."""
    config = make_config(
        policy_delay=3, learning_starts=64, total_steps=1000, log_interval=1, eval_episodes=0
    )
    trainer = td3.make_trainer(config)
    hp = hyperparams(config.agent)
    run = jax.jit(trainer.run, static_argnums=2)
    state, _ = run(jax.jit(trainer.init)(jax.random.PRNGKey(0), hp), hp, 63)
    assert int(state.updates) == 0 and int(state.buffer.size) == 63
    changed = lambda a, b: (
        not all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    )
    actor_changes, target_changes, critic_changes = [], [], []
    for i in range(6):
        new, metrics = run(state, hp, 1)
        assert int(metrics["gradient_steps"][0]) == i + 1
        actor_changes.append(changed(new.params, state.params))
        target_changes.append(changed(new.target_params, state.target_params))
        assert target_changes[-1] == changed(new.target_critic_params, state.target_critic_params)
        critic_changes.append(changed(new.critic_params, state.critic_params))
        assert np.isnan(metrics["actor_loss"][0]) != actor_changes[-1]
        state = new
    assert critic_changes == [True] * 6
    assert actor_changes == target_changes == [False, False, True, False, False, True]


@pytest.mark.slow
def test_short_pendulum_run_improves():
    """4k env steps, 2 gradient steps each, a 64x64 network: the greedy return rises well above the
    random policy's (about -1200). A learning run (`-m slow`); `python benchmarks/sac.py learning
    --config configs/td3_pendulum.yaml` measures TD3's learning on Pendulum."""
    keys = jnp.stack([jax.random.PRNGKey(1), jax.random.PRNGKey(2)])
    _, metrics = jax.jit(jax.vmap(td3.make_train(make_config(utd_ratio=2.0))))(keys)
    eval_return = np.asarray(metrics["eval_return"])
    assert np.all(np.isfinite(np.asarray(metrics["critic_loss"])[:, 1:]))
    assert np.all(eval_return[:, -1] > -700), eval_return
    assert np.all(eval_return[:, -1] > eval_return[:, 0] + 300), eval_return


def test_vmap_over_seeds_equals_per_seed_runs():
    """On the CPU, over a short horizon: training amplifies last-bit differences between a batched
    and an unbatched program (XLA may contract multiply-adds differently in each; on some CPUs the
    two drift apart by 1e-4 within 800 gradient steps), so 400 gradient steps (about 1e-6 apart)."""
    config = make_config(
        total_steps=600,
        learning_starts=200,
        log_interval=150,
        eval_episodes=2,
        network={"hidden": [16, 16]},
        fused_network=False,  # it runs on the CPU device, where a GPU's Triton kernel cannot
    )
    train = td3.make_train(config)
    with jax.default_device(jax.devices("cpu")[0]):
        keys = jnp.stack([jax.random.PRNGKey(1), jax.random.PRNGKey(2)])
        # the CPU fusion emitters on both sides (tests/conftest.py turns them off elsewhere): the
        # older emitters may round one expression differently in the two programs
        _, batched = jax.jit(jax.vmap(train), compiler_options=FUSION_EMITTERS)(keys)
        for i in range(2):
            _, single = jax.jit(train, compiler_options=FUSION_EMITTERS)(keys[i])
            for name in (
                "step",
                "episodes",
                "episode_return",
                "critic_loss",
                "actor_loss",
                "q_mean",
                "eval_return",
            ):
                np.testing.assert_allclose(
                    np.asarray(batched[name][i]),
                    np.asarray(single[name]),
                    rtol=1e-4,
                    atol=1e-5,
                    err_msg=name,
                )


def test_sweep_gives_one_result_per_setting():
    from rl.config import parse_sweep
    from rl.run.train import train_many

    config = make_config(total_steps=1000, learning_starts=200, eval_episodes=1)
    grid = parse_sweep(["agent.exploration_noise=0.1,0.3", "agent.lr=1e-3,3e-4"], config.agent)
    _, metrics = train_many(config, grid)
    assert np.asarray(metrics["eval_return"]).shape[:2] == (4, 1)
    finals = np.asarray(metrics["critic_loss"])[:, 0, -1]
    assert np.all(np.isfinite(finals)) and len(set(finals.tolist())) == 4


def test_haiku_backend_and_policy_in_env_units():
    config = make_config(
        total_steps=1000,
        learning_starts=200,
        eval_episodes=1,
        network={"hidden": [16], "backend": "haiku"},
    )
    state, metrics = jax.jit(td3.make_train(config))(jax.random.PRNGKey(0))
    assert np.isfinite(np.asarray(metrics["critic_loss"])[-1])
    policy = td3.make_policy(config)
    action = policy(state.params, jnp.array([1.0, 0.0, 0.5]), None)
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0  # Pendulum torque bounds


@pytest.mark.parametrize(
    "agent, env, message",
    [
        ({}, "CartPole-v1", "env.id: td3 needs continuous \\(Box\\) actions"),
        ({"policy_delay": 0}, "Pendulum-v1", "agent.policy_delay: 0 is out of range"),
        ({"noise_clip": -1.0}, "Pendulum-v1", "agent.noise_clip"),
        (
            {"utd_ratio": 0.5},
            "Pendulum-v1",
            "agent.utd_ratio \\(0.5\\) \\* agent.num_envs \\(1\\) must be a whole number",
        ),
        (
            {"log_interval": 300},
            "Pendulum-v1",
            "agent.total_steps \\(4000\\) must be a multiple of agent.log_interval",
        ),
    ],
)
def test_config_errors_name_the_key(agent, env, message):
    with pytest.raises(ConfigError, match=message):
        make_config(env, **agent)


def test_shipped_config_loads():
    from rl.config import load_config

    config = load_config("configs/td3_pendulum.yaml")
    assert config.agent.name == "td3" and config.agent.policy_delay == 2
