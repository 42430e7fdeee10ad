"""Decoupled PPO for lagged rollouts (`agent.lag_correction`, Hilton et al. 2022): under the
actor-learner architecture a rollout may come from params up to `arch.max_lag` updates old; with
the correction PPO clips its ratio around the learner's policy at the update's start (the proximal
policy) and weights each row by min(1, pi_prox / pi_behaviour). Checked here: the weighted
surrogate and the truncated weights by hand and against float64 NumPy (hypothesis), the learner's
first minibatch starting from ratio 1 on a lagged rollout (and not without the correction: the
test can fail), the correction changing nothing on an on-policy rollout, a run through the
actor-learner path logging its weights, and the configs it cannot serve."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sebulba import config

from rl.agents import ppo, ppo_variants
from rl.config import build_config, hyperparams
from rl.config.parsing import ConfigError
from rl.core import losses
from rl.sebulba import learner as sebulba
from rl.sebulba.pieces import make_pieces

CARTPOLE = "gymnasium:CartPole-v1"
KEY = jax.random.PRNGKey(3)


# ---------------------------------------------------------------- the weighted surrogate


def test_weighted_surrogate_by_hand():
    ratio = jnp.array([1.0, 1.2, 0.8])
    advantages = jnp.array([1.0, 1.0, -1.0])
    weights = jnp.array([0.5, 1.0, 0.25])
    # rows: min(1, 1) = 1; min(1.2, 1.1) = 1.1; min(-0.8, -0.9) = -0.9
    got = losses.clipped_surrogate_loss(ratio, advantages, 0.1, weights=weights)
    np.testing.assert_allclose(got, -(0.5 * 1.0 + 1.1 - 0.25 * 0.9) / 3, rtol=1e-6)
    mask = jnp.array([True, True, False])
    got = losses.clipped_surrogate_loss(ratio, advantages, 0.1, mask, weights)
    np.testing.assert_allclose(got, -(0.5 * 1.0 + 1.1) / 2, rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 40), seed=st.integers(0, 2**16), max_weight=st.floats(0.5, 2.0))
def test_truncated_importance_weights_against_numpy(m, seed, max_weight):
    rng = np.random.default_rng(seed)
    log_target, log_behaviour = rng.normal(-1.0, 1.0, (2, m))
    want = np.minimum(max_weight, np.exp(log_target - log_behaviour))
    got = losses.truncated_importance_weights(
        jnp.asarray(log_target, jnp.float32), jnp.asarray(log_behaviour, jnp.float32), max_weight
    )
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert float(jnp.max(got)) <= np.float32(max_weight)
    grad = jax.grad(lambda x: losses.truncated_importance_weights(x, log_behaviour).sum())
    np.testing.assert_array_equal(grad(jnp.asarray(log_target, jnp.float32)), 0.0)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(2, 30), seed=st.integers(0, 2**16))
def test_ppo_loss_with_unit_weights_is_plain_ppo_and_reports_them(m, seed):
    rng = np.random.default_rng(seed)
    rows = [jnp.asarray(rng.normal(size=m), jnp.float32) for _ in range(7)]
    args = (0.2, 0.2, 0.01, 0.5)
    plain, plain_stats = losses.ppo_loss(*rows, *args)
    weighted, stats = losses.ppo_loss(*rows, *args, weights=jnp.ones(m))
    np.testing.assert_allclose(weighted, plain, rtol=1e-6, atol=1e-7)
    assert float(stats["behaviour_weight"]) == 1.0 and "behaviour_weight" not in plain_stats


# ---------------------------------------------------------------- the learner's update


def rollout(pieces, hparams, params, key, steps=16, envs=4):
    """A rollout [steps, envs] of CartPole-shaped random observations whose actions and their
    log-probs come from the policy under `params` (the behaviour policy)."""
    k_obs, k_act, k_rew = jax.random.split(key, 3)
    obs = jax.random.normal(k_obs, (steps, envs, 4))
    _, (action, log_prob), _ = pieces.act(hparams, params, obs.reshape(-1, 4), k_act, 0)
    shape = (steps, envs)
    action, log_prob = action.reshape(shape), log_prob.reshape(shape)
    reward = jax.random.uniform(k_rew, shape)
    final_obs = jnp.concatenate([obs[1:], obs[:1]])
    no_end = jnp.zeros(shape, bool)
    return pieces.transition(obs, action, log_prob, reward, no_end, no_end, final_obs)


def learned(agent, lag):
    """(the update's mean stats, params after it) of the learner on a rollout collected under its
    own params plus `lag` times Gaussian noise (a policy some updates away; 0: on-policy)."""
    cfg = config(CARTPOLE, agent=agent)
    pieces = make_pieces(cfg)
    hparams = hyperparams(cfg.agent)
    params, opt_state, stored = pieces.init(jax.random.PRNGKey(0), hparams, np.zeros(4, np.float32))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    noise = [lag * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    behaviour = jax.tree.unflatten(tree, [x + n for x, n in zip(leaves, noise)])
    traj = rollout(pieces, hparams, behaviour, jax.random.PRNGKey(7))
    new_params, _, _, stats = jax.jit(pieces.learn)(
        hparams, params, opt_state, stored, traj, jax.random.PRNGKey(8)
    )
    return stats, new_params


ONE_STEP = {"num_epochs": 1, "num_minibatches": 1}


def test_a_lagged_rollouts_first_step_starts_at_ratio_one_with_the_correction():
    """Behaviour params some way from the learner's: the first (only) minibatch step's ratios
    are against the learner's own policy with the correction (approx_kl 0, nothing clipped),
    against the behaviour policy without it."""
    corrected, _ = learned({**ONE_STEP, "lag_correction": True}, lag=0.3)
    plain, _ = learned(ONE_STEP, lag=0.3)
    assert float(corrected["approx_kl"]) < 1e-6 and float(corrected["clip_fraction"]) == 0.0
    assert float(plain["approx_kl"]) > 1e-3 and float(plain["clip_fraction"]) > 0.0
    assert 0.0 < float(corrected["behaviour_weight"])
    assert "behaviour_weight" not in plain


def decoupled_objective(s, hparams, net_params, batch, advantages, proximal, behaviour):
    """Hilton et al.'s decoupled policy term written out in float64 NumPy from the network's
    log-probs: -mean(w min(r A, clip(r, 1 - eps, 1 + eps) A)), r = pi / pi_prox, w = min(w_max,
    pi_prox / pi_behaviour), A normalised."""
    head, _ = s.net.apply(net_params, batch.obs)
    log_prob, _ = s.distribution.from_head(head).log_prob_entropy(batch.action, "reference")
    log_prob, proximal, behaviour, a = (
        np.asarray(x, np.float64) for x in (log_prob, proximal, behaviour, advantages)
    )
    a = (a - a.mean()) / (a.std() + 1e-8)
    r, w = (
        np.exp(log_prob - proximal),
        np.minimum(s.agent.lag_weight_max, np.exp(proximal - behaviour)),
    )
    eps = hparams["clip_eps"]
    return -np.mean(w * np.minimum(r * a, np.clip(r, 1 - eps, 1 + eps) * a))


@pytest.mark.parametrize("weight_max", [100.0, 1.0, 0.9])
def test_the_loss_and_its_gradient_are_the_decoupled_objectives(weight_max):
    """On a lagged batch, at params moved from the proximal ones: the minibatch loss's policy term
    equals the written-out objective, and its gradient the gradient of that objective (autodiff
    of the written-out term in JAX, plus the value and entropy terms, which the correction leaves
    alone): the weights' direction and their reaching the gradient both count."""
    agent = {**ONE_STEP, "lag_correction": True, "lag_weight_max": weight_max}
    cfg = config(CARTPOLE, agent=agent)
    s, pieces, hparams = ppo.make_setup(cfg), make_pieces(cfg), hyperparams(cfg.agent)
    params, _, _ = pieces.init(jax.random.PRNGKey(0), hparams, np.zeros(4, np.float32))
    behaviour = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(KEY, x.shape), params)
    traj = rollout(pieces, hparams, behaviour, jax.random.PRNGKey(7))
    batch, advantages, targets = ppo.learn_batch(s, hparams, params, traj)
    proximal = ppo.policy(s, params, traj.obs).log_prob_entropy(traj.action, "reference")[0]
    np.testing.assert_allclose(batch.proximal_log_prob, proximal.reshape(-1), atol=1e-6)
    moved = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(KEY, x.shape), params)
    data = (batch, advantages, targets)
    _, stats = ppo.minibatch_loss(s, hparams, moved, data)
    want = decoupled_objective(s, hparams, moved, batch, advantages, proximal.reshape(-1),
                               traj.log_prob.reshape(-1))  # fmt: skip
    np.testing.assert_allclose(stats["policy_loss"], want, rtol=1e-5, atol=1e-7)

    def written_out(net_params):  # the same objective in JAX, the value and entropy terms kept
        head, values = s.net.apply(net_params, batch.obs)
        pi = s.distribution.from_head(head)
        log_prob, entropy = pi.log_prob_entropy(batch.action, "reference")
        a = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        r = jnp.exp(log_prob - batch.proximal_log_prob)
        w = jnp.minimum(weight_max, jnp.exp(batch.proximal_log_prob - batch.log_prob))
        eps = hparams["clip_eps"]
        policy = -jnp.mean(w * jnp.minimum(r * a, jnp.clip(r, 1 - eps, 1 + eps) * a))
        value = losses.clipped_value_loss(values, batch.value, targets, hparams["vf_clip_eps"])
        return policy + hparams["vf_coef"] * value - hparams["ent_coef"] * jnp.mean(entropy)

    got = jax.grad(lambda p: ppo.minibatch_loss(s, hparams, p, data)[0])(moved)
    want = jax.grad(written_out)(moved)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "agent",
    [{}, {"recompute_advantages": True}, {"minibatch_advantages": True, "gae_horizon": 8}],
    ids=["ppo", "ppo-recompute", "ppo-segments"],
)
def test_the_correction_changes_nothing_on_an_on_policy_rollout(agent):
    """Behaviour = learner params: the proximal policy is the behaviour policy, every weight 1,
    so the update is plain PPO's (up to float rounding of the recomputed log-probs)."""
    corrected_stats, corrected = learned({**agent, "lag_correction": True}, lag=0.0)
    plain_stats, plain = learned(agent, lag=0.0)
    np.testing.assert_allclose(corrected_stats["behaviour_weight"], 1.0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(corrected), jax.tree.leaves(plain)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_run_through_the_actor_learner_path_logs_its_weights():
    agent = {"lag_correction": True, "lag_weight_max": 1.0, "total_steps": 512}
    cfg = config(arch={"max_lag": 1}, agent=agent)
    learner = sebulba.Learner(cfg)
    _, rows = learner.run(learner.init(), num_updates=8)
    weights = [row["behaviour_weight"] for row in rows]
    assert len(weights) == 8 and all(0.0 < w <= 1.0 for w in weights), weights
    assert all(np.isfinite(row["policy_loss"]) for row in rows)


# ---------------------------------------------------------------- configs it cannot serve


def test_configs_without_lagged_rollouts_are_refused():
    with pytest.raises(ConfigError, match=r"agent.lag_weight_max .* agent.lag_correction: true"):
        config(arch={"max_lag": 1}, agent={"lag_weight_max": 1.0})
    with pytest.raises(ConfigError, match=r"agent.lag_correction .* arch.max_lag > 0"):
        config(arch={"max_lag": 0}, agent={"lag_correction": True})
    anakin = {
        "env": {"id": "CartPole-v1"},
        "agent": {"name": "ppo", "lag_correction": True},
    }
    with pytest.raises(ConfigError, match=r"agent.lag_correction .* arch.name: sebulba"):
        build_config(anakin)


def test_the_fused_gradient_kernel_says_it_takes_no_weights():
    agent = {"lag_correction": True, "network": {"hidden": [16, 16]}, "shared_network": False}
    reason = ppo_variants.fused_update_unfit_reason(config(CARTPOLE, agent=agent))
    assert reason is not None and "agent.lag_correction" in reason
