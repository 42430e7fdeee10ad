"""Rainbow: n-step transitions and C51 projection targets on hand-made cases (truncation bootstraps,
termination does not, at every position of the window), the loss and priorities by hand, the
network head switches, short runs (loss falls, finite Q) with every component on and off, vmap over
seeds equals per-seed runs, both network backends, config errors, the shipped configs."""

from __future__ import annotations

import glob
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.agents import rainbow
from rl.config import build_config, load_config
from rl.config.parsing import ConfigError
from rl.core import losses, packing
from rl.nn import layers, networks
from rl.nn.network_config import NetworkConfig
from rl.replay import buffers

SMALL = dict(
    name="rainbow",
    total_steps=1024,
    buffer_size=512,
    learning_starts=128,
    batch_size=16,
    train_freq=64,
    gradient_steps=8,
    target_update_interval=16,
    network={"hidden": [16, 16]},
    log_interval=256,
    eval_episodes=2,
    num_atoms=11,
    v_min=0.0,
    v_max=10.0,
    lr=1e-3,
)


def make_config(env_params=None, **agent):
    return build_config(
        {"env": {"id": "CartPole-v1", "params": env_params or {}}, "agent": {**SMALL, **agent}}
    )


# ---------------------------------------------------------------- n-step transitions


def window_of(rewards, terminated, truncated):
    """A window [n, envs] whose obs / final_obs encode (step, env) so gathers can be checked."""
    rewards = np.asarray(rewards, np.float32)
    n, e = rewards.shape
    idx = np.arange(n)[:, None] * 10 + np.arange(e)[None, :]
    return {
        "obs": jnp.asarray(np.stack([idx, -idx], -1), jnp.float32),
        "action": jnp.asarray(idx % 2, jnp.int32),
        "reward": jnp.asarray(rewards),
        "final_obs": jnp.asarray(np.stack([idx + 100, -idx - 100], -1), jnp.float32),
        "terminated": jnp.asarray(terminated),
        "truncated": jnp.asarray(truncated),
    }


def test_n_step_transition_cuts_at_the_first_episode_end():
    g = 0.9
    F, T = False, True
    # env 0: no end; 1: truncated at k=1; 2: terminated at k=0; 3: terminated at k=2;
    # 4: truncated at k=0 then terminated at k=2 (only the first end counts); 5: truncated at k=2
    rewards = [[1, 1, 1, 1, 1, 1], [2, 2, 2, 2, 2, 2], [4, 4, 4, 4, 4, 4]]
    terminated = [[F, F, T, F, F, F], [F, F, F, F, F, F], [F, F, F, T, T, F]]
    truncated = [[F, F, F, F, T, F], [F, T, F, F, F, F], [F, F, F, F, F, T]]
    out = jax.jit(losses.n_step_transition)(window_of(rewards, terminated, truncated), g)
    full = 1 + g * 2 + g * g * 4
    np.testing.assert_allclose(out["reward"], [full, 1 + g * 2, 1, full, 1, full], rtol=1e-6)
    np.testing.assert_array_equal(out["bootstrap_steps"], [3, 2, 1, 3, 1, 3])
    np.testing.assert_array_equal(out["terminated"], [F, F, T, T, F, F])
    end = np.array([2, 1, 0, 2, 0, 2])
    np.testing.assert_array_equal(
        out["next_obs"][:, 0], end * 10 + np.arange(6) + 100
    )  # final_obs of the end step
    np.testing.assert_array_equal(out["obs"][:, 0], np.arange(6))  # the oldest step
    # the bootstrap discount gamma^steps * (1 - terminated): truncation keeps it, termination
    # zeroes it
    discount = g ** np.asarray(out["bootstrap_steps"], np.float64) * (
        1 - np.asarray(out["terminated"])
    )
    np.testing.assert_allclose(discount, [g**3, g**2, 0, 0, g, g**3], rtol=1e-6)


def test_one_step_window_is_the_plain_transition():
    out = losses.n_step_transition(window_of([[3.0, 5.0]], [[False, True]], [[True, False]]), 0.99)
    np.testing.assert_allclose(out["reward"], [3.0, 5.0])
    np.testing.assert_array_equal(out["bootstrap_steps"], [1, 1])
    np.testing.assert_array_equal(out["terminated"], [False, True])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [100, 101])


def observations(t, shape, dtype):
    """Observations [2 envs, *shape] of step t: float32 with a NaN or -0.0 in one entry, else the
    dtype's values of t (bool: its parity, alternating over entries)."""
    size = int(np.prod(shape))
    if dtype == jnp.float32:
        obs = jnp.full((2, *shape), float(t))
        return obs.reshape(2, -1).at[1, 0].set(-0.0 if t == 4 else jnp.nan).reshape(2, *shape)
    values = (np.arange(2 * size).reshape(2, *shape) + t) % (2 if dtype == jnp.bool_ else 251)
    return jnp.asarray(values).astype(dtype)


@pytest.mark.parametrize(
    "obs_shape, obs_dtype",
    [((2, 3), jnp.float32), ((10, 10, 4), jnp.bool_), ((6, 6, 2), jnp.uint8)],
    ids=["float32", "bool-image", "uint8-image"],
)
def test_push_window_keeps_each_envs_last_n_steps_bit_for_bit(obs_shape, obs_dtype):
    """The packed windows [envs, n, width] keep each env's last n steps: every field unpacks to
    the steps pushed, with its dtype and every bit (negative zero, NaN, large ints), also where
    large narrow-dtype observations get a block of their own."""
    layout = rainbow.window_layout(jnp.zeros(obs_shape, obs_dtype))
    assert len(layout.block_dtypes) == (1 if obs_dtype == jnp.float32 else 2)
    window = rainbow.empty_window(layout, 2, 3)
    steps = []
    for t in range(1, 6):
        obs = observations(t, obs_shape, obs_dtype)
        step = rainbow.window_step(
            obs, jnp.array([t, 2**30 + t], jnp.int32), jnp.array([t, -t], jnp.float32) / 3,
            observations(t + 7, obs_shape, obs_dtype), jnp.array([t % 2 == 0, False]),
            jnp.array([False, t == 5]),
        )  # fmt: skip
        window, steps = rainbow.push_window(window, step, layout), steps + [step]
    got = packing.unpack(layout, window)
    for name, want in steps[0].items():
        expected = np.stack([np.asarray(s[name]) for s in steps[-3:]], axis=1)  # [envs, n, ...]
        assert got[name].dtype == want.dtype, name
        np.testing.assert_array_equal(
            np.asarray(got[name]).view(np.uint8), expected.view(np.uint8), err_msg=name
        )


def test_n_step_transitions_read_the_env_major_window_time_major():
    """The windows travel with the envs as [envs, n, ...]; their transitions are those of the
    time-major window [n, envs, ...] that `losses.n_step_transition` reads."""
    F, T = False, True
    time_major = window_of(
        [[1, 1, 1], [2, 2, 2], [4, 4, 4]], [[F, T, F], [F, F, F], [T, F, F]], [[F, F, T]] * 3
    )
    env_major = jax.tree.map(lambda w: jnp.swapaxes(w, 0, 1), time_major)
    setup = fake_setup(None, None)
    expected = losses.n_step_transition(time_major, 0.9)
    got = rainbow.n_step_transitions(setup, env_major, 0.9)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


# ---------------------------------------------------------------- C51 targets and the loss


def test_categorical_target_projects_by_hand():
    support = jnp.array([0.0, 1.0, 2.0])
    one_hot = jnp.array([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])
    # row 0: atoms 0.5 + z = [0.5, 1.5, 2.5], all mass on 0.5 -> half to 0, half to 1
    # row 1: terminal (discount 0): every atom at 1.25 -> 0.75 to atom 1, 0.25 to atom 2
    # row 2: atoms -1 + 0.5 z = [-1, -0.5, 0]: mass on 0 -> atom 0
    m = losses.categorical_td_target(
        jnp.array([0.5, 1.25, -1.0]), jnp.array([1.0, 0.0, 0.5]), one_hot, support
    )
    np.testing.assert_allclose(m, [[0.5, 0.5, 0.0], [0.0, 0.75, 0.25], [1.0, 0.0, 0.0]], atol=1e-6)


def fixed_apply(logits_by_obs):
    """A fake network: obs [B, 1] holds an id; returns logits_by_obs[id] ([A, atoms])."""
    table = jnp.asarray(logits_by_obs, jnp.float32)
    return lambda params, obs, rng=None: table[obs[..., 0].astype(jnp.int32)]


def fake_setup(apply, support, double_q=True, loss="huber"):
    agent = SimpleNamespace(double_q=double_q, loss=loss, noisy=False)
    return rainbow.Setup(
        None, None, layers.Network(init=None, apply=apply), support, agent, "reference"
    )


def test_distributional_loss_and_priorities_by_hand():
    support = jnp.array([0.0, 1.0, 2.0])
    logits = np.log(
        np.array(
            [
                [[0.2, 0.5, 0.3], [0.6, 0.2, 0.2]],  # obs 0 (the state)
                [
                    [1.0, 1e-9, 1e-9],
                    [1e-9, 1e-9, 1.0],
                ],  # obs 1 (next state): action 1 has the higher mean
            ]
        )
    )
    apply = fixed_apply(logits)
    batch = {
        "obs": jnp.array([[0.0], [0.0]]),
        "action": jnp.array([0, 1]),
        "reward": jnp.array([0.0, 0.5]),
        "next_obs": jnp.array([[1.0], [1.0]]),
        "terminated": jnp.array([False, True]),
        "bootstrap_steps": jnp.array([2, 1]),
    }
    weights = jnp.array([1.0, 0.5])
    keys = (None, None, None)
    loss, (priorities, q) = rainbow.rainbow_loss(
        fake_setup(apply, support), None, None, batch, weights, keys, 0.5
    )
    # row 0: next action 1 (all mass at z=2), discount 0.5^2: atom 0.5 -> m = [0.5, 0.5, 0]
    # row 1: terminal: atom 0.5 -> m = [0.5, 0.5, 0]
    m = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    p = np.array([[0.2, 0.5, 0.3], [0.6, 0.2, 0.2]])
    ce = -(m * np.log(p)).sum(1)
    kl = ce + (m[m > 0] * np.log(m[m > 0])).reshape(2, 2).sum(1)
    np.testing.assert_allclose(loss, (ce * [1.0, 0.5]).mean(), rtol=1e-5)
    np.testing.assert_allclose(priorities, kl, rtol=1e-5)
    np.testing.assert_allclose(q, (p * [0, 1, 2]).sum(1), rtol=1e-5)


def test_scalar_loss_bootstraps_on_truncation_only():
    apply = fixed_apply(
        np.array([[[1.0], [0.0]], [[3.0], [2.0]]])
    )  # Q(obs 0) = [1, 0], Q(obs 1) = [3, 2]
    batch = {
        "obs": jnp.zeros((2, 1)),
        "action": jnp.array([0, 0]),
        "reward": jnp.array([1.0, 1.0]),
        "next_obs": jnp.ones((2, 1)),
        "terminated": jnp.array([False, True]),
        "bootstrap_steps": jnp.array([3, 3]),
    }
    _, (priorities, _) = rainbow.rainbow_loss(
        fake_setup(apply, None, double_q=False, loss="mse"),
        None,
        None,
        batch,
        jnp.ones(2),
        (None,) * 3,
        0.5,
    )
    np.testing.assert_allclose(priorities, [abs(1.0 - (1.0 + 0.125 * 3.0)), 0.0], rtol=1e-6)


@pytest.mark.parametrize("dueling", [True, False])
@pytest.mark.parametrize("noisy", [True, False])
@pytest.mark.parametrize("backend", ["flax", "haiku"])
def test_head_shapes_dueling_mean_and_noise(dueling, noisy, backend):
    torso = networks.make_torso(NetworkConfig(hidden=(8,)))
    head = networks.rainbow_head(3, num_atoms=5, dueling=dueling, noisy=noisy, head_hidden=4)
    net = layers.build(networks.with_head(torso, head), backend)
    obs = jnp.ones((7, 4))
    params = net.init(jax.random.PRNGKey(0), obs)
    out = net.apply(params, obs)
    assert out.shape == (7, 3, 5)
    a, b = (
        net.apply(params, obs, rng=jax.random.PRNGKey(1)),
        net.apply(params, obs, rng=jax.random.PRNGKey(2)),
    )
    assert bool(jnp.any(a != b)) == noisy  # noise only with noisy layers and an rng
    np.testing.assert_array_equal(net.apply(params, obs), out)  # no rng: the mean network


# ---------------------------------------------------------------- training runs


COMPONENTS = ["noisy", "dueling", "distributional", "double_q", "per"]


@pytest.mark.parametrize(
    "off, backend",
    [(None, "flax"), ("noisy+per", "haiku"), ("distributional+dueling+double_q", "flax")],
)
def test_short_run_minimises_its_loss_and_q_stays_finite(off, backend):
    """gamma = 0: the target is the reward 1, on the support (distributional) or as a scalar, so the
    loss must fall; Q must approach 1. Both network backends."""
    switches = {name: False for name in (off or "").split("+") if name}
    config = make_config(
        total_steps=2048,
        gamma=0.0,
        gradient_steps=32,
        lr=3e-3,
        n_step=2,
        network={"backend": backend, "hidden": [16, 16]},
        **switches,
    )
    state, metrics = jax.jit(rainbow.make_train(config))(jax.random.PRNGKey(1))
    loss, q = np.asarray(metrics["loss"]), np.asarray(metrics["q_mean"])
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(q))
    assert loss[-1] < 0.2 * loss[0], loss
    assert abs(q[-1] - 1.0) < 0.1, q
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))


@pytest.fixture(scope="module")
def small_run():
    config = build_config(
        {
            "env": {"id": "CartPole-v1"},
            "agent": {**SMALL, "n_step": 3},
            "kernels": {"backend": "reference"},
        }
    )
    train = rainbow.make_train(config)
    with jax.default_device(jax.devices("cpu")[0]):  # vmap equals per-seed runs exactly on the CPU
        keys = jnp.stack([jax.random.PRNGKey(i) for i in (5, 6)])
        return config, train, keys, jax.jit(jax.vmap(train))(keys)


def test_vmap_over_seeds_equals_per_seed_runs(small_run):
    config, train, keys, (states, metrics) = small_run
    single = jax.jit(train)
    for i in range(len(keys)):
        with jax.default_device(jax.devices("cpu")[0]):
            state_i, metrics_i = single(keys[i])
        for name in ("eval_return", "episode_return", "step"):
            np.testing.assert_allclose(metrics[name][i], metrics_i[name], rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(metrics["loss"][i], metrics_i["loss"], rtol=1e-3)
        for level, level_i in zip(states.buffer.tree, state_i.buffer.tree):
            np.testing.assert_allclose(level[i], level_i, rtol=1e-3)
        for a, b in zip(jax.tree.leaves(states.params), jax.tree.leaves(state_i.params)):
            np.testing.assert_allclose(a[i], b, rtol=1e-4, atol=1e-5)


def test_the_prioritized_buffer_holds_n_step_transitions(small_run):
    config, _, _, (states, _) = small_run
    buf = states.buffer
    size = np.asarray(buf.size)
    np.testing.assert_array_equal(size, [512, 512])  # 1024 steps - (n - 1) stored, capacity 512
    steps = np.asarray(buf.data["bootstrap_steps"])
    assert set(np.unique(steps)) <= {1, 2, 3} and (steps == 3).mean() > 0.5
    leaves = np.asarray(buffers.sumtree_leaves(buf.tree))
    assert leaves.shape == (2, 512)
    assert np.all(leaves > 0)  # every stored item can be sampled


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize(
    "agent, message",
    [
        ({"v_min": 5.0, "v_max": 5.0}, "agent.v_min \\(5.0\\) must be below agent.v_max \\(5.0\\)"),
        ({"n_step": 0}, "agent.n_step: 0 is out of range"),
        ({"num_atoms": 1}, "agent.num_atoms: 1 is out of range"),
        ({"per_beta_start": 1.5}, "agent.per_beta_start: 1.5 is out of range"),
        ({"noisy": "yes"}, "agent.noisy: expected true or false"),
        (
            {"train_freq": 60, "num_envs": 8},
            "agent.train_freq \\(60\\) must be a multiple of agent.num_envs",
        ),
        ({"dueling_net": True}, "unknown key 'agent.dueling_net'"),
    ],
)
def test_config_errors_name_the_key(agent, message):
    with pytest.raises(ConfigError, match=message):
        make_config(**agent)


def test_shipped_configs_load_and_ablations_differ_in_one_component():
    full = load_config("configs/rainbow_cartpole.yaml").agent
    assert all(getattr(full, name) for name in COMPONENTS) and full.n_step > 1
    ablations = sorted(glob.glob("configs/rainbow_cartpole_no_*.yaml"))
    assert len(ablations) == 6
    for path in ablations:
        agent = load_config(path).agent
        changed = [
            name for name in COMPONENTS + ["n_step"] if getattr(agent, name) != getattr(full, name)
        ]
        assert len(changed) == 1, (path, changed)
