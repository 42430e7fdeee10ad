"""Networks as a pair of pure functions, with Flax (default) or Haiku behind one interface.

    torso = networks.make_torso(networks.NetworkConfig(hidden=(64, 64)))
    net = networks.build(networks.with_head(torso, networks.q_head(2)), backend="flax")
    params = net.init(key, obs)                  # obs: one observation or a batch
    q_values = net.apply(params, obs)            # noisy layers: net.apply(params, obs, rng=key)

A network is written ONCE as a plain function `fn(layers, *inputs)` against the tiny `Layers`
interface below (`dense`, `conv`, `noisy_dense`, `param`); `build` turns it into a Flax linen module or a
Haiku transform. Both backends create the same parameters with the same initialisers, so an agent
never sees which one it runs on (`agent.network.backend: flax | haiku` in a config).

A network is a torso (observations -> features; `make_torso` from `agent.network`: an MLP, or a
conv net for image observations, `cnn_minatar` / `nature_cnn`) and heads
(Q, Rainbow's dueling/noisy/distributional, categorical, Gaussian and deterministic policies, value), joined by
`with_head`, `actor_critic` or `twin_q`.

Initialisation (`agent.network.init`, dense and conv layers; biases 0): `orthogonal`, the usual
PPO/DQN practice, orthogonal weights with a per-layer gain (sqrt(2) for hidden ReLU/tanh layers; 0.01
for policy logits; 1 for values); or `lecun_uniform`, W ~ U(-sqrt(3 / fan_in), sqrt(3 / fan_in))
whatever the layer (Brax's networks), so Var(W) = 1 / fan_in. Noisy layers and recurrent kernels
keep their own initialisers.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from rl.config import ConfigError, hp

BACKENDS = ("flax", "haiku")
INITS = ("orthogonal", "lecun_uniform")

LAYER_NORM_EPS = (
    1e-5  # LayerNorm: (x - mean) / sqrt(var + eps) * scale + offset, over the last axis
)

ACTIVATIONS: dict[str, Callable] = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
    "elu": jax.nn.elu,
}


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
    uniform = lambda key, shape, dtype=jnp.float32: jax.random.uniform(
        key, shape, dtype, -bound, bound
    )
    constant = lambda key, shape, dtype=jnp.float32: jnp.full(
        shape, sigma0 / math.sqrt(fan_in), dtype
    )
    return uniform, constant


def _kernel_init(init: str, scale: float, variance_scaling: Callable, orthogonal: Callable):
    """The weight initialiser of a dense or conv layer of gain `scale` under `init` (module docstring)."""
    return orthogonal(scale) if init == "orthogonal" else variance_scaling(1.0, "fan_in", "uniform")


class FlaxLayers:
    """`Layers` on Flax linen: called inside a compact module."""

    def __init__(self, module, init: str = "orthogonal"):
        self.module = module
        self.init = init
        self.noisy_count = 0

    def _kernel(self, scale: float):
        import flax.linen as nn

        return _kernel_init(
            self.init, scale, nn.initializers.variance_scaling, nn.initializers.orthogonal
        )

    def dense(self, x, features: int, scale: float = math.sqrt(2), name: str | None = None):
        import flax.linen as nn

        layer = nn.Dense(
            features, kernel_init=self._kernel(scale), bias_init=nn.initializers.zeros, name=name
        )
        return layer(x)

    def conv(
        self,
        x,
        features: int,
        kernel: int,
        stride: int = 1,
        scale: float = math.sqrt(2),
        name: str | None = None,
    ):
        """2-D convolution of x [N, H, W, C], `kernel` x `kernel`, VALID padding (the layers' `init`, zero bias)."""
        import flax.linen as nn

        layer = nn.Conv(
            features,
            (kernel, kernel),
            strides=(stride, stride),
            padding="VALID",
            kernel_init=self._kernel(scale),
            bias_init=nn.initializers.zeros,
            name=name,
        )
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

    def layer_norm(self, x, name: str | None = None):
        import flax.linen as nn

        return nn.LayerNorm(epsilon=LAYER_NORM_EPS, name=name)(x)

    def param(self, name: str, shape: Sequence[int], init: Callable):
        return self.module.param(name, init, tuple(shape))


class HaikuLayers:
    """`Layers` on Haiku: called inside `hk.transform`."""

    def __init__(self, init: str = "orthogonal"):
        self.init = init
        self.noisy_count = 0

    def _kernel(self, scale: float):
        import haiku as hk

        return _kernel_init(
            self.init, scale, hk.initializers.VarianceScaling, hk.initializers.Orthogonal
        )

    def dense(self, x, features: int, scale: float = math.sqrt(2), name: str | None = None):
        import haiku as hk

        return hk.Linear(features, w_init=self._kernel(scale), b_init=jnp.zeros, name=name)(x)

    def conv(
        self,
        x,
        features: int,
        kernel: int,
        stride: int = 1,
        scale: float = math.sqrt(2),
        name: str | None = None,
    ):
        """2-D convolution of x [N, H, W, C], `kernel` x `kernel`, VALID padding (the layers' `init`, zero bias)."""
        import haiku as hk

        return hk.Conv2D(
            features,
            kernel,
            stride,
            padding="VALID",
            w_init=self._kernel(scale),
            b_init=jnp.zeros,
            name=name,
        )(x)

    def noisy_dense(self, x, features: int, sigma0: float = 0.5, name: str | None = None):
        import haiku as hk

        if name is None:
            name, self.noisy_count = f"noisy_{self.noisy_count}", self.noisy_count + 1
        fan_in = x.shape[-1]
        uniform, constant = _noisy_inits(fan_in, sigma0)
        haiku_init = lambda init: lambda shape, dtype: init(hk.next_rng_key(), shape, dtype)
        with hk.name_scope(name):
            w_mu = hk.get_parameter("w_mu", (fan_in, features), init=haiku_init(uniform))
            w_sigma = hk.get_parameter(
                "w_sigma", (fan_in, features), init=lambda s, d: constant(None, s, d)
            )
            b_mu = hk.get_parameter("b_mu", (features,), init=haiku_init(uniform))
            b_sigma = hk.get_parameter(
                "b_sigma", (features,), init=lambda s, d: constant(None, s, d)
            )
        key = hk.maybe_next_rng_key()
        return _noisy_dense(x, features, w_mu, w_sigma, b_mu, b_sigma, key)

    def layer_norm(self, x, name: str | None = None):
        import haiku as hk

        return hk.LayerNorm(
            axis=-1, create_scale=True, create_offset=True, eps=LAYER_NORM_EPS, name=name
        )(x)

    def param(self, name: str, shape: Sequence[int], init: Callable):
        import haiku as hk

        return hk.get_parameter(name, tuple(shape), init=lambda s, d: init(hk.next_rng_key(), s, d))


# ---------------------------------------------------------------- building a Network


def build(fn: Callable, backend: str = "flax", init: str = "orthogonal") -> Network:
    """A `Network` from `fn(layers, *inputs)`; `backend` is "flax" or "haiku", `init` one of `INITS`
    (the module docstring's initialisation).

    `apply(params, *inputs, rng=key)` feeds `rng` to noisy layers (no rng: noise-free, the mean net).
    """
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
    precision runs in TF32, a 10-bit mantissa). The orthogonal initialisers are a QR (LAPACK/cuSOLVER,
    no dot); what this pins is every dot that `init` traces (the forward pass that shapes the params,
    any initialiser that multiplies). A context manager at trace time: no process state changes."""

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


# Conv stacks of the cnn torsos, (features, kernel, stride) per layer, VALID padding; the dense
# layers after them are `agent.network.hidden`.
CNN_LAYERS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "cnn_minatar": ((16, 3, 1),),  # MinAtar's net (Young & Tian 2019): then hidden [128]
    "nature_cnn": (
        (32, 8, 4),
        (64, 4, 2),
        (64, 3, 1),
    ),  # Nature DQN (Mnih et al. 2015): then hidden [512]
}
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
        doc="dense/conv weight init: orthogonal with per-layer gains (sqrt 2 hidden, 0.01 policy, 1 value/Q), or lecun_uniform (U(+-sqrt(3/fan_in)), Brax's)",
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


def mlp(
    layers,
    x,
    hidden: Sequence[int],
    act: str = "relu",
    noisy: bool = False,
    layer_norm: bool = False,
):
    """Hidden layers h <- act(h W + b) of the given widths (gain sqrt(2) under the orthogonal init); with
    `layer_norm`, h <- act(LayerNorm(h W + b))."""
    f = activation(act)
    for width in hidden:
        x = layers.noisy_dense(x, width) if noisy else layers.dense(x, width)
        x = f(layers.layer_norm(x) if layer_norm else x)
    return x


def cnn(
    layers,
    x,
    convs: Sequence[tuple[int, int, int]],
    hidden: Sequence[int],
    act: str = "relu",
    layer_norm: bool = False,
):
    """Conv layers h <- act(conv(h)) ((features, kernel, stride) each, VALID padding, gain
    sqrt(2) under the orthogonal init) on images x [..., H, W, C] (any leading batch dims, none included), flattened, then
    the `hidden` dense layers: features [..., F]. With `layer_norm`, every layer is
    h <- act(LayerNorm(...)) (over the channels after a conv)."""
    f = activation(act)
    batch = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:])
    for features, kernel, stride in convs:
        x = layers.conv(x, features, kernel, stride)
        x = f(layers.layer_norm(x) if layer_norm else x)
    return mlp(layers, x.reshape(batch + (-1,)), hidden, act, layer_norm=layer_norm)


def cnn_output_shape(torso: str, obs_space) -> tuple[int, int, int]:
    """(height, width, channels) after the conv stack of `torso` on `obs_space`'s images; ValueError
    if the observations are not images [H, W, C] or are smaller than the stack's receptive field."""
    shape = tuple(getattr(obs_space, "shape", ()) or ())
    if obs_space is None or type(obs_space).__name__ != "Box" or len(shape) != 3:
        raise ValueError(
            f"torso {torso!r} needs image observations, a Box of shape [height, width, channels]; got {obs_space}"
        )
    height, width, channels = shape
    for features, kernel, stride in CNN_LAYERS[torso]:
        if min(height, width) < kernel:
            raise ValueError(
                f"torso {torso!r}: images of {shape[0]}x{shape[1]} are too small for its {kernel}x{kernel} conv layers {CNN_LAYERS[torso]}"
            )
        height, width, channels = (
            (height - kernel) // stride + 1,
            (width - kernel) // stride + 1,
            features,
        )
    return height, width, channels


def flatten_obs(obs, obs_space):
    """obs [..., *shape] -> [..., prod(shape)] for a Box of rank > 1 (images or grids through an MLP)."""
    shape = tuple(getattr(obs_space, "shape", ()) or ())
    if len(shape) < 2:
        return obs
    return obs.reshape(obs.shape[: obs.ndim - len(shape)] + (-1,))


def preprocess_obs(obs, num_discrete_obs: int | None = None):
    """Float features from observations: one-hot for discrete observations, float32 otherwise."""
    if num_discrete_obs is not None:
        return jax.nn.one_hot(obs, num_discrete_obs, dtype=jnp.float32)
    return jnp.asarray(obs, jnp.float32)


def num_discrete_obs(obs_space) -> int | None:
    """n for a Discrete observation space (one-hot encoded by the torso), else None."""
    return int(obs_space.n) if type(obs_space).__name__ == "Discrete" else None


def make_torso(config: NetworkConfig, obs_space=None) -> Callable:
    """`torso(layers, obs) -> features [..., F]` for `config.torso`:

    mlp: obs (one-hot if `obs_space` is Discrete, else float32, flattened if `obs_space` is a Box
         of rank > 1) -> the `hidden` layers (LayerNorm before each activation if `layer_norm`).
    cnn_minatar / nature_cnn: float32 images [..., H, W, C] -> the torso's conv stack (`CNN_LAYERS`)
         -> the `hidden` layers, `config.activation` (and `layer_norm`) on every layer; needs
         `obs_space`, a Box of images (ValueError otherwise).
    gru, lstm: a `RecurrentTorso`, called as `torso(layers, carry, obs, reset) -> (carry, features)`.
    Each call of `torso` creates a new set of layers (two calls: two torsos)."""
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


# ---------------------------------------------------------------- recurrent torsos (GRU, LSTM)


def _blockwise_orthogonal(blocks: int) -> Callable:
    """Initialiser of an [H, blocks * H] recurrent kernel: `blocks` independent orthogonal H x H blocks
    side by side (one per gate, as Flax's and PyTorch's cells initialise each gate's kernel)."""

    def init(key, shape, dtype=jnp.float32):
        size = shape[0]
        keys = jax.random.split(key, blocks)
        return jnp.concatenate(
            [jax.nn.initializers.orthogonal()(k, (size, size), dtype) for k in keys], axis=-1
        )

    return init


def _gru_step(h, inputs, w_h, b_hn):
    """One GRU step (Cho et al. 2014, the cuDNN / Flax `GRUCell` form) from the input projection
    x W_i + b_i = inputs = [i_r, i_z, i_n]:

        r = sigmoid(i_r + h W_hr),  z = sigmoid(i_z + h W_hz),  n = tanh(i_n + r (h W_hn + b_hn)),
        h' = (1 - z) n + z h."""
    i_r, i_z, i_n = jnp.split(inputs, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(h @ w_h, 3, axis=-1)
    r = jax.nn.sigmoid(i_r + h_r)
    z = jax.nn.sigmoid(i_z + h_z)
    n = jnp.tanh(i_n + r * (h_n + b_hn))
    return (1.0 - z) * n + z * h


def _lstm_step(carry, inputs, w_h):
    """One LSTM step (Hochreiter & Schmidhuber 1997) from the input projection x W_i + b_i = inputs
    = [i_i, i_f, i_g, i_o], carry (h, c):

        i = sigmoid(i_i + h W_hi),  f = sigmoid(i_f + h W_hf + 1),  g = tanh(i_g + h W_hg),
        o = sigmoid(i_o + h W_ho),  c' = f c + i g,  h' = o tanh(c')

    (the forget gate's +1, as Haiku's LSTM and Jozefowicz et al. 2015: remember by default)."""
    h, c = carry
    gates = inputs + h @ w_h
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jnp.tanh(c) * jax.nn.sigmoid(o), c


@dataclass(frozen=True)
class RecurrentTorso:
    """A GRU or LSTM torso over time-major sequences, as a pure function of the carry:

        carry, features = torso(layers, carry, obs, reset)
        obs [T, *batch, ...], reset [T, *batch] (bool), carry: `initial_carry(batch)`-shaped,
        features [T, *batch, size] (the hidden state h_t after each step), carry = the state after step T-1

    Per step t: the carry is first put back to the initial state where `reset[t]` (obs[t] begins an
    episode), then the cell reads x_t = mlp(obs[t]) (the `hidden` layers; none: the observation
    itself). The input projections x_t W_i + b_i of all T steps are one matmul before a `lax.scan`
    runs the recurrence (gates in `_gru_step` / `_lstm_step`); `layer_norm` as the mlp torso's. Built with `networks.build`, it is
    `apply(params, carry, obs, reset) -> (carry, features)` on either backend, with the same
    parameters: dense layers through `layers.dense` (input side, gain 1 under the orthogonal init) and the recurrent
    kernel [size, gates * size] (one orthogonal block per gate) and GRU's candidate bias through
    `layers.param`. For a single step pass T = 1 (obs[None], reset[None]).
    """

    cell: str  # "gru" or "lstm"
    size: int
    hidden: tuple[int, ...] = ()
    activation: str = "relu"
    num_discrete_obs: int | None = None
    layer_norm: bool = False  # LayerNorm in the layers before the cell

    def initial_carry(self, batch=()):
        """The state every episode starts from: zeros [*batch, size] (GRU: h), or a pair (h, c) of
        them (LSTM). `batch` is an int or a shape."""
        shape = ((batch,) if isinstance(batch, int) else tuple(batch)) + (self.size,)
        zeros = jnp.zeros(shape, jnp.float32)
        return zeros if self.cell == "gru" else (zeros, zeros)

    def __call__(self, layers, carry, obs=None, reset=None):
        if obs is None or reset is None:
            raise TypeError(
                f"a recurrent ({self.cell}) torso is called as torso(layers, carry, obs, reset); "
                "feedforward combinators (with_head, actor_critic, twin_q) cannot carry its state: use recurrent_actor_critic"
            )
        x = mlp(
            layers,
            preprocess_obs(obs, self.num_discrete_obs),
            self.hidden,
            self.activation,
            layer_norm=self.layer_norm,
        )
        gates = 3 if self.cell == "gru" else 4
        inputs = layers.dense(x, gates * self.size, scale=1.0)
        name = _fresh_name(layers, self.cell)
        w_h = layers.param(
            f"{name}_recurrent_kernel", (self.size, gates * self.size), _blockwise_orthogonal(gates)
        )
        b_hn = (
            layers.param(f"{name}_candidate_bias", (self.size,), constant_init(0.0))
            if self.cell == "gru"
            else None
        )

        def step(carry, step_inputs):
            inputs_t, reset_t = step_inputs
            carry = jax.tree.map(
                lambda c: jnp.where(reset_t[..., None], jnp.zeros_like(c), c), carry
            )
            if self.cell == "gru":
                carry = _gru_step(carry, inputs_t, w_h, b_hn)
                return carry, carry
            carry = _lstm_step(carry, inputs_t, w_h)
            return carry, carry[0]

        return jax.lax.scan(step, carry, (inputs, jnp.asarray(reset, jnp.bool_)))


def _fresh_name(layers, prefix: str) -> str:
    """`prefix_i`, i counting the recurrent cells built so far with these `layers` (two torsos: two cells)."""
    count = getattr(layers, "recurrent_count", 0)
    layers.recurrent_count = count + 1
    return f"{prefix}_{count}"


def recurrent_actor_critic(
    torso: RecurrentTorso, policy_head: Callable, shared: bool = False
) -> Callable:
    """`actor_critic` for a recurrent torso: `fn(layers, carry, obs, reset) -> (carry, (policy, value))`
    over time-major sequences (see `RecurrentTorso`), with `fn.initial_carry(batch)`. Separate actor
    and critic cells carry the pair (actor carry, critic carry); a shared one carries its own."""
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
    0.01), the log-std one learned state-independent parameter per dimension (initial `log_std_init`)."""

    def head(layers, x):
        mean = layers.dense(x, action_dim, scale=0.01)
        log_std = layers.param("log_std", (action_dim,), constant_init(log_std_init))
        return mean, jnp.broadcast_to(log_std, mean.shape)

    return head


def tanh_gaussian_policy_head(action_dim: int, min_std: float = 0.001) -> Callable:
    """(mean, log_std) of a state-dependent diagonal Gaussian whose samples are squashed by tanh
    (Brax's PPO policy), both [..., action_dim]: from one dense layer of 2 action_dim outputs (gain
    0.01) split into the mean and a raw scale, sigma = softplus(raw) + min_std (about 0.69 at first)."""

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


def constant_init(value: float) -> Callable:
    """Initialiser filling a parameter with `value` (for `layers.param`)."""
    return lambda key, shape, dtype=jnp.float32: jnp.full(shape, value, dtype)


# ---------------------------------------------------------------- torso + head


def q_network(config: NetworkConfig, obs_space, num_actions: int) -> Network:
    """obs -> Q-values [..., num_actions]: the torso of `config` and a linear `q_head`, on `config.backend`."""
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
    reading concat(obs, action). Discrete: `fn(layers, obs) -> (q1, q2)`, each [..., num_actions]."""
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
    """The (weight [in, out], bias [out]) pairs of a network of plain dense layers, in creation order,
    for either backend (flax `Dense_i/{kernel,bias}`, haiku `linear_i/{w,b}`). ValueError if the
    tree holds anything else (e.g. a learned log-std or noisy layers)."""
    modules = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        module, name = keys[-2] if len(keys) >= 2 else None, keys[-1]
        if module is None or name not in _WEIGHT_NAMES + _BIAS_NAMES:
            raise ValueError(
                f"dense_layers: parameter {'/'.join(map(str, keys))} is not a dense layer's weight or bias"
            )
        modules.setdefault(module, {})["w" if name in _WEIGHT_NAMES else "b"] = leaf
    ordered = sorted(modules, key=_layer_index)
    return [(modules[m]["w"], modules[m]["b"]) for m in ordered]


def leaf_offsets(params):
    """`params` with each leaf replaced by where it starts in `jax.flatten_util.ravel_pytree(params)`'s
    vector (an int): leaf k starts at the sum of the sizes of leaves 0..k-1, in `jax.tree` order.
    `dense_layers(leaf_offsets(params))` gives each dense layer's (weight, bias) offsets."""
    leaves, treedef = jax.tree.flatten(params)
    sizes = [math.prod(jnp.shape(x)) for x in leaves]
    return jax.tree.unflatten(treedef, [0, *itertools.accumulate(sizes)][: len(leaves)])


# ---------------------------------------------------------------- observation normalisation


def observation_stats_shape(obs_shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of the running observation statistics: one mean and variance per channel for
    images (rank 3, [height, width, channels]: every pixel of a channel is a sample), else one per
    feature (the observation's shape)."""
    obs_shape = tuple(int(n) for n in obs_shape)
    return obs_shape[-1:] if len(obs_shape) == 3 else obs_shape


def initial_observation_stats(obs_shape: Sequence[int]) -> dict:
    """{"mean": 0, "var": 1, "count": 1e-4} of `observation_stats_shape` (a plain dict of arrays, as
    `envs.wrappers.RunningMeanVar` starts), so checkpoints serialise it."""
    shape = observation_stats_shape(obs_shape)
    return {
        "mean": jnp.zeros(shape, jnp.float32),
        "var": jnp.ones(shape, jnp.float32),
        "count": jnp.float32(1e-4),
    }


def update_observation_stats(stats: dict, obs, obs_shape: Sequence[int]) -> dict:
    """`stats` merged with every observation of the batch `obs` [..., *obs_shape] by Chan et al.'s
    rule (`envs.wrappers.RunningMeanVar.update`); for images every pixel is a sample of its channel."""
    from envs.wrappers import RunningMeanVar

    samples = jnp.reshape(obs, (-1,) + observation_stats_shape(obs_shape))
    merged = RunningMeanVar(**stats).update(samples, 1)
    return {"mean": merged.mean, "var": merged.var, "count": merged.count}


def normalize_observation(obs, stats: dict, clip: float | None = 10.0, epsilon: float = 1e-8):
    """clip((obs - mean) / sqrt(var + epsilon), -clip, clip) with running statistics `stats`
    (broadcast over the batch axes and, for images, the pixels), as float32; `clip=None`: unclipped."""
    out = (jnp.asarray(obs, jnp.float32) - stats["mean"]) / jnp.sqrt(stats["var"] + epsilon)
    return out if clip is None else jnp.clip(out, -clip, clip)
