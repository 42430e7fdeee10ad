"""Episode statistics: the return, length and count of the episodes that end in a period, summed
from `envs.wrappers.EpisodeStatistics`'s `info`, and their means as log-point metrics."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class EpisodeTotals(NamedTuple):
    """Sums over the episodes that ended in a period: return, length and how many ended."""

    returns: jax.Array
    lengths: jax.Array
    count: jax.Array


def no_episodes(shape: tuple[int, ...] = ()) -> EpisodeTotals:
    """Zero totals: one set, or one per element of `shape` (e.g. per env, for `count_episodes`)."""
    return EpisodeTotals(
        jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.int32)
    )


def add_episodes(totals: EpisodeTotals, info: dict) -> EpisodeTotals:
    """`totals` plus the episodes that end in `info` (from `EpisodeStatistics`, any batch shape):
    sum(done * episode_return), sum(done * episode_length), sum(done)."""
    return add_totals(totals, count_episodes(no_episodes(jnp.shape(info["episode_done"])), info))


def count_episodes(totals: EpisodeTotals, info: dict) -> EpisodeTotals:
    """`add_episodes` element by element, with no sum (`totals` has the shape of `info`'s batch,
    e.g. one set per env): totals + (done * episode_return, done * episode_length, done). A rollout
    that carries these per env writes no per-step episode arrays; `add_totals` sums them once after
    it."""
    done = info["episode_done"]
    return EpisodeTotals(
        totals.returns + jnp.where(done, info["episode_return"], 0.0),
        totals.lengths + jnp.where(done, info["episode_length"], 0),
        totals.count + done.astype(jnp.int32),
    )


def add_totals(totals: EpisodeTotals, more: EpisodeTotals) -> EpisodeTotals:
    """`totals` plus every element of `more` (per-env totals from `count_episodes`), summed."""
    return EpisodeTotals(
        totals.returns + jnp.sum(more.returns),
        totals.lengths + jnp.sum(more.lengths),
        totals.count + jnp.sum(more.count),
    )


def episode_metrics(totals: EpisodeTotals) -> dict:
    """Mean return and length of the episodes in `totals` (NaN if none ended) and their number."""
    some = totals.count > 0
    count = jnp.maximum(totals.count, 1)
    return {
        "episode_return": jnp.where(some, totals.returns / count, jnp.nan),
        "episode_length": jnp.where(some, totals.lengths / count, jnp.nan),
        "episodes": totals.count,
    }
