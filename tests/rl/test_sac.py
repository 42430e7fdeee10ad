"""SAC: the agent's losses (wired to rl.core.losses) against hand computations (truncation
bootstraps, termination does not), short training runs, env-space policy actions, chunking and vmap.
The loss functions themselves are tested in test_losses_sac.py."""

import contextlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.agents import sac
from rl.config import build_config, hyperparams
from rl.config.parsing import ConfigError
from rl.core import environment, losses


def make_config(env_id="Pendulum-v1", **agent):
    base = dict(
        name="sac",
        total_steps=256,
        learning_starts=64,
        batch_size=32,
        buffer_size=1000,
        network={"hidden": [16, 16]},
        log_interval=64,
        eval_episodes=2,
    )
    base.update(agent)
    return build_config({"env": {"id": env_id}, "agent": base})


# ---------------------------------------------------------------- the agent's losses


def test_continuous_critic_target_by_hand():
    """A fixed 'policy' (mean m, tiny std) and a linear 'critic' make the target computable by
    hand."""
    actor = lambda p, obs: (
        jnp.full(obs.shape[:-1] + (1,), p["m"]),
        jnp.full(obs.shape[:-1] + (1,), -20.0),
    )
    critic = lambda p, obs, a: (
        p["w1"] * obs[..., 0] + a[..., 0],
        p["w2"] * obs[..., 0] + a[..., 0],
    )
    critic_loss, actor_loss = sac.continuous_losses(actor, critic)
    batch = {
        "obs": jnp.array([[1.0], [2.0]]),
        "action": jnp.array([[0.5], [-0.5]]),
        "reward": jnp.array([1.0, 2.0]),
        "next_obs": jnp.array(
            [[3.0], [4.0]]
        ),  # transition 0 was truncated (terminated False): bootstraps
        "terminated": jnp.array([False, True]),
    }
    critic_p = {"w1": jnp.float32(1.0), "w2": jnp.float32(2.0)}
    target_p = {"w1": jnp.float32(0.5), "w2": jnp.float32(0.25)}
    alpha, gamma, m = 0.1, 0.9, 0.3
    loss, _ = critic_loss(
        critic_p, {"m": jnp.float32(m)}, target_p, alpha, batch, jax.random.PRNGKey(0), gamma
    )
    a_next = math.tanh(m)
    std = math.exp(-20.0)
    _, lp = losses.squashed_gaussian_sample(
        jnp.full((2, 1), m), jnp.full((2, 1), -20.0), jax.random.PRNGKey(0)
    )
    # min target Q at s'=3: min(.5*3, .25*3) + a' = .75 + a'
    y0 = 1.0 + gamma * (0.75 + a_next - 0.1 * float(lp[0]))
    y1 = 2.0
    q1 = np.array([1.0 + 0.5, 2.0 - 0.5])
    q2 = np.array([2.0 + 0.5, 4.0 - 0.5])
    y = np.array([y0, y1])
    expected = 0.5 * (np.mean((q1 - y) ** 2) + np.mean((q2 - y) ** 2))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert std < 1e-8
    # actor: a = tanh(m) everywhere, min Q(s, a) = min(1 s, 2 s) + a = s + a
    pi_loss, entropy = actor_loss(
        {"m": jnp.float32(m)}, critic_p, alpha, batch, jax.random.PRNGKey(0)
    )
    np.testing.assert_allclose(
        float(pi_loss), np.mean(alpha * np.asarray(lp) - (np.array([1.0, 2.0]) + a_next)), rtol=1e-5
    )
    np.testing.assert_allclose(float(entropy), -np.mean(np.asarray(lp)), rtol=1e-6)


def test_discrete_losses_by_hand():
    logits = jnp.log(jnp.array([0.25, 0.75]))
    actor = lambda p, obs: jnp.broadcast_to(logits, obs.shape[:-1] + (2,))
    critic = lambda p, obs: (
        obs * p["s"] + jnp.array([0.0, 1.0]),
        obs * p["s"] + jnp.array([0.5, 0.0]),
    )
    critic_loss, actor_loss = sac.discrete_losses(actor, critic)
    batch = {
        "obs": jnp.array([[1.0]]),
        "action": jnp.array([1]),
        "reward": jnp.array([1.0]),
        "next_obs": jnp.array([[2.0]]),
        "terminated": jnp.array([False]),
    }
    alpha, gamma = 0.5, 0.9
    loss, _ = critic_loss({"s": 1.0}, None, {"s": 1.0}, alpha, batch, None, gamma)
    q_next_min = np.minimum([2.0, 3.0], [2.5, 2.0])  # [2, 2]
    pi = np.array([0.25, 0.75])
    v_next = np.sum(pi * (q_next_min - alpha * np.log(pi)))
    y = 1.0 + gamma * v_next
    expected = 0.5 * ((2.0 - y) ** 2 + (1.0 - y) ** 2)  # Q1(s, 1) = 1 + 1, Q2(s, 1) = 1 + 0
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    pi_loss, entropy = actor_loss(None, {"s": 1.0}, alpha, batch, None)
    q_min = np.minimum([1.0, 2.0], [1.5, 1.0])
    np.testing.assert_allclose(float(pi_loss), np.sum(pi * (alpha * np.log(pi) - q_min)), rtol=1e-5)
    np.testing.assert_allclose(float(entropy), -np.sum(pi * np.log(pi)), rtol=1e-5)


# ---------------------------------------------------------------- training


@pytest.mark.slow
def test_sac_learns_pendulum():
    """A learning run (`-m slow`): `python benchmarks/sac.py learning --config
    configs/sac_pendulum.yaml` measures SAC's learning on Pendulum; the continuous policy's actions
    in the env's bounds are also checked by test_policy_returns_env_space_actions."""
    config = make_config(
        total_steps=4000,
        learning_starts=500,
        batch_size=64,
        network={"hidden": [64, 64]},
        log_interval=500,
        eval_episodes=4,
    )
    state, metrics = jax.jit(sac.make_train(config))(jax.random.PRNGKey(0))
    ev = np.asarray(metrics["eval_return"])
    assert np.all(np.isfinite(metrics["critic_loss"][1:]))
    assert ev[-2:].mean() > ev[0] + 300 and ev[-1] > -700, ev
    action = sac.make_policy(config)(
        state.params, jnp.array([1.0, 0.0, 0.0]), jax.random.PRNGKey(0)
    )
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0


def test_discrete_sac_trains_on_cartpole():
    config = make_config(
        "CartPole-v1",
        total_steps=4000,
        learning_starts=500,
        batch_size=64,
        network={"hidden": [64, 64]},
        log_interval=500,
        eval_episodes=4,
        lr=3e-4,
        alpha_lr=3e-4,
        target_entropy_scale=0.5,
        gamma=0.99,
    )
    _, metrics = jax.jit(sac.make_train(config))(jax.random.PRNGKey(0))
    ev = np.asarray(metrics["eval_return"])
    assert np.all(np.isfinite(metrics["critic_loss"][1:])) and np.all(np.isfinite(metrics["alpha"]))
    assert ev[-2:].mean() > 100, ev


def on_cpu():
    """Runs on the CPU: jax.default_device(CPU) where the default backend is another (a GPU), else
    no context at all (a default device set is part of jit's cache key: code run inside and outside
    the context would compile twice)."""
    if jax.default_backend() == "cpu":
        return contextlib.nullcontext()
    return jax.default_device(jax.devices("cpu")[0])


@pytest.fixture(scope="module")
def default_train():
    """`train` of make_config(): `jax.jit` of this one function compiles once for the tests that run
    it alone (the vmap check's seeds and the unroll check's rolled run). Unfused critics: the vmap
    check runs it on the CPU device, where a GPU's Triton kernel cannot run."""
    return sac.make_train(make_config(fused_network=False))


def test_vmap_over_seeds_equals_per_seed_runs(default_train):
    """On the CPU, where a batched and an unbatched program round alike (a GPU's may differ in the
    last bits, and training amplifies them)."""
    with on_cpu():
        check_vmap_over_seeds_equals_per_seed_runs(default_train)


def check_vmap_over_seeds_equals_per_seed_runs(train):
    keys = jnp.stack([jax.random.PRNGKey(1), jax.random.PRNGKey(2)])
    _, batched = jax.jit(jax.vmap(train))(keys)
    for i in range(2):
        state, single = jax.jit(train)(keys[i])
        # one 200-step Pendulum episode ends in 256 steps, reported by the env's episode statistics
        np.testing.assert_array_equal(single["episodes"], [0, 0, 0, 1])
        assert float(single["episode_length"][-1]) == 200.0 and np.isfinite(
            single["episode_return"][-1]
        )
        # uniformly random actions in [-1, 1] before learning_starts (64 steps)
        random_actions = np.asarray(state.buffer.data["action"][:64, 0])
        assert np.all(np.abs(random_actions) <= 1.0) and 0.45 < random_actions.std() < 0.7
        for name in ("step", "episode_return", "critic_loss", "actor_loss", "alpha", "eval_return"):
            np.testing.assert_allclose(
                np.asarray(batched[name][i]),
                np.asarray(single[name]),
                rtol=1e-4,
                atol=1e-5,
                err_msg=name,
            )


def test_chunked_run_equals_one_run():
    config = make_config()
    trainer = sac.make_trainer(config)
    hp = hyperparams(config.agent)
    run = jax.jit(trainer.run, static_argnums=2)
    state = jax.jit(trainer.init)(jax.random.PRNGKey(3), hp)
    whole_state, whole = run(state, hp, 4)
    half, first = run(state, hp, 2)
    half, second = run(half, hp, 2)
    for name in whole:
        np.testing.assert_array_equal(
            np.concatenate([first[name], second[name]]), whole[name], err_msg=name
        )
    jax.tree.map(np.testing.assert_array_equal, half, whole_state)


def test_unrolled_loops_compute_the_same_run(default_train):
    """agent.unroll changes loop trips only. SAC's phases are one env step and one gradient step, so
    here the loop over phases unrolls (`actor_critic.scan_phases`)."""
    key = jax.random.PRNGKey(5)
    _, rolled = jax.jit(default_train)(key)  # on a CPU-only machine, the vmap check's compile
    _, unrolled = jax.jit(sac.make_train(make_config(unroll=2, fused_network=False)))(key)
    for name in rolled:
        np.testing.assert_allclose(
            np.asarray(unrolled[name]), np.asarray(rolled[name]), rtol=1e-4, atol=1e-5, err_msg=name
        )


def test_policy_returns_env_space_actions():
    """tanh of the Gaussian mean mapped onto Pendulum's [-2, 2] as RescaleAction maps it; argmax on
    CartPole."""
    config = make_config()
    state = jax.jit(sac.make_trainer(config).init)(jax.random.PRNGKey(0), hyperparams(config.agent))
    actor = sac.make_variant(config.agent, *environment.make_env(config)).actor
    obs = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.5]])
    params = jax.tree.map(lambda x: 30.0 * x, state.params)  # means far from 0
    mean = np.tanh(np.asarray(actor.apply(params, obs)[0], np.float64))
    action = sac.make_policy(config)(params, obs, jax.random.PRNGKey(0))
    np.testing.assert_allclose(action, -2.0 + (mean + 1.0) * 2.0, rtol=1e-5, atol=1e-6)
    config = make_config("CartPole-v1")
    state = jax.jit(sac.make_trainer(config).init)(jax.random.PRNGKey(0), hyperparams(config.agent))
    actor = sac.make_variant(config.agent, *environment.make_env(config)).actor
    logits = actor.apply(state.params, jnp.ones((3, 4)))
    np.testing.assert_array_equal(
        sac.make_policy(config)(state.params, jnp.ones((3, 4)), None), np.argmax(logits, axis=-1)
    )


@pytest.mark.parametrize(
    "override, key",
    [
        (dict(utd_ratio=0.5), "agent.utd_ratio"),
        (dict(log_interval=100), "agent.total_steps"),
        (dict(num_envs=3), "agent.log_interval"),
        (dict(log_std_min=3.0), "agent.log_std_min"),
        (dict(tau=0.0), "agent.tau"),
        (dict(network={"hidden": []}), "agent.network.hidden"),
    ],
)
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_config(**override)


def test_discrete_observations_rejected():
    with pytest.raises(ConfigError, match="env.id"):
        build_config({"env": {"id": "GridWorld"}, "agent": {"name": "sac", "total_steps": 1000}})
