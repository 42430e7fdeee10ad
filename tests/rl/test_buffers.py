"""Replay buffers: circular storage semantics, the sum-tree, PER sampling statistics against exact
probabilities, importance weights, duplicate-index updates, and no float32 drift over 10^6 updates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from rl import buffers


def transition(i):
    """A small pytree transition whose every leaf encodes the integer i."""
    return {
        "obs": jnp.full((3,), i, jnp.float32),
        "action": jnp.int32(i),
        "reward": jnp.float32(i),
        "nested": (jnp.full((2, 2), i, jnp.float32), jnp.bool_(i % 2)),
    }


def batch_of(ids):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *[transition(i) for i in ids])


# ---------------------------------------------------------------- uniform buffer


def test_uniform_add_wraps_around_and_keeps_the_newest():
    buf = buffers.uniform_init(transition(0), capacity=5)
    add = jax.jit(buffers.uniform_add)
    buf = add(buf, batch_of([1, 2, 3]))
    assert int(buf.size) == 3 and int(buf.position) == 3
    buf = add(buf, batch_of([4, 5, 6]))  # 6 overwrites slot 0 (item 1)
    assert int(buf.size) == 5 and int(buf.position) == 1
    np.testing.assert_array_equal(buf.data["action"], [6, 2, 3, 4, 5])
    np.testing.assert_array_equal(buf.data["obs"][:, 0], [6, 2, 3, 4, 5])
    np.testing.assert_array_equal(buf.data["nested"][1], [False, False, True, False, True])
    buf = add(buf, batch_of([7, 8, 9, 10, 11]))  # a whole capacity at once
    np.testing.assert_array_equal(buf.data["action"], [11, 7, 8, 9, 10])


def test_uniform_add_with_valid_false_changes_nothing():
    buf = buffers.uniform_add(buffers.uniform_init(transition(0), 4), batch_of([1, 2]))
    same = jax.jit(buffers.uniform_add)(buf, batch_of([8, 9]), jnp.bool_(False))
    for a, b in zip(jax.tree.leaves(buf), jax.tree.leaves(same)):
        np.testing.assert_array_equal(a, b)


def test_uniform_sample_only_returns_stored_items_uniformly():
    buf = buffers.uniform_add(buffers.uniform_init(transition(0), 100), batch_of(range(1, 11)))
    batch, idx = jax.jit(buffers.uniform_sample, static_argnums=2)(buf, jax.random.PRNGKey(0), 20_000)
    idx = np.asarray(idx)
    assert idx.min() >= 0 and idx.max() < 10
    np.testing.assert_array_equal(np.asarray(batch["action"]), idx + 1)  # items match their indices
    counts = np.bincount(idx, minlength=10)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_buffers_work_under_vmap_and_scan():
    """One buffer per seed (vmap), filled inside a scan."""

    def fill(key):
        buf = buffers.prioritized_init({"x": jnp.float32(0)}, 8)

        def body(buf, t):
            return buffers.prioritized_add(buf, {"x": jnp.stack([t, t + 0.5])}), None

        buf, _ = jax.lax.scan(body, buf, jnp.arange(6, dtype=jnp.float32))
        items, idx, w = buffers.prioritized_sample(buf, key, 4, 0.5)
        return buf, items, idx

    bufs, items, idx = jax.jit(jax.vmap(fill))(jax.random.split(jax.random.PRNGKey(1), 3))
    assert bufs.data["x"].shape == (3, 8)
    np.testing.assert_array_equal(bufs.size, [8, 8, 8])
    np.testing.assert_array_equal(bufs.data["x"][0], [4, 4.5, 5, 5.5, 2, 2.5, 3, 3.5])
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(bufs.data["x"]), np.asarray(idx), 1), items["x"])


def test_bad_items_raise_naming_the_problem():
    buf = buffers.uniform_init(transition(0), 4)
    bad = batch_of([1, 2])
    bad["obs"] = jnp.zeros((2, 5))
    with pytest.raises(ValueError, match=r"items\['obs'\] has shape \(2, 5\)"):
        buffers.uniform_add(buf, bad)
    with pytest.raises(ValueError, match="cannot add 6 items"):
        buffers.uniform_add(buf, batch_of(range(6)))
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        buffers.uniform_init(transition(0), 0)
    with pytest.raises(ValueError, match="pytree structure"):
        buffers.uniform_add(buf, {"obs": jnp.zeros((1, 3))})


# ---------------------------------------------------------------- sum-tree


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 100.0, width=32), min_size=1, max_size=37), st.data())
def test_sumtree_set_matches_a_tree_built_from_scratch(leaves, data):
    n = len(leaves)
    tree = buffers.sumtree_from_leaves(jnp.asarray(leaves, jnp.float32))
    indices = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=12))
    values = data.draw(st.lists(st.floats(0.0, 100.0, width=32), min_size=len(indices), max_size=len(indices)))
    updated = buffers.sumtree_set(tree, jnp.asarray(indices), jnp.asarray(values, jnp.float32))
    expected = np.asarray(leaves, np.float32).copy()
    for i, v in zip(indices, values):  # sequential writes: the last duplicate wins
        expected[i] = v
    np.testing.assert_array_equal(buffers.sumtree_leaves(updated)[:n], expected)
    np.testing.assert_allclose(updated, buffers.sumtree_from_leaves(expected, num_leaves=updated.shape[0] // 2), rtol=1e-6)


def test_sumtree_find_hits_the_right_leaf_at_every_boundary():
    leaves = np.array([1.0, 0.0, 2.0, 0.5, 0.0, 3.0], np.float32)
    tree = buffers.sumtree_from_leaves(leaves)
    cum = np.concatenate([[0.0], np.cumsum(leaves)])
    targets, expected = [], []
    for i in np.flatnonzero(leaves):
        targets += [cum[i], (cum[i] + cum[i + 1]) / 2, np.nextafter(np.float32(cum[i + 1]), np.float32(0))]
        expected += [i, i, i]
    np.testing.assert_array_equal(buffers.sumtree_find(tree, jnp.asarray(targets, jnp.float32)), expected)
    # overshoot by rounding (u >= total) lands on the last non-empty leaf, never on a zero leaf
    assert int(buffers.sumtree_find(tree, jnp.float32(cum[-1] * 1.001))) == 5


def test_duplicate_indices_in_one_update_are_deterministic_last_wins():
    buf = buffers.prioritized_add(buffers.prioritized_init({"x": jnp.float32(0)}, 4), {"x": jnp.arange(4.0)})
    idx = jnp.array([2, 0, 2, 2, 0])
    prio = jnp.array([5.0, 7.0, 1.0, 3.0, 2.0])
    out = jax.jit(buffers.prioritized_update)(buf, idx, prio, 1.0)
    np.testing.assert_array_equal(buffers.sumtree_leaves(out.tree), [2.0, 1.0, 3.0, 1.0])
    assert float(buffers.sumtree_total(out.tree)) == 7.0
    assert float(out.max_leaf) == 3.0  # dropped duplicates (5, 7) do not count as seen


# ---------------------------------------------------------------- prioritized replay


def filled_prioritized(priorities, alpha, capacity=None):
    n = len(priorities)
    buf = buffers.prioritized_init({"i": jnp.int32(0)}, capacity or n)
    buf = buffers.prioritized_add(buf, {"i": jnp.arange(n, dtype=jnp.int32)})
    return buffers.prioritized_update(buf, jnp.arange(n), jnp.asarray(priorities, jnp.float32), alpha)


def sample_counts(buf, num_batches, batch_size, beta=0.4, seed=0):
    @jax.jit
    def draw(keys):
        return jax.vmap(lambda k: buffers.prioritized_sample(buf, k, batch_size, beta))(keys)

    items, idx, weights = draw(jax.random.split(jax.random.PRNGKey(seed), num_batches))
    np.testing.assert_array_equal(items["i"], idx)
    return np.bincount(np.asarray(idx).ravel(), minlength=capacity_of(buf)), idx, weights


def capacity_of(buf):
    return buffers.capacity_of(buf)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_prioritized_sampling_frequencies_match_exact_probabilities(alpha):
    priorities = np.array([0.1, 1.0, 2.5, 0.01, 4.0, 0.7, 1.3, 3.3, 0.05, 2.0], np.float64)
    buf = filled_prioritized(priorities, alpha, capacity=13)  # 3 empty slots must never be drawn
    counts, _, _ = sample_counts(buf, num_batches=2000, batch_size=32)
    exact = priorities**alpha / np.sum(priorities**alpha)
    assert counts[10:].sum() == 0
    # Stratified sampling has less variance than multinomial draws, so the multinomial chi-square
    # test is conservative; a wrong probability (e.g. alpha ignored) fails it by far.
    result = stats.chisquare(counts[:10], exact * counts.sum())
    assert result.pvalue > 1e-3, (counts[:10], exact * counts.sum())


def test_importance_weights_are_normalised_inverse_probabilities():
    priorities = np.array([1.0, 2.0, 4.0, 8.0], np.float64)
    buf = filled_prioritized(priorities, alpha=1.0)
    _, idx, weights = sample_counts(buf, num_batches=50, batch_size=8, beta=0.5)
    p = priorities / priorities.sum()
    for batch_idx, batch_w in zip(np.asarray(idx), np.asarray(weights)):
        w = (4 * p[batch_idx]) ** -0.5
        np.testing.assert_allclose(batch_w, w / w.max(), rtol=1e-5)
    assert np.all(np.asarray(weights) <= 1.0)


def test_new_items_enter_at_the_max_priority_seen():
    buf = buffers.prioritized_init({"i": jnp.int32(0)}, 8)
    buf = buffers.prioritized_add(buf, {"i": jnp.arange(3, dtype=jnp.int32)})
    np.testing.assert_array_equal(buffers.sumtree_leaves(buf.tree)[:3], [1.0, 1.0, 1.0])
    buf = buffers.prioritized_update(buf, jnp.array([0, 1]), jnp.array([9.0, 0.5]), 0.5)
    buf = buffers.prioritized_update(buf, jnp.array([0]), jnp.array([0.01]), 0.5)  # max stays 3
    buf = buffers.prioritized_add(buf, {"i": jnp.array([3, 4], jnp.int32)})
    np.testing.assert_allclose(buffers.sumtree_leaves(buf.tree)[:5], [0.1, np.sqrt(0.5), 1.0, 3.0, 3.0], rtol=1e-6)
    # overwriting the oldest item replaces its leaf too
    buf = buffers.prioritized_add(buf, {"i": jnp.arange(5, 9, dtype=jnp.int32)})
    assert int(buf.position) == 1 and int(buf.size) == 8
    np.testing.assert_allclose(buffers.sumtree_leaves(buf.tree)[:2], [3.0, np.sqrt(0.5)], rtol=1e-6)


def test_beta_schedule_anneals_to_one():
    from rl.loop import linear_schedule

    beta = [float(linear_schedule(0.4, 1.0, 100, s)) for s in (0, 50, 100, 1000)]
    np.testing.assert_allclose(beta, [0.4, 0.7, 1.0, 1.0], rtol=1e-6)


def test_sumtree_does_not_drift_over_a_million_updates():
    """1,024,000 priority updates (batches of 256, duplicates included, values over 8 orders of
    magnitude) in one jitted scan: every internal node still equals the float32 sum of its children,
    the root matches the float64 sum of the leaves, and sampling frequencies still match."""
    capacity, batch, steps = 1000, 256, 4000
    buf = filled_prioritized(np.ones(capacity), 0.6)

    @jax.jit
    def hammer(buf, key):
        def body(buf, key):
            k_idx, k_val, k_exp = jax.random.split(key, 3)
            idx = jax.random.randint(k_idx, (batch,), 0, capacity)
            prio = jax.random.uniform(k_val, (batch,), minval=0.5, maxval=1.0) * 10.0 ** jax.random.randint(k_exp, (batch,), -4, 4)
            return buffers.prioritized_update(buf, idx, prio, 0.6), None

        return jax.lax.scan(body, buf, jax.random.split(key, steps))[0]

    buf = hammer(buf, jax.random.PRNGKey(3))
    tree = np.asarray(buf.tree)
    num_leaves = tree.shape[0] // 2
    internal = np.arange(1, num_leaves)
    np.testing.assert_array_equal(tree[internal], tree[2 * internal] + tree[2 * internal + 1])
    leaves = tree[num_leaves:].astype(np.float64)
    np.testing.assert_allclose(tree[1], leaves.sum(), rtol=1e-5)
    counts, _, _ = sample_counts(buf, num_batches=400, batch_size=256, seed=4)
    exact = leaves[:capacity] / leaves[:capacity].sum()
    assert counts[capacity:].sum() == 0
    big = exact * counts.sum() >= 20  # chi-square needs sizeable expected counts; pool the rest
    observed = np.append(counts[:capacity][big], counts[:capacity][~big].sum())
    expected = np.append(exact[big], exact[~big].sum()) * counts.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3
