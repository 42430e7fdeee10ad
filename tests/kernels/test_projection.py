"""categorical_projection on every backend vs a float64 NumPy bracket split, hand cases, grads."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import categorical_projection
from kernels.projection import ProjectionConfig, categorical_projection_reference

# one kernel launch in a jaxpr: an equation of either primitive
LAUNCH = re.compile(r"= (?:pure_callback|triton_kernel_call)\[")


def numpy_projection(atoms, probs, support):
    """float64: clip each atom to the support's range, find its bracket [s_l, s_l+1] with
    searchsorted, and split its mass linearly between the two ends (np.add.at)."""
    s = np.asarray(support, np.float64)
    k = s.shape[0]
    z = np.clip(np.asarray(atoms, np.float64), s[0], s[-1])
    p = np.asarray(probs, np.float64)
    batch, k_src = z.shape[:-1], z.shape[-1]
    z, p = z.reshape(-1, k_src), p.reshape(-1, k_src)
    lo = np.clip(np.searchsorted(s, z, side="right") - 1, 0, k - 2)
    w = (z - s[lo]) / (s[lo + 1] - s[lo])
    out = np.zeros((z.shape[0], k))
    rows = np.broadcast_to(np.arange(z.shape[0])[:, None], z.shape)
    np.add.at(out, (rows, lo), p * (1 - w))
    np.add.at(out, (rows, lo + 1), p * w)
    return out.reshape(*batch, k)


def numpy_projection_vjp(atoms, probs, support, g):
    """float64 (d atoms, d probs) for a cotangent g of the projection (atoms off the kinks)."""
    s = np.asarray(support, np.float64)
    raw = np.asarray(atoms, np.float64)
    z = np.clip(raw, s[0], s[-1])
    lo = np.clip(np.searchsorted(s, z, side="right") - 1, 0, len(s) - 2)
    gap = s[lo + 1] - s[lo]
    w = (z - s[lo]) / gap
    g = np.asarray(g, np.float64)
    g_lo = np.take_along_axis(g, lo, axis=-1)
    g_hi = np.take_along_axis(g, lo + 1, axis=-1)
    inside = (raw > s[0]) & (raw < s[-1])
    d_atoms = np.where(inside, np.asarray(probs, np.float64) * (g_hi - g_lo) / gap, 0.0)
    return d_atoms, g_lo * (1 - w) + g_hi * w


def assert_close(actual, expected, rtol=1e-5, atol=2e-6):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def make_support(rng, k, even):
    if even:
        return np.linspace(-10.0, 10.0, k).astype(np.float32)
    return (np.cumsum(rng.uniform(0.2, 2.0, size=k)) - 5.0).astype(np.float32)


def random_distribution(rng, batch, k_src, spread):
    atoms = (spread * rng.normal(size=(*batch, k_src))).astype(np.float32)
    logits = rng.normal(size=(*batch, k_src))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return atoms, probs.astype(np.float32)


# The property test calls the op through one jitted program per example (an example's shapes are
# new, so an eager call would compile each of the op's operations on its own); the other tests
# call it eagerly.
categorical_projection_jit = jax.jit(categorical_projection, static_argnames=("backend",))


@settings(max_examples=20, deadline=None)
@given(
    batch=st.sampled_from([(), (1,), (3,), (7,), (2, 3)]),
    k_src=st.sampled_from([1, 2, 5, 11, 51]),
    k=st.sampled_from([2, 3, 4, 11, 51, 64, 65]),
    even=st.booleans(),
    spread=st.sampled_from([1.0, 6.0, 30.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_float64_numpy(backend, batch, k_src, k, even, spread, seed):
    rng = np.random.default_rng(seed)
    support = make_support(rng, k, even)
    atoms, probs = random_distribution(rng, batch, k_src, spread)
    out = categorical_projection_jit(atoms, probs, support, backend=backend)
    assert out.shape == (*batch, k) and out.dtype == jnp.float32
    assert_close(out, numpy_projection(atoms, probs, support), atol=1e-5)
    assert_close(out.sum(-1), probs.astype(np.float64).sum(-1), atol=1e-5)  # mass is conserved


TILINGS = [
    ProjectionConfig(1, 4, 4, method="dense"),
    ProjectionConfig(4, 8, 2, method="dense"),
    ProjectionConfig(2, 64, 4, method="dense"),
    ProjectionConfig(method="scatter", block=16, num_warps=1),  # programs end mid-row
    ProjectionConfig(method="scatter", block=128, num_warps=4),
]


@pytest.mark.parametrize("config", TILINGS, ids=str)
@pytest.mark.parametrize("even", [True, False])
def test_tilings(kernel_backend, config, even):
    """Dense: source atoms in several chunks, partial row tiles. Scatter (atomic adds): programs
    that start and end inside a row. Both: interpolated and searched brackets."""
    rng = np.random.default_rng(8)
    support = make_support(rng, 13, even)
    atoms, probs = random_distribution(rng, (5,), 21, 8.0)
    out = categorical_projection(atoms, probs, support, backend=kernel_backend, config=config)
    assert_close(out, numpy_projection(atoms, probs, support), atol=1e-6)


@pytest.mark.parametrize("method", ["scatter", "dense"])
@pytest.mark.parametrize("even", [True, False])
def test_many_atoms_into_one_target(kernel_backend, method, even):
    """Atoms clipped onto the ends and atoms sharing a bracket: many adds meet at one address."""
    rng = np.random.default_rng(3)
    support = make_support(rng, 7, even)
    atoms = np.concatenate(
        [
            np.full((6, 20), 1e3, np.float32),
            np.full((6, 20), -1e3, np.float32),
            (support[2] + 0.3 * (support[3] - support[2]) + rng.uniform(0, 1e-3, (6, 20))).astype(
                np.float32
            ),
        ],
        axis=1,
    )
    probs = rng.uniform(0.0, 1.0, atoms.shape).astype(np.float32)
    config = ProjectionConfig(method=method, block=32)
    out = categorical_projection(atoms, probs, support, backend=kernel_backend, config=config)
    assert_close(out, numpy_projection(atoms, probs, support), atol=1e-5)


def test_bad_config_raises():
    with pytest.raises(ValueError, match="method"):
        ProjectionConfig(method="sparse")
    with pytest.raises(ValueError, match="power of two"):
        ProjectionConfig(block=100)


def test_atoms_on_support_points_keep_their_mass(backend):
    support = np.array([-2.0, -1.0, 0.5, 3.0], np.float32)  # not evenly spaced
    atoms = support[None, [3, 0, 2, 1]]
    probs = np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)
    out = categorical_projection(atoms, probs, support, backend=backend)
    assert_close(out, [[0.2, 0.4, 0.3, 0.1]], atol=1e-7)


def test_atoms_outside_the_range_go_to_the_ends(backend):
    support = np.linspace(0.0, 4.0, 5).astype(np.float32)
    atoms = np.array([[-7.0, -0.0001, 4.5, 100.0]], np.float32)
    probs = np.array([[0.25, 0.25, 0.3, 0.2]], np.float32)
    out = categorical_projection(atoms, probs, support, backend=backend)
    assert_close(out, [[0.5, 0.0, 0.0, 0.0, 0.5]], atol=1e-7)


def test_non_even_support_split_by_hand(backend):
    support = np.array([0.0, 1.0, 4.0], np.float32)
    # 2.5 lies in [1, 4]: 1/2 of its mass to 1 and 1/2 to 4; 0.25 in [0, 1]: 3/4 to 0, 1/4 to 1
    atoms = np.array([[2.5, 0.25]], np.float32)
    probs = np.array([[0.8, 0.2]], np.float32)
    out = categorical_projection(atoms, probs, support, backend=backend)
    assert_close(out, [[0.15, 0.4 + 0.05, 0.4]], atol=1e-7)


def test_c51_bellman_target(backend):
    """r + gamma * z projected back onto z: the C51 target, against NumPy and the reference."""
    rng = np.random.default_rng(7)
    support = np.linspace(-10.0, 10.0, 51).astype(np.float32)
    rewards = rng.normal(size=(3, 1)).astype(np.float32) * 3
    discounts = (0.99 * (rng.uniform(size=(3, 1)) > 0.3)).astype(np.float32)
    atoms = rewards + discounts * support
    _, probs = random_distribution(rng, (3,), 51, 1.0)
    out = categorical_projection(atoms, probs, support, backend=backend)
    assert_close(out, numpy_projection(atoms, probs, support), atol=1e-6)
    reference = categorical_projection_reference(
        jnp.asarray(atoms), jnp.asarray(probs), jnp.asarray(support)
    )
    assert_close(out, np.asarray(reference, np.float64), atol=1e-6)


def test_jit_nested_vmap_and_a_vmapped_support(backend):
    rng = np.random.default_rng(1)
    support = make_support(rng, 9, even=False)
    atoms, probs = random_distribution(rng, (3, 4, 2), 7, 5.0)
    f = jax.jit(
        jax.vmap(jax.vmap(lambda a, p: categorical_projection(a, p, support, backend=backend)))
    )
    assert_close(f(atoms, probs), numpy_projection(atoms, probs, support), atol=1e-6)
    # one support per vmapped setting (e.g. a sweep over v_max), shared atoms
    supports = np.stack([support * scale for scale in (0.5, 1.0, 2.0)])
    g = jax.vmap(lambda s: categorical_projection(atoms[0], probs[0], s, backend=backend))
    out = g(supports)
    for i, s in enumerate(supports):
        assert_close(out[i], numpy_projection(atoms[0], probs[0], s), atol=1e-6)


def test_one_launch_under_nested_vmap(kernel_backend):
    a = jnp.zeros((3, 4, 5, 7))
    s = jnp.linspace(0.0, 1.0, 11)
    f = jax.vmap(jax.vmap(lambda a, p: categorical_projection(a, p, s, backend=kernel_backend)))
    text = str(jax.make_jaxpr(f)(a, a))
    assert len(LAUNCH.findall(text)) == 1


def test_inside_lax_scan_with_traced_support(backend):
    rng = np.random.default_rng(2)
    support = make_support(rng, 11, even=True)
    atoms, probs = random_distribution(rng, (5, 3), 11, 8.0)

    def run(traced_support, atoms, probs):
        def step(total, ap):
            out = categorical_projection(ap[0], ap[1], traced_support, backend=backend)
            return total + out, out

        return jax.lax.scan(step, jnp.zeros((3, 11)), (atoms, probs))

    total, outs = jax.jit(run)(support, atoms, probs)
    expected = numpy_projection(atoms, probs, support)
    assert_close(outs, expected, atol=1e-6)
    assert_close(total, expected.sum(0), atol=1e-5)


@pytest.mark.parametrize(
    "batch,k_src,k,even", [((6,), 7, 9, True), ((2, 3), 51, 51, True), ((5,), 4, 6, False)]
)
def test_gradients_match_the_hand_derived_float64_vjp(backend, batch, k_src, k, even):
    """The gradients with respect to atoms and probabilities against the float64 NumPy VJP
    `numpy_projection_vjp` (an oracle independent of the op and of JAX), and, for a kernel
    backend, against autodiff of the reference."""
    rng = np.random.default_rng(3)
    support = make_support(rng, k, even)
    atoms, probs = random_distribution(rng, batch, k_src, 6.0)
    w = rng.normal(size=(*batch, k)).astype(np.float32)

    def loss(op):
        return lambda a, p: jnp.sum(w * op(a, p, support))

    op = lambda a, p, s: categorical_projection(a, p, s, backend=backend)
    d_atoms, d_probs = jax.jit(jax.grad(loss(op), argnums=(0, 1)))(atoms, probs)
    np_atoms, np_probs = numpy_projection_vjp(atoms, probs, support, w)
    assert_close(d_probs, np_probs, atol=1e-5)
    assert_close(d_atoms, np_atoms, atol=1e-5)
    if backend != "reference":
        ref_atoms, ref_probs = jax.grad(loss(categorical_projection_reference), argnums=(0, 1))(
            atoms, probs
        )
        assert_close(d_probs, np.asarray(ref_probs, np.float64), atol=1e-5)
        assert_close(d_atoms, np.asarray(ref_atoms, np.float64), atol=1e-5)


def test_no_gradient_into_the_support(backend):
    support = np.linspace(-1.0, 1.0, 5).astype(np.float32)
    atoms, probs = random_distribution(np.random.default_rng(4), (3,), 4, 1.0)
    g = jax.grad(lambda s: jnp.sum(categorical_projection(atoms, probs, s, backend=backend) ** 2))(
        support
    )
    assert np.all(np.asarray(g) == 0.0)


def test_gradients_under_vmap(backend):
    rng = np.random.default_rng(5)
    support = make_support(rng, 8, even=False)
    atoms, probs = random_distribution(rng, (3, 4), 6, 4.0)
    g = rng.normal(size=(3, 4, 8)).astype(np.float32)
    op = lambda a, p: categorical_projection(a, p, support, backend=backend)
    vjp = jax.vmap(lambda a, p, c: jax.vjp(op, a, p)[1](c))
    d_atoms, d_probs = vjp(atoms, probs, g)
    np_atoms, np_probs = numpy_projection_vjp(atoms, probs, support, g)
    assert_close(d_probs, np_probs, atol=1e-5)
    assert_close(d_atoms, np_atoms, atol=1e-5)


GOOD_ATOMS = np.zeros((4, 5), np.float32)
GOOD_SUPPORT = np.linspace(0.0, 1.0, 3).astype(np.float32)


@pytest.mark.parametrize(
    "atoms,probs,support,message",
    [
        (
            GOOD_ATOMS.astype(np.int32),
            GOOD_ATOMS,
            GOOD_SUPPORT,
            r"atoms must be a floating-point array, got dtype int32 with shape \(4, 5\)",
        ),
        (
            GOOD_ATOMS,
            GOOD_ATOMS.astype(np.int32),
            GOOD_SUPPORT,
            r"probs must be a floating-point array, got dtype int32",
        ),
        (
            GOOD_ATOMS,
            GOOD_ATOMS[:, :4],
            GOOD_SUPPORT,
            r"probs must have the shape of atoms \(4, 5\), got \(4, 4\)",
        ),
        (
            np.float32(0.0),
            np.float32(0.0),
            GOOD_SUPPORT,
            r"atoms must have rank >= 1, got shape \(\)",
        ),
        (
            GOOD_ATOMS,
            GOOD_ATOMS,
            GOOD_SUPPORT[None],
            r"target_support must have rank 1, got shape \(1, 3\)",
        ),
        (
            GOOD_ATOMS,
            GOOD_ATOMS,
            GOOD_SUPPORT[:1],
            r"target_support needs at least 2 atoms, got shape \(1,\)",
        ),
        (
            GOOD_ATOMS,
            GOOD_ATOMS,
            np.arange(3),
            r"target_support must be a floating-point array, got dtype int",
        ),
    ],
)
def test_bad_inputs_raise_at_trace_time(backend, atoms, probs, support, message):
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda a, p, s: categorical_projection(a, p, s, backend=backend))(
            atoms, probs, support
        )


def test_unsorted_concrete_support_raises(backend):
    with pytest.raises(
        ValueError, match=r"target_support must be strictly increasing, got \[0.0, 2.0, 1.0\]"
    ):
        categorical_projection(
            GOOD_ATOMS, GOOD_ATOMS, np.array([0.0, 2.0, 1.0], np.float32), backend=backend
        )
