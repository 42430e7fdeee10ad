"""SimbaV2's torso (Lee et al. 2025, "Hyperspherical Normalization for Scalable Deep Reinforcement
Learning"): every feature vector and every weight vector lies on the unit hypersphere, and learned
scalers set the magnitudes (`torso`). After every optimiser step the agent puts each weight back
on the sphere (`project`). The output layer is the agent's usual head: SimbaV2's own heads (a
distributional critic over 101 bins, reward scaling to a bounded return) are not here.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

from rl.nn.layers import constant_init

EPS = 1e-8
SHIFT = 3.0  # the constant appended to the observation before the first projection (c_shift)
EXPANSION = 4  # a block's inner width, in widths
HYPER_PREFIX = "hyper_w"


def l2_normalize(x, axis: int = -1):
    """x / max(||x||_2, EPS) along `axis`."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=axis, keepdims=True), EPS)


def hyper_init(key, shape, dtype=jnp.float32):
    """An orthogonal [in, out] matrix with each column scaled to unit norm."""
    w = jax.nn.initializers.orthogonal(scale=1.0, column_axis=0)(key, shape, dtype)
    return l2_normalize(w, axis=0)


def hyper_dense(layers, x, features: int):
    """x W, W [in, features] a hyperspherical weight (param `HYPER_PREFIX`<i>), no bias."""
    w = layers.param(layers.unique_name(HYPER_PREFIX), (x.shape[-1], features), hyper_init)
    return x @ w


def scaler(layers, x, init: float, scale: float):
    """(init / scale) a * x with a learned vector a [F] starting at `scale`: the product starts at
    `init`, while the optimiser moves a at its own scale."""
    a = layers.param(layers.unique_name("scaler"), (x.shape[-1],), constant_init(scale))
    return (init / scale) * a * x


def block(layers, z, width: int, num_blocks: int):
    """One residual block: an inverted-bottleneck hyperspherical MLP, then the interpolation
    z' = n(z + alpha (m - z)) (`torso`)."""
    s = math.sqrt(2.0 / width) / math.sqrt(EXPANSION)
    m = scaler(layers, hyper_dense(layers, z, width * EXPANSION), s, s)
    m = l2_normalize(hyper_dense(layers, jax.nn.relu(m) + EPS, width))
    step = scaler(layers, m - z, 1.0 / (num_blocks + 1), 1.0 / math.sqrt(width))  # alpha (m - z)
    return l2_normalize(z + step)


def torso(layers, x, hidden: Sequence[int]):
    """Features [..., w] of x [..., D]: the embedding, len(`hidden`) residual blocks of width
    w = hidden[0] (the widths must be equal), then s_1(z W_p). With n(x) = x / max(||x||_2, `EPS`)
    over the last axis, hyperspherical dense layers x W (W [in, out], no bias, unit-norm columns,
    orthogonal then projected at init; params `HYPER_PREFIX`<i>) and scalers s_c(x) = (c / k) a * x
    (a learned vector initialised to k, so the product starts at c: `scaler`):

        embedding:  z0 = n(s_{sqrt(2/w)}(n([x, `SHIFT`]) W_e))
        block:      m  = n((relu(s_{sqrt(2/w)/2}(z W_1)) + EPS) W_2)  (W_1: w -> 4w, W_2: 4w -> w)
                    z' = n(z + alpha * (m - z))       (alpha a scaler, c = 1 / (blocks + 1),
                                                       k = 1 / sqrt(w))
        features:   f  = s_1(z_L W_p)                 (the first half of SimbaV2's heads)
    """
    width, num_blocks = int(hidden[0]), len(hidden)
    s = math.sqrt(2.0 / width)
    x = jnp.asarray(x, jnp.float32)
    shift = jnp.full(x.shape[:-1] + (1,), SHIFT, x.dtype)
    z = l2_normalize(jnp.concatenate([x, shift], axis=-1))
    z = l2_normalize(scaler(layers, hyper_dense(layers, z, width), s, s))
    for _ in range(num_blocks):
        z = block(layers, z, width, num_blocks)
    return scaler(layers, hyper_dense(layers, z, width), 1.0, 1.0)


def is_hyper_weight(path) -> bool:
    """Whether a params leaf at `path` (`jax.tree_util` keys) is a hyperspherical weight."""
    last = path[-1] if path else None
    name = getattr(last, "key", getattr(last, "name", None))
    return isinstance(name, str) and name.startswith(HYPER_PREFIX)


def project(params):
    """The params with every hyperspherical weight's columns put back on the unit sphere,
    W[:, j] <- W[:, j] / ||W[:, j]||; other leaves (scalers, heads) unchanged."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: l2_normalize(leaf, axis=0) if is_hyper_weight(path) else leaf, params
    )
