"""Replay buffers: circular storage semantics, the sum-tree, PER sampling statistics against exact
probabilities, importance weights, duplicate-index updates, and no float32 drift over 10^6
updates."""

from __future__ import annotations

import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import FUSION_EMITTERS
from scipy import stats

import kernels
from rl.core import packing
from rl.replay import buffers


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
    batch, idx = jax.jit(buffers.uniform_sample, static_argnums=2)(
        buf, jax.random.PRNGKey(0), 20_000
    )
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
    np.testing.assert_array_equal(
        np.take_along_axis(np.asarray(bufs.data["x"]), np.asarray(idx), 1), items["x"]
    )


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


# jitted: an example's shapes are often new, and an eager call compiles each of the ops' operations
# on its own (about 4x the CPU time); the other sum-tree tests call them eagerly
sumtree_set_jit = jax.jit(buffers.sumtree_set)
sumtree_from_leaves_jit = jax.jit(buffers.sumtree_from_leaves)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 100.0, width=32), min_size=1, max_size=37), st.data())
def test_sumtree_set_matches_a_tree_built_from_scratch(leaves, data):
    n = len(leaves)
    tree = sumtree_from_leaves_jit(jnp.asarray(leaves, jnp.float32))
    indices = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=12))
    values = data.draw(
        st.lists(st.floats(0.0, 100.0, width=32), min_size=len(indices), max_size=len(indices))
    )
    updated = sumtree_set_jit(tree, jnp.asarray(indices), jnp.asarray(values, jnp.float32))
    expected = np.asarray(leaves, np.float32).copy()
    for i, v in zip(indices, values):  # sequential writes: the last duplicate wins
        expected[i] = v
    np.testing.assert_array_equal(buffers.sumtree_leaves(updated)[:n], expected)
    for got, want in zip(updated, sumtree_from_leaves_jit(expected)):  # every level, root first
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_sumtree_find_hits_the_right_leaf_at_every_boundary():
    leaves = np.array([1.0, 0.0, 2.0, 0.5, 0.0, 3.0], np.float32)
    tree = buffers.sumtree_from_leaves(leaves)
    cum = np.concatenate([[0.0], np.cumsum(leaves)])
    targets, expected = [], []
    for i in np.flatnonzero(leaves):
        targets += [
            cum[i],
            (cum[i] + cum[i + 1]) / 2,
            np.nextafter(np.float32(cum[i + 1]), np.float32(0)),
        ]
        expected += [i, i, i]
    np.testing.assert_array_equal(
        buffers.sumtree_find(tree, jnp.asarray(targets, jnp.float32)), expected
    )
    # overshoot by rounding (u >= total) lands on the last non-empty leaf, never on a zero leaf
    assert int(buffers.sumtree_find(tree, jnp.float32(cum[-1] * 1.001))) == 5


def test_duplicate_indices_in_one_update_are_deterministic_last_wins():
    buf = buffers.prioritized_add(
        buffers.prioritized_init({"x": jnp.float32(0)}, 4), {"x": jnp.arange(4.0)}
    )
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
    return buffers.prioritized_update(
        buf, jnp.arange(n), jnp.asarray(priorities, jnp.float32), alpha
    )


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


def test_prioritized_sampling_draws_one_target_in_each_stratum():
    """Target k of a batch of B is uniform in the k-th of B equal segments of the total mass, so
    item k of the batch is an item whose mass bracket [cumsum before it, cumsum to it) meets the
    k-th segment: with equal priorities (each segment exactly 4 items) item k is one of items
    4k..4k+3, and with unequal ones its bracket meets segment k. Plain uniform targets put two
    in one segment and none in another in almost every batch."""
    batch_size = 16
    rng = np.random.default_rng(0)
    for priorities in (np.ones(4 * batch_size), rng.uniform(0.1, 3.0, 50)):
        buf = filled_prioritized(priorities, alpha=1.0, capacity=64)
        _, idx, _ = sample_counts(buf, num_batches=50, batch_size=batch_size)
        idx = np.asarray(idx)  # [batches, B]
        upper = np.cumsum(priorities) / np.sum(priorities) * batch_size  # in segment units
        lower = upper - priorities / np.sum(priorities) * batch_size
        stratum = np.arange(batch_size)
        # (float32 sums: a bracket may end a hair past its segment's edge)
        assert np.all(lower[idx] <= stratum + 1 + 1e-4) and np.all(upper[idx] >= stratum - 1e-4)
        if len(priorities) == 4 * batch_size:  # equal: exactly the 4 items of segment k
            np.testing.assert_array_equal(idx // 4, np.broadcast_to(stratum, idx.shape))


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
    np.testing.assert_allclose(
        buffers.sumtree_leaves(buf.tree)[:5], [0.1, np.sqrt(0.5), 1.0, 3.0, 3.0], rtol=1e-6
    )
    # overwriting the oldest item replaces its leaf too
    buf = buffers.prioritized_add(buf, {"i": jnp.arange(5, 9, dtype=jnp.int32)})
    assert int(buf.position) == 1 and int(buf.size) == 8
    np.testing.assert_allclose(buffers.sumtree_leaves(buf.tree)[:2], [3.0, np.sqrt(0.5)], rtol=1e-6)


def test_beta_schedule_anneals_to_one():
    from rl.core.exploration import linear_schedule

    beta = [float(linear_schedule(0.4, 1.0, 100, s)) for s in (0, 50, 100, 1000)]
    np.testing.assert_allclose(beta, [0.4, 0.7, 1.0, 1.0], rtol=1e-6)


def test_sumtree_does_not_drift_over_a_million_updates():
    """1,024,000 priority updates (batches of 256, duplicates included, values over 8 orders of
    magnitude) in one jitted scan: every internal node still equals the sum of its children (to the
    float32 rounding of that one sum, not an accumulated error), the root matches the float64 sum of
    the leaves, and sampling frequencies still match."""
    capacity, batch, steps = 1000, 256, 4000
    buf = filled_prioritized(np.ones(capacity), 0.6)

    @jax.jit
    def hammer(buf, key):
        def body(buf, key):
            k_idx, k_val, k_exp = jax.random.split(key, 3)
            idx = jax.random.randint(k_idx, (batch,), 0, capacity)
            prio = jax.random.uniform(
                k_val, (batch,), minval=0.5, maxval=1.0
            ) * 10.0 ** jax.random.randint(k_exp, (batch,), -4, 4)
            return buffers.prioritized_update(buf, idx, prio, 0.6), None

        return jax.lax.scan(body, buf, jax.random.split(key, steps))[0]

    buf = hammer(buf, jax.random.PRNGKey(3))
    levels = [np.asarray(level, np.float64) for level in buf.tree]
    for parent, children in zip(
        levels[:-1], levels[1:]
    ):  # each node vs the exact sum of its children
        np.testing.assert_allclose(
            parent, children.reshape(parent.shape[0], -1).sum(axis=1), rtol=2e-6
        )
    leaves = levels[-1]
    np.testing.assert_allclose(levels[0][0], leaves.sum(), rtol=1e-5)
    counts, _, _ = sample_counts(buf, num_batches=400, batch_size=256, seed=4)
    exact = leaves[:capacity] / leaves[:capacity].sum()
    assert counts[capacity:].sum() == 0
    big = exact * counts.sum() >= 20  # chi-square needs sizeable expected counts; pool the rest
    observed = np.append(counts[:capacity][big], counts[:capacity][~big].sum())
    expected = np.append(exact[big], exact[~big].sum()) * counts.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3


# ---------------------------------------------------------------- against a float64 NumPy reference


def buffer_with_priorities(priorities, alpha, capacity):
    """A prioritized buffer of `capacity` items whose first len(priorities) are stored with leaf
    p^alpha (the rest empty); items hold their own index."""
    return _buffer_with_priorities(jnp.asarray(priorities, jnp.float32), alpha, capacity)


@partial(jax.jit, static_argnums=(1, 2))
def _buffer_with_priorities(priorities, alpha, capacity):
    buf = buffers.prioritized_init({"i": jnp.int32(0)}, capacity)
    n = len(priorities)
    buf = buffers.prioritized_add(buf, {"i": jnp.arange(n, dtype=jnp.int32)})
    return buffers.prioritized_update(buf, jnp.arange(n), priorities, alpha)


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from([1, 6, 37, 256, 300, 5000]),  # one to three levels below the root
    st.data(),
    st.sampled_from([0.0, 0.5, 1.0]),
    st.floats(0.0, 1.0),
)
def test_sum_queries_sampling_and_weights_match_a_float64_reference(capacity, data, alpha, beta):
    n = data.draw(st.integers(1, min(capacity, 300)))
    priorities = np.asarray(
        data.draw(
            st.lists(
                st.sampled_from([0.0, 1e-3, 0.5, 1.0, 7.0, 1e3]) | st.floats(1e-4, 1e4),
                min_size=n,
                max_size=n,
            )
        )
    )
    if not np.any(priorities > 0):
        priorities[0] = 1.0
    buf = buffer_with_priorities(priorities, alpha, capacity)
    leaves64 = np.zeros(capacity)
    leaves64[:n] = np.where(priorities > 0, priorities**alpha, 0.0) if alpha else np.ones(n)
    total64, cum64 = leaves64.sum(), np.cumsum(leaves64)

    # sum queries: every node is the sum of the leaves below it, the root the total
    stored = np.asarray(buffers.sumtree_leaves(buf.tree), np.float64)
    np.testing.assert_allclose(stored[:capacity], leaves64, rtol=1e-6)
    assert not stored[capacity:].any()
    for level in buf.tree:
        below = stored.reshape(level.shape[0], -1).sum(axis=1)
        np.testing.assert_allclose(np.asarray(level), below, rtol=1e-5)
    np.testing.assert_allclose(float(buffers.sumtree_total(buf.tree)), total64, rtol=1e-5)

    # find: u lands on the leaf whose cumulative interval holds it (up to float32 rounding of the
    # sums)
    u = np.asarray(jax.random.uniform(jax.random.PRNGKey(n), (256,))) * total64
    found = np.asarray(jax.jit(buffers.sumtree_find)(buf.tree, jnp.asarray(u, jnp.float32)))
    slack = 1e-5 * total64
    assert np.all(leaves64[found] > 0)
    assert np.all(cum64[found] - leaves64[found] - slack <= u) and np.all(u < cum64[found] + slack)

    # sampling frequencies and importance weights
    items, idx, weights = draw_batches(buf, jax.random.split(jax.random.PRNGKey(n), 100), beta)
    idx = np.asarray(idx)
    np.testing.assert_array_equal(items["i"], idx)
    p64 = leaves64 / total64
    w = (n * p64[idx]) ** -beta
    np.testing.assert_allclose(weights, w / w.max(axis=1, keepdims=True), rtol=1e-4)
    counts = np.bincount(idx.ravel(), minlength=capacity)
    assert counts[p64 == 0].sum() == 0
    expected = p64 * counts.sum()
    big, small = expected >= 20, (expected > 0) & (expected < 20)  # pool the small expected counts
    observed, expected = counts[big], expected[big]
    if small.any():
        observed, expected = (
            np.append(observed, counts[small].sum()),
            np.append(expected, p64[small].sum() * counts.sum()),
        )
    if len(observed) >= 2:
        assert stats.chisquare(observed, expected).pvalue > 1e-4


@partial(jax.jit, static_argnums=3)
def draw_batches(buf, keys, beta, batch_size=64):
    """One stratified batch per key (vmapped): (items, indices, weights) [len(keys), batch_size]."""
    return jax.vmap(lambda key: buffers.prioritized_sample(buf, key, batch_size, beta))(keys)


def test_batched_seeds_under_vmap_equal_one_seed_at_a_time():
    """Sample, update and add vmapped over 3 buffers give the per-buffer results: the same indices
    and trees bit for bit, the same weights to float32 rounding (exp/log vectorise differently)."""
    capacity = 700
    bufs = [
        buffer_with_priorities(
            np.random.default_rng(s).gamma(0.5, size=capacity - 50) + 1e-3, 0.6, capacity
        )
        for s in range(3)
    ]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *bufs)
    keys = jax.random.split(jax.random.PRNGKey(7), 3)

    def step(buf, key):
        items, idx, weights = buffers.prioritized_sample(buf, key, 64, 0.4)
        buf = buffers.prioritized_update(buf, idx, 1.0 + (idx % 5).astype(jnp.float32), 0.6)
        buf = buffers.prioritized_add(buf, {"i": jnp.full((4,), -1, jnp.int32)})
        return buf, idx, weights

    batched = jax.jit(jax.vmap(step))(stacked, keys)
    for s in range(3):
        single = jax.jit(step)(bufs[s], keys[s])
        for got, want in zip(jax.tree.leaves(batched[:2]), jax.tree.leaves(single[:2])):
            np.testing.assert_array_equal(np.asarray(got)[s], want)
        np.testing.assert_allclose(batched[2][s], single[2], rtol=1e-6)


def test_updates_at_capacity_100k_leave_every_other_priority_intact():
    """50 sample-then-update steps (with duplicate indices) on a full 100,000-item buffer in one
    jitted scan: the written leaves hold the last write, every other leaf is bit-identical, and
    every node is still the sum of its children."""
    capacity = 100_000
    start = np.random.default_rng(0).uniform(0.01, 2.0, capacity).astype(np.float32)
    buf = buffers.prioritized_init({"i": jnp.int32(0)}, capacity)
    buf = buf._replace(size=jnp.int32(capacity), tree=buffers.sumtree_from_leaves(start))

    # the CPU fusion emitters: XLA's older ones compute p ** 1 a last bit off p
    @partial(jax.jit, compiler_options=FUSION_EMITTERS)
    def run(buf, key):
        def body(buf, key):
            k_sample, k_prio = jax.random.split(key)
            _, idx, _ = buffers.prioritized_sample(buf, k_sample, 64, 0.5)
            idx = idx.at[-8:].set(idx[:8])  # duplicates: the later entries win
            prio = jax.random.uniform(k_prio, (64,), minval=0.1, maxval=3.0)
            return buffers.prioritized_update(buf, idx, prio, 1.0), (idx, prio)

        return jax.lax.scan(body, buf, jax.random.split(key, 50))

    out, (idx, prio) = run(buf, jax.random.PRNGKey(0))
    expected = start.copy()
    for step_idx, step_prio in zip(np.asarray(idx), np.asarray(prio)):
        for i, p in zip(step_idx, step_prio):  # sequential writes: the last duplicate wins
            expected[i] = p
    np.testing.assert_array_equal(np.asarray(buffers.sumtree_leaves(out.tree))[:capacity], expected)
    assert len(np.unique(np.asarray(idx))) > 1000
    levels = [np.asarray(level, np.float64) for level in out.tree]
    for parent, children in zip(levels[:-1], levels[1:]):
        np.testing.assert_allclose(
            parent, children.reshape(parent.shape[0], -1).sum(axis=1), rtol=2e-6
        )


@pytest.mark.parametrize("platform, backend", [("cpu", "reference"), ("gpu", "triton")])
def test_the_replay_loop_copies_nothing_of_capacity_size(platform, backend):
    """The cost of PER on XLA:CPU came from copies of the whole tree inside the training loop: XLA
    copies a buffer when an in-place scatter into it may run before a read of it (here: the fused
    tree descent, re-run inside the update's fusions). Compiled like the agents' loop (phases of a
    scan of adds, then a scan of sample -> loss-like use of the weights -> update), no loop body
    copies an array of the capacity's size or more: on XLA:CPU with the plain-JAX tree, and on the
    GPU with the sum-tree kernels (descent and leaf writes), whose levels are updated in place
    (input-output aliases)."""
    if platform == "gpu" and "triton" not in kernels.available_backends():
        pytest.skip("needs a GPU with jax_triton")
    capacity = 100_000

    def add(buf, x):
        return buffers.prioritized_add(
            buf, {"obs": jnp.full((1, 4), x), "r": x[None]}, backend=backend
        ), None

    def learn(carry, key):
        buf, acc = carry
        k_sample, k_prio = jax.random.split(key)
        items, idx, weights = buffers.prioritized_sample(buf, k_sample, 64, 0.5, backend=backend)
        td = items["obs"].sum(-1) + items["r"] + jax.random.uniform(k_prio, (64,))
        buf = buffers.prioritized_update(buf, idx, jnp.abs(td) + 1e-6, 0.6, backend=backend)
        return (buf, acc + jnp.mean(weights * td**2)), None

    def phase(carry, key):
        buf, acc = carry
        buf, _ = jax.lax.scan(add, buf, acc + jnp.arange(16.0))
        return jax.lax.scan(learn, (buf, acc), jax.random.split(key, 8))[0], None

    def program(buf, key):
        return jax.lax.scan(phase, (buf, 0.0), jax.random.split(key, 4))[0]

    with jax.default_device(jax.devices(platform)[0]):
        buf = buffers.prioritized_init({"obs": jnp.zeros((4,)), "r": jnp.float32(0)}, capacity)
        hlo = jax.jit(program).lower(buf, jax.random.PRNGKey(0)).compile().as_text()
    loops = hlo[
        : hlo.index("\nENTRY")
    ]  # every computation but the entry: the loop bodies among them
    sizes = [
        np.prod([int(d) for d in dims.split(",") if d])
        for dims in re.findall(r"= \w+\[([0-9,]*)\]\{[0-9,]*\} copy\(", loops)
    ]
    assert not [s for s in sizes if s >= capacity], sizes


def test_prioritized_add_with_valid_false_changes_nothing_even_with_padded_leaves():
    """Capacity 300 has 304 leaves (19 groups of 16): an invalid add must not wake a padding
    leaf."""
    buf = buffers.prioritized_add(
        buffers.prioritized_init({"x": jnp.float32(0)}, 300), {"x": jnp.arange(5.0)}
    )
    assert buffers.sumtree_leaves(buf.tree).shape == (304,)
    same = jax.jit(buffers.prioritized_add)(buf, {"x": jnp.arange(3.0)}, jnp.bool_(False))
    for a, b in zip(jax.tree.leaves(buf), jax.tree.leaves(same)):
        np.testing.assert_array_equal(a, b)


def test_sampling_an_empty_prioritized_buffer_gives_row_0_and_weights_1():
    buffer = buffers.prioritized_init({"x": jnp.zeros(3)}, 300)
    _, indices, weights = buffers.prioritized_sample(buffer, jax.random.PRNGKey(0), 4, 0.4)
    np.testing.assert_array_equal(indices, 0)
    np.testing.assert_array_equal(weights, 1.0)
    with pytest.raises(ValueError, match="capacity 3 is less than the 5 leaves"):
        buffers.sumtree_from_leaves(jnp.ones(5), 3)


# ---------------------------------------------------------------- packed storage


def test_storage_packs_32_bit_and_small_leaves_into_one_block_and_large_narrow_leaves_apart():
    item = {
        "obs": jnp.zeros((10, 10, 4), jnp.bool_),  # 400 bools: a block of their own
        "action": jnp.int32(0),
        "reward": jnp.float32(0),
        "terminated": jnp.bool_(False),  # small: joins the uint32 block
        "next_obs": jnp.zeros((10, 10, 4), jnp.bool_),
        "extra": jnp.zeros((3,), jnp.int8),  # small
        "big_u8": jnp.zeros((17,), jnp.uint8),  # past SMALL_LEAF: its own block
    }
    layout = packing.storage_layout(
        item
    )  # blocks in order of first use, leaves in pytree order (sorted keys)
    assert layout.block_dtypes == ("uint32", "uint8", "bool")
    assert layout.block_widths == (1 + 3 + 1 + 1, 17, 800)
    buf = buffers.uniform_init(item, 7)
    assert [b.shape for b in buf.storage] == [(7, 6), (7, 17), (7, 800)]
    cartpole = {
        "obs": jnp.zeros(4),
        "action": jnp.int32(0),
        "reward": jnp.float32(0),
        "next_obs": jnp.zeros(4),
        "terminated": jnp.bool_(False),
    }
    assert packing.storage_layout(cartpole).block_dtypes == (
        "uint32",
    )  # a DQN transition: one scatter per add


_DTYPES = [
    "float32",
    "int32",
    "uint32",
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "float16",
    "bfloat16",
]


def _bits(a):
    """The raw bits of an array (bools as they are)."""
    a = np.asarray(a)
    return (
        a
        if a.dtype == np.bool_
        else a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])
    )


# 20 examples: each one is a new pytree, so two compiles (~0.5 s of one core each)
@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(1, 6), max_size=2)),
        min_size=1,
        max_size=5,
    ),
    st.integers(0, 2**32 - 1),
)
def test_stored_items_come_back_bit_for_bit(leaves, seed):
    """Any mix of dtypes and shapes, with random bit patterns (so float NaN payloads, infinities,
    subnormals, signed zeros and the extremes of every int type), written to a buffer by one jitted
    add and read back by another jitted call: every leaf returns bit for bit. Both compile with
    XLA's CPU fusion emitters (`FUSION_EMITTERS`), as runs do: the older emitters this suite
    otherwise uses (tests/conftest.py) move a bfloat16 array (a slice, a concatenation, an update
    slice: a wide leaf's own block) through float32 and canonicalise its NaNs (0x7F8C, a
    signalling NaN, comes back 0x7FC0), so a draw holding such a NaN failed by chance."""
    rng = np.random.default_rng(seed)
    items = {}
    for i, (dtype, shape) in enumerate(leaves):
        shape = (3,) + tuple(shape)
        if dtype == "bool":
            x = rng.integers(0, 2, shape).astype(bool)
        else:
            width = np.dtype(jnp.dtype(dtype)).itemsize
            raw = rng.integers(0, 2 ** (8 * width), shape, dtype=np.uint64).astype(
                {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
            )
            x = raw.view(jnp.dtype(dtype))
        items[f"leaf{i}"] = jnp.asarray(x)
    buf = buffers.uniform_init(jax.tree.map(lambda x: x[0], items), 5)
    buf = jax.jit(buffers.uniform_add, compiler_options=FUSION_EMITTERS)(buf, items)
    read = jax.jit(
        lambda b: jax.tree.map(lambda x: x[:3], b.data), compiler_options=FUSION_EMITTERS
    )
    back = read(buf)
    for name, x in items.items():
        assert back[name].dtype == x.dtype and back[name].shape == x.shape
        np.testing.assert_array_equal(_bits(back[name]), _bits(x))


@pytest.mark.parametrize("size", [2, 40], ids=["narrow", "wide"])  # the uint32 block, its own
def test_float_nan_payloads_come_back_bit_for_bit(size):
    """Signalling and quiet NaNs with payloads, of either sign, in half-width floats: stored and
    read back as their bits (compiled as test_stored_items_come_back_bit_for_bit says)."""
    patterns = {
        "bfloat16": [0x7F8C, 0x7FC1, 0xFF81, 0x7F81, 0x7F80],
        "float16": [0x7C01, 0x7D00, 0xFE01, 0x7E00, 0x7C00],
    }
    items = {
        name: jnp.asarray(np.repeat(np.array(bits, np.uint16)[:, None], size, 1).view(name))
        for name, bits in patterns.items()
    }
    buf = buffers.uniform_init(jax.tree.map(lambda x: x[0], items), 8)
    buf = jax.jit(buffers.uniform_add, compiler_options=FUSION_EMITTERS)(buf, items)
    read = jax.jit(
        lambda b: jax.tree.map(lambda x: x[:5], b.data), compiler_options=FUSION_EMITTERS
    )
    back = read(buf)
    for name, x in items.items():
        np.testing.assert_array_equal(_bits(back[name]), _bits(x))


def test_zero_size_leaves_and_empty_adds_are_stored_as_nothing():
    item = {"empty": jnp.zeros((0,), jnp.float32), "image": jnp.zeros((20,), jnp.uint8)}
    layout = packing.storage_layout(item)
    assert layout.block_dtypes == ("uint32", "uint8") and layout.block_widths == (0, 20)
    buf = buffers.uniform_init(item, 4)
    buf = buffers.uniform_add(
        buf, {"empty": jnp.zeros((2, 0)), "image": jnp.ones((2, 20), jnp.uint8)}
    )
    buf = buffers.uniform_add(
        buf, {"empty": jnp.zeros((0, 0)), "image": jnp.zeros((0, 20), jnp.uint8)}
    )
    assert (
        int(buf.size) == 2
        and buf.data["empty"].dtype == jnp.float32
        and buf.data["empty"].shape == (4, 0)
    )
    np.testing.assert_array_equal(buf.data["image"][:2], 1)


def test_an_add_is_one_scatter_per_block_and_a_sample_one_gather_per_block():
    item = {
        "obs": jnp.zeros(4),
        "action": jnp.int32(0),
        "reward": jnp.float32(0),
        "next_obs": jnp.zeros(4),
        "terminated": jnp.bool_(False),
    }
    buf = buffers.uniform_init(item, 100)
    batch = jax.tree.map(lambda x: jnp.zeros((10,) + x.shape, x.dtype), item)
    add = str(jax.make_jaxpr(buffers.uniform_add)(buf, batch))
    sample = str(
        jax.make_jaxpr(lambda b, k: buffers.uniform_sample(b, k, 32))(buf, jax.random.PRNGKey(0))
    )
    assert len(re.findall(r"= scatter\[", add)) == 1, add
    assert len(re.findall(r"= gather\[", sample)) == 1, sample
