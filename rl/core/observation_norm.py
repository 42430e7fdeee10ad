"""Observation normalisation with running statistics: the observation minus its running mean,
over its running standard deviation, clipped (PPO's `agent.normalize_obs`).

The statistics are a plain dict of arrays (so checkpoints serialise it), merged batch by batch by
Chan et al.'s parallel rule (`envs.wrappers.RunningMeanVar`): one mean and variance per feature,
or per channel for images.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp


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


def update_observation_stats(stats: dict, obs, obs_shape: Sequence[int], mask=None) -> dict:
    """`stats` merged with every observation of the batch `obs` [..., *obs_shape] by Chan et al.'s
    rule (`envs.wrappers.RunningMeanVar.update`); for images every pixel is a sample of its
    channel. With `mask` [...] (bool), only the observations it sets: with m kept samples of mean
    mu_x and variance var_x, n = count + m, delta = mu_x - mean, mean' = mean + delta m / n,
    var' = (var count + var_x m + delta^2 count m / n) / n (stats unchanged for m = 0)."""
    from envs.wrappers import RunningMeanVar

    stats_shape = observation_stats_shape(obs_shape)
    samples = jnp.reshape(obs, (-1,) + stats_shape)
    if mask is None:
        merged = RunningMeanVar(**stats).update(samples, 1)
        return {"mean": merged.mean, "var": merged.var, "count": merged.count}
    per_obs = samples.shape[0] // mask.size  # samples of one observation (an image's pixels)
    keep = jnp.repeat(jnp.reshape(mask, (-1,)), per_obs).reshape((-1,) + (1,) * len(stats_shape))
    samples = jnp.asarray(samples, jnp.float32)
    m = jnp.sum(keep).astype(jnp.float32)  # keep is [samples, 1, ...]: one entry a sample
    kept_sum = lambda x: jnp.sum(jnp.where(keep, x, 0.0), axis=0)
    batch_mean = kept_sum(samples) / jnp.maximum(m, 1.0)
    batch_var = kept_sum(jnp.square(samples - batch_mean)) / jnp.maximum(m, 1.0)
    total = stats["count"] + m
    delta = batch_mean - stats["mean"]
    mean = stats["mean"] + delta * m / total
    m2 = stats["var"] * stats["count"] + batch_var * m + delta**2 * stats["count"] * m / total
    return {"mean": mean, "var": m2 / total, "count": total}


def normalize_observation(obs, stats: dict, clip: float | None = 10.0, epsilon: float = 1e-8):
    """clip((obs - mean) / sqrt(var + epsilon), -clip, clip) with running statistics `stats`
    (broadcast over the batch axes and, for images, the pixels), as float32; `clip=None`:
    unclipped."""
    out = (jnp.asarray(obs, jnp.float32) - stats["mean"]) / jnp.sqrt(stats["var"] + epsilon)
    return out if clip is None else jnp.clip(out, -clip, clip)
