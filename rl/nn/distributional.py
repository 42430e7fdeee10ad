"""The distributional twin critics of FastTD3 and FastSAC (Seo et al. 2025, after C51: Bellemare
et al. 2017): each critic reads concat(obs, action) and puts logits over `num_atoms` atoms of a
fixed support z_k = v_min + k (v_max - v_min) / (K - 1), k = 0..K-1; Q_i(s, a) = sum_k
softmax(l_i)_k z_k is its expected value.

Target, for a sampled transition (s, a, R, s', terminated, n) (`rl.agents.fast_recipe`: R the
discounted sum of n rewards; n = 1 without n-step returns), discount d = gamma^n (1 - terminated),
the next action a' (TD3: the smoothed target action; SAC: a' ~ pi(s')) and its bonus b (SAC:
-alpha log pi(a'|s'), which enters the value before the projection; TD3: 0):

    m_i = Phi(R + d b + d z ; p'_i)          p'_i = softmax(l'_i(s', a')), the target critics'
                                              (Phi: `kernels.categorical_projection` onto z)
    m   = m_1 where E[m_1] < E[m_2] else m_2  per sample                (clipped double Q)
    L_Q = mean_b CE(m, l_1(s, a)) + mean_b CE(m, l_2(s, a)),  CE(m, l) = -sum_k m_k log softmax(l)_k

Clipped double Q is FastTD3's (`fast_td3/train.py`, `use_cdq`): both critics' target
distributions are projected, their expected values compared per sample, and both critics regress
onto the one of the smaller expected value; the two cross-entropies are summed. The actor
maximises min(Q_1, Q_2)(s, mu(s)) of the expected values (FastTD3's actor loss with `use_cdq`);
SAC's actor loss already reads min(Q1, Q2).

The fused twin-critic kernels (`rl.fused.critic`) hold scalar heads only: these critics run
through the network's apply and autodiff (XLA), the projection through `kernels` with the agent's
`backend`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rl.core import losses
from rl.nn import layers, networks


def support(v_min: float, v_max: float, num_atoms: int) -> jax.Array:
    """The fixed atoms z [K]: `num_atoms` evenly spaced values from v_min to v_max, float32."""
    return jnp.linspace(v_min, v_max, num_atoms, dtype=jnp.float32)


def twin_distributional_q(torso: Callable, num_atoms: int) -> Callable:
    """Two independent distributional Q-networks in one parameter tree: `fn(layers, obs, action)
    -> (logits_1, logits_2)`, each [..., num_atoms], each torso reading concat(obs, action), each
    head one linear layer (gain 1, as `networks.q_head`)."""
    head = networks.q_head(num_atoms)

    def fn(layers, obs, action):
        x = jnp.concatenate(
            [jnp.asarray(obs, jnp.float32), jnp.asarray(action, jnp.float32)], axis=-1
        )
        return tuple(head(layers, torso(layers, x)) for _ in range(2))

    return fn


def twin_critic(network_config, num_atoms: int):
    """The distributional twin critics as a `Network` on `network_config`'s backend (its critic
    torsos: `network_config.critic`)."""
    if getattr(network_config, "batch_renorm", False):
        raise ValueError("distributional critics are built without batch renormalisation")
    critic = network_config.critic
    fn = twin_distributional_q(networks.make_torso(critic), num_atoms)
    return layers.build(fn, critic.backend, critic.init)


def expected_values(logits, z, *, backend: str | None = None):
    """Q = sum_k softmax(logits)_k z_k over the last axis: [..., K] -> [...]."""
    return losses.categorical_q_values(logits, z, backend=backend)


def twin_target_distribution(
    reward, discount, next_logits_1, next_logits_2, z, *, backend=None, deterministic=False
):
    """The clipped double-Q target distribution m [B, K] (the module docstring), held fixed.

    Args:
      reward: [B] R + d b (the bonus already added: `critic_loss`).
      discount: [B] d = gamma^n (1 - terminated).
      next_logits_1, next_logits_2: [B, K] the target critics' logits at (s', a').
      z: [K] the support.
    Returns:
      m [B, K]: per row, the projection of R + d z under softmax(next_logits_i) for the critic i
      whose projected distribution has the smaller expected value (`m_1 if E[m_1] < E[m_2] else
      m_2`, as FastTD3: critic 2's on ties). Both projections are one
      `kernels.categorical_projection` call on the stacked [2B, K] rows."""
    size = reward.shape[0]
    probs = jnp.concatenate([next_logits_1, next_logits_2])
    probs = jax.nn.softmax(probs.astype(jnp.float32), axis=-1)
    both = losses.categorical_td_target(
        jnp.concatenate([reward, reward]),
        jnp.concatenate([discount, discount]),
        probs,
        z,
        backend=backend,
        deterministic=deterministic,
    )
    m1, m2 = both[:size], both[size:]
    first = (m1 @ z < m2 @ z)[:, None]
    return jax.lax.stop_gradient(jnp.where(first, m1, m2))


def twin_cross_entropy(logits_1, logits_2, target):
    """L_Q = mean_b CE(m, logits_1) + mean_b CE(m, logits_2), CE(m, l) = -sum_k m_k log
    softmax(l)_k (FastTD3's qf1_loss + qf2_loss); `target` m [B, K] held fixed."""
    ce_1, _ = losses.categorical_cross_entropy(logits_1, target)
    ce_2, _ = losses.categorical_cross_entropy(logits_2, target)
    return jnp.mean(ce_1) + jnp.mean(ce_2)


def critic_loss(
    critic: Callable,
    z,
    critic_params,
    target_critic_params,
    batch,
    next_action,
    bonus,
    discount,
    *,
    backend=None,
    deterministic=False,
):
    """(L_Q, mean Q_1(s, a)) of the distributional twin critics on a minibatch (the module
    docstring); `critic(params, obs, action) -> (logits_1, logits_2)` is the network's apply,
    `next_action` a' [B, ...], `bonus` b [B] (SAC's -alpha log pi(a'|s'); zeros for TD3) and
    `discount` d [B]."""
    next_logits = critic(target_critic_params, batch["next_obs"], next_action)
    reward = batch["reward"] + discount * bonus
    target = twin_target_distribution(
        reward, discount, *next_logits, z, backend=backend, deterministic=deterministic
    )
    logits_1, logits_2 = critic(critic_params, batch["obs"], batch["action"])
    q_1 = jax.lax.stop_gradient(expected_values(logits_1, z, backend=backend))
    return twin_cross_entropy(logits_1, logits_2, target), jnp.mean(q_1)


def twin_values(critic: Callable, z, *, backend=None) -> Callable:
    """`values(params, obs, action) -> (Q_1, Q_2)`: the expected values of the twin critics
    `critic`, for the actor's loss."""

    def values(params, obs, action):
        logits_1, logits_2 = critic(params, obs, action)
        return (
            expected_values(logits_1, z, backend=backend),
            expected_values(logits_2, z, backend=backend),
        )

    return values
