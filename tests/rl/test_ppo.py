"""PPO: truncation-aware GAE on a hand-made trajectory, loss pieces against hand computations,
short training runs (both network backends, discrete and continuous), vmap and chunking invariance."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.agents import ppo
from rl.config import ConfigError, build_config, hyperparams


def make_config(env_id="CartPole-v1", **agent):
    base = dict(name="ppo", total_steps=1024, num_envs=4, num_steps=32, num_epochs=2, num_minibatches=2, hidden=[16, 16], log_interval=2)
    base.update(agent)
    return build_config({"env": {"id": env_id}, "agent": base})


# ---------------------------------------------------------------- GAE with truncation


def test_gae_hand_made_trajectory_bootstraps_on_truncation_and_cuts_the_chain():
    # one env, 5 steps: an episode truncated at t=1 (time limit), a new one terminated at t=3, then one step.
    rewards = np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)
    values = np.array([10.0, 11.0, 12.0, 13.0, 14.0], np.float32)
    next_values = np.array([11.0, 20.0, 13.0, 99.0, 15.0], np.float32)  # V(final_obs): 20 after truncation; 99 ignored (terminated)
    terminated = np.array([False, False, False, True, False])
    truncated = np.array([False, True, False, False, False])
    gamma, lam = 0.9, 0.8
    adv, targets = ppo.truncation_aware_gae(
        jnp.asarray(rewards)[:, None], jnp.asarray(values)[:, None], jnp.asarray(next_values)[:, None],
        jnp.asarray(terminated)[:, None], jnp.asarray(truncated)[:, None], jnp.float32(gamma), jnp.float32(lam),
    )
    # by hand, backwards:
    a4 = 5.0 + 0.9 * 15.0 - 14.0                      # last step bootstraps from V(final_obs)
    a3 = 4.0 + 0.0 - 13.0                             # terminated: no bootstrap, chain cut
    a2 = (3.0 + 0.9 * 13.0 - 12.0) + 0.9 * 0.8 * a3
    a1 = 2.0 + 0.9 * 20.0 - 11.0                      # truncated: bootstrap from V(final_obs) = 20, chain cut
    a0 = (1.0 + 0.9 * 11.0 - 10.0) + 0.9 * 0.8 * a1
    expected = np.array([a0, a1, a2, a3, a4])
    np.testing.assert_allclose(np.asarray(adv)[:, 0], expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(targets)[:, 0], expected + values, rtol=1e-6)


def test_gae_traced_gamma_and_lambda_under_vmap():
    rewards = jnp.ones((4, 3))
    values = jnp.zeros((4, 3))
    term = jnp.zeros((4, 3), bool)
    f = lambda g, l: ppo.truncation_aware_gae(rewards, values, values, term, term, g, l)[0]
    out = jax.jit(jax.vmap(f))(jnp.array([0.5, 0.9]), jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(out[0, :, 0], [1.875, 1.75, 1.5, 1.0], rtol=1e-6)  # sum of 0.5^k
    np.testing.assert_allclose(out[1], 1.0, rtol=1e-6)  # lambda 0: one-step TD errors


# ---------------------------------------------------------------- loss pieces


def test_clipped_surrogate_by_hand():
    ratio = jnp.array([0.5, 1.0, 1.5, 1.5, 0.7])
    adv = jnp.array([1.0, 2.0, 1.0, -1.0, -2.0])
    # min(r A, clip(r, .8, 1.2) A): .5 -> min(.5, .8)=.5; 2 -> 2; 1.5 -> min(1.5, 1.2)=1.2;
    # A=-1, r=1.5 -> min(-1.5, -1.2) = -1.5; A=-2, r=.7 -> min(-1.4, -1.6) = -1.6
    expected = -np.mean([0.5, 2.0, 1.2, -1.5, -1.6])
    np.testing.assert_allclose(ppo.clipped_surrogate_loss(ratio, adv, 0.2), expected, rtol=1e-6)


def test_value_loss_by_hand():
    values = jnp.array([1.0, 3.0, 0.0])
    old = jnp.array([0.5, 2.0, 0.0])
    targets = jnp.array([2.0, 2.0, 1.0])
    # clipped values (eps .2): 0.7, 2.2, 0.0 -> squared errors clipped 1.69, .04, 1; unclipped 1, 1, 1
    np.testing.assert_allclose(ppo.value_loss(values, old, targets, 0.2, clip=True), 0.5 * np.mean([1.69, 1.0, 1.0]), rtol=1e-6)
    np.testing.assert_allclose(ppo.value_loss(values, old, targets, 0.2, clip=False), 0.5 * np.mean([1.0, 1.0, 1.0]), rtol=1e-6)


def test_normalize():
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    n = np.asarray(ppo.normalize(x))
    np.testing.assert_allclose(n, (np.arange(1, 5) - 2.5) / np.std(np.arange(1, 5)), rtol=1e-5)


def test_categorical_log_prob_entropy_by_hand():
    logits = jnp.array([[0.0, math.log(3.0)], [1.0, 1.0]])
    lp, ent = ppo.categorical_log_prob_entropy(logits, jnp.array([1, 0], jnp.int32))
    np.testing.assert_allclose(lp, [math.log(0.75), math.log(0.5)], rtol=1e-6)
    np.testing.assert_allclose(ent, [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2.0)], rtol=1e-6)


def test_gaussian_log_prob_entropy_by_hand():
    mean = jnp.array([[0.0, 1.0]])
    log_std = jnp.array([[0.0, math.log(2.0)]])
    a = jnp.array([[1.0, 0.0]])
    lp, ent = ppo.gaussian_log_prob_entropy(mean, log_std, a)
    normal_pdf = lambda x, m, s: math.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    np.testing.assert_allclose(lp[0], math.log(normal_pdf(1, 0, 1) * normal_pdf(0, 1, 2)), rtol=1e-6)
    np.testing.assert_allclose(ent[0], 0.5 * math.log(2 * math.pi * math.e) * 2 + math.log(2.0), rtol=1e-6)


def test_to_env_action_clips_and_rescales():
    low, high = jnp.array([-2.0]), jnp.array([2.0])
    np.testing.assert_allclose(ppo.to_env_action(jnp.array([[-3.0], [0.25], [1.5]]), low, high)[:, 0], [-2.0, 0.5, 2.0])


# ---------------------------------------------------------------- training


def first_and_last(values):
    values = np.asarray(values)
    finite = values[np.isfinite(values)]
    return finite[0], finite[-1]


@pytest.mark.parametrize("backend", ["flax", "haiku"])
def test_ppo_learns_cartpole_on_both_backends(backend):
    config = make_config(
        total_steps=24_576, num_envs=8, num_steps=32, num_epochs=10, num_minibatches=1, lr=1e-3, gamma=0.98,
        gae_lambda=0.8, ent_coef=0.0, hidden=[32, 32], log_interval=32, eval_envs=4, network_backend=backend,
    )
    _, metrics = jax.jit(ppo.make_train(config))(jax.random.PRNGKey(0))
    first, last = first_and_last(metrics["episode_return"])
    assert metrics["step"][-1] == 24_576
    assert last > 2 * first and last > 60, (first, last)
    assert metrics["eval_return"][-1] > 100, metrics["eval_return"]


def test_ppo_continuous_pendulum_improves_and_acts_within_bounds():
    config = make_config(
        "Pendulum-v1", total_steps=49_152, num_envs=16, num_steps=256, num_epochs=10, num_minibatches=16, lr=1e-3,
        gamma=0.9, ent_coef=0.0, reward_scale=0.1, clip_value_loss=False, hidden=[32, 32], log_interval=4,
    )
    state, metrics = jax.jit(ppo.make_train(config))(jax.random.PRNGKey(0))
    returns = np.asarray(metrics["episode_return"])
    assert np.all(np.isfinite(returns)) and np.all(np.isfinite(metrics["value_loss"]))
    assert returns[-1] > returns[0] + 150, returns
    action = ppo.make_policy(config)(state["params"], jnp.array([1.0, 0.0, 0.0]), jax.random.PRNGKey(0))
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0


def test_vmap_over_seeds_equals_per_seed_runs():
    config = make_config(total_steps=512)
    train = ppo.make_train(config)
    keys = jnp.stack([jax.random.PRNGKey(1), jax.random.PRNGKey(2)])
    _, batched = jax.jit(jax.vmap(train))(keys)
    single_train = jax.jit(train)
    for i in range(2):
        _, single = single_train(keys[i])
        for name in ("step", "episode_return", "policy_loss", "value_loss", "entropy"):
            np.testing.assert_allclose(np.asarray(batched[name][i]), np.asarray(single[name]), rtol=1e-5, atol=1e-6, err_msg=name)


def test_chunked_run_equals_one_run_with_a_shared_torso():
    config = make_config(total_steps=1024, log_interval=2, shared_network=True)  # 8 updates, 4 log points
    trainer = ppo.make_trainer(config)
    hp = hyperparams(config.agent)
    run = jax.jit(trainer.run, static_argnums=2)
    state = jax.jit(trainer.init)(jax.random.PRNGKey(3), hp)
    whole_state, whole = run(state, hp, 4)
    half_state, first = run(state, hp, 2)
    half_state, second = run(half_state, hp, 2)
    for name in whole:
        np.testing.assert_array_equal(np.concatenate([first[name], second[name]]), whole[name], err_msg=name)
    jax.tree.map(np.testing.assert_array_equal, half_state, whole_state)
    assert np.all(np.isfinite(whole["value_loss"]))
    action = ppo.make_policy(config)(whole_state["params"], jnp.zeros(4), jax.random.PRNGKey(0))
    assert action.shape == () and action.dtype == jnp.int32


# ---------------------------------------------------------------- bad config


@pytest.mark.parametrize(
    "override, key",
    [
        (dict(num_minibatches=3), "agent.num_minibatches"),
        (dict(total_steps=100), "agent.total_steps"),
        (dict(log_interval=3), "agent.log_interval"),
        (dict(activation="sigmoid"), "agent.activation"),
        (dict(network_backend="torch"), "agent.network_backend"),
        (dict(lr=0.0), "agent.lr"),
        (dict(hidden=[]), "agent.hidden"),
    ],
)
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_config(**override)



# ---------------------------------------------------------------- the fused minibatch gradient


def triton_source_backend() -> str:
    """The backend that runs the Triton source here: the GPU kernel, else the CPU interpreter."""
    import kernels

    return "triton" if "triton" in kernels.available_backends() else "interpret"


@pytest.mark.parametrize("network_backend", ["flax", "haiku"])
@pytest.mark.parametrize("kernel_backend", ["reference", "kernel"])
def test_fused_gradient_equals_autodiff_of_the_agents_loss(network_backend, kernel_backend):
    """kernels.ppo_actor_critic_grads (through fused_loss_grads) against jax.grad of the loss built from
    this module's pieces and the real network, on a random minibatch with some ratios clipped."""
    config = make_config(network_backend=network_backend, activation="tanh", hidden=[16, 8])
    net, _ = ppo.make_network(config)
    rng = np.random.default_rng(0)
    m = 37
    obs = jnp.asarray(rng.normal(size=(m, 4)).astype(np.float32))
    params = net.init(jax.random.PRNGKey(1), obs[0])
    logits, values = net.apply(params, obs)
    actions = jnp.asarray(rng.integers(0, 2, m), jnp.int32)
    log_probs = jax.nn.log_softmax(logits)[jnp.arange(m), actions] + jnp.asarray(rng.normal(size=m).astype(np.float32) * 0.3)
    batch = (ppo.LearnBatch(obs, actions, log_probs, values + 0.3), jnp.asarray(rng.normal(size=m).astype(np.float32)), jnp.asarray(rng.normal(size=m).astype(np.float32)))
    hparams = {"clip_eps": jnp.float32(0.2), "vf_clip_eps": jnp.float32(0.2), "ent_coef": jnp.float32(0.05), "vf_coef": jnp.float32(0.5)}

    def loss(params):
        trans, advantages, targets = batch
        policy, value = net.apply(params, trans.obs)
        log_prob, entropy = ppo.categorical_log_prob_entropy(policy, trans.action)
        ratio = jnp.exp(log_prob - trans.log_prob)
        return (ppo.clipped_surrogate_loss(ratio, ppo.normalize(advantages), 0.2) + 0.5 * ppo.value_loss(value, trans.value, targets, 0.2, True)
                - 0.05 * jnp.mean(entropy))

    import kernels

    kernel_backend = triton_source_backend() if kernel_backend == "kernel" else kernel_backend
    with jax.default_matmul_precision("highest"):
        want = jax.grad(loss)(params)

        with kernels.use_backend(kernel_backend):
            got, stats = ppo.fused_loss_grads(params, batch, hparams, config.agent)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    tolerance = 2e-2 if kernel_backend == "triton" else 2e-4  # tf32 products on the GPU
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tolerance, atol=tolerance * float(jnp.max(jnp.abs(w))) + 1e-7)
    assert 0.0 < float(stats["clip_fraction"]) < 1.0


def test_fused_update_trains_like_autodiff_through_the_interpreter():
    """One short run with the Triton kernels (fused gradient, GAE and policy head; through the interpreter
    on the CPU) ends at the same parameters as the reference backend (autodiff), up to rounding."""
    import kernels

    config = make_config(total_steps=32, num_envs=2, num_steps=8, num_epochs=2, num_minibatches=2, hidden=[16, 16], log_interval=2)
    assert ppo.fused_update_unfit_reason(config) is None
    runs = {}
    kernel = triton_source_backend()
    for backend in ("reference", kernel):
        with kernels.use_backend(backend):
            train = ppo.make_train(config)
            runs[backend] = jax.jit(train)(jax.random.PRNGKey(3))[0]["params"]
    tolerance = 1e-2 if kernel == "triton" else 1e-4  # tf32 products on the GPU, in both paths but not alike
    for g, w in zip(jax.tree.leaves(runs[kernel]), jax.tree.leaves(runs["reference"])):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tolerance, atol=tolerance / 10)


def test_fused_update_unfit_configs_say_why():
    assert "continuous" in ppo.fused_update_unfit_reason(make_config("Pendulum-v1"))
    assert "two tanh or relu" in ppo.fused_update_unfit_reason(make_config(shared_network=True))
    assert "two tanh or relu" in ppo.fused_update_unfit_reason(make_config(hidden=[16, 16, 16]))
    assert "limits" in ppo.fused_update_unfit_reason(make_config(hidden=[256, 256]))
    assert ppo.fused_update_unfit_reason(make_config(activation="relu")) is None
