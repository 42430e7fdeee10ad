"""SAC: the squashed-Gaussian log-probability against numerical checks, the losses against hand
computations (truncation bootstraps, termination does not), short training runs, chunking and vmap."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.agents import sac
from rl.config import ConfigError, build_config, hyperparams


def make_config(env_id="Pendulum-v1", **agent):
    base = dict(name="sac", total_steps=256, learning_starts=64, batch_size=32, buffer_size=1000, hidden=[16, 16], log_interval=64, eval_episodes=2)
    base.update(agent)
    return build_config({"env": {"id": env_id}, "agent": base})


# ---------------------------------------------------------------- squashed Gaussian


def test_tanh_log_det_jacobian_matches_float64_and_is_stable():
    u = np.linspace(-8.0, 8.0, 101)
    np.testing.assert_allclose(sac.tanh_log_det_jacobian(jnp.asarray(u, jnp.float32)), np.log(1.0 - np.tanh(u) ** 2), rtol=1e-5, atol=1e-5)
    big = sac.tanh_log_det_jacobian(jnp.array([-60.0, 60.0]))
    np.testing.assert_allclose(big, 2 * (math.log(2.0) - 60.0), rtol=1e-6)  # naive log(1 - tanh^2) = log 0 = -inf
    assert np.all(np.isfinite(jax.grad(lambda x: sac.tanh_log_det_jacobian(x).sum())(jnp.array([-60.0, 0.3, 60.0]))))


def test_squashed_log_prob_is_the_change_of_variables_density():
    """p_A(a) = p_U(atanh a) / |d tanh(u)/du|, with the derivative taken by central finite differences (float64)."""
    mean, log_std = 0.4, math.log(0.7)
    u = np.array([-2.5, -1.0, 0.0, 0.3, 1.7, 3.0])
    h = 1e-6
    jac = (np.tanh(u + h) - np.tanh(u - h)) / (2 * h)
    sigma = math.exp(log_std)
    p_u = np.exp(-0.5 * ((u - mean) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
    expected = np.log(p_u / jac)
    got = sac.squashed_gaussian_log_prob(jnp.full((6, 1), mean), jnp.full((6, 1), log_std), jnp.asarray(u, jnp.float32)[:, None])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_squashed_density_integrates_to_one_and_matches_monte_carlo():
    mean, log_std = -0.6, math.log(1.3)
    # quadrature in action space: a = tanh(u), integrate exp(log pi(a)) over (-1, 1)
    a = np.linspace(-1 + 1e-6, 1 - 1e-6, 200_001)
    u = np.arctanh(a)
    density = np.exp(np.asarray(sac.squashed_gaussian_log_prob(jnp.full((a.size, 1), mean), jnp.full((a.size, 1), log_std), jnp.asarray(u, jnp.float32)[:, None]), np.float64))
    assert abs(np.trapezoid(density, a) - 1.0) < 2e-3
    # Monte Carlo: bin probabilities of sampled actions vs the integral of the density over each bin
    actions, log_probs = sac.squashed_gaussian_sample(jnp.full((200_000, 1), mean), jnp.full((200_000, 1), log_std), jax.random.PRNGKey(0))
    actions = np.asarray(actions)[:, 0]
    edges = np.linspace(-1, 1, 11)
    counts = np.histogram(actions, edges)[0] / actions.size
    for lo, hi, frac in zip(edges[:-1], edges[1:], counts):
        inside = (a >= lo) & (a <= hi)
        assert abs(np.trapezoid(density[inside], a[inside]) - frac) < 0.006, (lo, hi)
    # the sampler's log-probabilities are the density at the sampled actions
    u_s = np.arctanh(np.clip(actions.astype(np.float64), -1 + 1e-7, 1 - 1e-7))[:1000]
    ref = sac.squashed_gaussian_log_prob(jnp.full((1000, 1), mean), jnp.full((1000, 1), log_std), jnp.asarray(u_s, jnp.float32)[:, None])
    np.testing.assert_allclose(np.asarray(log_probs)[:1000], ref, rtol=1e-3, atol=2e-3)


def test_log_prob_sums_over_action_dimensions():
    mean = jnp.array([[0.1, -0.2]])
    log_std = jnp.array([[0.0, -0.5]])
    u = jnp.array([[0.5, 0.2]])
    joint = sac.squashed_gaussian_log_prob(mean, log_std, u)
    parts = sum(sac.squashed_gaussian_log_prob(mean[:, i : i + 1], log_std[:, i : i + 1], u[:, i : i + 1]) for i in range(2))
    np.testing.assert_allclose(joint, parts, rtol=1e-6)


# ---------------------------------------------------------------- losses by hand


def test_polyak_and_alpha_loss():
    out = sac.polyak({"w": jnp.array([0.0, 10.0])}, {"w": jnp.array([1.0, 0.0])}, 0.1)
    np.testing.assert_allclose(out["w"], [0.1, 9.0])
    # entropy above the target: alpha's gradient is positive, so gradient descent lowers alpha
    assert float(jax.grad(sac.alpha_loss)(jnp.float32(0.0), jnp.float32(2.0), jnp.float32(-1.0))) == pytest.approx(3.0)


def test_continuous_critic_target_by_hand():
    """A fixed 'policy' (mean m, tiny std) and a linear 'critic' make the target computable by hand."""
    actor = lambda p, obs: (jnp.full(obs.shape[:-1] + (1,), p["m"]), jnp.full(obs.shape[:-1] + (1,), -20.0))
    critic = lambda p, obs, a: (p["w1"] * obs[..., 0] + a[..., 0], p["w2"] * obs[..., 0] + a[..., 0])
    critic_loss, actor_loss = sac.continuous_losses(actor, critic)
    batch = {
        "obs": jnp.array([[1.0], [2.0]]),
        "action": jnp.array([[0.5], [-0.5]]),
        "reward": jnp.array([1.0, 2.0]),
        "next_obs": jnp.array([[3.0], [4.0]]),  # transition 0 was truncated (terminated False): bootstraps
        "terminated": jnp.array([False, True]),
    }
    critic_p = {"w1": jnp.float32(1.0), "w2": jnp.float32(2.0)}
    target_p = {"w1": jnp.float32(0.5), "w2": jnp.float32(0.25)}
    log_alpha, gamma, m = jnp.log(0.1), 0.9, 0.3
    loss, _ = critic_loss(critic_p, {"m": jnp.float32(m)}, target_p, log_alpha, batch, jax.random.PRNGKey(0), gamma)
    a_next = math.tanh(m)
    std = math.exp(-20.0)
    _, lp = sac.squashed_gaussian_sample(jnp.full((2, 1), m), jnp.full((2, 1), -20.0), jax.random.PRNGKey(0))
    # min target Q at s'=3: min(.5*3, .25*3) + a' = .75 + a'
    y0 = 1.0 + gamma * (0.75 + a_next - 0.1 * float(lp[0]))
    y1 = 2.0
    q1 = np.array([1.0 + 0.5, 2.0 - 0.5])
    q2 = np.array([2.0 + 0.5, 4.0 - 0.5])
    y = np.array([y0, y1])
    expected = 0.5 * (np.mean((q1 - y) ** 2) + np.mean((q2 - y) ** 2))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert std < 1e-8


def test_discrete_losses_by_hand():
    logits = jnp.log(jnp.array([0.25, 0.75]))
    actor = lambda p, obs: jnp.broadcast_to(logits, obs.shape[:-1] + (2,))
    critic = lambda p, obs: (obs * p["s"] + jnp.array([0.0, 1.0]), obs * p["s"] + jnp.array([0.5, 0.0]))
    critic_loss, actor_loss = sac.discrete_losses(actor, critic)
    batch = {"obs": jnp.array([[1.0]]), "action": jnp.array([1]), "reward": jnp.array([1.0]), "next_obs": jnp.array([[2.0]]), "terminated": jnp.array([False])}
    alpha, gamma = 0.5, 0.9
    loss, _ = critic_loss({"s": 1.0}, None, {"s": 1.0}, jnp.log(alpha), batch, None, gamma)
    q_next_min = np.minimum([2.0, 3.0], [2.5, 2.0])  # [2, 2]
    pi = np.array([0.25, 0.75])
    v_next = np.sum(pi * (q_next_min - alpha * np.log(pi)))
    y = 1.0 + gamma * v_next
    expected = 0.5 * ((2.0 - y) ** 2 + (1.0 - y) ** 2)  # Q1(s, 1) = 1 + 1, Q2(s, 1) = 1 + 0
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    pi_loss, entropy = actor_loss(None, {"s": 1.0}, jnp.log(alpha), batch, None)
    q_min = np.minimum([1.0, 2.0], [1.5, 1.0])
    np.testing.assert_allclose(float(pi_loss), np.sum(pi * (alpha * np.log(pi) - q_min)), rtol=1e-5)
    np.testing.assert_allclose(float(entropy), -np.sum(pi * np.log(pi)), rtol=1e-5)


# ---------------------------------------------------------------- training


def test_sac_learns_pendulum():
    config = make_config(total_steps=4000, learning_starts=500, batch_size=64, hidden=[64, 64], log_interval=500, eval_episodes=4)
    state, metrics = jax.jit(sac.make_train(config))(jax.random.PRNGKey(0))
    ev = np.asarray(metrics["eval_return"])
    assert np.all(np.isfinite(metrics["critic_loss"][1:]))
    assert ev[-2:].mean() > ev[0] + 300 and ev[-1] > -700, ev
    action = sac.make_policy(config)(state["params"], jnp.array([1.0, 0.0, 0.0]), jax.random.PRNGKey(0))
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0


def test_discrete_sac_trains_on_cartpole():
    config = make_config("CartPole-v1", total_steps=4000, learning_starts=500, batch_size=64, hidden=[64, 64], log_interval=500, eval_episodes=4, lr=3e-4, alpha_lr=3e-4, target_entropy_scale=0.5, gamma=0.99)
    _, metrics = jax.jit(sac.make_train(config))(jax.random.PRNGKey(0))
    ev = np.asarray(metrics["eval_return"])
    assert np.all(np.isfinite(metrics["critic_loss"][1:])) and np.all(np.isfinite(metrics["alpha"]))
    assert ev[-2:].mean() > 100, ev


def test_vmap_over_seeds_equals_per_seed_runs():
    config = make_config()
    train = sac.make_train(config)
    keys = jnp.stack([jax.random.PRNGKey(1), jax.random.PRNGKey(2)])
    _, batched = jax.jit(jax.vmap(train))(keys)
    for i in range(2):
        _, single = jax.jit(train)(keys[i])
        for name in ("step", "episode_return", "critic_loss", "actor_loss", "alpha", "eval_return"):
            np.testing.assert_allclose(np.asarray(batched[name][i]), np.asarray(single[name]), rtol=1e-4, atol=1e-5, err_msg=name)


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
        np.testing.assert_array_equal(np.concatenate([first[name], second[name]]), whole[name], err_msg=name)
    jax.tree.map(np.testing.assert_array_equal, half, whole_state)


@pytest.mark.parametrize(
    "override, key",
    [
        (dict(utd_ratio=0.5), "agent.utd_ratio"),
        (dict(log_interval=100), "agent.total_steps"),
        (dict(num_envs=3), "agent.log_interval"),
        (dict(log_std_min=3.0), "agent.log_std_min"),
        (dict(tau=0.0), "agent.tau"),
    ],
)
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_config(**override)


def test_discrete_observations_rejected():
    with pytest.raises(ConfigError, match="env.id"):
        build_config({"env": {"id": "GridWorld"}, "agent": {"name": "sac", "total_steps": 1000}})
