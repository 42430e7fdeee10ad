"""Networks as a pair of pure functions, with Flax (default) or Haiku behind one interface.

    net = networks.build(networks.q_mlp(num_actions=2, hidden=(64, 64)), backend="flax")
    params = net.init(key, obs)                  # obs: one observation or a batch
    q_values = net.apply(params, obs)            # noisy layers: net.apply(params, obs, rng=key)

A network is written ONCE as a plain function `fn(layers, *inputs)` against the tiny `Layers`
interface below (`dense`, `noisy_dense`, `param`); `build` turns it into a Flax linen module or a
Haiku transform. Both backends create the same parameters with the same initialisers, so an agent
never sees which one it runs on (`agent.network_backend: flax | haiku` in a config).

Initialisation follows the usual PPO/DQN practice: orthogonal weights with a per-layer gain
(sqrt(2) for hidden ReLU/tanh layers; 0.01 for policy logits; 1 for values), zero biases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

BACKENDS = ("flax", "haiku")

ACTIVATIONS: dict[str, Callable] = {"relu": jax.nn.relu, "tanh": jnp.tanh, "gelu": jax.nn.gelu, "silu": jax.nn.silu, "elu": jax.nn.elu}


@dataclass(frozen=True)
class Network:
    """`init(key, *inputs) -> params`, `apply(params, *inputs, rng=None) -> outputs`."""

    init: Callable
    apply: Callable


def activation(name: str) -> Callable:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


# ---------------------------------------------------------------- the Layers interface


def _noisy_dense(x, features, w_mu, w_sigma, b_mu, b_sigma, key):
    """Factorised-Gaussian noisy linear layer (Fortunato et al. 2018):

    y = x (w_mu + w_sigma * (f(e_in) f(e_out)^T)) + b_mu + b_sigma * f(e_out),  f(e) = sign(e) sqrt(|e|),
    with e_in ~ N(0, I_in), e_out ~ N(0, I_out) drawn from `key`; with key None the noise is zero.
    """
    if key is None:
        return x @ w_mu + b_mu
    k_in, k_out = jax.random.split(key)
    f = lambda e: jnp.sign(e) * jnp.sqrt(jnp.abs(e))
    e_in = f(jax.random.normal(k_in, (x.shape[-1],)))
    e_out = f(jax.random.normal(k_out, (features,)))
    # x (w_sigma * e_in e_out^T) = ((x * e_in) @ w_sigma) * e_out: no [in, out] noise matrix.
    return x @ w_mu + ((x * e_in) @ w_sigma) * e_out + b_mu + b_sigma * e_out


def _noisy_inits(fan_in: int, sigma0: float):
    bound = 1.0 / math.sqrt(fan_in)
    uniform = lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)
    constant = lambda key, shape, dtype=jnp.float32: jnp.full(shape, sigma0 / math.sqrt(fan_in), dtype)
    return uniform, constant


class FlaxLayers:
    """`Layers` on Flax linen: called inside a compact module."""

    def __init__(self, module):
        self.module = module
        self.noisy_count = 0

    def dense(self, x, features: int, scale: float = math.sqrt(2), name: str | None = None):
        import flax.linen as nn

        layer = nn.Dense(features, kernel_init=nn.initializers.orthogonal(scale), bias_init=nn.initializers.zeros, name=name)
        return layer(x)

    def noisy_dense(self, x, features: int, sigma0: float = 0.5, name: str | None = None):
        if name is None:
            name, self.noisy_count = f"noisy_{self.noisy_count}", self.noisy_count + 1
        fan_in = x.shape[-1]
        uniform, constant = _noisy_inits(fan_in, sigma0)
        m = self.module
        w_mu = m.param(f"{name}_w_mu", uniform, (fan_in, features))
        w_sigma = m.param(f"{name}_w_sigma", constant, (fan_in, features))
        b_mu = m.param(f"{name}_b_mu", uniform, (features,))
        b_sigma = m.param(f"{name}_b_sigma", constant, (features,))
        key = m.make_rng("noise") if m.has_rng("noise") else None
        return _noisy_dense(x, features, w_mu, w_sigma, b_mu, b_sigma, key)

    def param(self, name: str, shape: Sequence[int], init: Callable):
        return self.module.param(name, init, tuple(shape))


class HaikuLayers:
    """`Layers` on Haiku: called inside `hk.transform`."""

    def __init__(self):
        self.noisy_count = 0

    def dense(self, x, features: int, scale: float = math.sqrt(2), name: str | None = None):
        import haiku as hk

        return hk.Linear(features, w_init=hk.initializers.Orthogonal(scale), b_init=jnp.zeros, name=name)(x)

    def noisy_dense(self, x, features: int, sigma0: float = 0.5, name: str | None = None):
        import haiku as hk

        if name is None:
            name, self.noisy_count = f"noisy_{self.noisy_count}", self.noisy_count + 1
        fan_in = x.shape[-1]
        uniform, constant = _noisy_inits(fan_in, sigma0)
        haiku_init = lambda init: (lambda shape, dtype: init(hk.next_rng_key(), shape, dtype))
        with hk.name_scope(name):
            w_mu = hk.get_parameter("w_mu", (fan_in, features), init=haiku_init(uniform))
            w_sigma = hk.get_parameter("w_sigma", (fan_in, features), init=lambda s, d: constant(None, s, d))
            b_mu = hk.get_parameter("b_mu", (features,), init=haiku_init(uniform))
            b_sigma = hk.get_parameter("b_sigma", (features,), init=lambda s, d: constant(None, s, d))
        key = hk.maybe_next_rng_key()
        return _noisy_dense(x, features, w_mu, w_sigma, b_mu, b_sigma, key)

    def param(self, name: str, shape: Sequence[int], init: Callable):
        import haiku as hk

        return hk.get_parameter(name, tuple(shape), init=lambda s, d: init(hk.next_rng_key(), s, d))


# ---------------------------------------------------------------- building a Network


def build(fn: Callable, backend: str = "flax") -> Network:
    """A `Network` from `fn(layers, *inputs)`; `backend` is "flax" or "haiku".

    `apply(params, *inputs, rng=key)` feeds `rng` to noisy layers (no rng: noise-free, the mean net).
    """
    if backend == "flax":
        return _build_flax(fn)
    if backend == "haiku":
        return _build_haiku(fn)
    raise ValueError(f"unknown network backend {backend!r}; known: {', '.join(BACKENDS)}")


def _build_flax(fn: Callable) -> Network:
    import flax.linen as nn

    class Module(nn.Module):
        @nn.compact
        def __call__(self, *inputs):
            return fn(FlaxLayers(self), *inputs)

    module = Module()

    def init(key, *inputs):
        params_key, noise_key = jax.random.split(key)
        return module.init({"params": params_key, "noise": noise_key}, *inputs)

    def apply(params, *inputs, rng=None):
        return module.apply(params, *inputs, rngs=None if rng is None else {"noise": rng})

    return Network(init=init, apply=apply)


def _build_haiku(fn: Callable) -> Network:
    import haiku as hk

    transformed = hk.transform(lambda *inputs: fn(HaikuLayers(), *inputs))

    def init(key, *inputs):
        return transformed.init(key, *inputs)

    def apply(params, *inputs, rng=None):
        return transformed.apply(params, rng, *inputs)

    return Network(init=init, apply=apply)


# ---------------------------------------------------------------- shared pieces


def mlp(layers, x, hidden: Sequence[int], act: str = "relu", noisy: bool = False):
    """Hidden layers `act(dense(x))` of the given widths (orthogonal init, gain sqrt(2))."""
    f = activation(act)
    for i, width in enumerate(hidden):
        x = f(layers.noisy_dense(x, width) if noisy else layers.dense(x, width))
    return x


def preprocess_obs(obs, num_discrete_obs: int | None = None):
    """Float features from observations: one-hot for discrete observations, float32 otherwise."""
    if num_discrete_obs is not None:
        return jax.nn.one_hot(obs, num_discrete_obs, dtype=jnp.float32)
    return jnp.asarray(obs, jnp.float32)


def q_mlp(num_actions: int, hidden: Sequence[int] = (64, 64), act: str = "relu", num_discrete_obs: int | None = None):
    """Q-network: MLP torso and a linear head of `num_actions` Q-values (gain 1)."""

    def fn(layers, obs):
        x = mlp(layers, preprocess_obs(obs, num_discrete_obs), hidden, act)
        return layers.dense(x, num_actions, scale=1.0)

    return fn


def constant_init(value: float) -> Callable:
    """Initialiser filling a parameter with `value` (for `layers.param`)."""
    return lambda key, shape, dtype=jnp.float32: jnp.full(shape, value, dtype)


def actor_critic(action_dim: int, continuous: bool = False, hidden: Sequence[int] = (64, 64), act: str = "tanh", shared: bool = False, log_std_init: float = 0.0, num_discrete_obs: int | None = None):
    """PPO's actor-critic: `fn(layers, obs) -> (policy, value)`.

    Discrete: policy = logits [..., action_dim] (head gain 0.01). Continuous: policy = (mean, log_std),
    both [..., action_dim]: a diagonal Gaussian whose mean comes from the actor (gain 0.01) and whose
    log-std is one state-independent learned parameter per action dimension (initial `log_std_init`).
    value: [...] from a gain-1 head. `shared=True` puts both heads on one torso; otherwise actor and
    critic have separate MLP torsos of the same widths (both in one parameter tree).
    """

    def fn(layers, obs):
        x = preprocess_obs(obs, num_discrete_obs)
        actor_h = mlp(layers, x, hidden, act)
        critic_h = actor_h if shared else mlp(layers, x, hidden, act)
        head = layers.dense(actor_h, action_dim, scale=0.01)
        value = layers.dense(critic_h, 1, scale=1.0)[..., 0]
        if continuous:
            log_std = layers.param("log_std", (action_dim,), constant_init(log_std_init))
            return (head, jnp.broadcast_to(log_std, head.shape)), value
        return head, value

    return fn


def squashed_gaussian_actor(action_dim: int, hidden: Sequence[int] = (256, 256), act: str = "relu", log_std_min: float = -5.0, log_std_max: float = 2.0):
    """SAC's actor: `fn(layers, obs) -> (mean, log_std)` of the pre-tanh Gaussian, [..., action_dim].

    The log-std is bounded smoothly: log_std = min + (max - min) * (tanh(raw) + 1) / 2.
    """

    def fn(layers, obs):
        x = mlp(layers, preprocess_obs(obs), hidden, act)
        mean = layers.dense(x, action_dim, scale=0.01)
        raw = layers.dense(x, action_dim, scale=0.01)
        log_std = log_std_min + 0.5 * (log_std_max - log_std_min) * (jnp.tanh(raw) + 1.0)
        return mean, log_std

    return fn


def twin_q(hidden: Sequence[int] = (256, 256), act: str = "relu", num_actions: int | None = None):
    """Two independent Q-networks in one parameter tree (SAC's clipped double Q).

    Continuous (`num_actions=None`): `fn(layers, obs, action) -> (q1, q2)`, each [...], from
    concat(obs, action). Discrete: `fn(layers, obs) -> (q1, q2)`, each [..., num_actions].
    """

    def fn(layers, obs, action=None):
        x = preprocess_obs(obs)
        if num_actions is None:
            x = jnp.concatenate([x, jnp.asarray(action, jnp.float32)], axis=-1)
        outs = []
        for _ in range(2):
            h = mlp(layers, x, hidden, act)
            q = layers.dense(h, 1 if num_actions is None else num_actions, scale=1.0)
            outs.append(q[..., 0] if num_actions is None else q)
        return tuple(outs)

    return fn


def rainbow_q(
    num_actions: int,
    hidden: Sequence[int] = (128, 128),
    head_hidden: int = 0,
    num_atoms: int = 1,
    dueling: bool = True,
    noisy: bool = True,
    act: str = "relu",
    num_discrete_obs: int | None = None,
):
    """Q-network of Rainbow with every part switchable: an MLP torso of `hidden` widths (plain
    dense), then a head giving `[..., num_actions, num_atoms]` outputs (logits over atoms when
    `num_atoms` > 1, Q-values when 1).

    Head: an optional hidden layer of `head_hidden` units per stream, then a linear output; layers
    of the head are factorised-noisy when `noisy`. Dueling (Wang et al. 2016) combines a value
    stream V [..., 1, atoms] and an advantage stream A [..., actions, atoms] as
    V + A - mean_actions(A); without it one stream outputs [..., actions, atoms] directly.
    """
    f = activation(act)

    def stream(layers, x, outputs):
        if head_hidden:
            x = f(layers.noisy_dense(x, head_hidden) if noisy else layers.dense(x, head_hidden))
        return layers.noisy_dense(x, outputs) if noisy else layers.dense(x, outputs, scale=1.0)

    def fn(layers, obs):
        x = mlp(layers, preprocess_obs(obs, num_discrete_obs), hidden, act)
        shape = x.shape[:-1] + (num_actions, num_atoms)
        if not dueling:
            return stream(layers, x, num_actions * num_atoms).reshape(shape)
        value = stream(layers, x, num_atoms).reshape(x.shape[:-1] + (1, num_atoms))
        advantage = stream(layers, x, num_actions * num_atoms).reshape(shape)
        return value + advantage - advantage.mean(axis=-2, keepdims=True)

    return fn


# ---------------------------------------------------------------- dense layers by position

_WEIGHT_NAMES, _BIAS_NAMES = ("kernel", "w"), ("bias", "b")


def _layer_index(module_name: str) -> int:
    """Creation index of a flax `Dense_3` / haiku `linear_3` module (`linear` alone is 0)."""
    head, _, tail = module_name.rpartition("_")
    return int(tail) if head and tail.isdigit() else 0


def dense_layers(params) -> list[tuple[jax.Array, jax.Array]]:
    """The (weight [in, out], bias [out]) pairs of a network of plain dense layers, in creation order,
    for either backend (flax `Dense_i/{kernel,bias}`, haiku `linear_i/{w,b}`). ValueError if the
    tree holds anything else (e.g. a learned log-std or noisy layers)."""
    modules = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        module, name = keys[-2] if len(keys) >= 2 else None, keys[-1]
        if module is None or name not in _WEIGHT_NAMES + _BIAS_NAMES:
            raise ValueError(f"dense_layers: parameter {'/'.join(map(str, keys))} is not a dense layer's weight or bias")
        modules.setdefault(module, {})["w" if name in _WEIGHT_NAMES else "b"] = leaf
    ordered = sorted(modules, key=_layer_index)
    return [(modules[m]["w"], modules[m]["b"]) for m in ordered]


def replace_dense_layers(params, layers):
    """`params` with its dense layers (in creation order, as `dense_layers` lists them) replaced."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    keys = [[getattr(k, "key", getattr(k, "name", None)) for k in path] for path, _ in leaves]
    order = {m: i for i, m in enumerate(sorted({k[-2] for k in keys}, key=_layer_index))}
    new = [layers[order[k[-2]]][0 if k[-1] in _WEIGHT_NAMES else 1] for k in keys]
    return jax.tree_util.tree_unflatten(treedef, new)
