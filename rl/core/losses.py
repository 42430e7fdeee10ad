"""One pure function per RL idea, with its maths, in the style of rlax. Arrays are batched along
leading axes unless a docstring says otherwise; `backend=` is the kernel backend (`kernels`) of
the functions that run a kernels op, and `deterministic=` picks its fixed-order kernel. Nothing
here holds state, reads a config or calls a network. Truncation is not termination throughout: a
transition's discount is gamma (1 - terminated), so a time-limit end still bootstraps from the
observation actually reached (`info["final_obs"]`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

import kernels

# ---------------------------------------------------------------- value-based (DQN, Rainbow)


def action_value(q_values, action):
    """Q(s, a) from rows of Q-values [..., A] and actions [...]: sum_b [b = a] Q(s, b), a select and
    a sum (its gradient is a select too, where a gather's is a scatter-add)."""
    chosen = jnp.arange(q_values.shape[-1]) == jnp.asarray(action)[..., None]
    return jnp.sum(jnp.where(chosen, q_values, 0.0), axis=-1)


def episode_discount(gamma, terminated):
    """gamma_t = gamma (1 - terminated_t): zero only where the episode terminated."""
    return gamma * (1.0 - terminated.astype(jnp.float32))


def n_step_discount(gamma, steps, terminated):
    """gamma^n (1 - terminated) for an n-step transition that bootstraps `steps` steps ahead."""
    return gamma ** steps.astype(jnp.float32) * (1.0 - terminated.astype(jnp.float32))


def bootstrap_value(q_next_target, q_next_selector):
    """Q_target(s', argmax_a Q_selector(s', a)), per row of [..., A] Q-values: DQN (Mnih et al.
    2015) selects with the target network itself, double Q-learning (van Hasselt et al. 2016) with
    the online network."""
    return action_value(q_next_target, jnp.argmax(q_next_selector, axis=-1))


def q_learning_target(reward, discount, next_value):
    """y = r + gamma_t V(s'), held fixed (no gradient)."""
    return jax.lax.stop_gradient(reward + discount * next_value)


def td_loss(td_error, kind: str = "huber"):
    """Per-item loss of a TD error d: huber (delta 1: 0.5 d^2 for |d| <= 1, |d| - 0.5 beyond) or
    mse (d^2)."""
    if kind == "huber":
        return optax.huber_loss(td_error, delta=1.0)
    if kind == "mse":
        return jnp.square(td_error)
    raise ValueError(f"td_loss: kind must be 'huber' or 'mse', got {kind!r}")


def n_step_transition(window, gamma, *, backend: str | None = None, deterministic: bool = False):
    """The n-step transition of the oldest step of a window of the last n steps of each env.

    window: {"obs", "action", "reward", "final_obs", "terminated", "truncated"}, each
    [n, envs, ...]. With k the first step of the window at which the episode ended (terminated or
    truncated), or n - 1 if none did:

        reward = sum_{i <= k} gamma^i r_i,   next_obs = final_obs_k,   terminated = terminated_k,
        bootstrap_steps = k + 1

    so the target is reward + gamma^(k+1) (1 - terminated_k) max_a Q(next_obs, a)
    (`n_step_discount`). The discounted sum runs through `kernels.discounted_returns`.
    """
    n = window["reward"].shape[0]
    done = window["terminated"] | window["truncated"]
    discounts = gamma * (1.0 - done.astype(jnp.float32))
    ret = kernels.discounted_returns(
        window["reward"],
        discounts,
        jnp.zeros_like(window["reward"][0]),
        backend=backend,
        deterministic=deterministic,
    )[0]
    last = jnp.arange(n)[:, None] == n - 1
    end = jnp.argmax(done | last, axis=0)
    take = lambda x: jnp.take_along_axis(x, end.reshape((1, -1) + (1,) * (x.ndim - 2)), axis=0)[0]
    return {
        "obs": window["obs"][0],
        "action": window["action"][0],
        "reward": ret,
        "next_obs": take(window["final_obs"]),
        "terminated": take(window["terminated"]),
        "bootstrap_steps": (end + 1).astype(jnp.int32),
    }


def categorical_q_values(logits, support, *, backend: str | None = None):
    """Q(s, a) = sum_i softmax(logits)_i z_i over the atoms z (last axis of `logits`)."""
    return jnp.sum(kernels.softmax(logits, axis=-1, backend=backend) * support, axis=-1)


def categorical_td_target(
    reward,
    discount,
    next_probs,
    support,
    *,
    backend: str | None = None,
    deterministic: bool = False,
):
    """C51's target distribution (Bellemare et al. 2017), no gradient: the distribution of
    r + gamma_t z under `next_probs` [B, K], projected onto the support z [K]
    (`kernels.categorical_projection`; `deterministic`: its fixed-order kernel).
    `reward`, `discount`: [B]."""
    atoms = reward[:, None] + discount[:, None] * support[None, :]
    return jax.lax.stop_gradient(
        kernels.categorical_projection(
            atoms, next_probs, support, backend=backend, deterministic=deterministic
        )
    )


def categorical_cross_entropy(logits, target_probs):
    """(-sum_i m_i log p_i, KL(m || p)) per row, p = softmax(logits), m the target distribution.
    The KL (clipped at 0) is Rainbow's replay priority."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    cross_entropy = -jnp.sum(target_probs * log_p, axis=-1)
    neg_entropy = jnp.sum(
        jnp.where(
            target_probs > 0,
            target_probs * jnp.log(jnp.where(target_probs > 0, target_probs, 1.0)),
            0.0,
        ),
        axis=-1,
    )
    return cross_entropy, jnp.maximum(cross_entropy + neg_entropy, 0.0)


# ---------------------------------------------------------------- policy gradient (PPO)


def masked_mean(x, mask=None):
    """mean(x) over the rows where `mask` [M] (bool or 0/1) is set: sum_{mask} x / max(|mask|, 1)
    (0 with no row set); mean(x) without a mask. The value ignores what rows left out hold; a
    gradient through it needs them finite (0 times a non-finite derivative is NaN)."""
    if mask is None:
        return jnp.mean(x)
    mask = mask.astype(bool)
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1).astype(x.dtype)


def normalize(x, eps: float = 1e-8, mask=None):
    """(x - mean(x)) / (std(x) + eps), the mean and the standard deviation over the rows `mask`
    sets (`masked_mean`; all rows without one). Rows the mask leaves out are normalised by the
    same numbers, as the loss ignores them."""
    if mask is None:
        return (x - x.mean()) / (x.std() + eps)
    mean = masked_mean(x, mask)
    return (x - mean) / (jnp.sqrt(masked_mean(jnp.square(x - mean), mask)) + eps)


def gae_coefficients(terminated, truncated, gamma, gae_lambda):
    """(d_t, lambda_t) for truncation-aware GAE: d_t = gamma (1 - terminated_t) bootstraps through
    a time limit, lambda_t = lambda (1 - (terminated_t | truncated_t)) stops the advantage chain at
    any episode end."""
    discounts = gamma * (1.0 - terminated.astype(jnp.float32))
    lambdas = gae_lambda * (1.0 - (terminated | truncated).astype(jnp.float32))
    return discounts, lambdas


def truncation_aware_gae(
    rewards,
    values,
    next_values,
    terminated,
    truncated,
    gamma,
    gae_lambda,
    *,
    backend: str | None = None,
    deterministic: bool = False,
):
    """(advantages, value targets) of a time-major rollout, GAE (Schulman et al. 2016) with the
    coefficients of `gae_coefficients` and next_values = V(final_obs_t):

        delta_t = r_t + d_t V(final_obs_t) - V(s_t),
        A_t = delta_t + d_t lambda_t A_{t+1},   R_t = A_t + V(s_t)

    through `kernels.gae`."""
    discounts, lambdas = gae_coefficients(terminated, truncated, gamma, gae_lambda)
    return kernels.gae(
        rewards,
        values,
        next_values,
        discounts,
        lambdas,
        backend=backend,
        deterministic=deterministic,
    )


def truncation_aware_q_lambda(
    rewards,
    next_values,
    terminated,
    truncated,
    gamma,
    q_lambda,
    *,
    backend: str | None = None,
    deterministic: bool = False,
):
    """Peng's Q(lambda) targets of a time-major rollout (PQN; Gallici et al. 2024) with the
    coefficients of `gae_coefficients` and next_values = max_a Q(final_obs_t, a):

        G_t = r_t + d_t [(1 - lambda_t) max_a Q(final_obs_t, a) + lambda_t G_{t+1}]
        (G after the last step: its bootstrap),

    so a time limit still bootstraps and no return chains across an episode end; through
    `kernels.q_lambda_returns`."""
    discounts, lambdas = gae_coefficients(terminated, truncated, gamma, q_lambda)
    return kernels.q_lambda_returns(
        rewards, next_values, discounts, lambdas, backend=backend, deterministic=deterministic
    )


def clipped_surrogate_loss(ratio, advantages, clip_eps, mask=None, weights=None):
    """PPO's clipped surrogate (Schulman et al. 2017), to be minimised:

        -mean(w min(rho A, clip(rho, 1 - eps, 1 + eps) A))

    with rho = pi(a|s) / pi_old(a|s) the probability ratio [M] and A the advantages [M]: the
    policy gains nothing from moving rho beyond 1 +- eps in the direction A rewards. `weights` w
    [M] (held as given; 1 without them) weight the rows: decoupled PPO's importance weights
    (`truncated_importance_weights`). The mean is over the rows `mask` [M] sets (`masked_mean`)."""
    surrogate = jnp.minimum(
        ratio * advantages, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    )
    if weights is not None:
        surrogate = weights * surrogate
    return -masked_mean(surrogate, mask)


def truncated_importance_weights(log_target, log_behaviour, max_weight: float = 1.0):
    """min(max_weight, pi_target(a|s) / pi_behaviour(a|s)) from the two log-probs [M] of the taken
    actions: the importance weights of a sample drawn by the behaviour policy, truncated above as
    V-trace's rho-bar (Espeholt et al. 2018); no gradient flows through them."""
    return jax.lax.stop_gradient(jnp.minimum(max_weight, jnp.exp(log_target - log_behaviour)))


def clipped_value_loss(values, old_values, targets, clip_eps, clip: bool = True, mask=None):
    """PPO's value loss with the value update clipped around the behaviour values V_old:

        0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2))

    and 0.5 mean((V - R)^2) when not `clip`. values, old_values, targets R: [M]; the mean is over
    the rows `mask` [M] sets (`masked_mean`)."""
    unclipped = jnp.square(values - targets)
    if not clip:
        return 0.5 * masked_mean(unclipped, mask)
    clipped = jnp.square(old_values + jnp.clip(values - old_values, -clip_eps, clip_eps) - targets)
    return 0.5 * masked_mean(jnp.maximum(unclipped, clipped), mask)


def ppo_loss(
    log_prob,
    entropy,
    values,
    old_log_probs,
    old_values,
    advantages,
    targets,
    clip_eps,
    vf_clip_eps,
    ent_coef,
    vf_coef,
    clip_value_loss: bool = True,
    mask=None,
    weights=None,
):
    """PPO's objective on one minibatch of M rows, from the current policy's log pi(a|s) and
    entropy H[pi(.|s)] and the current value V(s) of each row (any action distribution):

        L = -mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A))                    (policy_loss)
            + vf_coef 0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2))
            - ent_coef mean(H)                                                  (entropy)

    with rho = exp(log pi(a|s) - log pi_old(a|s)) (`clipped_surrogate_loss`) and the value term
    `clipped_value_loss` (0.5 mean((V - R)^2) without `clip_value_loss`). The advantages A are used
    as given (normalise them first if wanted: `normalize`). With `mask` [M] (bool or 0/1) every
    mean, the stats' too, is over the rows it sets (`masked_mean`): rows that are not the agent's
    decisions (an envpool env's reset step) count for nothing. `weights` [M] weight the rows of
    the policy term (`clipped_surrogate_loss`; decoupled PPO: pi_old is then the proximal policy,
    rho and the stats measure against it, and w = min(w_max, pi_old / pi_behaviour), whose mean the
    stats add as behaviour_weight).

    Args: log_prob, entropy, values, old_log_probs (log pi_old(a|s)), old_values (V_old),
    advantages, targets (R): [M]; clip_eps (eps), vf_clip_eps (eps_v), ent_coef, vf_coef: scalars
    (may be traced).
    Returns: (L, stats), stats the scalars policy_loss, value_loss, entropy (mean H),
    approx_kl = mean(rho - 1 - log rho) and clip_fraction = mean(|rho - 1| > eps).

    `kernels.ppo_actor_critic_grads_flat` computes the gradient of this objective (without
    weights) for a two-MLP categorical actor-critic in fused kernels (tests/rl/test_losses_ppo.py
    ties the two)."""
    log_ratio = log_prob - old_log_probs
    ratio = jnp.exp(log_ratio)
    policy_loss = clipped_surrogate_loss(ratio, advantages, clip_eps, mask, weights)
    value_loss = clipped_value_loss(values, old_values, targets, vf_clip_eps, clip_value_loss, mask)
    entropy = masked_mean(entropy, mask)
    total = policy_loss + vf_coef * value_loss - ent_coef * entropy
    clipped = (jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32)
    stats = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
        "clip_fraction": masked_mean(clipped, mask),
    }
    if weights is not None:
        stats["behaviour_weight"] = masked_mean(weights, mask)
    return total, stats


def gaussian_log_prob_entropy(mean, log_std, actions):
    """Diagonal Gaussian, summed over the last axis: H = sum log sigma + log(2 pi e) / 2 and
    log pi(a) = sum -((a - mu) / sigma)^2 / 2 - log sigma - log(2 pi) / 2."""
    z = (actions - mean) * jnp.exp(-log_std)
    log_prob = jnp.sum(-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi), axis=-1)
    entropy = jnp.sum(log_std + 0.5 * math.log(2 * math.pi * math.e), axis=-1)
    return log_prob, entropy


def tanh_gaussian_log_prob_entropy(mean, log_std, u):
    """(log pi(tanh u), H) of the tanh-squashed diagonal Gaussian at a pre-squash sample u, summed
    over the last axis:

        log pi(tanh u) = sum_j [log N(u_j; mu_j, sigma_j) - log(1 - tanh(u_j)^2)]
        H = sum_j [log sigma_j + log(2 pi e) / 2 + log(1 - tanh(u'_j)^2)],
        u' = mu + sigma stop_grad((u - mu) / sigma)

    H is the one-sample estimate H[N] + E[log |d tanh(u) / du|] (the squashed entropy has no closed
    form) at the given sample, reparameterised: u' equals u, and its gradient flows to mu and sigma
    as a fresh sample's would (Brax's PPO estimates it with a fresh sample). In PPO's ratio the
    Jacobian term of the log-probability cancels, since old and new policies score the same u."""
    log_prob, entropy = gaussian_log_prob_entropy(mean, log_std, u)
    std = jnp.exp(log_std)
    u_reparam = mean + std * jax.lax.stop_gradient((u - mean) / std)
    return (
        log_prob - jnp.sum(tanh_log_det_jacobian(u), axis=-1),
        entropy + jnp.sum(tanh_log_det_jacobian(u_reparam), axis=-1),
    )


# ---------------------------------------------------------------- soft actor-critic (SAC)


def tanh_log_det_jacobian(u):
    """log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), elementwise, stable for large |u|."""
    return 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))


def squashed_gaussian_sample(mean, log_std, key):
    """(a, log pi(a)) with a = tanh(u), u = mu + sigma eps, eps ~ N(0, I) (reparameterised):

    log pi(a) = sum_j [log N(u_j; mu_j, sigma_j) - log(1 - tanh(u_j)^2)]   (over the last axis)."""
    eps = jax.random.normal(key, mean.shape)
    u = mean + jnp.exp(log_std) * eps
    log_normal = -0.5 * eps * eps - log_std - 0.5 * math.log(2.0 * math.pi)
    return jnp.tanh(u), jnp.sum(log_normal - tanh_log_det_jacobian(u), axis=-1)


def squashed_gaussian_log_prob(mean, log_std, u):
    """log pi(tanh(u)) of the squashed Gaussian for a given pre-squash u
    (`squashed_gaussian_sample`)."""
    z = (u - mean) * jnp.exp(-log_std)
    return jnp.sum(
        -0.5 * z * z - log_std - 0.5 * math.log(2.0 * math.pi) - tanh_log_det_jacobian(u), axis=-1
    )


def soft_value(q1, q2, log_prob, alpha):
    """V(s') = min(Q1, Q2)(s', a') - alpha log pi(a'|s') for a sampled a' (clipped double Q)."""
    return jnp.minimum(q1, q2) - alpha * log_prob


def soft_value_discrete(log_pi, q1, q2, alpha):
    """V(s') = sum_a pi(a|s') (min(Q1, Q2)(s', a) - alpha log pi(a|s')) for a categorical policy
    (Christodoulou 2019); `log_pi`, `q1`, `q2`: [..., A]."""
    return jnp.sum(jnp.exp(log_pi) * (jnp.minimum(q1, q2) - alpha * log_pi), axis=-1)


def twin_q_loss(q1, q2, target):
    """L_Q = (mean((Q1 - y)^2) + mean((Q2 - y)^2)) / 2, y held fixed."""
    target = jax.lax.stop_gradient(target)
    return 0.5 * (jnp.mean(jnp.square(q1 - target)) + jnp.mean(jnp.square(q2 - target)))


def sac_actor_loss(log_prob, q1, q2, alpha):
    """L_pi = mean(alpha log pi(a|s) - min(Q1, Q2)(s, a)), a reparameterised sample of pi(s)."""
    return jnp.mean(alpha * log_prob - jnp.minimum(q1, q2))


def sac_actor_loss_discrete(log_pi, q1, q2, alpha):
    """L_pi = mean(sum_a pi(a|s) (alpha log pi(a|s) - min(Q1, Q2)(s, a))), the Q-values held
    fixed."""
    q = jax.lax.stop_gradient(jnp.minimum(q1, q2))
    return jnp.mean(jnp.sum(jnp.exp(log_pi) * (alpha * log_pi - q), axis=-1))


def temperature_loss(log_alpha, entropy, target_entropy):
    """L_alpha = -log_alpha (log pi + target_entropy) = log_alpha (H - target_entropy), H held
    fixed: alpha grows while the policy's entropy H is below the target."""
    return log_alpha * (jax.lax.stop_gradient(entropy) - target_entropy)


# ---------------------------------------------------------------- TD3


def smoothed_target_action(
    target_action, key, noise_std, noise_clip, low: float = -1.0, high: float = 1.0
):
    """TD3's target policy smoothing (Fujimoto et al. 2018): a' = clip(mu'(s') + clip(eps, -c, c),
    low, high), eps ~ N(0, noise_std^2) per action dimension, c = `noise_clip`."""
    noise = jnp.clip(
        noise_std * jax.random.normal(key, target_action.shape), -noise_clip, noise_clip
    )
    return jnp.clip(target_action + noise, low, high)


def deterministic_policy_loss(q):
    """L_mu = -mean Q(s, mu(s)) (DDPG/TD3's actor loss, through the first critic); the gradient
    reaches the actor through the action."""
    return -jnp.mean(q)
