"""kernels.sumtree_set_leaves: leaf writes (last duplicate wins, out-of-range ignored) and the
ancestors recomputed; kernels.sumtree_find_leaves: the descent to the leaf a target mass falls in.
Both against the plain-JAX reference and float64 NumPy built from scratch (a tree; running sums of
the leaves)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import sumtree_find_leaves, sumtree_set_leaves
from kernels.sumtree import sumtree_find_leaves_reference, sumtree_set_leaves_reference
from rl.replay.buffers import sumtree_from_leaves


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
            written[b] = i not in list(indices[b + 1 :])
    return leaves, written


def assert_tree_equal(got, want):
    assert len(got) == len(want)
    for level, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(
            np.asarray(g, np.float64), np.asarray(w, np.float64), err_msg=f"level {level}"
        )


# The property tests call the ops through one jitted program per example (an example's shapes are
# new, so an eager call would compile each of the op's operations on its own: about 3x the CPU
# time); the other tests call them eagerly.
set_leaves_jit = jax.jit(sumtree_set_leaves, static_argnames=("distinct", "backend"))
find_leaves_jit = jax.jit(sumtree_find_leaves, static_argnames=("backend",))


# integer-valued leaves and values: every sum is exact in float32, so all backends agree bit for bit
@settings(max_examples=12, deadline=None)
@given(
    capacity=st.sampled_from([1, 7, 256, 300, 5000, 70000]),
    batch=st.integers(1, 150),
    duplicates=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_an_independent_float64_tree(backend, capacity, batch, duplicates, seed):
    rng = np.random.default_rng(seed)
    tree = sumtree_from_leaves(jnp.asarray(rng.integers(0, 8, capacity), jnp.float32), capacity)
    n = tree[-1].shape[0]
    indices = rng.integers(-2, n + 2, batch)
    if duplicates and batch > 2:
        indices[rng.integers(0, batch, batch // 2)] = indices[0]
    values = rng.integers(1, 20, batch).astype(np.float32)
    got, written = set_leaves_jit(
        tree, jnp.asarray(indices, jnp.int32), jnp.asarray(values), backend=backend
    )
    leaves, want_written = numpy_set(np.asarray(tree[-1]), indices, values)
    assert_tree_equal(got, numpy_tree(leaves, [level.shape[0] for level in tree]))
    np.testing.assert_array_equal(np.asarray(written), want_written)


def test_distinct_writes_skip_the_duplicate_search(backend):
    rng = np.random.default_rng(1)
    tree = sumtree_from_leaves(jnp.asarray(rng.integers(0, 8, 5000), jnp.float32), 5000)
    indices = jnp.asarray(
        rng.permutation(5000)[:64].tolist() + [5120, -1], jnp.int32
    )  # the last two: out of range
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
    want = numpy_tree(
        numpy_set(np.asarray(tree[-1]), np.asarray(indices), np.asarray(values))[0],
        [x.shape[0] for x in tree],
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=2e-5, atol=1e-6)


def test_nested_vmap_under_jit_equals_a_loop(kernel_backend):
    rng = np.random.default_rng(3)
    trees = [
        sumtree_from_leaves(jnp.asarray(rng.integers(0, 8, 5000), jnp.float32), 5000)
        for _ in range(6)
    ]
    stacked = jax.tree.map(lambda *x: jnp.stack(x).reshape((2, 3) + x[0].shape), *trees)
    indices = jnp.asarray(rng.integers(0, 5000, (2, 3, 40)), jnp.int32)
    values = jnp.asarray(rng.integers(1, 9, (2, 3, 40)), jnp.float32)
    f = lambda t, i, v: sumtree_set_leaves(t, i, v, backend=kernel_backend)
    got, written = jax.jit(jax.vmap(jax.vmap(f)))(stacked, indices, values)
    for a in range(2):
        for b in range(3):
            want, want_written = sumtree_set_leaves_reference(
                trees[3 * a + b], indices[a, b], values[a, b]
            )
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


# ---------------------------------------------------------------- the descent


def numpy_find(leaves: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The leaf i with cumsum_{<i} <= u < cumsum_{<=i} (float64 running sums of the leaves); a
    target at or past the total goes to the last leaf of positive mass (the last leaf if none has
    mass)."""
    cum = np.cumsum(np.asarray(leaves, np.float64))
    found = np.searchsorted(cum, np.asarray(targets, np.float64), side="right")
    positive = np.flatnonzero(leaves > 0)
    last = positive[-1] if positive.size else len(leaves) - 1
    return np.minimum(found, last)


@settings(max_examples=12, deadline=None)
@given(
    capacity=st.sampled_from([1, 7, 256, 300, 5000, 70000]),
    batch=st.integers(1, 150),
    zeros=st.floats(0.0, 0.9),
    seed=st.integers(0, 2**31 - 1),
)
def test_descent_matches_float64_running_sums(backend, capacity, batch, zeros, seed):
    """Integer masses (exact sums) with runs of empty leaves; targets spread over [0, total], some
    exactly on a boundary, one at the total: the leaf and its mass as NumPy's searchsorted."""
    rng = np.random.default_rng(seed)
    leaves = rng.integers(1, 8, capacity) * (rng.random(capacity) >= zeros)
    tree = sumtree_from_leaves(jnp.asarray(leaves, jnp.float32), capacity)
    padded = np.asarray(tree[-1], np.float64)
    total = padded.sum()
    targets = rng.random(batch) * total
    targets[: batch // 3] = np.cumsum(padded)[
        rng.integers(0, len(padded), batch // 3)
    ]  # exactly on a boundary
    targets[-1] = total
    targets = np.minimum(targets.astype(np.float32), np.float32(total))
    found, mass = find_leaves_jit(tree, jnp.asarray(targets), backend=backend)
    want = numpy_find(padded, targets)
    np.testing.assert_array_equal(np.asarray(found), want)
    np.testing.assert_array_equal(np.asarray(mass, np.float64), padded[want])
    if total > 0:
        assert (np.asarray(mass) > 0).all()


def test_descent_with_float_masses_lands_within_rounding_of_the_float64_brackets(backend):
    """Float masses: the float32 running sums differ from float64 ones (and between backends, whose
    sums run in other orders) by rounding, so a target within that distance of a boundary may land
    on either side of it. Every target lies within 1e-6 of the total of its leaf's float64 bracket,
    every leaf found has positive mass and is reported with its own value."""
    rng = np.random.default_rng(4)
    tree = sumtree_from_leaves(jnp.asarray(rng.random(100000) ** 4, jnp.float32), 100000)
    leaves = np.asarray(tree[-1], np.float64)
    cum = np.cumsum(leaves)
    targets = jnp.asarray(rng.random(512), jnp.float32) * tree[0][0]
    found, mass = sumtree_find_leaves(tree, targets, backend=backend)
    found, u = np.asarray(found), np.asarray(targets, np.float64)
    slack = 1e-6 * cum[-1]  # about 16 float32 ulps of the total
    assert (cum[found] - leaves[found] <= u + slack).all() and (u < cum[found] + slack).all()
    assert (leaves[found] > 0).all()
    np.testing.assert_array_equal(np.asarray(mass), np.asarray(tree[-1])[found])
    exact = numpy_find(leaves, u)
    assert (found == exact).mean() > 0.95  # only targets next to a boundary may differ


def test_descent_of_an_empty_tree_and_of_any_target_shape(backend):
    empty = sumtree_from_leaves(jnp.zeros((300,), jnp.float32))
    found, mass = sumtree_find_leaves(empty, jnp.zeros((5,), jnp.float32), backend=backend)
    np.testing.assert_array_equal(np.asarray(found), 303)  # the last of the 304 leaves
    np.testing.assert_array_equal(np.asarray(mass), 0.0)
    tree = sumtree_from_leaves(jnp.arange(1.0, 301.0))
    targets = jnp.asarray([[0.0, 1.0, 2.5], [3.0, 44.0, 45.0]], jnp.float32)
    found, mass = sumtree_find_leaves(tree, targets, backend=backend)
    assert (
        found.shape == mass.shape == (2, 3)
        and found.dtype == jnp.int32
        and mass.dtype == jnp.float32
    )
    np.testing.assert_array_equal(np.asarray(found), [[0, 1, 1], [2, 8, 9]])
    scalar, _ = sumtree_find_leaves(tree, jnp.float32(3.0), backend=backend)
    assert scalar.shape == () and int(scalar) == 2
    none, _ = sumtree_find_leaves(tree, jnp.zeros((0,), jnp.float32), backend=backend)
    assert none.shape == (0,)


def test_descent_under_nested_vmap_and_jit_equals_a_loop(kernel_backend):
    rng = np.random.default_rng(5)
    trees = [
        sumtree_from_leaves(jnp.asarray(rng.integers(0, 8, 5000), jnp.float32), 5000)
        for _ in range(6)
    ]
    stacked = jax.tree.map(lambda *x: jnp.stack(x).reshape((2, 3) + x[0].shape), *trees)
    targets = jnp.asarray(rng.random((2, 3, 70)), jnp.float32) * stacked[0][..., :1]
    f = lambda t, u: sumtree_find_leaves(t, u, backend=kernel_backend)
    found, mass = jax.jit(jax.vmap(jax.vmap(f)))(stacked, targets)
    shared = jax.jit(jax.vmap(lambda u: f(trees[0], u)))(targets[0])  # an unbatched tree
    for a in range(2):
        for b in range(3):
            want, want_mass = sumtree_find_leaves_reference(trees[3 * a + b], targets[a, b])
            np.testing.assert_array_equal(np.asarray(found[a, b]), np.asarray(want))
            np.testing.assert_array_equal(np.asarray(mass[a, b]), np.asarray(want_mass))
    for b in range(3):
        want, want_mass = sumtree_find_leaves_reference(trees[0], targets[0, b])
        np.testing.assert_array_equal(np.asarray(shared[0][b]), np.asarray(want))
        np.testing.assert_array_equal(np.asarray(shared[1][b]), np.asarray(want_mass))


@pytest.mark.parametrize(
    "sizes", [(1, 5, 20, 20), (1, 5, 5, 80), (1, 7, 7, 28, 28), (1, 1, 16), (1, 3, 3, 3, 3)]
)
def test_descent_through_levels_of_one_child(backend, sizes):
    """Fan-out 1 (a level as wide as the one above), alone or between wider ones; integer masses."""
    rng = np.random.default_rng(6)
    leaves = rng.integers(0, 5, sizes[-1]).astype(np.float64)
    levels = [jnp.asarray(level, jnp.float32) for level in numpy_tree(leaves, sizes)]
    total = leaves.sum()
    targets = np.minimum(np.concatenate([rng.random(200) * total, [0.0, total]]), total).astype(
        np.float32
    )
    found, mass = sumtree_find_leaves(tuple(levels), jnp.asarray(targets), backend=backend)
    want = numpy_find(leaves, targets)
    np.testing.assert_array_equal(np.asarray(found), want)
    np.testing.assert_array_equal(np.asarray(mass, np.float64), leaves[want])


def test_descent_takes_lists_and_integer_targets_and_returns_float32():
    tree = sumtree_from_leaves(jnp.arange(1.0, 301.0))
    found, mass = sumtree_find_leaves(tree, [0.5, 2.5], backend="reference")
    assert found.tolist() == [0, 1] and mass.dtype == jnp.float32
    found, _ = sumtree_find_leaves(tree, jnp.array([1, 3]), backend="reference")
    assert found.tolist() == [1, 2]
    half = tuple(level.astype(jnp.bfloat16) for level in sumtree_from_leaves(jnp.ones((4,))))
    assert sumtree_find_leaves(half, jnp.array([1.5]), backend="reference")[1].dtype == jnp.float32


def test_descent_bad_inputs_name_the_problem():
    tree = sumtree_from_leaves(jnp.ones((300,), jnp.float32))
    with pytest.raises(ValueError, match="real numbers"):
        sumtree_find_leaves(tree, jnp.zeros((4,), jnp.complex64), backend="reference")
    with pytest.raises(ValueError, match="root of shape"):
        sumtree_find_leaves((tree[1], tree[2]), jnp.zeros((4,)), backend="reference")
    with pytest.raises(ValueError, match="must not be empty"):
        sumtree_find_leaves(
            (jnp.zeros((1,)), jnp.zeros((0,))), jnp.zeros((4,)), backend="reference"
        )
    with pytest.raises(ValueError, match="must not be empty"):
        sumtree_set_leaves(
            (jnp.zeros((1,)), jnp.zeros((4,)), jnp.zeros((0,))),
            jnp.zeros((1,), jnp.int32),
            jnp.ones((1,)),
            backend="reference",
        )


def test_descent_over_more_trees_than_one_grid_axis_holds(kernel_backend):
    """70,000 vmapped trees: more than a CUDA grid's y or z axis takes (65,535),
    so trees go on x."""
    if kernel_backend != "triton":
        pytest.skip("70,000 programs: a GPU check (the interpreter runs programs one at a time)")
    leaves = jnp.asarray(np.random.default_rng(7).integers(0, 5, (70_000, 16)), jnp.float32)
    trees = jax.vmap(sumtree_from_leaves)(leaves)
    targets = jnp.full((70_000, 2), 0.5) * trees[0]
    found, mass = jax.jit(jax.vmap(lambda t, u: sumtree_find_leaves(t, u, backend=kernel_backend)))(
        trees, targets
    )
    want, want_mass = jax.vmap(sumtree_find_leaves_reference)(trees, targets)
    np.testing.assert_array_equal(np.asarray(found), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(mass), np.asarray(want_mass))


def test_descent_refuses_more_targets_per_tree_than_its_grid_takes(kernel_backend):
    tree = sumtree_from_leaves(jnp.ones((300,), jnp.float32))
    too_many = jax.ShapeDtypeStruct(
        (65535 * 64 + 1,), jnp.float32
    )  # traced only: nothing is allocated
    with pytest.raises(ValueError, match="targets per tree"):
        jax.eval_shape(lambda u: sumtree_find_leaves(tree, u, backend=kernel_backend), too_many)
