"""Networks written once, built as Flax or Haiku: same shapes, same parameter counts, same
initialisation rules; factorised noisy layers match their formula and are deterministic without
rng."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.spaces import Discrete
from rl.nn import layers, networks
from rl.nn.layers import activation, mlp
from rl.nn.network_config import RECURRENT_TORSOS, NetworkConfig

pytestmark = pytest.mark.usefixtures(
    "full_precision_matmuls"
)  # exact float32 comparisons, also on the GPU

KEY = jax.random.PRNGKey(0)


def count(params) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def leaves_by_shape(params):
    return sorted(tuple(x.shape) for x in jax.tree.leaves(params))


def noisy_mlp(num_actions=3, hidden=(16,)):
    def fn(layers, obs):
        x = mlp(layers, obs, hidden, noisy=True)
        return layers.noisy_dense(x, num_actions)

    return fn


def q_net(num_actions, hidden=(64, 64), obs_space=None):
    torso = networks.make_torso(NetworkConfig(hidden=hidden), obs_space)
    return networks.with_head(torso, networks.q_head(num_actions))


def rainbow_net(num_actions, hidden, **head):
    return networks.with_head(
        networks.make_torso(NetworkConfig(hidden=hidden)),
        networks.rainbow_head(num_actions, **head),
    )


NETS = {
    "q_mlp": (
        lambda: q_net(4, hidden=(32, 16)),
        (jnp.ones((5, 6)),),
        (5, 4),
        6 * 32 + 32 + 32 * 16 + 16 + 16 * 4 + 4,
    ),
    "q_mlp_discrete_obs": (
        lambda: q_net(4, hidden=(8,), obs_space=Discrete(25)),
        (jnp.arange(7),),
        (7, 4),
        25 * 8 + 8 + 8 * 4 + 4,
    ),
    "noisy": (
        lambda: noisy_mlp(),
        (jnp.ones((5, 6)),),
        (5, 3),
        2 * (6 * 16 + 16) + 2 * (16 * 3 + 3),
    ),
    "rainbow_noisy_dueling": (
        lambda: rainbow_net(3, (16,), num_atoms=5),
        (jnp.ones((2, 4)),),
        (2, 3, 5),
        (4 * 16 + 16) + 2 * (16 * 5 + 5) + 2 * (16 * 15 + 15),
    ),
}


@pytest.mark.parametrize("name", sorted(NETS))
def test_flax_and_haiku_agree_on_shapes_and_parameter_counts(name):
    make_fn, inputs, out_shape, num_params = NETS[name]
    results = {}
    for backend in layers.BACKENDS:
        net = layers.build(make_fn(), backend)
        params = jax.eval_shape(net.init, KEY, *inputs)  # shapes only: nothing is computed
        out = jax.eval_shape(net.apply, params, *inputs)
        out_noisy = jax.eval_shape(
            lambda p, *x: net.apply(p, *x, rng=jax.random.PRNGKey(1)), params, *inputs
        )
        assert out.shape == out_shape and out.dtype == jnp.float32
        assert out_noisy.shape == out_shape
        results[backend] = (count(params), leaves_by_shape(params))
    assert results["flax"] == results["haiku"]
    assert results["flax"][0] == num_params


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_actor_critic_and_twin_q_shapes(backend):
    obs = jnp.ones((3, 4))
    torso = networks.make_torso(NetworkConfig(hidden=(8, 8)))
    ac = layers.build(networks.actor_critic(torso, networks.gaussian_policy_head(2)), backend)
    params = ac.init(KEY, obs)
    (mean, log_std), value = ac.apply(params, obs)
    assert mean.shape == log_std.shape == (3, 2) and value.shape == (3,)
    twin = layers.build(networks.twin_q(networks.make_torso(NetworkConfig(hidden=(8,)))), backend)
    q1, q2 = twin.apply(twin.init(KEY, obs, jnp.ones((3, 2))), obs, jnp.ones((3, 2)))
    assert q1.shape == q2.shape == (3,) and not np.allclose(q1, q2)  # two independent networks


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_dense_init_is_orthogonal_with_gain_and_zero_bias(backend):
    net = layers.build(q_net(4, hidden=(32,)), backend)
    params = net.init(KEY, jnp.ones((1, 64)))
    weights = sorted((x for x in jax.tree.leaves(params) if x.ndim == 2), key=lambda w: w.shape[0])
    biases = [x for x in jax.tree.leaves(params) if x.ndim == 1]
    hidden_w, head_w = weights[1], weights[0]  # [64, 32] (gain sqrt 2), [32, 4] (gain 1)
    hidden_w, head_w = (
        np.asarray(hidden_w, np.float64),
        np.asarray(head_w, np.float64),
    )  # products on the host, in float64
    np.testing.assert_allclose(hidden_w.T @ hidden_w, 2.0 * np.eye(32), atol=1e-5)
    np.testing.assert_allclose(head_w.T @ head_w, np.eye(4), atol=1e-5)
    assert all(np.all(b == 0) for b in biases)


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_lecun_uniform_init_draws_uniform_weights_of_variance_one_over_fan_in(backend):
    """init="lecun_uniform": every dense and conv kernel, head or hidden, is U(+-sqrt(3 / fan_in))
    (bounds, mean 0, variance 1 / fan_in; a KS test against that uniform), biases 0."""
    from scipy import stats

    from envs.spaces import Box

    torso = networks.make_torso(
        NetworkConfig(torso="cnn_minatar", hidden=(64,)), Box(0.0, 1.0, (10, 10, 4))
    )
    net = layers.build(
        networks.with_head(torso, networks.categorical_policy_head(6)),
        backend,
        init="lecun_uniform",
    )
    params = net.init(KEY, jnp.ones((1, 10, 10, 4)))
    kernels = [np.asarray(x, np.float64) for x in jax.tree.leaves(params) if x.ndim >= 2]
    assert sorted(k.shape for k in kernels) == sorted([(3, 3, 4, 16), (1024, 64), (64, 6)])
    for w in kernels:
        bound = math.sqrt(3.0 / int(np.prod(w.shape[:-1])))
        assert np.abs(w).max() <= bound
        assert stats.kstest(w.ravel(), stats.uniform(-bound, 2 * bound).cdf).pvalue > 1e-3
    assert all(np.all(np.asarray(b) == 0) for b in jax.tree.leaves(params) if b.ndim == 1)
    with pytest.raises(ValueError, match="unknown network init 'xavier'"):
        layers.build(q_net(2), backend, init="xavier")


@pytest.mark.parametrize("agent", ["ppo", "ppo_rnn", "rainbow", "dqn", "pqn", "sac", "td3"])
def test_every_agent_builds_its_networks_with_the_configured_init(agent, monkeypatch):
    """agent.network.init reaches `layers.build` from every agent that has networks (the agents'
    own network builders, run on a small env)."""
    from rl.config import build_config
    from rl.config.registry import get_agent_module

    env_id = "Pendulum-v1" if agent in ("sac", "td3") else "CartPole-v1"
    network = {
        "init": "lecun_uniform",
        **({"torso": "gru", "hidden": [8]} if agent == "ppo_rnn" else {}),
    }
    steps = {"pqn": {"total_steps": 65536}}.get(agent, {})
    config = build_config(
        {"env": {"id": env_id}, "agent": {"name": agent, "network": network, **steps}}
    )
    seen, build = [], layers.build

    def spy(fn, backend="flax", init="orthogonal"):
        seen.append(init)
        return build(fn, backend, init)

    monkeypatch.setattr(layers, "build", spy)
    monkeypatch.setattr(networks, "build", spy)  # networks.q_network's (DQN, PQN)
    get_agent_module(agent).make_train(config)
    assert seen and set(seen) == {"lecun_uniform"}, seen


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_noisy_layers_deterministic_without_rng_stochastic_with_it(backend):
    net = layers.build(noisy_mlp(), backend)
    obs = jax.random.normal(jax.random.PRNGKey(3), (4, 6))
    params = net.init(KEY, obs)
    a, b = net.apply(params, obs), net.apply(params, obs)
    np.testing.assert_array_equal(a, b)
    n1 = net.apply(params, obs, rng=jax.random.PRNGKey(1))
    n1_again = net.apply(params, obs, rng=jax.random.PRNGKey(1))
    n2 = net.apply(params, obs, rng=jax.random.PRNGKey(2))
    np.testing.assert_array_equal(n1, n1_again)
    assert not np.allclose(n1, a) and not np.allclose(n1, n2)


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_noisy_init_ranges(backend):
    net = layers.build(noisy_mlp(hidden=(16,)), backend)
    params = net.init(KEY, jnp.ones((1, 9)))
    flat = {
        "/".join(str(getattr(k, "key", k)) for k in path): v
        for path, v in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    sigmas = [v for k, v in flat.items() if "sigma" in k]
    mus = [v for k, v in flat.items() if "mu" in k]
    assert len(sigmas) == 4 and len(mus) == 4
    for v in sigmas:  # sigma0 / sqrt(fan_in), fan_in 9 (first layer) or 16 (second)
        assert np.allclose(v, 0.5 / 3.0) or np.allclose(v, 0.5 / 4.0)
    for v in mus:
        assert np.abs(v).max() <= 1.0 / 3.0 + 1e-6


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_noisy_layers_match_the_explicit_noise_matrix(backend):
    """Two noisy layers through `apply(rng=key)`: layer i's noise is one normal draw of fan_in +
    features entries from fold_in(key, i), f(e) = sign(e) sqrt(|e|), and the layer is the dense
    formula y = x (mu + sigma * f(e_in) f(e_out)^T) + b_mu + b_sigma * f(e_out) (float64 here)."""
    net = layers.build(
        lambda lay, x: lay.noisy_dense(jax.nn.relu(lay.noisy_dense(x, 4)), 3), backend=backend
    )
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    params = net.init(jax.random.PRNGKey(1), jnp.asarray(x))
    leaves = {
        "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v, np.float64)
        for path, v in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    key = jax.random.PRNGKey(7)
    f = lambda e: np.sign(e) * np.sqrt(np.abs(e))

    def layer(h, i, fan_in, features, noisy):
        find = lambda part: next(v for k, v in leaves.items() if f"noisy_{i}" in k and part in k)
        w_mu, w_sigma, b_mu, b_sigma = (find(p) for p in ("w_mu", "w_sigma", "b_mu", "b_sigma"))
        if not noisy:
            return h @ w_mu + b_mu
        e = f(np.asarray(jax.random.normal(jax.random.fold_in(key, i), (fan_in + features,))))
        e_in, e_out = e[:fan_in], e[fan_in:]
        return h @ (w_mu + w_sigma * np.outer(e_in, e_out)) + b_mu + b_sigma * e_out

    for rng, noisy in ((key, True), (None, False)):
        expected = layer(np.maximum(layer(x, 0, 5, 4, noisy), 0.0), 1, 4, 3, noisy)
        out = np.asarray(net.apply(params, jnp.asarray(x), rng=rng))
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_batched_apply_equals_per_example_apply(backend):
    net = layers.build(q_net(2, hidden=(8,)), backend)
    obs = jax.random.normal(jax.random.PRNGKey(4), (6, 3))
    params = net.init(KEY, obs[0])
    batched = net.apply(params, obs)
    per_example = jax.vmap(lambda o: net.apply(params, o))(obs)
    np.testing.assert_allclose(batched, per_example, rtol=1e-6, atol=1e-6)


def test_bad_backend_and_activation():
    with pytest.raises(ValueError, match="unknown network backend 'torch'"):
        layers.build(q_net(2), "torch")
    with pytest.raises(ValueError, match="unknown activation 'sigmoidish'"):
        activation("sigmoidish")


def test_network_config_from_yaml_merges_over_the_agents_defaults_and_names_bad_keys():
    from rl.config import build_config
    from rl.config.parsing import ConfigError

    base = {"env": {"id": "CartPole-v1"}, "agent": {"name": "ppo"}}
    assert build_config(base).agent.network == NetworkConfig(hidden=(64, 64), activation="tanh")
    config = build_config({**base, "agent": {"name": "ppo", "network": {"hidden": [32]}}})
    assert (
        config.agent.network.hidden == (32,) and config.agent.network.activation == "tanh"
    )  # default kept
    with pytest.raises(ConfigError, match="agent.network.hidden"):
        build_config({**base, "agent": {"name": "ppo", "network": {"hidden": [8, 0]}}})
    with pytest.raises(
        ConfigError, match="unknown key 'agent.network.hiden'.*did you mean 'agent.network.hidden'"
    ):
        build_config({**base, "agent": {"name": "ppo", "network": {"hiden": [8]}}})
    with pytest.raises(ConfigError, match="agent.network.torso"):
        build_config({**base, "agent": {"name": "ppo", "network": {"torso": "transformer"}}})
    with pytest.raises(ConfigError, match="agent.network: expected a mapping"):
        build_config({**base, "agent": {"name": "ppo", "network": [64, 64]}})


@pytest.mark.parametrize("backend", layers.BACKENDS)
def test_torso_and_heads_compose(backend):
    """Two torso calls make two torsos; a shared actor-critic has one; heads give their shapes."""
    torso = networks.make_torso(NetworkConfig(hidden=(8,)))
    obs = jnp.ones((3, 4))
    separate = layers.build(
        networks.actor_critic(torso, networks.categorical_policy_head(5)), backend
    )
    shared = layers.build(
        networks.actor_critic(torso, networks.categorical_policy_head(5), shared=True), backend
    )
    p_sep, p_shared = separate.init(KEY, obs), shared.init(KEY, obs)
    assert count(p_sep) == 2 * (4 * 8 + 8) + (8 * 5 + 5) + (8 + 1)
    assert count(p_shared) == (4 * 8 + 8) + (8 * 5 + 5) + (8 + 1)
    logits, value = separate.apply(p_sep, obs)
    assert logits.shape == (3, 5) and value.shape == (3,)
    squashed = layers.build(
        networks.with_head(torso, networks.squashed_gaussian_head(2, -5.0, 2.0)), backend
    )
    mean, log_std = squashed.apply(squashed.init(KEY, obs), obs * 100.0)
    assert mean.shape == log_std.shape == (3, 2) and np.all((log_std >= -5.0) & (log_std <= 2.0))


# ---------------------------------------------------------------- recurrent torsos (GRU, LSTM)


def recurrent_torso(cell, hidden=(8,), size=5, obs_space=None):
    return networks.make_torso(
        NetworkConfig(torso=cell, hidden=hidden, recurrent_hidden=size), obs_space
    )


def run_torso(backend, torso, carry, obs, reset, key=KEY):
    net = layers.build(torso, backend)
    params = net.init(key, carry, obs, reset)
    return net, params, net.apply(params, carry, obs, reset)


@pytest.mark.parametrize("backend", layers.BACKENDS)
@pytest.mark.parametrize("cell", RECURRENT_TORSOS)
def test_recurrent_torso_shapes_on_both_backends(backend, cell):
    """obs [T, *batch, D], reset [T, *batch] -> features [T, *batch, size] and the carry of
    initial_carry(batch) (GRU: h; LSTM: (h, c)); any batch shape, none included."""
    torso = recurrent_torso(cell)
    for batch in [(3,), (2, 3), ()]:
        carry = torso.initial_carry(batch)
        obs, reset = jnp.ones((4, *batch, 6)), jnp.zeros((4, *batch), bool)
        _, params, (new_carry, features) = run_torso(backend, torso, carry, obs, reset)
        assert features.shape == (4, *batch, 5)
        assert jax.tree.map(jnp.shape, new_carry) == jax.tree.map(jnp.shape, carry)
        want = (*batch, 5) if cell == "gru" else ((*batch, 5), (*batch, 5))
        assert jax.tree.map(jnp.shape, carry) == want and all(
            not np.any(c) for c in jax.tree.leaves(carry)
        )
        gates = 3 if cell == "gru" else 4
        # embedding 6 -> 8, input projection 8 -> gates * 5 (+ bias), recurrent kernel
        # 5 x gates * 5 (+ GRU's candidate bias)
        assert count(params) == 6 * 8 + 8 + 8 * gates * 5 + gates * 5 + 5 * gates * 5 + (
            5 if cell == "gru" else 0
        )
    assert jax.tree.map(jnp.shape, torso.initial_carry(7)) == jax.tree.map(
        jnp.shape, torso.initial_carry((7,))
    )


@pytest.mark.parametrize("cell", RECURRENT_TORSOS)
def test_recurrent_flax_and_haiku_agree_on_structure(cell):
    """The same parameters on both backends (shapes and count), for the actor-critic with separate
    cells, and the same output shapes; the recurrent kernels are orthogonal per gate on both."""
    torso = recurrent_torso(cell, hidden=(8,), size=6)
    fn = networks.recurrent_actor_critic(torso, networks.categorical_policy_head(3))
    carry, obs, reset = fn.initial_carry(2), jnp.ones((5, 2, 4)), jnp.zeros((5, 2), bool)
    shapes, outs = {}, {}
    for backend in layers.BACKENDS:
        net = layers.build(fn, backend)
        params = net.init(KEY, carry, obs, reset)
        shapes[backend] = leaves_by_shape(params)
        outs[backend] = jax.tree.map(jnp.shape, net.apply(params, carry, obs, reset))
        kernels = [
            x
            for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
            if "recurrent_kernel" in jax.tree_util.keystr(path)
        ]
        assert len(kernels) == 2  # one cell each for actor and critic
        for kernel in kernels:
            for block in np.split(np.asarray(kernel), 3 if cell == "gru" else 4, axis=-1):
                np.testing.assert_allclose(block.T @ block, np.eye(6), atol=1e-5)
    assert shapes["flax"] == shapes["haiku"]
    assert outs["flax"] == outs["haiku"] == (jax.tree.map(jnp.shape, carry), ((5, 2, 3), (5, 2)))


def test_gru_equals_flax_gru_cell():
    """The GRU step is Flax's nn.GRUCell with the same weights (input kernels [ir|iz|in] with
    biases, recurrent kernels [hr|hz|hn], hn's bias the candidate bias)."""
    import flax.linen as nn

    torso = recurrent_torso("gru", hidden=(), size=4)
    obs = jax.random.normal(jax.random.PRNGKey(1), (6, 3, 5))
    reset = jnp.zeros((6, 3), bool)
    carry = jax.random.normal(jax.random.PRNGKey(2), (3, 4))
    _, params, (_, features) = run_torso("flax", torso, carry, obs, reset)
    p = params["params"]
    w_i, b_i = np.split(p["Dense_0"]["kernel"], 3, -1), np.split(p["Dense_0"]["bias"], 3, -1)
    w_h = np.split(p["gru_0_recurrent_kernel"], 3, -1)
    cell_params = {
        "params": {
            "ir": {"kernel": w_i[0], "bias": b_i[0]},
            "iz": {"kernel": w_i[1], "bias": b_i[1]},
            "in": {"kernel": w_i[2], "bias": b_i[2]},
            "hr": {"kernel": w_h[0]},
            "hz": {"kernel": w_h[1]},
            "hn": {"kernel": w_h[2], "bias": p["gru_0_candidate_bias"]},
        }
    }
    cell, h, want = nn.GRUCell(features=4), carry, []
    for t in range(6):
        h, _ = cell.apply(cell_params, h, obs[t])
        want.append(h)
    np.testing.assert_allclose(features, np.stack(want), rtol=1e-5, atol=1e-6)


def test_lstm_equals_haiku_lstm():
    """The LSTM step is Haiku's hk.LSTM (forget bias +1) with the same weights: Haiku's one linear
    layer over concat(x, h) holds [W_i; W_h] with the gates in the order (i, g, f, o) instead of
    (i, f, g, o)."""
    import haiku as hk

    torso = recurrent_torso("lstm", hidden=(), size=4)
    obs = jax.random.normal(jax.random.PRNGKey(1), (6, 3, 5))
    reset = jnp.zeros((6, 3), bool)
    carry = (
        jax.random.normal(jax.random.PRNGKey(2), (3, 4)),
        jax.random.normal(jax.random.PRNGKey(3), (3, 4)),
    )
    _, params, ((h_last, c_last), features) = run_torso("haiku", torso, carry, obs, reset)
    order = lambda x: np.concatenate(
        [np.split(x, 4, -1)[i] for i in (0, 2, 1, 3)], -1
    )  # (i, f, g, o) -> (i, g, f, o)
    w = np.concatenate(
        [order(params["linear"]["w"]), order(params["~"]["lstm_0_recurrent_kernel"])], axis=0
    )
    lstm = hk.without_apply_rng(hk.transform(lambda x, state: hk.LSTM(4)(x, state)))
    state, want = hk.LSTMState(hidden=carry[0], cell=carry[1]), []
    for t in range(6):
        out, state = lstm.apply(
            {"lstm/linear": {"w": w, "b": order(params["linear"]["b"])}}, obs[t], state
        )
        want.append(out)
    np.testing.assert_allclose(features, np.stack(want), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c_last, state.cell, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", layers.BACKENDS)
@pytest.mark.parametrize("cell", RECURRENT_TORSOS)
def test_recurrent_reset_puts_the_carry_back_before_the_cell(backend, cell):
    """A hand-made sequence of resets: where reset[t] the step reads the initial carry, whatever
    came before, so the outputs from t on equal a fresh run from the initial carry on obs[t:];
    elsewhere the state goes on (a run split at a step without reset equals the whole run)."""
    torso = recurrent_torso(cell)
    T = 7
    obs = jax.random.normal(jax.random.PRNGKey(1), (T, 2, 6))
    reset = (
        jnp.zeros((T, 2), bool).at[0, :].set(True).at[3, 0].set(True).at[5, 1].set(True)
    )  # env 0 at 3, env 1 at 5
    junk = jax.tree.map(lambda x: x + 3.0, torso.initial_carry(2))
    net, params, (carry, features) = run_torso(backend, torso, junk, obs, reset)
    np.testing.assert_allclose(
        features, net.apply(params, torso.initial_carry(2), obs, reset)[1], rtol=1e-6
    )  # reset at t = 0
    for env, t in [(0, 3), (1, 5)]:
        fresh_carry, fresh = net.apply(
            params, torso.initial_carry(), obs[t:, env], jnp.zeros((T - t,), bool)
        )
        np.testing.assert_allclose(features[t:, env], fresh, rtol=1e-5, atol=1e-6)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a[env], b, rtol=1e-5, atol=1e-6),
            carry,
            fresh_carry,
        )
        assert not np.allclose(
            features[t - 1, env],
            net.apply(params, torso.initial_carry(), obs[t - 1 : t, env], jnp.zeros((1,), bool))[1][
                0
            ],
        )
    # no reset at t = 2: running [0, 2) then [2, T) from the carry in between equals the whole run
    mid, first = net.apply(params, torso.initial_carry(2), obs[:2], reset[:2])
    _, rest = net.apply(params, mid, obs[2:], reset[2:])
    np.testing.assert_allclose(np.concatenate([first, rest]), features, rtol=1e-5, atol=1e-6)


def test_recurrent_torso_reads_discrete_observations_one_hot():
    torso = recurrent_torso("gru", hidden=(), size=3, obs_space=Discrete(6))
    _, params, (_, features) = run_torso(
        "flax", torso, torso.initial_carry(4), jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 4), bool)
    )
    assert features.shape == (2, 4, 3) and params["params"]["Dense_0"]["kernel"].shape == (6, 9)


def test_recurrent_torso_in_a_feedforward_network_says_what_to_use():
    net = layers.build(networks.with_head(recurrent_torso("lstm"), networks.q_head(2)), "flax")
    with pytest.raises(TypeError, match="recurrent_actor_critic"):
        net.init(KEY, jnp.ones((3, 6)))


def test_recurrent_network_config():
    from rl.config.parsing import ConfigError, build_dataclass

    config = build_dataclass(
        NetworkConfig,
        {"torso": "lstm", "hidden": [], "recurrent_hidden": 32},
        "agent.network",
    )
    assert config.recurrent and not NetworkConfig().recurrent
    with pytest.raises(ConfigError, match="agent.network.hidden"):
        build_dataclass(NetworkConfig, {"torso": "mlp", "hidden": []}, "agent.network")
    with pytest.raises(ConfigError, match="agent.network.recurrent_hidden"):
        build_dataclass(NetworkConfig, {"torso": "gru", "recurrent_hidden": 0}, "agent.network")
    with pytest.raises(ConfigError, match="agent.network.torso"):
        build_dataclass(NetworkConfig, {"torso": "rnn"}, "agent.network")
