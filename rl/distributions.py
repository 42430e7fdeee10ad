"""Action distributions as small objects: what a policy head's output means.

Each is a NamedTuple (a pytree: it passes through `jit`, `vmap` and `lax.scan`) built from a head's
output by `from_head`, with

    sample(key) -> action          the action stored and scored (pre-squash for `TanhGaussian`)
    log_prob_entropy(action) -> (log pi(a), H[pi])
    mode() -> action               the greedy action (argmax, mean)
    env_action(action) -> action   what the env receives (tanh(u) for `TanhGaussian`)

Box actions live in the agent's action space [-1, 1]^d (`rl.environment.make_env` rescales them to
the env's bounds and clips a Gaussian's samples there); log-probabilities are of the stored action,
before any squashing or clipping, so they stay exact.

    dist = distributions.Categorical.from_head(logits)
    action = dist.sample(key)
    log_prob, entropy = dist.log_prob_entropy(action, backend="auto")

Action masks (`Categorical.masked`): the logits of the actions a mask rules out become
`MASKED_LOGIT`, so their probability is exactly 0 in float32 and nothing becomes NaN.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

import kernels
from rl import losses

MASKED_LOGIT = -1e9
"""The logit of a masked-out action: exp(MASKED_LOGIT - max logit) is 0 in float32 (so sampling,
the log-probabilities of the allowed actions, the entropy and the mode ignore it), yet finite, so
p log p = 0 and the gradients stay 0 rather than NaN."""


class Categorical(NamedTuple):
    """pi(a) = softmax(logits)_a over the last axis of `logits` [..., A]."""

    logits: jax.Array

    @classmethod
    def from_head(cls, logits) -> Categorical:
        return cls(logits)

    def masked(self, mask) -> Categorical:
        """pi restricted to the actions where `mask` (bool [..., A]) is True:
        pi(a) = m_a exp(z_a) / sum_b m_b exp(z_b), the masked logits set to `MASKED_LOGIT`. A row
        with every action masked becomes uniform."""
        return Categorical(jnp.where(mask, self.logits, MASKED_LOGIT))

    def sample(self, key) -> jax.Array:
        """a ~ pi, int32 [...]."""
        return jax.random.categorical(key, self.logits).astype(jnp.int32)

    def log_prob_entropy(self, action, backend: str | None = None):
        """(log softmax(logits)_a, -sum_a pi(a) log pi(a)) from the fused kernel op
        (`kernels.categorical_log_prob_entropy`; `backend` as there)."""
        return kernels.categorical_log_prob_entropy(self.logits, action, backend=backend)

    def mode(self) -> jax.Array:
        """argmax_a logits (first index on ties), int32."""
        return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)

    def env_action(self, action) -> jax.Array:
        return action


class Gaussian(NamedTuple):
    """A diagonal Gaussian N(mean, exp(log_std)^2) over the last axis; the env clips its samples to
    the action bounds (`envs.wrappers.RescaleAction`), the score is of the unclipped sample."""

    mean: jax.Array
    log_std: jax.Array

    @classmethod
    def from_head(cls, output) -> Gaussian:
        return cls(*output)

    def sample(self, key) -> jax.Array:
        """mean + exp(log_std) eps, eps ~ N(0, I)."""
        return self.mean + jnp.exp(self.log_std) * jax.random.normal(key, self.mean.shape)

    def log_prob_entropy(self, action, backend: str | None = None):
        """`losses.gaussian_log_prob_entropy` (`backend` unused: plain JAX)."""
        return losses.gaussian_log_prob_entropy(self.mean, self.log_std, action)

    def mode(self) -> jax.Array:
        return self.mean

    def env_action(self, action) -> jax.Array:
        return action


class TanhGaussian(NamedTuple):
    """a = tanh(u), u ~ N(mean, exp(log_std)^2) (diagonal). The pre-squash u is what `sample`
    returns, what is stored and what `log_prob_entropy` scores; the env receives tanh(u)."""

    mean: jax.Array
    log_std: jax.Array

    @classmethod
    def from_head(cls, output) -> TanhGaussian:
        return cls(*output)

    def sample(self, key) -> jax.Array:
        """The pre-squash u = mean + exp(log_std) eps, eps ~ N(0, I)."""
        return self.mean + jnp.exp(self.log_std) * jax.random.normal(key, self.mean.shape)

    def log_prob_entropy(self, u, backend: str | None = None):
        """`losses.tanh_gaussian_log_prob_entropy` at the pre-squash u: the exact log-probability
        of tanh(u) and a one-sample entropy estimate (`backend` unused: plain JAX)."""
        return losses.tanh_gaussian_log_prob_entropy(self.mean, self.log_std, u)

    def squashed_sample(self, key):
        """(a, log pi(a)): a reparameterised sample a = tanh(u), differentiable in mean and log_std,
        and its log-probability (`losses.squashed_gaussian_sample`; SAC's actor and target)."""
        return losses.squashed_gaussian_sample(self.mean, self.log_std, key)

    def mode(self) -> jax.Array:
        """The pre-squash mean (`env_action` squashes it)."""
        return self.mean

    def env_action(self, u) -> jax.Array:
        """tanh(u), in [-1, 1]^d."""
        return jnp.tanh(u)


Distribution = Categorical | Gaussian | TanhGaussian
