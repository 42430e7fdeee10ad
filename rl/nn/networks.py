"""Networks: torsos, heads, the action distributions a policy head's output means, and their
combinations, each written once as a plain function `fn(layers, *inputs)` against the `Layers`
interface of `rl.nn.layers`, whose `build` turns it into a `Network` (`init`, `apply`) on Flax
(default) or Haiku.

    torso = networks.make_torso(network_config.NetworkConfig(hidden=(64, 64)), obs_space)
    net = layers.build(networks.actor_critic(torso, networks.categorical_policy_head(2)), "flax")
    logits, value = net.apply(net.init(key, obs), obs)       # obs: one observation or a batch
    pi = networks.Categorical.from_head(logits)

A network is a torso (observations -> features; `make_torso` from `agent.network`: an MLP, a conv
net for image observations, `cnn_minatar` / `nature_cnn` (`rl.nn.cnn`), or a GRU / LSTM
(`rl.nn.recurrent`)) and heads (features -> Q-values, Rainbow's dueling/noisy/distributional head,
categorical, Gaussian and deterministic policies, a value), joined by `with_head`, `actor_critic`,
`twin_q` or `recurrent_actor_critic`.

Distributions are NamedTuples (pytrees: they pass through `jit`, `vmap` and `lax.scan`) built from
a policy head's output by `from_head` (`policy_head` picks the head and its distribution), with

    sample(key) -> action          the action stored and scored (pre-squash for `TanhGaussian`)
    log_prob_entropy(action) -> (log pi(a), H[pi])
    mode() -> action               the greedy action (argmax, mean)
    env_action(action) -> action   what the env receives (tanh(u) for `TanhGaussian`)

Box actions live in the agent's action space [-1, 1]^d (`rl.core.environment.make_env` rescales them
to the env's bounds and clips a Gaussian's samples there); log-probabilities are of the stored
action, before any squashing or clipping, so they stay exact. Action masks (`Categorical.masked`):
the logits of the actions a mask rules out become `MASKED_LOGIT`, so their probability is exactly 0
in float32 and nothing becomes NaN."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import kernels
from envs.spaces import Box
from rl.core import losses
from rl.nn import simbav2
from rl.nn.batch_renorm import renorm_mlp
from rl.nn.cnn import CNN_LAYERS, cnn, cnn_output_shape, image_input
from rl.nn.layers import (
    Network,
    activation,
    build,
    constant_init,
    flatten_obs,
    mlp,
    num_discrete_obs,
    preprocess_obs,
)
from rl.nn.network_config import TORSOS, NetworkConfig
from rl.nn.recurrent import RecurrentTorso

# ---------------------------------------------------------------- torsos


def make_torso(config: NetworkConfig, obs_space=None) -> Callable:
    """`torso(layers, obs) -> features [..., F]` for `config.torso`:

    mlp: obs (one-hot if `obs_space` is Discrete, else float32, flattened if `obs_space` is a Box
         of rank > 1) -> the `hidden` layers (LayerNorm before each activation if `layer_norm`).
    cnn_minatar / nature_cnn: images [..., H, W, C] (`rl.nn.cnn.image_input`: uint8 frames / 255,
         [..., C, H, W] with `channels_first`) -> the torso's conv stack (`CNN_LAYERS`)
         -> the `hidden` layers, `config.activation` (and `layer_norm`) on every layer; needs
         `obs_space`, a Box of images (ValueError otherwise).
    gru, lstm: a `RecurrentTorso`, called as `torso(layers, carry, obs, reset) -> (carry,
    features)`.
    simbav2: the observations (as for mlp) -> SimbaV2's hyperspherical embedding and residual
         blocks (`rl.nn.simbav2.torso`; the replay actor-critics' `ActorCriticNetworkConfig`).
    mlp with `batch_renorm` (`ActorCriticNetworkConfig`): CrossQ's torso, batch renormalisation on
         the input and after each hidden activation (`rl.nn.batch_renorm.renorm_mlp`; built with
         `rl.nn.batch_renorm.build`, which keeps the running statistics).
    Each call of `torso` creates a new set of layers (two calls: two torsos)."""
    n = None if obs_space is None else num_discrete_obs(obs_space)
    features = lambda obs: flatten_obs(preprocess_obs(obs, n), obs_space)
    if config.torso == "simbav2":
        return lambda layers, obs: simbav2.torso(layers, features(obs), config.hidden)
    if getattr(config, "batch_renorm", False):
        momentum, warmup = config.renorm_momentum, config.renorm_warmup
        return lambda layers, obs: renorm_mlp(
            layers, features(obs), config.hidden, config.activation, momentum, warmup
        )
    if config.torso not in TORSOS:
        raise ValueError(f"unknown torso {config.torso!r}; known: {', '.join(TORSOS)}")
    if config.torso in CNN_LAYERS:
        cnn_output_shape(config.torso, obs_space, config.channels_first)
        convs = CNN_LAYERS[config.torso]
        return lambda layers, obs: cnn(
            layers,
            image_input(obs, config.channels_first),
            convs,
            config.hidden,
            config.activation,
            layer_norm=config.layer_norm,
        )
    if config.recurrent:
        return RecurrentTorso(
            config.torso,
            config.recurrent_hidden,
            tuple(config.hidden),
            config.activation,
            n,
            config.layer_norm,
        )
    return lambda layers, obs: mlp(
        layers,
        features(obs),
        config.hidden,
        config.activation,
        layer_norm=config.layer_norm,
    )


# ---------------------------------------------------------------- heads


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


# ---------------------------------------------------------------- distributions

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


def policy_head(space, continuous_policy: str = "gaussian", log_std_init: float = 0.0):
    """(head, distribution class) for an action space: a categorical head for Discrete actions; for
    a Box a diagonal Gaussian head (initial log-std `log_std_init`) or, with `continuous_policy`
    "tanh_gaussian", a tanh-squashed one with a state-dependent scale. The policy is
    `distribution.from_head(head output)`."""
    if not isinstance(space, Box):
        return categorical_policy_head(int(space.n)), Categorical
    action_dim = int(np.prod(space.shape))
    if continuous_policy == "tanh_gaussian":
        return tanh_gaussian_policy_head(action_dim), TanhGaussian
    return gaussian_policy_head(action_dim, log_std_init), Gaussian


# ---------------------------------------------------------------- torso + head


def q_network(config: NetworkConfig, obs_space, num_actions: int) -> Network:
    """obs -> Q-values [..., num_actions]: the torso of `config` and a linear `q_head`, on
    `config.backend`."""
    return build(
        with_head(make_torso(config, obs_space), q_head(num_actions)), config.backend, config.init
    )


def with_head(torso: Callable, head: Callable) -> Callable:
    """`fn(layers, obs) = head(layers, torso(layers, obs))`."""
    return lambda layers, obs: head(layers, torso(layers, obs))


def actor_critic(
    torso: Callable,
    policy_head: Callable,
    shared: bool = False,
    critic_torso: Callable | None = None,
) -> Callable:
    """`fn(layers, obs) -> (policy, value)`: separate actor and critic torsos (or one shared torso),
    the policy head on the actor's features and a value head on the critic's. The critic's torso is
    `critic_torso` when given (e.g. wider than the actor's), else another `torso`."""
    value = value_head()
    critic_torso = torso if critic_torso is None else critic_torso

    def fn(layers, obs):
        actor_features = torso(layers, obs)
        critic_features = actor_features if shared else critic_torso(layers, obs)
        return policy_head(layers, actor_features), value(layers, critic_features)

    return fn


def twin_q(torso: Callable, num_actions: int | None = None) -> Callable:
    """Two independent Q-networks in one parameter tree (clipped double Q).

    Continuous (`num_actions=None`): `fn(layers, obs, action) -> (q1, q2)`, each [...], each torso
    reading concat(obs, action). Discrete: `fn(layers, obs) -> (q1, q2)`, each [...,
    num_actions]."""
    head = value_head() if num_actions is None else q_head(num_actions)

    def fn(layers, obs, action=None):
        x = obs
        if num_actions is None:
            x = jnp.concatenate(
                [jnp.asarray(obs, jnp.float32), jnp.asarray(action, jnp.float32)], axis=-1
            )
        return tuple(head(layers, torso(layers, x)) for _ in range(2))

    return fn


def recurrent_actor_critic(
    torso: RecurrentTorso, policy_head: Callable, shared: bool = False
) -> Callable:
    """`actor_critic` for a recurrent torso: `fn(layers, carry, obs, reset) -> (carry, (policy,
    value))` over time-major sequences (see `RecurrentTorso`), with `fn.initial_carry(batch)`.
    Separate actor and critic cells carry the pair (actor carry, critic carry); a shared one carries
    its own."""
    value = value_head()

    def fn(layers, carry, obs, reset):
        if shared:
            carry, features = torso(layers, carry, obs, reset)
            return carry, (policy_head(layers, features), value(layers, features))
        actor_carry, actor_features = torso(layers, carry[0], obs, reset)
        critic_carry, critic_features = torso(layers, carry[1], obs, reset)
        return (actor_carry, critic_carry), (
            policy_head(layers, actor_features),
            value(layers, critic_features),
        )

    fn.initial_carry = (
        torso.initial_carry
        if shared
        else (lambda batch=(): (torso.initial_carry(batch), torso.initial_carry(batch)))
    )
    return fn
