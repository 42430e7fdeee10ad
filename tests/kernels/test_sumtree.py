"""kernels.sumtree_set_leaves: leaf writes (last duplicate wins, out-of-range ignored) and the ancestors
recomputed, against the plain-JAX reference and a float64 NumPy tree built from scratch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import sumtree_set_leaves
from kernels.sumtree import sumtree_set_leaves_reference
from rl.buffers import sumtree_from_leaves


def numpy_tree(leaves: np.ndarray, sizes) -> list[np.ndarray]:
    """Float64 levels, root first, each node the sum of its children (built independently)."""
    levels = [np.asarray(leaves, np.float64)]
    for parent in sizes[-2::-1]:
        levels.append(levels[-1].reshape(parent, -1).sum(axis=1))
    return levels[::-1]


def numpy_set(leaves: np.ndarray, indices, values) -> tuple[np.ndarray, np.ndarray]:
    """The leaves after the writes in batch order (so the last duplicate wins), and which entries
    were the written ones (in range, no later entry with the same index)."""
    leaves = np.array(leaves, np.float64)
    written = np.zeros(len(indices), bool)
    for b, (i, v) in enumerate(zip(indices, values)):
        if 0 <= i < len(leaves):
            leaves[i] = v
            written[b] = i not in list(indices[b + 1:])
    return leaves, written


def assert_tree_equal(got, want):
    assert len(got) == len(want)
    for level, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(np.asarray(g, np.float64), np.asarray(w, np.float64), err_msg=f"level {level}")


# integer-valued leaves and values: every sum is exact in float32, so all backends agree bit for bit
@settings(max_examples=12, deadline=None)
@given(capacity=st.sampled_from([1, 7, 256, 300, 5000, 70000]), batch=st.integers(1, 150),
       duplicates=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_matches_an_independent_float64_tree(backend, capacity, batch, duplicates, seed):
    rng = np.random.default_rng(seed)
    tree = sumtree_from_leaves(jnp.asarray(rng.integers(0, 8, capacity), jnp.float32), capacity)
    n = tree[-1].shape[0]
    indices = rng.integers(-2, n + 2, batch)
    if duplicates and batch > 2:
        indices[rng.integers(0, batch, batch // 2)] = indices[0]
    values = rng.integers(1, 20, batch).astype(np.float32)
    got, written = sumtree_set_leaves(tree, jnp.asarray(indices, jnp.int32), jnp.asarray(values), backend=backend)
    leaves, want_written = numpy_set(np.asarray(tree[-1]), indices, values)
    assert_tree_equal(got, numpy_tree(leaves, [level.shape[0] for level in tree]))
    np.testing.assert_array_equal(np.asarray(written), want_written)


def test_distinct_writes_skip_the_duplicate_search(backend):
    rng = np.random.default_rng(1)
    tree = sumtree_from_leaves(jnp.asarray(rng.integers(0, 8, 5000), jnp.float32), 5000)
    indices = jnp.asarray(rng.permutation(5000)[:64].tolist() + [5120, -1], jnp.int32)  # the last two: out of range
    values = jnp.asarray(rng.integers(1, 20, 66), jnp.float32)
    got, written = sumtree_set_leaves(tree, indices, values, distinct=True, backend=backend)
    want, want_written = sumtree_set_leaves_reference(tree, indices, values)
    assert_tree_equal(got, want)
    np.testing.assert_array_equal(np.asarray(written), np.asarray(want_written))
    assert not bool(written[-1]) and not bool(written[-2]) and bool(written[:-2].all())


def test_float_sums_match_the_reference_to_rounding(backend):
    rng = np.random.default_rng(2)
    tree = sumtree_from_leaves(jnp.asarray(rng.random(100000), jnp.float32), 100000)
    indices = jnp.asarray(rng.integers(0, 100000, 128), jnp.int32)
    values = jnp.asarray(rng.random(128) * 3, jnp.float32)
    got, _ = sumtree_set_leaves(tree, indices, values, backend=backend)
    want = numpy_tree(numpy_set(np.asarray(tree[-1]), np.asarray(indices), np.asarray(values))[0], [x.shape[0] for x in tree])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=2e-5, atol=1e-6)


def test_nested_vmap_under_jit_equals_a_loop(kernel_backend):
    rng = np.random.default_rng(3)
    trees = [sumtree_from_leaves(jnp.asarray(rng.integers(0, 8, 5000), jnp.float32), 5000) for _ in range(6)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x).reshape((2, 3) + x[0].shape), *trees)
    indices = jnp.asarray(rng.integers(0, 5000, (2, 3, 40)), jnp.int32)
    values = jnp.asarray(rng.integers(1, 9, (2, 3, 40)), jnp.float32)
    f = lambda t, i, v: sumtree_set_leaves(t, i, v, backend=kernel_backend)
    got, written = jax.jit(jax.vmap(jax.vmap(f)))(stacked, indices, values)
    for a in range(2):
        for b in range(3):
            want, want_written = sumtree_set_leaves_reference(trees[3 * a + b], indices[a, b], values[a, b])
            assert_tree_equal([level[a, b] for level in got], want)
            np.testing.assert_array_equal(np.asarray(written[a, b]), np.asarray(want_written))


def test_bad_inputs_name_the_problem():
    tree = sumtree_from_leaves(jnp.ones((300,), jnp.float32))
    i, v = jnp.zeros((4,), jnp.int32), jnp.ones((4,), jnp.float32)
    with pytest.raises(ValueError, match="root of shape"):
        sumtree_set_leaves((tree[1], tree[2]), i, v, backend="reference")
    with pytest.raises(ValueError, match="multiple of the one above"):
        sumtree_set_leaves((tree[0], jnp.ones((19,)), jnp.ones((300,))), i, v, backend="reference")
    with pytest.raises(ValueError, match="same non-zero length"):
        sumtree_set_leaves(tree, i, v[:3], backend="reference")
    with pytest.raises(ValueError, match="same non-zero length"):
        sumtree_set_leaves(tree, i[:0], v[:0], backend="reference")
    with pytest.raises(ValueError, match="integers"):
        sumtree_set_leaves(tree, v, v, backend="reference")
    with pytest.raises(ValueError, match="power of 2"):
        sumtree_set_leaves((tree[0], jnp.ones((4,)), jnp.ones((12,))), i, v, backend="reference")
