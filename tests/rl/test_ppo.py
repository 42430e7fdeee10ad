"""PPO: the env-space action of the policy, short training runs (both network backends, discrete
and continuous), vmap and chunking invariance, bad configs, and the fused minibatch gradient against
autodiff of the agent's own loss. (The loss functions: tests/rl/test_losses_ppo.py; the policy
distributions: tests/rl/test_distributions.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import kernels
from rl.agents import ppo, ppo_variants
from rl.config import build_config, hyperparams
from rl.config.parsing import ConfigError
from rl.core import environment, optimizers


def make_config(env_id="CartPole-v1", network=None, kernel_backend=None, **agent):
    base = dict(
        name="ppo",
        total_steps=1024,
        num_envs=4,
        num_steps=32,
        num_epochs=2,
        num_minibatches=2,
        log_interval=2,
    )
    base.update(agent)
    base["network"] = {"hidden": [16, 16], **(network or {})}
    data = {"env": {"id": env_id}, "agent": base}
    if kernel_backend is not None:
        data["kernels"] = {"backend": kernel_backend}
    return build_config(data)


# ---------------------------------------------------------------- training


def first_and_last(values):
    values = np.asarray(values)
    finite = values[np.isfinite(values)]
    return finite[0], finite[-1]


@pytest.mark.parametrize("backend", ["flax", "haiku"])
def test_ppo_learns_cartpole_on_both_backends(backend):
    config = make_config(
        total_steps=24_576,
        num_envs=8,
        num_steps=32,
        num_epochs=10,
        num_minibatches=1,
        lr=1e-3,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        log_interval=32,
        eval_envs=4,
        network={"hidden": [32, 32], "backend": backend},
    )
    _, metrics = jax.jit(ppo.make_train(config))(jax.random.PRNGKey(0))
    first, last = first_and_last(metrics["episode_return"])
    assert metrics["step"][-1] == 24_576
    assert last > 2 * first and last > 60, (first, last)
    assert metrics["eval_return"][-1] > 100, metrics["eval_return"]


def test_ppo_continuous_pendulum_improves_and_acts_within_bounds():
    config = make_config(
        "Pendulum-v1",
        total_steps=49_152,
        num_envs=16,
        num_steps=256,
        num_epochs=10,
        num_minibatches=16,
        lr=1e-3,
        gamma=0.9,
        ent_coef=0.0,
        reward_scale=0.1,
        clip_value_loss=False,
        network={"hidden": [32, 32]},
        log_interval=4,
    )
    state, metrics = jax.jit(ppo.make_train(config))(jax.random.PRNGKey(0))
    returns = np.asarray(metrics["episode_return"])
    assert np.all(np.isfinite(returns)) and np.all(np.isfinite(metrics["value_loss"]))
    assert returns[-1] > returns[0] + 150, returns
    policy = ppo.make_policy(config)
    obs = jnp.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 8.0], [0.0, 1.0, -8.0]])
    actions = policy(state.params, obs, jax.random.PRNGKey(0))
    assert actions.shape == (3, 1) and np.all(np.abs(np.asarray(actions)) <= 2.0)
    net, _ = ppo.make_network(config.agent, *environment.make_env(config))
    mean = net.apply(state.params, obs)[0][0]
    np.testing.assert_allclose(
        actions, np.clip(np.asarray(mean), -1.0, 1.0) * 2.0, rtol=1e-6, atol=1e-6
    )  # [-1, 1] -> [-2, 2]


def test_vmap_over_seeds_equals_per_seed_runs():
    """With the kernel backend named (on a GPU: the triton kernels; on the CPU: the reference), a
    seed run alone and the same seed vmapped beside another agree. (With the automatic choice on a
    GPU a lone seed's minibatch gradient goes to XLA, the crossover of
    kernels.ppo_actor_critic_grads_flat, so the two agree only to rounding there.)"""
    config = make_config(total_steps=512, kernel_backend=kernels.resolve_backend(None))
    train = ppo.make_train(config)
    keys = jnp.stack([jax.random.PRNGKey(1), jax.random.PRNGKey(2)])
    _, batched = jax.jit(jax.vmap(train))(keys)
    single_train = jax.jit(train)
    for i in range(2):
        _, single = single_train(keys[i])
        for name in ("step", "episode_return", "policy_loss", "value_loss", "entropy"):
            np.testing.assert_allclose(
                np.asarray(batched[name][i]),
                np.asarray(single[name]),
                rtol=1e-5,
                atol=1e-6,
                err_msg=name,
            )
        # CartPole pays 1 a step: the wrapper's episode returns and lengths agree; episodes end
        np.testing.assert_array_equal(
            np.asarray(single["episode_return"]), np.asarray(single["episode_length"])
        )
        assert int(np.sum(single["episodes"])) > 0


def test_unrolled_loops_compute_the_same_run():
    """agent.unroll changes loop trips only (the rollout's 32 steps and the minibatch scans, 8 and 2
    per trip): the same metrics and params as the rolled run, to float32 round-off."""
    key = jax.random.PRNGKey(3)
    state, metrics = jax.jit(ppo.make_train(make_config(total_steps=512)))(key)
    unrolled_state, unrolled = jax.jit(ppo.make_train(make_config(total_steps=512, unroll=8)))(key)
    for name in ("step", "episode_return", "policy_loss", "value_loss", "entropy"):
        np.testing.assert_allclose(
            np.asarray(unrolled[name]),
            np.asarray(metrics[name]),
            rtol=1e-5,
            atol=1e-6,
            err_msg=name,
        )
    for a, b in zip(jax.tree.leaves(unrolled_state.params), jax.tree.leaves(state.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_chunked_run_equals_one_run_with_a_shared_torso():
    config = make_config(
        total_steps=1024, log_interval=2, shared_network=True
    )  # 8 updates, 4 log points
    trainer = ppo.make_trainer(config)
    hp = hyperparams(config.agent)
    run = jax.jit(trainer.run, static_argnums=2)
    state = jax.jit(trainer.init)(jax.random.PRNGKey(3), hp)
    whole_state, whole = run(state, hp, 4)
    half_state, first = run(state, hp, 2)
    half_state, second = run(half_state, hp, 2)
    for name in whole:
        np.testing.assert_array_equal(
            np.concatenate([first[name], second[name]]), whole[name], err_msg=name
        )
    jax.tree.map(np.testing.assert_array_equal, half_state, whole_state)
    assert np.all(np.isfinite(whole["value_loss"]))
    action = ppo.make_policy(config)(whole_state.params, jnp.zeros(4), jax.random.PRNGKey(0))
    assert action.shape == () and action.dtype == jnp.int32


def test_adam_eps_is_the_optimisers_epsilon():
    """Adam's first step is lr g / (|g| + eps) per coordinate (bias-corrected moments of one
    gradient), with eps = agent.adam_eps, as PPO builds its optimiser."""
    g = jnp.array([1e-3, -2e-5, 0.5], jnp.float32)
    for eps in (1e-5, 1e-8, 1.0):
        agent = make_config(adam_eps=eps, anneal_lr=False).agent
        optimizer = optimizers.annealed_clipped_adam(agent, 0.1, 1e9, eps=agent.adam_eps)
        updates, _ = optimizer.update(g, optimizer.init(jnp.zeros(3)), jnp.zeros(3))
        np.testing.assert_allclose(updates, -0.1 * g / (jnp.abs(g) + eps), rtol=1e-5)


# ---------------------------------------------------------------- bad config


@pytest.mark.parametrize(
    "override, key",
    [
        (dict(num_minibatches=3), "agent.num_minibatches"),
        (dict(total_steps=100), "agent.total_steps"),
        (dict(log_interval=3), "agent.log_interval"),
        (dict(network={"activation": "sigmoid"}), "agent.network.activation"),
        (dict(network={"backend": "torch"}), "agent.network.backend"),
        (dict(network={"hidden": []}), "agent.network.hidden"),
        (dict(hidden=[16, 16]), "agent.hidden"),  # the network lives in agent.network
        (dict(lr=0.0), "agent.lr"),
        (dict(gae_horizon=-1), "agent.gae_horizon"),
        (dict(gae_horizon=33), r"agent.gae_horizon \(33\) exceeds agent.num_steps \(32\)"),
        (dict(adam_eps=0.0), "agent.adam_eps"),
        (
            dict(minibatch_advantages=True),
            r"agent.minibatch_advantages needs agent.gae_horizon > 0",
        ),
        (
            dict(minibatch_advantages=True, gae_horizon=5),
            r"agent.gae_horizon \(5\) to divide agent.num_steps \(32\)",
        ),
        (
            dict(minibatch_advantages=True, gae_horizon=8, num_minibatches=32),
            r"agent.num_minibatches \(32\) must divide the 16 segments",
        ),
        (dict(minibatch_advantages=True, gae_horizon=8, recompute_advantages=True), "choose one"),
        (dict(network={"init": "xavier"}), "agent.network.init"),
    ],
)
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_config(**override)


@pytest.mark.parametrize(
    "override, suggestion",
    [
        # batch 4 * 32 = 128 steps; log_interval 2 -> valid total_steps are multiples of 256
        (
            dict(total_steps=1000),
            "gives 7 updates of agent.num_envs * agent.num_steps = 128 steps, which must be a "
            "positive multiple of agent.log_interval (2); nearest valid: agent.total_steps=768 or "
            "agent.total_steps=1024 (multiples of 128 * 2 = 256)",
        ),
        (
            dict(total_steps=100),
            "gives 0 updates of agent.num_envs * agent.num_steps = 128 steps, which must be a "
            "positive multiple of agent.log_interval (2); nearest valid: agent.total_steps=256 "
            "(multiples",
        ),
        (
            dict(log_interval=3),
            "agent.total_steps (1024) gives 8 updates of agent.num_envs * agent.num_steps = 128 "
            "steps, which must be a positive multiple of agent.log_interval (3); nearest valid: "
            "agent.total_steps=768 or agent.total_steps=1152",
        ),
    ],
)
def test_total_steps_error_suggests_the_nearest_valid_values(override, suggestion):
    with pytest.raises(ConfigError) as info:
        make_config(**override)
    assert suggestion in str(info.value)
    for value in [
        int(v) for v in str(info.value).split("agent.total_steps=")[1:] for v in [v.split()[0]]
    ]:
        make_config(**{**override, "total_steps": value})  # each suggestion is accepted


def test_check_env_refuses_unbounded_box_actions():
    from envs.spaces import Box

    class Unbounded:
        def action_space(self, params):
            return Box(low=-np.inf, high=np.inf, shape=(1,))

    config = make_config("Pendulum-v1")
    with pytest.raises(ConfigError, match="bounded Box"):
        ppo.check_env(config, Unbounded(), None)


def test_acting_takes_the_log_prob_in_plain_jax_on_a_kernel_backend():
    """With a Triton-source backend (here the interpreter, a pure_callback per launch) the rollout
    launches no kernel: log pi(a|s) of the sampled action is plain JAX, equal to the kernel's."""
    import kernels

    config = make_config(kernel_backend=triton_source_backend())
    s = ppo.make_setup(config)
    state = ppo.init_state(s, jax.random.PRNGKey(0), hyperparams(config.agent))
    rollout = lambda state: ppo.rollout(s, state.params, state.envs, jax.random.PRNGKey(1))
    jaxpr = str(jax.make_jaxpr(rollout)(state))
    assert "pure_callback" not in jaxpr and "triton" not in jaxpr
    _, traj, _ = jax.jit(rollout)(state)
    logits = ppo.policy(s, state.params, traj.obs).logits
    expected, _ = kernels.categorical_log_prob_entropy(
        logits, traj.action, backend=config.kernels.backend
    )
    np.testing.assert_allclose(traj.log_prob, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the fused minibatch gradient


def triton_source_backend() -> str:
    """The backend that runs the Triton source here: the GPU kernel, else the CPU interpreter."""
    import kernels

    return "triton" if "triton" in kernels.available_backends() else "interpret"


# The haiku layout through the kernel (the interpreter on the CPU) under -m slow: the default cases
# take the haiku layout through the flat op's reference and the kernel through the flax layout
# (tests/kernels/test_ppo_grads.py checks the kernel on shuffled layouts).
@pytest.mark.parametrize(
    "network_backend, kernel_backend",
    [
        ("flax", "reference"),
        ("haiku", "reference"),
        ("flax", "kernel"),
        pytest.param("haiku", "kernel", marks=pytest.mark.slow),
    ],
)
def test_fused_gradient_equals_autodiff_of_the_agents_loss(network_backend, kernel_backend):
    """kernels.ppo_actor_critic_grads_flat (through ppo_variants.fused_flat_grads, on ravel_pytree's
    vector laid out by fused_layout) against jax.grad of the agent's own minibatch loss
    (rl.core.losses.ppo_loss on the real network), on a random minibatch with some ratios clipped;
    and its squared norm."""
    config = make_config(
        network={"backend": network_backend, "activation": "tanh", "hidden": [16, 8]}
    )
    s = ppo.make_setup(config)._replace(backend="reference")
    net = s.net
    rng = np.random.default_rng(0)
    m = 37
    obs = jnp.asarray(rng.normal(size=(m, 4)).astype(np.float32))
    params = net.init(jax.random.PRNGKey(1), obs[0])
    logits, values = net.apply(params, obs)
    actions = jnp.asarray(rng.integers(0, 2, m), jnp.int32)
    log_probs = jax.nn.log_softmax(logits)[jnp.arange(m), actions] + jnp.asarray(
        rng.normal(size=m).astype(np.float32) * 0.3
    )
    batch = (
        ppo.LearnBatch(obs, actions, log_probs, values + 0.3),
        jnp.asarray(rng.normal(size=m).astype(np.float32)),
        jnp.asarray(rng.normal(size=m).astype(np.float32)),
    )
    hparams = {
        "clip_eps": jnp.float32(0.2),
        "vf_clip_eps": jnp.float32(0.2),
        "ent_coef": jnp.float32(0.05),
        "vf_coef": jnp.float32(0.5),
    }
    loss = lambda params: ppo.minibatch_loss(s, hparams, params, batch)[0]

    kernel_backend = triton_source_backend() if kernel_backend == "kernel" else kernel_backend
    tolerance = 2e-2 if kernel_backend == "triton" else 2e-4  # tf32 products on the GPU
    with jax.default_matmul_precision("highest"):
        want = jax.grad(loss)(params)
        flat_params, unravel = ravel_pytree(params)
        got_flat, sq_norm, stats = ppo_variants.fused_flat_grads(
            hparams, flat_params, unravel, batch, agent=config.agent, backend=kernel_backend
        )
    got = unravel(got_flat)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    np.testing.assert_allclose(
        float(sq_norm),
        float(sum(jnp.sum(jnp.square(w)) for w in jax.tree.leaves(want))),
        rtol=2 * tolerance,
    )
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(
            np.asarray(g),
            np.asarray(w),
            rtol=tolerance,
            atol=tolerance * float(jnp.max(jnp.abs(w))) + 1e-7,
        )
    assert 0.0 < float(stats["clip_fraction"]) < 1.0


def test_fused_update_trains_like_autodiff_through_the_interpreter():
    """One short run with the Triton kernels (fused gradient, GAE and policy head; through the
    interpreter on the CPU), chosen by kernels.backend in the config, ends at the same parameters as
    the reference backend (autodiff), up to rounding."""
    kernel = triton_source_backend()
    runs = {}
    for backend in ("reference", kernel):
        config = make_config(
            total_steps=32,
            num_envs=2,
            num_steps=8,
            num_epochs=2,
            num_minibatches=2,
            log_interval=2,
            kernel_backend=backend,
        )
        assert ppo_variants.fused_update_unfit_reason(config) is None
        runs[backend] = jax.jit(ppo.make_train(config))(jax.random.PRNGKey(3))[0].params
    tolerance = (
        1e-2 if kernel == "triton" else 1e-4
    )  # tf32 products on the GPU, in both paths but not alike
    for g, w in zip(jax.tree.leaves(runs[kernel]), jax.tree.leaves(runs["reference"])):
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(w), rtol=tolerance, atol=tolerance / 10
        )


def test_fused_update_unfit_configs_say_why():
    assert "continuous" in ppo_variants.fused_update_unfit_reason(make_config("Pendulum-v1"))
    assert "two tanh or relu" in ppo_variants.fused_update_unfit_reason(
        make_config(shared_network=True)
    )
    assert "two tanh or relu" in ppo_variants.fused_update_unfit_reason(
        make_config(network={"hidden": [16, 16, 16]})
    )
    assert "two tanh or relu" in ppo_variants.fused_update_unfit_reason(
        make_config(network={"activation": "gelu"})
    )
    assert "limits" in ppo_variants.fused_update_unfit_reason(
        make_config(network={"hidden": [256, 256]})
    )
    assert (
        ppo_variants.fused_update_unfit_reason(make_config(network={"activation": "relu"})) is None
    )
    wide = make_config(network={"hidden": [128, 128]})
    assert ppo_variants.fused_update_unfit_reason(wide) is None  # CartPole's 4 features fit
    from envs.spaces import Box, Discrete

    class FortyFeatures:  # an env with 40 observation features and 6 actions
        observation_space = staticmethod(lambda params: Box(-1.0, 1.0, (40,)))
        action_space = staticmethod(lambda params: Discrete(6))

    assert "shared memory" in ppo_variants.fused_update_unfit_reason(wide, FortyFeatures(), None)
    assert (
        ppo_variants.fused_update_unfit_reason(make_config(), FortyFeatures(), None) is None
    )  # 16 x 16 fits
