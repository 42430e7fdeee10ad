"""DQN through the fused Q-network (rl.fused.q): its acting and its gradient equal the unfused
agent's on the same params and keys, a short run on the interpreter learns, its params are one
flat vector that rl eval's policy reads, rl eval reads a run's final params and checkpoints whether
they were written through the kernels or not on either backend, and a network the kernels cannot
hold keeps the unfused path. The kernels themselves: tests/kernels/test_q_grads.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from run_helpers import FUSION_EMITTERS, run_cli, trained_on

from rl.agents import dqn
from rl.cli.evaluate import evaluate
from rl.config import build_config, hyperparams
from rl.core import environment, exploration
from rl.fused import q as fused_q
from rl.replay import loop as replay
from rl.run.run_dir import FINAL_PARAMS_FILE, load_params, load_run_config

pytest.importorskip("triton")
pytest.importorskip("torch")

SMALL = dict(
    name="dqn",
    total_steps=1024,
    num_envs=8,
    buffer_size=512,
    learning_starts=128,
    batch_size=32,
    train_freq=64,
    gradient_steps=4,
    target_update_interval=8,
    network={"hidden": [16, 16]},
    log_interval=256,
    eval_episodes=2,
    epsilon_decay_steps=512,
    lr=3e-3,
    fused_network=True,
)


def make_config(backend="interpret", **agent):
    return build_config(
        {
            "env": {"id": "CartPole-v1"},
            "agent": {**SMALL, **agent},
            "kernels": {"backend": backend},
        }
    )


def fused_of(config):
    env, env_params = environment.make_env(config)
    q_network = dqn.make_q_network(config, env, env_params)
    return dqn.make_fused(config, env, env_params, q_network), q_network, env, env_params


@pytest.mark.parametrize("double_q, loss", [(True, "huber"), (False, "mse")])
def test_fused_gradient_equals_autodiff_of_the_agents_loss(double_q, loss, full_precision_matmuls):
    """On the same params, target and batch, the kernel's gradient (on the flat vector) is jax.grad
    of dqn.q_loss (on the tree), raveled."""
    config = make_config(double_q=double_q, loss=loss)
    fused, q_network, env, env_params = fused_of(config)
    rng = np.random.default_rng(0)
    obs = jnp.asarray(rng.normal(size=(32, 4)).astype(np.float32))
    batch = replay.transition(
        obs,
        jnp.asarray(rng.integers(0, 2, 32), jnp.int32),
        jnp.ones(32),
        obs + 0.1,
        jnp.asarray(rng.random(32) < 0.2),
    )
    params = q_network.init(jax.random.key(1), obs[0])
    target = q_network.init(jax.random.key(2), obs[0])
    want, unravel = ravel_pytree(
        jax.grad(lambda p: dqn.q_loss(q_network.apply, p, target, batch, 0.99, double_q, loss)[0])(
            params
        )
    )
    discounts = 0.99 * (1.0 - batch["terminated"].astype(jnp.float32))
    flat, flat_target = ravel_pytree(params)[0], ravel_pytree(target)[0]
    got, sq_norm, stats = fused_q.q_learning_grads(
        fused, flat, flat_target, batch, discounts, loss=loss, double_q=double_q
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * float(jnp.abs(want).max()))
    np.testing.assert_allclose(sq_norm, jnp.sum(want**2), rtol=1e-4)
    np.testing.assert_allclose(
        stats["loss"],
        dqn.q_loss(q_network.apply, params, target, batch, 0.99, double_q, loss)[0],
        rtol=1e-5,
    )


def test_fused_acting_equals_epsilon_greedy_on_the_networks_q_values(full_precision_matmuls):
    config = make_config()
    fused, q_network, _, _ = fused_of(config)
    obs = jax.random.normal(jax.random.key(3), (50, 4))
    params = q_network.init(jax.random.key(4), obs[0])
    flat = ravel_pytree(params)[0]
    key = jax.random.key(5)
    for epsilon in (0.0, 0.3, 1.0):
        want = exploration.epsilon_greedy(key, q_network.apply(params, obs), epsilon)
        got = fused_q.epsilon_greedy(fused, flat, obs, key, epsilon)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(fused_q.q_values(fused, flat, obs), q_network.apply(params, obs))


def test_a_fused_run_is_the_unfused_run_and_keeps_its_params_flat(full_precision_matmuls):
    """The same seed through the kernels (interpreter) and through apply and autodiff (reference,
    at full float32 precision on the GPU too): the same run up to float rounding. gamma 0: the
    target is the reward (1 on every CartPole step), so the loss falls and Q(s, a) climbs
    towards 1."""
    config = make_config(gamma=0.0)
    # the CPU fusion emitters on both sides (tests/conftest.py turns them off elsewhere): the
    # older emitters may round one expression differently in the two programs
    compile_run = lambda c: jax.jit(dqn.make_train(c), compiler_options=FUSION_EMITTERS)
    state, metrics = compile_run(config)(jax.random.PRNGKey(1))
    unfused = make_config(gamma=0.0, fused_network=False)
    tree_state, tree_metrics = compile_run(unfused)(jax.random.PRNGKey(1))
    for name in ("loss", "q_mean", "episode_return", "eval_return"):
        np.testing.assert_allclose(metrics[name], tree_metrics[name], rtol=1e-3, err_msg=name)
    fused, q_network, env, env_params = fused_of(config)
    np.testing.assert_allclose(state.params, ravel_pytree(tree_state.params)[0], atol=1e-4)
    loss, q = np.asarray(metrics["loss"]), np.asarray(metrics["q_mean"])
    assert np.all(np.isfinite(loss)) and loss[-1] < 0.2 * loss[0], loss
    assert np.all(np.diff(q) > 0) and 0.5 < q[-1] < 1.05, q
    assert state.params.shape == state.target_params.shape == (fused.layout.size,)
    obs = jax.random.normal(jax.random.key(0), (6, 4))
    want = jnp.argmax(q_network.apply(fused.unravel(state.params), obs), axis=-1)
    # what rl eval runs on the checkpoint's params, here and where the kernels do not run
    for where in (config, make_config(backend="reference", gamma=0.0)):
        np.testing.assert_array_equal(dqn.make_policy(where)(state.params, obs, None), want)
    np.testing.assert_array_equal(
        dqn.make_policy(unfused)(tree_state.params, obs, None),
        jnp.argmax(q_network.apply(tree_state.params, obs), axis=-1),
    )


def test_the_reference_backend_and_unfit_networks_keep_the_unfused_path():
    """No Triton backend, LayerNorm or three hidden layers: params stay a tree (the unfused agent,
    unchanged), and the reason is stated."""
    for config in (
        make_config(backend="reference"),
        make_config(network={"hidden": [16, 16], "layer_norm": True}),
        make_config(network={"hidden": [16, 16, 16]}),
    ):
        assert fused_of(config)[0] is None
        state = dqn.make_trainer(config).init(jax.random.PRNGKey(0), hyperparams(config.agent))
        assert isinstance(state.params, dict)
    reason = fused_q.unfit_reason(
        make_config(network={"hidden": [16, 16, 16]}).agent.network,
        *(lambda e, p: (e.observation_space(p), e.action_space(p)))(
            *environment.make_env(make_config())
        ),
    )
    assert "two tanh, relu or silu hidden layers" in reason


@pytest.mark.parametrize(
    "trained, evaluated", [("interpret", "reference"), ("reference", "interpret")]
)
def test_rl_eval_reads_a_run_written_through_the_kernels_or_not_on_either_backend(
    tmp_path, monkeypatch, capsys, trained, evaluated
):
    """A run trained with FUSEDRL_KERNEL_BACKEND=interpret keeps its Q-network, target and Adam
    moments as flat vectors; the same config.yaml (kernels.backend auto) builds them as trees on
    the reference backend (and the other way round). rl eval reads the final params, a chosen
    checkpoint and, without final_params.msgpack, the newest checkpoint as they are stored, and
    plays the greedy policy of the same numbers."""
    agent = dict(SMALL, total_steps=128, log_interval=64, train_freq=64, gradient_steps=1)
    agent.update(learning_starts=64, batch_size=8, network={"hidden": [8, 8]}, eval_episodes=0)
    data = {"env": {"id": "CartPole-v1"}, "agent": agent, "run": {"seed": 0, "seeds": 1}}
    run_dir = trained_on(tmp_path, monkeypatch, data, trained, then=trained)
    config, grid = load_run_config(run_dir)
    kept, _ = load_params(run_dir, config, grid)
    assert isinstance(kept, np.ndarray) == (trained == "interpret")  # flat where fused
    want, _ = evaluate(config, kept, episodes=3)
    monkeypatch.setenv("FUSEDRL_KERNEL_BACKEND", evaluated)
    capsys.readouterr()
    for args in ([], ["--checkpoint", "128"]):
        assert run_cli(["eval", run_dir, "--episodes", "3", *args]) == 0
    (run_dir / FINAL_PARAMS_FILE).unlink()
    assert run_cli(["eval", run_dir, "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"{want.mean():.4g} +- {want.std():.4g}") == 3, out
    assert "final_params.msgpack" in out and out.count("checkpoints/128") == 2, out
    for checkpoint in (None, 64):
        params, _ = load_params(run_dir, config, grid, checkpoint)
        assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, kept)
