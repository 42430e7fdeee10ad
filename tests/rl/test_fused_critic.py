"""TD3 and SAC through the fused twin critics (rl.fused.critic): the critic step's gradient (and
the actor step's) equals the unfused agent's autodiff on the same params and batch, a short run
through the kernel (the Triton interpreter) is the unfused run up to float rounding with its
critics kept as one flat vector, rl eval reads the checkpoints of such a run where the kernels do
not run, and critics the kernel cannot hold (or a backend without Triton) keep the unfused path.
The kernel itself: tests/kernels/test_twin_q_grads.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from rl.agents import sac, td3
from rl.config import build_config, hyperparams
from rl.core import environment, losses
from rl.fused import critic as fused_critic

pytest.importorskip("triton")
pytest.importorskip("torch")

SMALL = dict(
    total_steps=48,
    num_envs=1,
    buffer_size=64,
    learning_starts=24,
    batch_size=16,
    utd_ratio=1.0,
    network={"hidden": [16, 8], "backend": "flax"},
    log_interval=16,
    eval_episodes=0,
    lr=3e-3,
)


def make_config(name, backend="interpret", **agent):
    return build_config(
        {
            "env": {"id": "Pendulum-v1"},
            "agent": {"name": name, **SMALL, **agent},
            "kernels": {"backend": backend},
        }
    )


def critics_of(config, module):
    env, env_params = environment.make_env(config)
    if module is td3:
        _, critic = td3.make_networks(config.agent, env, env_params)
    else:
        critic = sac.make_variant(config.agent, env, env_params).critic
    return fused_critic.for_agent(config, env, env_params, critic), critic


def test_fused_critic_gradient_equals_autodiff_of_td3s_loss(full_precision_matmuls):
    """On the same critics, targets, batch and smoothing noise, the kernel's gradient (on the flat
    vector) is jax.grad of td3.critic_loss (on the tree), raveled."""
    config = make_config("td3")
    fused, critic = critics_of(config, td3)
    env, env_params = environment.make_env(config)
    actor, _ = td3.make_networks(config.agent, env, env_params)
    rng = np.random.default_rng(0)
    obs = jnp.asarray(rng.normal(size=(24, 3)).astype(np.float32))
    batch = {
        "obs": obs,
        "action": jnp.asarray(rng.uniform(-1, 1, (24, 1)).astype(np.float32)),
        "reward": jnp.asarray(rng.normal(size=24).astype(np.float32)),
        "next_obs": obs + 0.1,
        "terminated": jnp.asarray(rng.random(24) < 0.2),
    }
    params = critic.init(jax.random.key(1), obs[0], batch["action"][0])
    target = critic.init(jax.random.key(2), obs[0], batch["action"][0])
    actor_params = actor.init(jax.random.key(3), obs[0])
    hparams = hyperparams(config.agent)
    key = jax.random.key(4)
    loss_fn = lambda p: td3.critic_loss(
        actor.apply, critic.apply, p, actor_params, target, batch, key, hparams
    )
    (want_loss, want_q), want = jax.value_and_grad(loss_fn, has_aux=True)(params)
    next_action = td3.target_action(actor.apply, actor_params, batch, key, hparams)
    discounts = losses.episode_discount(hparams["gamma"], batch["terminated"])
    flat, flat_target = ravel_pytree(params)[0], ravel_pytree(target)[0]
    got, sq_norm, stats = fused_critic.critic_grads(
        fused, flat, flat_target, batch, discounts, next_action, jnp.zeros(24)
    )
    want = ravel_pytree(want)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * float(jnp.abs(want).max()))
    np.testing.assert_allclose(sq_norm, jnp.sum(want**2), rtol=1e-4)
    np.testing.assert_allclose(stats["loss"], want_loss, rtol=1e-5)
    np.testing.assert_allclose(stats["q_mean"], want_q, rtol=1e-5, atol=1e-6)


def test_fused_actor_gradient_equals_autodiff_of_td3s_actor_loss(full_precision_matmuls):
    """On the same actor, critics and batch, the kernel's actor gradient (unraveled into the actor's
    tree) is jax.grad of td3.actor_loss."""
    config = make_config("td3")
    fused, critic = critics_of(config, td3)
    env, env_params = environment.make_env(config)
    actor, _ = td3.make_networks(config.agent, env, env_params)
    obs = jax.random.normal(jax.random.key(0), (24, 3))
    fused_actor = fused_critic.deterministic_actor(fused, actor, obs[0])
    assert fused_actor is not None
    actor_params = actor.init(jax.random.key(1), obs[0])
    critic_params = critic.init(jax.random.key(2), obs[0], jnp.zeros(1))
    loss_fn = lambda p: td3.actor_loss(actor.apply, critic.apply, p, critic_params, {"obs": obs})
    want_loss, want = jax.value_and_grad(loss_fn)(actor_params)
    got, sq_norm, stats = fused_critic.deterministic_policy_grads(
        fused, fused_actor, actor_params, ravel_pytree(critic_params)[0], obs
    )
    want, got = ravel_pytree(want)[0], ravel_pytree(got)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * float(jnp.abs(want).max()))
    np.testing.assert_allclose(sq_norm, jnp.sum(want**2), rtol=1e-4)
    np.testing.assert_allclose(stats["loss"], want_loss, rtol=1e-5, atol=1e-7)


def test_fused_actor_gradient_equals_autodiff_of_sacs_actor_loss(full_precision_matmuls):
    """On the same actor, critics, batch, temperature and key, the kernel's actor gradient and
    entropy equal jax.grad of SAC's own actor loss (rl.agents.sac.continuous_losses)."""
    config = make_config("sac")
    fused, critic = critics_of(config, sac)
    env, env_params = environment.make_env(config)
    actor = sac.make_variant(config.agent, env, env_params).actor
    obs = jax.random.normal(jax.random.key(0), (24, 3))
    fused_actor = fused_critic.squashed_gaussian_actor(fused, actor, obs[0])
    assert fused_actor is not None
    actor_params = actor.init(jax.random.key(1), obs[0])
    critic_params = critic.init(jax.random.key(2), obs[0], jnp.zeros(1))
    key, alpha = jax.random.key(3), jnp.float32(0.3)
    _, actor_loss = sac.continuous_losses(actor.apply, critic.apply)
    (want_loss, want_entropy), want = jax.value_and_grad(actor_loss, has_aux=True)(
        actor_params, critic_params, alpha, {"obs": obs}, key
    )
    got, sq_norm, stats = fused_critic.sac_actor_grads(
        fused, fused_actor, actor_params, ravel_pytree(critic_params)[0], obs,
        jax.random.normal(key, (24, 1)), alpha,
        (config.agent.log_std_min, config.agent.log_std_max),
    )  # fmt: skip
    want, got = ravel_pytree(want)[0], ravel_pytree(got)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(jnp.abs(want).max()))
    np.testing.assert_allclose(sq_norm, jnp.sum(want**2), rtol=1e-4)
    np.testing.assert_allclose(stats["loss"], want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["entropy"], want_entropy, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, module", [("td3", td3), ("sac", sac)])
def test_a_fused_run_is_the_unfused_run_with_flat_critics(name, module, full_precision_matmuls):
    """The same seed through the kernel (interpreter) and through apply and autodiff: the same
    run up to float rounding; the critics (and their target) are one flat vector; the actor, what
    rl eval reads, stays the network's tree."""
    config = make_config(name)
    state, metrics = jax.jit(module.make_train(config))(jax.random.PRNGKey(1))
    unfused = make_config(name, fused_network=False)
    tree_state, tree_metrics = jax.jit(module.make_train(unfused))(jax.random.PRNGKey(1))
    for metric in ("critic_loss", "actor_loss", "q_mean", "episode_return"):
        np.testing.assert_allclose(
            metrics[metric], tree_metrics[metric], rtol=2e-3, atol=1e-5, err_msg=metric
        )
    fused, _ = critics_of(config, module)
    assert state.critic_params.shape == state.target_critic_params.shape == (fused.layout.size,)
    np.testing.assert_allclose(
        state.critic_params, ravel_pytree(tree_state.critic_params)[0], rtol=1e-3, atol=1e-4
    )
    assert jax.tree.structure(state.params) == jax.tree.structure(tree_state.params)


def test_the_reference_backend_and_unfit_critics_keep_the_unfused_path():
    """No Triton backend, LayerNorm, a gelu torso or three hidden layers: the critics stay a tree
    (the unfused agent, unchanged), and the reason is stated."""
    for config in (
        make_config("td3", backend="reference"),
        make_config("td3", network={"hidden": [16, 16], "layer_norm": True}),
        make_config("sac", network={"hidden": [16, 16], "activation": "gelu"}),
        make_config("sac", network={"hidden": [16, 16, 16]}),
        make_config("td3", fused_network=False),
    ):
        module = td3 if config.agent.name == "td3" else sac
        assert critics_of(config, module)[0] is None
        state = module.make_trainer(config).init(jax.random.PRNGKey(0), hyperparams(config.agent))
        assert isinstance(state.critic_params, dict)
    env, env_params = environment.make_env(make_config("td3"))
    reason = fused_critic.unfit_reason(
        make_config("td3", network={"hidden": [16, 16, 16]}).agent.network,
        env.observation_space(env_params),
        env.action_space(env_params),
    )
    assert "two tanh, relu or silu hidden layers" in reason


def test_rl_eval_reads_the_checkpoints_of_a_run_with_flat_critics_on_the_reference_backend(
    tmp_path, monkeypatch, capsys
):
    """A run trained with FUSEDRL_KERNEL_BACKEND=interpret keeps its critics, their target and
    their Adam moments as flat vectors, which the same config.yaml (kernels.backend auto) builds as
    trees on the reference backend; rl eval there reads a chosen checkpoint and, without
    final_params.msgpack, the newest one for their actor params (a tree either way). TD3 (SAC keeps
    its critics in the same rl.fused.critic vector); no gradient step (learning_starts after the
    run): the checkpoints' layout is what counts."""
    from run_helpers import printed_returns, run_cli, trained_on

    agent = dict(SMALL, name="td3", learning_starts=64, network={"hidden": [16, 8]})
    data = {"env": {"id": "Pendulum-v1"}, "agent": agent, "run": {"seed": 0, "seeds": 1}}
    run_dir = trained_on(tmp_path, monkeypatch, data, "interpret", then="reference")
    capsys.readouterr()
    assert run_cli(["eval", run_dir, "--episodes", "1"]) == 0
    assert run_cli(["eval", run_dir, "--episodes", "1", "--checkpoint", "32"]) == 0
    (run_dir / "final_params.msgpack").unlink()
    assert run_cli(["eval", run_dir, "--episodes", "1"]) == 0
    out = capsys.readouterr().out
    returns = printed_returns(out)
    assert len(returns) == 3 and len(set(returns)) == 1, out  # the actor never changed
    assert "checkpoints/32" in out and "checkpoints/48" in out, out
