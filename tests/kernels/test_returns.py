"""discounted_returns on every backend vs a float64 NumPy reference, under jit/vmap/scan/grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import central_differences

from kernels import discounted_returns
from kernels._chunked_scan import ScanConfig
from kernels.returns import discounted_returns_reference

# tilings that exercise both grids on small shapes (partial tiles, several tiles per column)
CONFIGS = [
    None,
    ScanConfig(chunk_t=4, block_n=4, chained=False),
    ScanConfig(chunk_t=4, block_n=8, chained=True),
    ScanConfig(
        chunk_t=2, block_n=4, chained=True, prefix_lookup=False
    ),  # look-back composes aggregates
]


def numpy_returns(rewards, discounts, bootstrap):
    """float64 loop: G_t = r_t + d_t G_{t+1}, G_T = bootstrap."""
    r, d = np.asarray(rewards, np.float64), np.asarray(discounts, np.float64)
    out = np.zeros_like(r)
    acc = np.asarray(bootstrap, np.float64)
    for t in reversed(range(r.shape[0])):
        acc = r[t] + d[t] * acc
        out[t] = acc
    return out


def assert_close(actual, expected, horizon):
    expected = np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), expected, rtol=1e-5, atol=2e-6 * (horizon + 1) * scale
    )


def random_inputs(rng, shape, gamma=0.97, done_prob=0.2):
    rewards = rng.normal(size=shape).astype(np.float32)
    done = rng.uniform(size=shape) < done_prob
    discounts = (gamma * (1.0 - done)).astype(np.float32)
    bootstrap = rng.normal(size=shape[1:]).astype(np.float32)
    return rewards, discounts, bootstrap


# The property test calls the op through one jitted program per example (an example's shapes are
# new, so an eager call would compile each of the op's operations on its own); the other tests
# call it eagerly.
discounted_returns_jit = jax.jit(discounted_returns, static_argnames=("backend",))


@settings(max_examples=25, deadline=None)
@given(
    horizon=st.integers(1, 40),
    batch=st.sampled_from([(), (1,), (3,), (5,), (2, 3), (7, 1)]),
    gamma=st.floats(0.0, 1.0),
    done_prob=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_float64_numpy(backend, horizon, batch, gamma, done_prob, seed):
    rng = np.random.default_rng(seed)
    rewards, discounts, bootstrap = random_inputs(rng, (horizon, *batch), gamma, done_prob)
    out = discounted_returns_jit(rewards, discounts, bootstrap, backend=backend)
    assert out.shape == rewards.shape and out.dtype == jnp.float32
    assert_close(out, numpy_returns(rewards, discounts, bootstrap), horizon)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("shape", [(1, 3), (9, 5), (17, 2, 3)])
def test_tilings(kernel_backend, config, shape):
    rewards, discounts, bootstrap = random_inputs(np.random.default_rng(1), shape)
    out = discounted_returns(rewards, discounts, bootstrap, backend=kernel_backend, config=config)
    assert_close(out, numpy_returns(rewards, discounts, bootstrap), shape[0])


def test_episode_end_at_every_position(backend):
    horizon = 6
    rewards = np.arange(1, horizon + 1, dtype=np.float32)[:, None] * np.ones(
        (1, horizon), np.float32
    )
    discounts = np.full((horizon, horizon), 0.5, np.float32)
    discounts[np.arange(horizon), np.arange(horizon)] = 0.0  # column k ends its episode at step k
    bootstrap = np.full((horizon,), 100.0, np.float32)
    out = discounted_returns(rewards, discounts, bootstrap, backend=backend)
    assert_close(out, numpy_returns(rewards, discounts, bootstrap), horizon)
    # hand check for column 0: the episode ends at t=0, so G_0 = r_0 exactly
    assert float(out[0, 0]) == 1.0


def test_jit_nested_vmap_and_partial_batching(backend):
    rng = np.random.default_rng(2)
    seeds, envs, horizon = 3, 4, 11
    rewards = rng.normal(size=(seeds, envs, horizon)).astype(np.float32)
    discounts = (0.9 * (rng.uniform(size=(envs, horizon)) > 0.1)).astype(
        np.float32
    )  # shared by seeds
    bootstrap = rng.normal(size=(seeds, envs)).astype(np.float32)

    def one(r, d, b):  # r, d: [T], b: []
        return discounted_returns(r, d, b, backend=backend)

    batched = jax.jit(jax.vmap(jax.vmap(one, in_axes=(0, 0, 0)), in_axes=(0, None, 0)))
    out = batched(rewards, discounts, bootstrap)
    for s in range(seeds):
        expected = numpy_returns(rewards[s].T, discounts.T, bootstrap[s]).T
        assert_close(out[s], expected, horizon)


def test_vmap_over_a_non_leading_axis(backend):
    rng = np.random.default_rng(3)
    rewards, discounts, bootstrap = random_inputs(rng, (8, 5))
    out = jax.vmap(
        lambda r, d, b: discounted_returns(r, d, b, backend=backend), in_axes=(1, 1, 0), out_axes=1
    )(rewards, discounts, bootstrap)
    assert_close(out, numpy_returns(rewards, discounts, bootstrap), 8)


def test_inside_lax_scan_with_traced_gamma(backend):
    rng = np.random.default_rng(4)
    rewards, done = rng.normal(size=(7, 3)).astype(np.float32), rng.uniform(size=(7, 3)) < 0.3
    gammas = jnp.array([0.0, 0.5, 0.99], jnp.float32)

    @jax.jit
    def run(gammas):
        def body(carry, gamma):
            discounts = gamma * (1.0 - done.astype(jnp.float32))
            return carry, discounted_returns(rewards, discounts, jnp.zeros(3), backend=backend)

        return jax.lax.scan(body, 0.0, gammas)[1]

    out = run(gammas)
    for i, gamma in enumerate(np.asarray(gammas)):
        assert_close(out[i], numpy_returns(rewards, gamma * (1.0 - done), np.zeros(3)), 7)


def test_gradients_match_float64_finite_differences(backend):
    """The gradients with respect to rewards, discounts and the bootstrap, against float64 central
    differences of the NumPy loop `numpy_returns` (an oracle independent of the op and of JAX),
    and, for a kernel backend, against autodiff of the reference."""
    rng = np.random.default_rng(5)
    rewards, discounts, bootstrap = random_inputs(rng, (13, 4))
    weights = rng.normal(size=(13, 4)).astype(np.float32)

    def loss(fn, xp=jnp):
        return lambda r, d, b: xp.sum(weights * xp.sin(fn(r, d, b)))

    ours = jax.jit(
        jax.grad(loss(lambda *a: discounted_returns(*a, backend=backend)), argnums=(0, 1, 2))
    )(rewards, discounts, bootstrap)
    oracle = central_differences(loss(numpy_returns, np), (rewards, discounts, bootstrap))
    for got, want in zip(ours, oracle):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if backend != "reference":
        ref = jax.grad(loss(discounted_returns_reference), argnums=(0, 1, 2))
        for got, want in zip(ours, ref(rewards, discounts, bootstrap)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_gradients_under_tilings(kernel_backend, config):
    """The backward pass (the adjoint scan, forward in time) on each tiling,
    against the reference's."""
    rng = np.random.default_rng(7)
    rewards, discounts, bootstrap = random_inputs(rng, (11, 6))
    weights = rng.normal(size=(11, 6)).astype(np.float32)

    def loss(fn):
        return lambda r, d, b: jnp.sum(weights * fn(r, d, b) ** 2)

    ours = jax.grad(
        loss(lambda *a: discounted_returns(*a, backend=kernel_backend, config=config)),
        argnums=(0, 1, 2),
    )
    ref = jax.grad(loss(discounted_returns_reference), argnums=(0, 1, 2))
    for got, want in zip(ours(rewards, discounts, bootstrap), ref(rewards, discounts, bootstrap)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gradients_under_vmap(backend):
    rng = np.random.default_rng(6)
    rewards = rng.normal(size=(2, 9, 3)).astype(np.float32)
    discounts = np.full((9, 3), 0.9, np.float32)

    def grad_r(fn):
        return jax.vmap(jax.grad(lambda r: jnp.sum(fn(r, discounts, jnp.ones(3)) ** 2)))

    ours = grad_r(lambda *a: discounted_returns(*a, backend=backend))(rewards)
    ref = grad_r(discounted_returns_reference)(rewards)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "rewards, discounts, bootstrap, message",
    [
        (
            np.zeros((4, 3), np.int32),
            np.zeros((4, 3)),
            np.zeros(3),
            "rewards must be a floating-point",
        ),
        (
            np.zeros((4, 3)),
            np.zeros((4, 2)),
            np.zeros(3),
            r"discounts must have the shape of rewards \(4, 3\), got \(4, 2\)",
        ),
        (
            np.zeros((4, 3)),
            np.zeros((4, 3)),
            np.zeros(4),
            r"bootstrap must have the shape of one time step .*\(3,\).*got \(4,\)",
        ),
        (np.zeros(()), np.zeros(()), np.zeros(()), r"rewards must have rank >= 1, got shape \(\)"),
        (
            np.zeros((4, 3)),
            np.zeros((4, 3), bool),
            np.zeros(3),
            "discounts must be a floating-point",
        ),
    ],
)
def test_bad_inputs_raise_at_trace_time(backend, rewards, discounts, bootstrap, message):
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda r, d, b: discounted_returns(r, d, b, backend=backend)).lower(
            rewards, discounts, bootstrap
        )
