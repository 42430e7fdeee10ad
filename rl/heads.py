"""Heads: features -> what an agent reads, written against the `rl.layers` interface as
`head(layers, x)`.

Q-values, a state value, Rainbow's dueling / noisy / distributional head, and policies: categorical
logits, diagonal Gaussians (state-independent or tanh-squashed log-std), SAC's bounded log-std and
TD3's deterministic tanh action. `rl.networks.with_head`, `actor_critic` and `twin_q` join a head
to a torso.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from envs.spaces import Box
from rl import distributions
from rl.layers import activation, constant_init


def q_head(num_actions: int) -> Callable:
    """Q-values [..., num_actions] from features: one linear layer (gain 1)."""
    return lambda layers, x: layers.dense(x, num_actions, scale=1.0)


def value_head() -> Callable:
    """A state value [...] from features: one linear unit (gain 1)."""
    return lambda layers, x: layers.dense(x, 1, scale=1.0)[..., 0]


def categorical_policy_head(num_actions: int) -> Callable:
    """Logits [..., num_actions] from features (gain 0.01: a near-uniform initial policy)."""
    return lambda layers, x: layers.dense(x, num_actions, scale=0.01)


def gaussian_policy_head(action_dim: int, log_std_init: float = 0.0) -> Callable:
    """(mean, log_std) of a diagonal Gaussian, both [..., action_dim]: the mean from features (gain
    0.01), the log-std one learned state-independent parameter per dimension (initial
    `log_std_init`)."""

    def head(layers, x):
        mean = layers.dense(x, action_dim, scale=0.01)
        log_std = layers.param("log_std", (action_dim,), constant_init(log_std_init))
        return mean, jnp.broadcast_to(log_std, mean.shape)

    return head


def tanh_gaussian_policy_head(action_dim: int, min_std: float = 0.001) -> Callable:
    """(mean, log_std) of a state-dependent diagonal Gaussian whose samples are squashed by tanh
    (Brax's PPO policy), both [..., action_dim]: from one dense layer of 2 action_dim outputs (gain
    0.01) split into the mean and a raw scale, sigma = softplus(raw) + min_std (about 0.69 at
    first)."""

    def head(layers, x):
        mean, raw = jnp.split(layers.dense(x, 2 * action_dim, scale=0.01), 2, axis=-1)
        return mean, jnp.log(jax.nn.softplus(raw) + min_std)

    return head


def deterministic_policy_head(action_dim: int) -> Callable:
    """An action tanh(x W + b) in [-1, 1]^action_dim from features (gain 0.01: near 0 at first)."""
    return lambda layers, x: jnp.tanh(layers.dense(x, action_dim, scale=0.01))


def squashed_gaussian_head(
    action_dim: int, log_std_min: float = -5.0, log_std_max: float = 2.0
) -> Callable:
    """(mean, log_std) of SAC's pre-tanh Gaussian, [..., action_dim], the log-std bounded smoothly:
    log_std = min + (max - min) (tanh(raw) + 1) / 2."""

    def head(layers, x):
        mean = layers.dense(x, action_dim, scale=0.01)
        raw = layers.dense(x, action_dim, scale=0.01)
        return mean, log_std_min + 0.5 * (log_std_max - log_std_min) * (jnp.tanh(raw) + 1.0)

    return head


def rainbow_head(
    num_actions: int,
    num_atoms: int = 1,
    dueling: bool = True,
    noisy: bool = True,
    head_hidden: int = 0,
    act: str = "relu",
) -> Callable:
    """Rainbow's head, every part switchable: outputs [..., num_actions, num_atoms] (logits over
    atoms when num_atoms > 1, Q-values when 1).

    Each stream: an optional hidden layer of `head_hidden` units, then a linear output; factorised
    noisy layers when `noisy`. Dueling (Wang et al. 2016): Q = V + A - mean_a A from a value stream
    V [..., 1, atoms] and an advantage stream A [..., actions, atoms]; else one stream."""
    f = activation(act)

    def stream(layers, x, outputs):
        if head_hidden:
            x = f(layers.noisy_dense(x, head_hidden) if noisy else layers.dense(x, head_hidden))
        return layers.noisy_dense(x, outputs) if noisy else layers.dense(x, outputs, scale=1.0)

    def head(layers, x):
        shape = x.shape[:-1] + (num_actions, num_atoms)
        if not dueling:
            return stream(layers, x, num_actions * num_atoms).reshape(shape)
        value = stream(layers, x, num_atoms).reshape(x.shape[:-1] + (1, num_atoms))
        advantage = stream(layers, x, num_actions * num_atoms).reshape(shape)
        return value + advantage - advantage.mean(axis=-2, keepdims=True)

    return head


def policy_head(space, continuous_policy: str = "gaussian", log_std_init: float = 0.0):
    """(head, distribution class) for an action space: a categorical head for Discrete actions; for
    a Box a diagonal Gaussian head (initial log-std `log_std_init`) or, with `continuous_policy`
    "tanh_gaussian", a tanh-squashed one with a state-dependent scale. The policy is
    `distribution.from_head(head output)`."""
    if not isinstance(space, Box):
        return categorical_policy_head(int(space.n)), distributions.Categorical
    action_dim = int(np.prod(space.shape))
    if continuous_policy == "tanh_gaussian":
        return tanh_gaussian_policy_head(action_dim), distributions.TanhGaussian
    return gaussian_policy_head(action_dim, log_std_init), distributions.Gaussian
