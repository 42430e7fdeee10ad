"""The `Layers` interface networks are written against, its two backends, and `build`. A network is
written once as `fn(layers, *inputs)` against `Layers` (`dense`, `conv`, `noisy_dense`,
`layer_norm`, `param`; `state`, `set_state`, `unique_name`, `training` for running statistics);
`build` runs it on `FlaxLayers` or `HaikuLayers` (`agent.network.backend`), which create the same
parameters with the same initialisers. Also here: `mlp`, activations, observation preprocessing.

    net = layers.build(networks.with_head(torso, networks.q_head(2)), backend="flax")
    q_values = net.apply(net.init(key, obs), obs)   # noisy layers: net.apply(params, obs, rng=key)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

INITS = ("orthogonal", "lecun_uniform")
BACKENDS = ("flax", "haiku")


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


def activation(name: str) -> Callable:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def noisy_layer_noise(noise_key, index: int, fan_in: int, features: int):
    """(f(e_in) [fan_in], f(e_out) [features]): the factorised noise of the `index`-th noisy layer
    a network applies (from 0, in call order) under `noise_key`,

    e = (e_in, e_out) ~ N(0, I_{fan_in + features}), drawn from fold_in(noise_key, index),
    f(e) = sign(e) sqrt(|e|),

    one draw a layer. A fused kernel that runs a noisy network outside its `apply` draws the same
    noise with this."""
    e = jax.random.normal(jax.random.fold_in(noise_key, index), (fan_in + features,))
    e = jnp.sign(e) * jnp.sqrt(jnp.abs(e))
    return e[:fan_in], e[fan_in:]


def _noisy_dense(x, w_mu, w_sigma, b_mu, b_sigma, noise):
    """Factorised-Gaussian noisy linear layer (Fortunato et al. 2018):

    y = x (w_mu + w_sigma * (f(e_in) f(e_out)^T)) + b_mu + b_sigma * f(e_out)

    with `noise` = (f(e_in), f(e_out)) (`noisy_layer_noise`); with noise None, the mean layer
    x w_mu + b_mu."""
    if noise is None:
        return x @ w_mu + b_mu
    e_in, e_out = noise
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
    """The weight initialiser of a dense or conv layer of gain `scale` under `init` (`build`)."""
    return orthogonal(scale) if init == "orthogonal" else variance_scaling(1.0, "fan_in", "uniform")


class NoiseSource:
    """The noise of a network's noisy layers in one `apply`: layer i (in call order) gets
    `noisy_layer_noise(noise_key, i, ...)`; no noise (the mean layers) when noise_key is None."""

    def __init__(self, noise_key):
        self.noise_key, self.index = noise_key, 0

    def next(self, fan_in: int, features: int):
        if self.noise_key is None:
            return None
        self.index += 1
        return noisy_layer_noise(self.noise_key, self.index - 1, fan_in, features)


def unique_name(counts: dict, prefix: str) -> str:
    """`prefix` followed by how many names of that prefix `counts` has handed out (then one
    more): the names of a network's parameters and running statistics, in call order."""
    counts[prefix] = counts.get(prefix, -1) + 1
    return f"{prefix}{counts[prefix]}"


class FlaxLayers:
    """`Layers` on Flax linen: called inside a compact module. `training`: whether layers with
    running statistics normalise by the batch and update them (`rl.nn.batch_renorm`)."""

    def __init__(self, module, init: str = "orthogonal", noise_key=None, training: bool = False):
        self.module = module
        self.init = init
        self.noisy_count = 0
        self.noise = NoiseSource(noise_key)
        self.training = training
        self.names, self.variables = {}, {}

    def unique_name(self, prefix: str) -> str:
        return unique_name(self.names, prefix)

    def state(self, name: str, initial):
        """The running statistic `name` (a "batch_stats" variable; `initial` before any update)."""
        self.variables[name] = self.module.variable("batch_stats", name, lambda: initial)
        return self.variables[name].value

    def set_state(self, name: str, value):
        """Replace the running statistic `name` (not while the params are being initialised)."""
        if not self.module.is_initializing():
            self.variables[name].value = value

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
        """2-D convolution of x [N, H, W, C], `kernel` x `kernel`, VALID padding (the layers'
        `init`, zero bias)."""
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
        return _noisy_dense(x, w_mu, w_sigma, b_mu, b_sigma, self.noise.next(fan_in, features))

    def layer_norm(self, x, name: str | None = None):
        import flax.linen as nn

        return nn.LayerNorm(epsilon=LAYER_NORM_EPS, name=name)(x)

    def param(self, name: str, shape: Sequence[int], init: Callable):
        return self.module.param(name, init, tuple(shape))


class HaikuLayers:
    """`Layers` on Haiku: called inside `hk.transform` (`hk.transform_with_state` where layers
    keep running statistics)."""

    def __init__(self, init: str = "orthogonal", noise_key=None, training: bool = False):
        self.init = init
        self.noisy_count = 0
        self.noise = NoiseSource(noise_key)
        self.training = training
        self.names = {}

    def unique_name(self, prefix: str) -> str:
        return unique_name(self.names, prefix)

    def state(self, name: str, initial):
        import haiku as hk

        return hk.get_state(name, initial.shape, initial.dtype, init=lambda *_: initial)

    def set_state(self, name: str, value):
        import haiku as hk

        if not hk.running_init():
            hk.set_state(name, value)

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
        """2-D convolution of x [N, H, W, C], `kernel` x `kernel`, VALID padding (the layers'
        `init`, zero bias)."""
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
        return _noisy_dense(x, w_mu, w_sigma, b_mu, b_sigma, self.noise.next(fan_in, features))

    def layer_norm(self, x, name: str | None = None):
        import haiku as hk

        return hk.LayerNorm(
            axis=-1, create_scale=True, create_offset=True, eps=LAYER_NORM_EPS, name=name
        )(x)

    def param(self, name: str, shape: Sequence[int], init: Callable):
        import haiku as hk

        return hk.get_parameter(name, tuple(shape), init=lambda s, d: init(hk.next_rng_key(), s, d))


# ---------------------------------------------------------------- building a Network


@dataclass(frozen=True)
class Network:
    """`init(key, *inputs) -> params`, `apply(params, *inputs, rng=None) -> outputs`."""

    init: Callable
    apply: Callable


def build(fn: Callable, backend: str = "flax", init: str = "orthogonal") -> Network:
    """A `Network` from `fn(layers, *inputs)`; `backend` is "flax" or "haiku", `init` one of `INITS`
    (`agent.network.init`, dense and conv layers; biases 0): `orthogonal`, the usual PPO/DQN
    practice, orthogonal weights with a per-layer gain (sqrt(2) for hidden ReLU/tanh layers, 0.01
    for policy logits, 1 for values); or `lecun_uniform`, W ~ U(-sqrt(3 / fan_in), sqrt(3 /
    fan_in)) whatever the layer (Brax's networks), so Var(W) = 1 / fan_in. Noisy layers and
    recurrent kernels keep their own initialisers.

    `apply(params, *inputs, rng=key)` gives noisy layer i (in call order) the noise
    `noisy_layer_noise(key, i, ...)` (no rng: noise-free, the mean net)."""
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
        def __call__(self, *inputs, noise_key=None):
            return fn(FlaxLayers(self, init, noise_key), *inputs)

    module = Module()

    def init_params(key, *inputs):
        params_key, _ = jax.random.split(key)
        return module.init({"params": params_key}, *inputs)

    def apply(params, *inputs, rng=None):
        return module.apply(params, *inputs, noise_key=rng)

    return Network(init=init_params, apply=apply)


def _build_haiku(fn: Callable, init: str) -> Network:
    import haiku as hk

    transformed = hk.transform(
        lambda *inputs, noise_key=None: fn(HaikuLayers(init, noise_key), *inputs)
    )

    def init_params(key, *inputs):
        return transformed.init(key, *inputs)

    def apply(params, *inputs, rng=None):
        return transformed.apply(params, None, *inputs, noise_key=rng)

    return Network(init=init_params, apply=apply)


# ---------------------------------------------------------------- building blocks


def constant_init(value: float) -> Callable:
    """Initialiser filling a parameter with `value` (for `layers.param`)."""
    return lambda key, shape, dtype=jnp.float32: jnp.full(shape, value, dtype)


def mlp(
    layers,
    x,
    hidden: Sequence[int],
    act: str = "relu",
    noisy: bool = False,
    layer_norm: bool = False,
):
    """Hidden layers h <- act(h W + b) of the given widths (gain sqrt(2) under the orthogonal init);
    with `layer_norm`, h <- act(LayerNorm(h W + b))."""
    f = activation(act)
    for width in hidden:
        x = layers.noisy_dense(x, width) if noisy else layers.dense(x, width)
        x = f(layers.layer_norm(x) if layer_norm else x)
    return x


def flatten_obs(obs, obs_space):
    """obs [..., *shape] -> [..., prod(shape)] for a Box of rank > 1 (images or grids through an
    MLP)."""
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
