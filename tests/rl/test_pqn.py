"""PQN: the Q(lambda) targets by hand (truncation bootstraps from final_obs, termination does not,
no chain across an episode end), LayerNorm in the torso on both backends, a typed state with no
replay buffer or target network, a short CartPole run that improves (`-m slow`), vmap over seeds
equals per-seed runs (CPU), the interpreter-run kernel gives the reference's run, a sweep gives one
result per setting, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.agents import pqn
from rl.config import build_config, hyperparams
from rl.config.parsing import ConfigError
from rl.core.environment import make_env
from rl.core.state import Envs, OnPolicyState
from rl.nn import layers, networks
from rl.nn.network_config import NetworkConfig

SMALL = dict(
    name="pqn",
    total_steps=4096,
    num_envs=8,
    num_steps=32,
    num_epochs=2,
    num_minibatches=4,
    log_interval=4,
    eval_envs=4,
    network={"hidden": [32, 32]},
)


def make_config(env="CartPole-v1", backend="reference", **agent):
    return build_config(
        {"env": {"id": env}, "agent": {**SMALL, **agent}, "kernels": {"backend": backend}}
    )


def test_q_lambda_targets_by_hand():
    """One env, T = 4, gamma .5, lambda .5, Q(final_obs) looked up by obs id. Step 1 is truncated
    (bootstraps, chain cut), step 2 terminated (no bootstrap), step 3 the rollout's last step."""
    config = make_config(gamma=0.5, q_lambda=0.5, reward_scale=1.0)
    q_table = jnp.array([[1.0, 2.0], [4.0, 3.0], [10.0, 0.0], [6.0, 8.0]])
    fake_q = lambda params, obs: q_table[obs[..., 0].astype(jnp.int32)]
    col = lambda *xs: jnp.array(xs)[:, None]
    traj = pqn.Transition(
        obs=None,
        action=None,
        reward=col(1.0, 1.0, 1.0, 1.0),
        terminated=col(False, False, True, False),
        truncated=col(False, True, False, False),
        final_obs=jnp.array([0.0, 1.0, 2.0, 3.0])[:, None, None],
        episode=None,
    )
    targets = pqn.q_lambda_targets(fake_q, None, traj, hyperparams(config.agent), "reference")
    targets = targets[:, 0]
    g3 = 1 + 0.5 * 8.0  # last step: r + gamma max Q(final_obs_3)
    g2 = 1.0  # terminated: no bootstrap
    g1 = 1 + 0.5 * 4.0  # truncated: bootstraps from max Q(final_obs_1), no chain
    g0 = 1 + 0.5 * (0.5 * 2.0 + 0.5 * g1)  # mid-episode: (1 - lambda) max Q + lambda G_1
    np.testing.assert_allclose(targets, [g0, g1, g2, g3], rtol=1e-6)


@pytest.mark.parametrize("backend", ["flax", "haiku"])
def test_layer_norm_torso(backend):
    config = NetworkConfig(hidden=(16, 16), layer_norm=True, backend=backend)
    net = layers.build(networks.make_torso(config), backend)
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 3)) * 100.0
    params = net.init(jax.random.PRNGKey(1), x)
    sizes = sorted(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
    assert sizes == sorted(
        [3 * 16, 16, 16, 16, 16 * 16, 16, 16, 16]
    )  # two dense layers + two (scale, offset)
    one_layer = layers.build(lambda layers, x: layers.layer_norm(layers.dense(x, 16)), backend)
    h = one_layer.apply(one_layer.init(jax.random.PRNGKey(2), x), x)
    np.testing.assert_allclose(h.mean(-1), 0.0, atol=1e-5)  # unit scale and zero offset at init
    np.testing.assert_allclose(h.std(-1), 1.0, rtol=1e-3)


def test_state_has_no_buffer_and_no_target_network():
    config = make_config()
    state = pqn.make_trainer(config).init(jax.random.PRNGKey(0), hyperparams(config.agent))
    assert isinstance(state, OnPolicyState) and isinstance(state.envs, Envs)
    assert state.envs.obs.shape == (config.agent.num_envs, 4)
    assert "LayerNorm_0" in state.params["params"]


@pytest.mark.slow
def test_short_cartpole_run_improves():
    """32k env steps: the greedy return rises well above a random policy's (about 20): over the
    last two log points (8 greedy episodes each) it averages more than 120 for each seed (one
    log point alone is noisy). A learning run (`-m slow`); `python benchmarks/dqn.py learning
    --agent pqn` measures PQN's learning on CartPole."""
    config = make_config(
        total_steps=32768,
        num_envs=16,
        num_steps=32,
        num_epochs=4,
        num_minibatches=4,
        log_interval=16,
        eval_envs=8,
        lr=5e-4,
        network={"hidden": [64, 64]},
    )
    with jax.default_device(jax.devices("cpu")[0]):
        keys = jnp.stack([jax.random.PRNGKey(1), jax.random.PRNGKey(2)])
        _, metrics = jax.jit(jax.vmap(pqn.make_train(config)))(keys)
    eval_return = np.asarray(metrics["eval_return"])
    assert np.all(np.isfinite(np.asarray(metrics["loss"])))
    assert np.all(eval_return[:, -2:].mean(axis=1) > 120), eval_return
    np.testing.assert_allclose(
        np.asarray(metrics["epsilon"])[:, -1], 0.05, rtol=1e-5
    )  # decayed within the first 20%


def test_vmap_over_seeds_equals_per_seed_runs():
    config = make_config()
    train = pqn.make_train(config)
    with jax.default_device(jax.devices("cpu")[0]):
        keys = jnp.stack([jax.random.PRNGKey(1), jax.random.PRNGKey(2)])
        _, batched = jax.jit(jax.vmap(train))(keys)
        for i in range(2):
            _, single = jax.jit(train)(keys[i])
            for name in ("step", "episode_return", "loss", "q_mean", "eval_return"):
                np.testing.assert_allclose(
                    np.asarray(batched[name][i]),
                    np.asarray(single[name]),
                    rtol=1e-4,
                    atol=1e-5,
                    err_msg=name,
                )


def test_kernel_source_gives_the_reference_run():
    """The Q(lambda) targets through the Triton source (Triton's interpreter on the CPU; the GPU
    kernel where it runs) train as the plain-JAX reference does, up to float rounding (the GPU
    kernel scans in another order, so a 16-update run agrees to 1e-3 there)."""
    from kernels.launch import available_backends

    backend = "triton" if "triton" in available_backends() else "interpret"
    if backend == "interpret":
        pytest.importorskip("torch")
    config = dict(total_steps=512, num_envs=4, num_steps=16, log_interval=2, eval_envs=2)
    device = jax.devices()[0] if backend == "triton" else jax.devices("cpu")[0]
    with jax.default_device(device):
        _, ref = jax.jit(pqn.make_train(make_config(**config)))(jax.random.PRNGKey(3))
        _, kernel = jax.jit(pqn.make_train(make_config(backend=backend, **config)))(
            jax.random.PRNGKey(3)
        )
    tolerance = 1e-3 if backend == "triton" else 1e-4
    for name in ("loss", "q_mean", "eval_return"):
        np.testing.assert_allclose(
            np.asarray(kernel[name]), np.asarray(ref[name]), rtol=tolerance, atol=1e-5, err_msg=name
        )


def test_sweep_gives_one_result_per_setting():
    from rl.config import parse_sweep
    from rl.run.train import train_many

    config = make_config(total_steps=1024, log_interval=2, eval_envs=1)
    grid = parse_sweep(["agent.q_lambda=0.0,0.9", "agent.lr=1e-3,1e-4"], config.agent)
    _, metrics = train_many(config, grid)
    finals = np.asarray(metrics["loss"])[:, 0, -1]
    assert np.asarray(metrics["eval_return"]).shape[:2] == (4, 1)
    assert np.all(np.isfinite(finals)) and len(set(finals.tolist())) == 4


def test_haiku_backend_and_greedy_policy():
    config = make_config(
        total_steps=1024, log_interval=2, network={"hidden": [16], "backend": "haiku"}
    )
    state, metrics = jax.jit(pqn.make_train(config))(jax.random.PRNGKey(0))
    assert np.isfinite(np.asarray(metrics["loss"])[-1])
    policy = pqn.make_policy(config)
    obs = jnp.array([[0.0, 0.0, 0.1, 0.0], [0.0, 0.0, -0.1, 0.0]])
    q = pqn.make_q_network(config.agent, *make_env(config)).apply(state.params, obs)
    np.testing.assert_array_equal(policy(state.params, obs, None), jnp.argmax(q, axis=-1))


@pytest.mark.parametrize(
    "agent, env, message",
    [
        ({}, "Pendulum-v1", "env.id: pqn needs discrete actions; Pendulum-v1 has Box"),
        ({"num_minibatches": 3}, "CartPole-v1", r"agent.num_minibatches \(3\) must divide"),
        (
            {"log_interval": 3},
            "CartPole-v1",
            r"agent.log_interval \(3 updates\) must divide .* e.g. agent.total_steps=3840 or 4608",
        ),
        ({"q_lambda": 1.5}, "CartPole-v1", "agent.q_lambda: 1.5 is out of range"),
        ({"epsilon_decay_fraction": 0.0}, "CartPole-v1", "agent.epsilon_decay_fraction"),
    ],
)
def test_config_errors_name_the_key(agent, env, message):
    with pytest.raises(ConfigError, match=message):
        config = make_config(env, **agent)
        pqn.check_env(config, *make_env(config))


def test_shipped_config_loads():
    from rl.config import load_config

    config = load_config("configs/pqn_cartpole.yaml")
    assert (
        config.agent.name == "pqn"
        and config.agent.network.layer_norm
        and config.agent.num_updates == 96
    )


def test_unrolled_loops_compute_the_same_run():
    config = dict(total_steps=1024, log_interval=2, eval_envs=2)
    with jax.default_device(jax.devices("cpu")[0]):
        _, rolled = jax.jit(pqn.make_train(make_config(**config)))(jax.random.PRNGKey(4))
        _, unrolled = jax.jit(pqn.make_train(make_config(unroll=2, **config)))(
            jax.random.PRNGKey(4)
        )
    for name in ("loss", "q_mean", "eval_return", "episode_return"):
        np.testing.assert_allclose(
            np.asarray(unrolled[name]), np.asarray(rolled[name]), rtol=1e-4, atol=1e-5, err_msg=name
        )
