"""Batch renormalisation (Ioffe 2017, "Batch Renormalization"), CrossQ's normaliser (Bhatt et al.
2024), and the networks that carry its running statistics. A network with such layers is a
`StatefulNetwork`: its statistics are not params (no gradient, no optimiser), so an agent keeps
them in a field of its own state (SAC's and TD3's `critic_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from rl.nn.layers import FlaxLayers, HaikuLayers, activation, at_full_precision, constant_init

EPS = 1e-3  # sbx's BatchRenorm epsilon (flax's BatchNorm default is 1e-5)
R_MAX = 3.0
D_MAX = 5.0


# ---------------------------------------------------------------- the maths


def initial_stats(features: int) -> dict:
    """The running statistics before any update: mean 0, var 1, steps 0 (int32)."""
    return {
        "mean": jnp.zeros((features,), jnp.float32),
        "var": jnp.ones((features,), jnp.float32),
        "steps": jnp.int32(0),
    }


def renorm_train(x, stats: dict, momentum: float, warmup: int):
    """(x_hat, stats'): x [..., F] normalised over every axis but the last, and the running
    statistics (mean mu and variance v per feature) after this batch, eps = `EPS`:

        mu_B = mean(x),  s_B = sqrt(var(x) + eps)        (batch statistics, biased var)
        s = sqrt(v + eps),  r = sg(clip(s_B / s, 1 / r_max, r_max)),
        d = sg(clip((mu_B - mu) / s, -d_max, d_max))
        x_hat = (x - mu_B) / s_B * r + d     (r = 1, d = 0 for the first `warmup` training passes)
        mu <- m mu + (1 - m) mu_B,  v <- m v + (1 - m) var(x),  steps <- steps + 1

    sg is stop-gradient: the gradient flows through mu_B and s_B as in batch normalisation, not
    through r and d. r_max = `R_MAX`, d_max = `D_MAX` (fixed, as sbx's CrossQ has them; the paper
    relaxes them over a schedule), m = `momentum`."""
    axes = tuple(range(x.ndim - 1))
    batch_mean = jnp.mean(x, axis=axes)
    batch_var = jnp.mean(jnp.square(x - batch_mean), axis=axes)
    batch_std = jnp.sqrt(batch_var + EPS)
    running_std = jnp.sqrt(stats["var"] + EPS)
    r = jnp.clip(batch_std / running_std, 1.0 / R_MAX, R_MAX)
    d = jnp.clip((batch_mean - stats["mean"]) / running_std, -D_MAX, D_MAX)
    warmed_up = stats["steps"] >= warmup
    r = jax.lax.stop_gradient(jnp.where(warmed_up, r, 1.0))
    d = jax.lax.stop_gradient(jnp.where(warmed_up, d, 0.0))
    x_hat = (x - batch_mean) / batch_std * r + d
    batch_mean, batch_var = jax.lax.stop_gradient((batch_mean, batch_var))
    new = {
        "mean": momentum * stats["mean"] + (1.0 - momentum) * batch_mean,
        "var": momentum * stats["var"] + (1.0 - momentum) * batch_var,
        "steps": stats["steps"] + 1,
    }
    return x_hat, new


def renorm_eval(x, stats: dict):
    """x_hat = (x - mu) / sqrt(v + eps): the inference branch, by the running statistics."""
    return (x - stats["mean"]) / jnp.sqrt(stats["var"] + EPS)


# ---------------------------------------------------------------- the layer and the torso


def batch_renorm(layers, x, momentum: float = 0.99, warmup: int = 100_000):
    """y = gamma x_hat + beta over the last axis of x (gamma = 1, beta = 0 at first): x_hat by the
    batch (`renorm_train`, the running statistics updated) when `layers.training`, else by the
    running statistics (`renorm_eval`)."""
    name = layers.unique_name("batch_renorm")
    features = x.shape[-1]
    scale = layers.param(f"{name}_scale", (features,), constant_init(1.0))
    offset = layers.param(f"{name}_offset", (features,), constant_init(0.0))
    stats = {k: layers.state(f"{name}_{k}", v) for k, v in initial_stats(features).items()}
    if layers.training:
        x_hat, stats = renorm_train(x, stats, momentum, warmup)
        for key, value in stats.items():
            layers.set_state(f"{name}_{key}", value)
    else:
        x_hat = renorm_eval(x, stats)
    return scale * x_hat + offset


def renorm_mlp(
    layers, x, hidden: Sequence[int], act: str, momentum: float = 0.99, warmup: int = 100_000
):
    """CrossQ's torso: the input renormalised, then for each width h <- BRN(act(h W + b))."""
    f = activation(act)
    x = batch_renorm(layers, jnp.asarray(x, jnp.float32), momentum, warmup)
    for width in hidden:
        x = batch_renorm(layers, f(layers.dense(x, width)), momentum, warmup)
    return x


# ---------------------------------------------------------------- a network with statistics


@dataclass(frozen=True)
class StatefulNetwork:
    """`init(key, *inputs) -> (params, stats)`, `apply(params, stats, *inputs, training=False) ->
    (outputs, stats)`: in training the layers normalise by the batch and return the updated
    statistics; otherwise they read them and return them unchanged."""

    init: Callable
    apply: Callable


def build(fn: Callable, backend: str = "flax", init: str = "orthogonal") -> StatefulNetwork:
    """A `StatefulNetwork` from `fn(layers, *inputs)` on "flax" (the statistics are the
    "batch_stats" collection) or "haiku" (`hk.transform_with_state`'s state); the params are what
    `rl.nn.layers.build` would make of the same function."""
    net = _build_flax(fn, init) if backend == "flax" else _build_haiku(fn, init)
    return StatefulNetwork(init=at_full_precision(net.init), apply=net.apply)


def _build_flax(fn: Callable, init: str) -> StatefulNetwork:
    import flax.linen as nn

    class Module(nn.Module):
        @nn.compact
        def __call__(self, *inputs, training=False):
            return fn(FlaxLayers(self, init, training=training), *inputs)

    module = Module()

    def init_params(key, *inputs):
        params_key, _ = jax.random.split(key)  # as rl.nn.layers.build's Flax init
        variables = module.init({"params": params_key}, *inputs)
        return {"params": variables["params"]}, dict(variables.get("batch_stats", {}))

    def apply(params, stats, *inputs, training=False):
        variables = {**params, "batch_stats": stats}
        if not training:
            return module.apply(variables, *inputs), stats
        outputs, updated = module.apply(variables, *inputs, training=True, mutable=["batch_stats"])
        return outputs, dict(updated.get("batch_stats", {}))

    return StatefulNetwork(init=init_params, apply=apply)


def _build_haiku(fn: Callable, init: str) -> StatefulNetwork:
    import haiku as hk

    transformed = hk.transform_with_state(
        lambda *inputs, training=False: fn(HaikuLayers(init, training=training), *inputs)
    )

    def apply(params, stats, *inputs, training=False):
        outputs, updated = transformed.apply(params, stats, None, *inputs, training=training)
        return outputs, (updated if training else stats)

    return StatefulNetwork(init=transformed.init, apply=apply)
