"""Networks written once, built as Flax or Haiku: same shapes, same parameter counts, same
initialisation rules; factorised noisy layers match their formula and are deterministic without rng."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.spaces import Discrete
from rl import networks

KEY = jax.random.PRNGKey(0)


def count(params) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def leaves_by_shape(params):
    return sorted(tuple(x.shape) for x in jax.tree.leaves(params))


def noisy_mlp(num_actions=3, hidden=(16,)):
    def fn(layers, obs):
        x = networks.mlp(layers, obs, hidden, noisy=True)
        return layers.noisy_dense(x, num_actions)

    return fn


def q_net(num_actions, hidden=(64, 64), obs_space=None):
    torso = networks.make_torso(networks.NetworkConfig(hidden=hidden), obs_space)
    return networks.with_head(torso, networks.q_head(num_actions))


def rainbow_net(num_actions, hidden, **head):
    return networks.with_head(networks.make_torso(networks.NetworkConfig(hidden=hidden)), networks.rainbow_head(num_actions, **head))


NETS = {
    "q_mlp": (lambda: q_net(4, hidden=(32, 16)), (jnp.ones((5, 6)),), (5, 4), 6 * 32 + 32 + 32 * 16 + 16 + 16 * 4 + 4),
    "q_mlp_discrete_obs": (lambda: q_net(4, hidden=(8,), obs_space=Discrete(25)), (jnp.arange(7),), (7, 4), 25 * 8 + 8 + 8 * 4 + 4),
    "noisy": (lambda: noisy_mlp(), (jnp.ones((5, 6)),), (5, 3), 2 * (6 * 16 + 16) + 2 * (16 * 3 + 3)),
    "rainbow_noisy_dueling": (lambda: rainbow_net(3, (16,), num_atoms=5), (jnp.ones((2, 4)),), (2, 3, 5), (4 * 16 + 16) + 2 * (16 * 5 + 5) + 2 * (16 * 15 + 15)),
}


@pytest.mark.parametrize("name", sorted(NETS))
def test_flax_and_haiku_agree_on_shapes_and_parameter_counts(name):
    make_fn, inputs, out_shape, num_params = NETS[name]
    results = {}
    for backend in networks.BACKENDS:
        net = networks.build(make_fn(), backend)
        params = jax.eval_shape(net.init, KEY, *inputs)  # shapes only: nothing is computed
        out = jax.eval_shape(net.apply, params, *inputs)
        out_noisy = jax.eval_shape(lambda p, *x: net.apply(p, *x, rng=jax.random.PRNGKey(1)), params, *inputs)
        assert out.shape == out_shape and out.dtype == jnp.float32
        assert out_noisy.shape == out_shape
        results[backend] = (count(params), leaves_by_shape(params))
    assert results["flax"] == results["haiku"]
    assert results["flax"][0] == num_params


@pytest.mark.parametrize("backend", networks.BACKENDS)
def test_actor_critic_and_twin_q_shapes(backend):
    obs = jnp.ones((3, 4))
    torso = networks.make_torso(networks.NetworkConfig(hidden=(8, 8)))
    ac = networks.build(networks.actor_critic(torso, networks.gaussian_policy_head(2)), backend)
    params = ac.init(KEY, obs)
    (mean, log_std), value = ac.apply(params, obs)
    assert mean.shape == log_std.shape == (3, 2) and value.shape == (3,)
    twin = networks.build(networks.twin_q(networks.make_torso(networks.NetworkConfig(hidden=(8,)))), backend)
    q1, q2 = twin.apply(twin.init(KEY, obs, jnp.ones((3, 2))), obs, jnp.ones((3, 2)))
    assert q1.shape == q2.shape == (3,) and not np.allclose(q1, q2)  # two independent networks


@pytest.mark.parametrize("backend", networks.BACKENDS)
def test_dense_init_is_orthogonal_with_gain_and_zero_bias(backend):
    net = networks.build(q_net(4, hidden=(32,)), backend)
    params = net.init(KEY, jnp.ones((1, 64)))
    weights = sorted((x for x in jax.tree.leaves(params) if x.ndim == 2), key=lambda w: w.shape[0])
    biases = [x for x in jax.tree.leaves(params) if x.ndim == 1]
    hidden_w, head_w = weights[1], weights[0]  # [64, 32] (gain sqrt 2), [32, 4] (gain 1)
    hidden_w, head_w = np.asarray(hidden_w, np.float64), np.asarray(head_w, np.float64)  # products on the host, in float64
    np.testing.assert_allclose(hidden_w.T @ hidden_w, 2.0 * np.eye(32), atol=1e-5)
    np.testing.assert_allclose(head_w.T @ head_w, np.eye(4), atol=1e-5)
    assert all(np.all(b == 0) for b in biases)


@pytest.mark.parametrize("backend", networks.BACKENDS)
def test_noisy_layers_deterministic_without_rng_stochastic_with_it(backend):
    net = networks.build(noisy_mlp(), backend)
    obs = jax.random.normal(jax.random.PRNGKey(3), (4, 6))
    params = net.init(KEY, obs)
    a, b = net.apply(params, obs), net.apply(params, obs)
    np.testing.assert_array_equal(a, b)
    n1 = net.apply(params, obs, rng=jax.random.PRNGKey(1))
    n1_again = net.apply(params, obs, rng=jax.random.PRNGKey(1))
    n2 = net.apply(params, obs, rng=jax.random.PRNGKey(2))
    np.testing.assert_array_equal(n1, n1_again)
    assert not np.allclose(n1, a) and not np.allclose(n1, n2)


@pytest.mark.parametrize("backend", networks.BACKENDS)
def test_noisy_init_ranges(backend):
    net = networks.build(noisy_mlp(hidden=(16,)), backend)
    params = net.init(KEY, jnp.ones((1, 9)))
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): v for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    sigmas = [v for k, v in flat.items() if "sigma" in k]
    mus = [v for k, v in flat.items() if "mu" in k]
    assert len(sigmas) == 4 and len(mus) == 4
    for v in sigmas:  # sigma0 / sqrt(fan_in), fan_in 9 (first layer) or 16 (second)
        assert np.allclose(v, 0.5 / 3.0) or np.allclose(v, 0.5 / 4.0)
    for v in mus:
        assert np.abs(v).max() <= 1.0 / 3.0 + 1e-6


def test_noisy_dense_matches_the_explicit_noise_matrix():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5)).astype(np.float32)
    w_mu, w_sigma = rng.normal(size=(5, 4)).astype(np.float32), rng.random((5, 4)).astype(np.float32)
    b_mu, b_sigma = rng.normal(size=4).astype(np.float32), rng.random(4).astype(np.float32)
    key = jax.random.PRNGKey(7)
    out = np.asarray(networks._noisy_dense(jnp.asarray(x), 4, w_mu, w_sigma, b_mu, b_sigma, key))
    # the same noise draws, then the dense formula y = x (mu + sigma * f(e_in) f(e_out)^T) + b
    k_in, k_out = jax.random.split(key)
    f = lambda e: np.sign(e) * np.sqrt(np.abs(e))
    e_in, e_out = f(np.asarray(jax.random.normal(k_in, (5,)), np.float64)), f(np.asarray(jax.random.normal(k_out, (4,)), np.float64))
    w = w_mu + w_sigma * np.outer(e_in, e_out)
    expected = x.astype(np.float64) @ w + b_mu + b_sigma * e_out
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(networks._noisy_dense(jnp.asarray(x), 4, w_mu, w_sigma, b_mu, b_sigma, None)), x @ w_mu + b_mu, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", networks.BACKENDS)
def test_batched_apply_equals_per_example_apply(backend):
    net = networks.build(q_net(2, hidden=(8,)), backend)
    obs = jax.random.normal(jax.random.PRNGKey(4), (6, 3))
    params = net.init(KEY, obs[0])
    batched = net.apply(params, obs)
    per_example = jax.vmap(lambda o: net.apply(params, o))(obs)
    np.testing.assert_allclose(batched, per_example, rtol=1e-6, atol=1e-6)


def test_bad_backend_and_activation():
    with pytest.raises(ValueError, match="unknown network backend 'torch'"):
        networks.build(q_net(2), "torch")
    with pytest.raises(ValueError, match="unknown activation 'sigmoidish'"):
        networks.activation("sigmoidish")


def test_network_config_from_yaml_merges_over_the_agents_defaults_and_names_bad_keys():
    from rl.config import ConfigError, build_config

    base = {"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo"}}
    assert build_config(base).agent.network == networks.NetworkConfig(hidden=(64, 64), activation="tanh")
    config = build_config({**base, "agent": {"name": "ppo", "network": {"hidden": [32]}}})
    assert config.agent.network.hidden == (32,) and config.agent.network.activation == "tanh"  # default kept
    with pytest.raises(ConfigError, match="agent.network.hidden"):
        build_config({**base, "agent": {"name": "ppo", "network": {"hidden": [8, 0]}}})
    with pytest.raises(ConfigError, match="unknown key 'agent.network.hiden'.*did you mean 'agent.network.hidden'"):
        build_config({**base, "agent": {"name": "ppo", "network": {"hiden": [8]}}})
    with pytest.raises(ConfigError, match="agent.network.torso"):
        build_config({**base, "agent": {"name": "ppo", "network": {"torso": "transformer"}}})
    with pytest.raises(ConfigError, match="agent.network: expected a mapping"):
        build_config({**base, "agent": {"name": "ppo", "network": [64, 64]}})


@pytest.mark.parametrize("backend", networks.BACKENDS)
def test_torso_and_heads_compose(backend):
    """Two torso calls make two torsos; a shared actor-critic has one; heads give their shapes."""
    torso = networks.make_torso(networks.NetworkConfig(hidden=(8,)))
    obs = jnp.ones((3, 4))
    separate = networks.build(networks.actor_critic(torso, networks.categorical_policy_head(5)), backend)
    shared = networks.build(networks.actor_critic(torso, networks.categorical_policy_head(5), shared=True), backend)
    p_sep, p_shared = separate.init(KEY, obs), shared.init(KEY, obs)
    assert count(p_sep) == 2 * (4 * 8 + 8) + (8 * 5 + 5) + (8 + 1)
    assert count(p_shared) == (4 * 8 + 8) + (8 * 5 + 5) + (8 + 1)
    logits, value = separate.apply(p_sep, obs)
    assert logits.shape == (3, 5) and value.shape == (3,)
    squashed = networks.build(networks.with_head(torso, networks.squashed_gaussian_head(2, -5.0, 2.0)), backend)
    mean, log_std = squashed.apply(squashed.init(KEY, obs), obs * 100.0)
    assert mean.shape == log_std.shape == (3, 2) and np.all((log_std >= -5.0) & (log_std <= 2.0))
