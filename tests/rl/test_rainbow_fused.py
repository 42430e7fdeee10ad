"""Rainbow's fused acting (rl.fused.rainbow): the kernel's actions are the network's epsilon-greedy
actions with the noise its apply draws (both layer backends), which configs take the kernel, and a
run through it (interpreter) against the run through apply. The kernel itself:
tests/kernels/test_rainbow_act.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from run_helpers import FUSION_EMITTERS

from rl.agents import rainbow
from rl.config import build_config
from rl.core import environment, exploration
from rl.fused import rainbow as fused_rainbow

pytest.importorskip("triton")
pytest.importorskip("torch")

SMALL = dict(
    name="rainbow",
    total_steps=1024,
    num_envs=4,
    buffer_size=512,
    learning_starts=128,
    batch_size=16,
    train_freq=64,
    gradient_steps=4,
    target_update_interval=16,
    network={"hidden": [16, 16]},
    log_interval=256,
    eval_episodes=2,
    num_atoms=11,
    v_min=0.0,
    v_max=10.0,
    lr=1e-3,
    epsilon_start=0.3,
    epsilon_end=0.0,
    fused_acting=True,
)


def make_config(backend="interpret", **agent):
    return build_config(
        {"env": {"id": "CartPole-v1"}, "agent": {**SMALL, **agent}, "kernels": {"backend": backend}}
    )


@pytest.mark.parametrize("layer_backend", ["flax", "haiku"])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_fused_actions_are_the_networks_epsilon_greedy_actions(
    layer_backend, activation, full_precision_matmuls
):
    config = make_config(
        network={"hidden": [24, 40], "activation": activation, "backend": layer_backend},
        num_atoms=21,
    )
    setup = rainbow.make_setup(config)
    assert setup.fused_acting
    obs = jax.random.normal(jax.random.key(0), (64, 4))
    params = setup.network.init(jax.random.key(1), obs[0])
    noise_key, act_key = jax.random.split(jax.random.key(2))
    q = rainbow.q_values(setup, setup.network.apply(params, obs, rng=noise_key))
    q = np.asarray(q, np.float64)
    top = np.sort(q, axis=-1)
    decided = top[:, -1] - top[:, -2] > 1e-4
    assert decided.mean() > 0.9
    for epsilon in (0.0, 0.4):
        want = exploration.epsilon_greedy(act_key, jnp.asarray(q), epsilon)
        got = fused_rainbow.epsilon_greedy(
            params, obs, epsilon, setup.support, noise_key=noise_key, act_key=act_key,
            activation=activation, backend=setup.backend, precision="ieee",
        )  # fmt: skip
        np.testing.assert_array_equal(np.asarray(got)[decided], np.asarray(want)[decided])


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"dueling": False}, "noisy dueling distributional head"),
        ({"noisy": False}, "noisy dueling distributional head"),
        ({"distributional": False}, "noisy dueling distributional head"),
        ({"head_hidden": 8}, "no head_hidden"),
        ({"network": {"hidden": [16, 16, 16]}}, "MLP of two"),
        ({"network": {"hidden": [16, 16], "layer_norm": True}}, "no LayerNorm"),
        ({"network": {"hidden": [16, 300]}}, "hidden 512 > 128"),
    ],
)
def test_networks_the_kernel_cannot_run_act_through_apply(change, reason):
    config = make_config(**change)
    env, env_params = environment.make_env(config)
    spaces = env.observation_space(env_params), env.action_space(env_params)
    assert reason in fused_rainbow.unfit_reason(config.agent, *spaces)
    assert not rainbow.make_setup(config).fused_acting


def test_the_kernel_acts_when_asked_on_a_triton_backend():
    assert rainbow.make_setup(make_config()).fused_acting
    assert not rainbow.make_setup(make_config(fused_acting=False)).fused_acting
    unasked = {k: v for k, v in SMALL.items() if k != "fused_acting"}
    default = build_config(
        {"env": {"id": "CartPole-v1"}, "agent": unasked, "kernels": {"backend": "interpret"}}
    )
    assert not default.agent.fused_acting and not rainbow.make_setup(default).fused_acting
    assert not rainbow.make_setup(make_config(backend="reference")).fused_acting
    highest = build_config(
        {
            "env": {"id": "CartPole-v1"},
            "agent": SMALL,
            "kernels": {"backend": "interpret"},
            "run": {"matmul_precision": "highest"},
        }
    )
    assert rainbow.make_setup(highest).dot_precision == "ieee"
    assert rainbow.make_setup(make_config()).dot_precision == "tf32"


def test_a_run_acting_through_the_kernel_is_the_run_through_apply(full_precision_matmuls):
    """The same seed with acting through the kernel and through the network's apply (the other
    kernels on the interpreter on both sides, both programs with the CPU fusion emitters): the same
    actions, so the same episodes, losses and params up to float rounding."""
    run = lambda fused: jax.jit(
        rainbow.make_train(make_config(fused_acting=fused, total_steps=512)),
        compiler_options=FUSION_EMITTERS,
    )(jax.random.PRNGKey(4))
    runs = {fused: run(fused) for fused in (True, False)}
    (state, metrics), (tree_state, tree_metrics) = runs[True], runs[False]
    for name in ("episode_return", "eval_return", "loss", "q_mean"):
        np.testing.assert_allclose(metrics[name], tree_metrics[name], rtol=1e-3, err_msg=name)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(tree_state.params)):
        np.testing.assert_allclose(a, b, atol=1e-4)
    assert np.isfinite(np.asarray(metrics["loss"])).all()


def test_full_float32_products_act_through_apply_where_the_kernel_lacks_shared_memory():
    """run.matmul_precision highest gives the kernel "ieee" products, which hold fewer actions
    and atoms (kernels.rainbow_act.IEEE_SHARED_BYTES): 7 actions of 64 atoms at hidden 128 fit
    with TF32 products only."""
    from envs.spaces import Box, Discrete

    agent = make_config(network={"hidden": [128, 128]}, num_atoms=64).agent
    obs_space, actions = Box(-1.0, 1.0, (4,)), Discrete(7)
    assert fused_rainbow.unfit_reason(agent, obs_space, actions, "tf32") is None
    assert "shared memory" in fused_rainbow.unfit_reason(agent, obs_space, actions, "ieee")
    assert fused_rainbow.runs_fused(agent, obs_space, actions, "interpret", "tf32")
    assert not fused_rainbow.runs_fused(agent, obs_space, actions, "interpret", "ieee")


@pytest.mark.parametrize("matmul_precision, fused", [("default", True), ("highest", False)])
def test_a_run_asking_for_highest_precision_acts_through_apply_beyond_the_shared_memory(
    matmul_precision, fused
):
    """Acrobot's 3 actions of 128 atoms at hidden 128: 4 x 128 x 128 x 4 bytes with "ieee"
    products, beyond kernels.rainbow_act.IEEE_SHARED_BYTES."""
    config = build_config(
        {
            "env": {"id": "Acrobot-v1"},
            "agent": {**SMALL, "network": {"hidden": [128, 128]}, "num_atoms": 128},
            "kernels": {"backend": "interpret"},
            "run": {"matmul_precision": matmul_precision},
        }
    )
    setup = rainbow.make_setup(config)
    assert setup.fused_acting is fused
    assert setup.dot_precision == ("ieee" if matmul_precision == "highest" else "tf32")
