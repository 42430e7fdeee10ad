"""rl.core.episodes: the return, length and count of the episodes that end, summed from
`EpisodeStatistics`'s info (over a whole batch, or per env then summed), and their means."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.core import episodes


def test_add_episodes_and_episode_metrics_on_a_hand_made_batch():
    # two steps of three envs: episodes end in env 0 (return 5, length 4) and env 2 (return 1,
    # length 2) on the first step, in env 1 (return 9, length 10) on the second. The returns of
    # envs that did not end (stale values of earlier episodes) must not count.
    info = {
        "episode_done": jnp.array([[True, False, True], [False, True, False]]),
        "episode_return": jnp.array([[5.0, 100.0, 1.0], [5.0, 9.0, 1.0]]),
        "episode_length": jnp.array([[4, 70, 2], [4, 10, 2]], jnp.int32),
    }
    totals = episodes.add_episodes(episodes.no_episodes(), info)
    assert float(totals.returns) == 15.0 and int(totals.lengths) == 16 and int(totals.count) == 3
    metrics = episodes.episode_metrics(totals)
    assert float(metrics["episode_return"]) == pytest.approx(5.0)
    assert float(metrics["episode_length"]) == pytest.approx(16 / 3)
    assert int(metrics["episodes"]) == 3
    # adding step by step gives the same totals
    stepwise = episodes.no_episodes()
    for t in range(2):
        stepwise = episodes.add_episodes(stepwise, jax.tree.map(lambda x: x[t], info))
    assert stepwise == totals


def test_episode_metrics_are_nan_when_no_episode_ended():
    info = {
        "episode_done": jnp.zeros(4, bool),
        "episode_return": jnp.full(4, 7.0),
        "episode_length": jnp.full(4, 3, jnp.int32),
    }
    metrics = episodes.episode_metrics(episodes.add_episodes(episodes.no_episodes(), info))
    assert np.isnan(metrics["episode_return"]) and np.isnan(metrics["episode_length"])
    assert int(metrics["episodes"]) == 0


def test_per_env_episode_counts_sum_to_the_batch_totals():
    """`count_episodes` step by step per env, then `add_totals`, gives `add_episodes` of the whole
    [T, E] batch: the same lengths and counts, the same return sum up to float rounding."""
    rng = np.random.default_rng(0)
    info = {
        "episode_done": jnp.asarray(rng.random((7, 3)) < 0.4),
        "episode_return": jnp.asarray(rng.normal(size=(7, 3)), jnp.float32),
        "episode_length": jnp.asarray(rng.integers(1, 50, (7, 3)), jnp.int32),
    }
    per_env = episodes.no_episodes((3,))
    for t in range(7):
        per_env = episodes.count_episodes(per_env, {k: v[t] for k, v in info.items()})
    start = episodes.EpisodeTotals(jnp.float32(1.5), jnp.int32(4), jnp.int32(2))
    got, want = episodes.add_totals(start, per_env), episodes.add_episodes(start, info)
    assert int(got.count) == int(want.count) == 2 + int(np.sum(np.asarray(info["episode_done"])))
    assert int(got.lengths) == int(want.lengths)
    np.testing.assert_allclose(float(got.returns), float(want.returns), rtol=1e-6)
