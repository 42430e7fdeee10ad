"""Networks as a pair of pure functions (`Network`): torsos, heads and their combinations, built on
the `rl.layers` interface with Flax (default) or Haiku behind it.

    torso = networks.make_torso(networks.NetworkConfig(hidden=(64, 64)))
    net = networks.build(networks.with_head(torso, heads.q_head(2)), backend="flax")
    params = net.init(key, obs)                  # obs: one observation or a batch
    q_values = net.apply(params, obs)            # noisy layers: net.apply(params, obs, rng=key)

A network is written ONCE as a plain function `fn(layers, *inputs)` against the tiny `Layers`
interface of `rl.layers` (`dense`, `conv`, `noisy_dense`, `layer_norm`, `param`); `build` turns it
into a Flax linen module or a Haiku transform. Both backends create the same parameters with the
same initialisers, so an agent never sees which one it runs on (`agent.network.backend: flax |
haiku` in a config).

A network is a torso (observations -> features; `make_torso` from `agent.network`: an MLP, a conv
net for image observations, `cnn_minatar` / `nature_cnn` (`rl.cnn`), or a GRU / LSTM
(`rl.recurrent`)) and heads (Q, Rainbow's
dueling/noisy/distributional, categorical, Gaussian and deterministic policies, value: `rl.heads`),
joined by `with_head`, `actor_critic` or `twin_q`."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rl.cnn import CNN_LAYERS, cnn, cnn_output_shape
from rl.config_parsing import ConfigError, hp
from rl.heads import q_head, value_head
from rl.layers import (
    ACTIVATIONS,
    INITS,
    FlaxLayers,
    HaikuLayers,
    flatten_obs,
    mlp,
    num_discrete_obs,
    preprocess_obs,
)
from rl.recurrent import RecurrentTorso

BACKENDS = ("flax", "haiku")


@dataclass(frozen=True)
class Network:
    """`init(key, *inputs) -> params`, `apply(params, *inputs, rng=None) -> outputs`."""

    init: Callable
    apply: Callable


# ---------------------------------------------------------------- building a Network


def build(fn: Callable, backend: str = "flax", init: str = "orthogonal") -> Network:
    """A `Network` from `fn(layers, *inputs)`; `backend` is "flax" or "haiku", `init` one of `INITS`
    (the module docstring's initialisation).

    `apply(params, *inputs, rng=key)` feeds `rng` to noisy layers (no rng: noise-free, the mean
    net)."""
    if init not in INITS:
        raise ValueError(f"unknown network init {init!r}; known: {', '.join(INITS)}")
    if backend == "flax":
        net = _build_flax(fn, init)
    elif backend == "haiku":
        net = _build_haiku(fn, init)
    else:
        raise ValueError(f"unknown network backend {backend!r}; known: {', '.join(BACKENDS)}")
    return Network(init=at_full_precision(net.init), apply=net.apply)


def at_full_precision(init: Callable) -> Callable:
    """`init` traced under `jax.default_matmul_precision("highest")`: initial params at full float32
    whatever the run's `run.matmul_precision` (on Ampere/Hopper GPUs a float32 dot at the default
    precision runs in TF32, a 10-bit mantissa). The orthogonal initialisers are a QR
    (LAPACK/cuSOLVER, no dot); what this pins is every dot that `init` traces (the forward pass that
    shapes the params, any initialiser that multiplies). A context manager at trace time: no process
    state changes."""

    def init_highest(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return init(*args, **kwargs)

    return init_highest


def _build_flax(fn: Callable, init: str) -> Network:
    import flax.linen as nn

    class Module(nn.Module):
        @nn.compact
        def __call__(self, *inputs):
            return fn(FlaxLayers(self, init), *inputs)

    module = Module()

    def init_params(key, *inputs):
        params_key, noise_key = jax.random.split(key)
        return module.init({"params": params_key, "noise": noise_key}, *inputs)

    def apply(params, *inputs, rng=None):
        return module.apply(params, *inputs, rngs=None if rng is None else {"noise": rng})

    return Network(init=init_params, apply=apply)


def _build_haiku(fn: Callable, init: str) -> Network:
    import haiku as hk

    transformed = hk.transform(lambda *inputs: fn(HaikuLayers(init), *inputs))

    def init_params(key, *inputs):
        return transformed.init(key, *inputs)

    def apply(params, *inputs, rng=None):
        return transformed.apply(params, rng, *inputs)

    return Network(init=init_params, apply=apply)


# ---------------------------------------------------------------- torsos


RECURRENT_TORSOS = ("gru", "lstm")
TORSOS = ("mlp", *CNN_LAYERS) + RECURRENT_TORSOS


@dataclass(frozen=True)
class NetworkConfig:
    """`agent.network` in a config: the torso that turns observations into features, and the
    backend. Each agent puts its own heads on the torso."""

    torso: str = hp("mlp", choices=TORSOS, doc="observation encoder")
    hidden: tuple[int, ...] = hp(
        (64, 64),
        doc="hidden widths of the torso (gru/lstm: of the layers before the cell; may be empty)",
    )
    activation: str = hp("relu", choices=tuple(ACTIVATIONS), doc="hidden activation")
    backend: str = hp("flax", choices=BACKENDS, doc="flax (linen) or haiku")
    init: str = hp(
        "orthogonal",
        choices=INITS,
        doc="dense/conv weight init: orthogonal with per-layer gains (sqrt 2 hidden, 0.01 "
        "policy, 1 value/Q), or lecun_uniform (U(+-sqrt(3/fan_in)), Brax's)",
    )
    layer_norm: bool = hp(
        False, doc="LayerNorm on each hidden layer's pre-activation (PQN's stabiliser)"
    )
    recurrent_hidden: int = hp(128, low=1, doc="hidden-state size of a gru or lstm torso")

    @property
    def recurrent(self) -> bool:
        """Whether the torso carries a hidden state (gru, lstm): only agents that declare
        `RECURRENT = True` take one (rl.config.check_recurrence)."""
        return self.torso in RECURRENT_TORSOS

    def validate(self):
        if (not self.hidden and not self.recurrent) or any(width < 1 for width in self.hidden):
            raise ConfigError(
                f"agent.network.hidden must list positive widths, got {list(self.hidden)}"
            )

    def check_obs_space(self, obs_space) -> None:
        """ConfigError (naming agent.network.torso) if the torso cannot read these observations."""
        if self.torso in CNN_LAYERS:
            try:
                cnn_output_shape(self.torso, obs_space)
            except ValueError as err:
                raise ConfigError(f"agent.network.torso: {err}") from None


def network_config(**defaults) -> Any:
    """A dataclass field holding a `NetworkConfig` with an agent's own defaults."""
    return field(
        default_factory=lambda: NetworkConfig(**defaults),
        metadata=dict(doc="torso and backend (NetworkConfig)"),
    )


def make_torso(config: NetworkConfig, obs_space=None) -> Callable:
    """`torso(layers, obs) -> features [..., F]` for `config.torso`:

    mlp: obs (one-hot if `obs_space` is Discrete, else float32, flattened if `obs_space` is a Box
         of rank > 1) -> the `hidden` layers (LayerNorm before each activation if `layer_norm`).
    cnn_minatar / nature_cnn: float32 images [..., H, W, C] -> the torso's conv stack (`CNN_LAYERS`)
         -> the `hidden` layers, `config.activation` (and `layer_norm`) on every layer; needs
         `obs_space`, a Box of images (ValueError otherwise).
    gru, lstm: a `RecurrentTorso`, called as `torso(layers, carry, obs, reset) -> (carry,
    features)`. Each call of `torso` creates a new set of layers (two calls: two torsos)."""
    if config.torso not in TORSOS:
        raise ValueError(f"unknown torso {config.torso!r}; known: {', '.join(TORSOS)}")
    if config.torso in CNN_LAYERS:
        cnn_output_shape(config.torso, obs_space)
        convs = CNN_LAYERS[config.torso]
        return lambda layers, obs: cnn(
            layers,
            preprocess_obs(obs),
            convs,
            config.hidden,
            config.activation,
            layer_norm=config.layer_norm,
        )
    n = None if obs_space is None else num_discrete_obs(obs_space)
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
        flatten_obs(preprocess_obs(obs, n), obs_space),
        config.hidden,
        config.activation,
        layer_norm=config.layer_norm,
    )


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


# ---------------------------------------------------------------- dense layers by position

_WEIGHT_NAMES, _BIAS_NAMES = ("kernel", "w"), ("bias", "b")


def _layer_index(module_name: str) -> int:
    """Creation index of a flax `Dense_3` / haiku `linear_3` module (`linear` alone is 0)."""
    head, _, tail = module_name.rpartition("_")
    return int(tail) if head and tail.isdigit() else 0


def dense_layers(params) -> list[tuple[jax.Array, jax.Array]]:
    """The (weight [in, out], bias [out]) pairs of a network of plain dense layers, in creation
    order, for either backend (flax `Dense_i/{kernel,bias}`, haiku `linear_i/{w,b}`). ValueError if
    the tree holds anything else (e.g. a learned log-std or noisy layers)."""
    modules = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        module, name = keys[-2] if len(keys) >= 2 else None, keys[-1]
        if module is None or name not in _WEIGHT_NAMES + _BIAS_NAMES:
            raise ValueError(
                f"dense_layers: parameter {'/'.join(map(str, keys))} is not a dense layer's "
                "weight or bias"
            )
        modules.setdefault(module, {})["w" if name in _WEIGHT_NAMES else "b"] = leaf
    ordered = sorted(modules, key=_layer_index)
    return [(modules[m]["w"], modules[m]["b"]) for m in ordered]


def leaf_offsets(params):
    """`params` with each leaf replaced by where it starts in
    `jax.flatten_util.ravel_pytree(params)`'s vector (an int): leaf k starts at the sum of the sizes
    of leaves 0..k-1, in `jax.tree` order. `dense_layers(leaf_offsets(params))` gives each dense
    layer's (weight, bias) offsets."""
    leaves, treedef = jax.tree.flatten(params)
    sizes = [math.prod(jnp.shape(x)) for x in leaves]
    return jax.tree.unflatten(treedef, [0, *itertools.accumulate(sizes)][: len(leaves)])
